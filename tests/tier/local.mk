# SPDX-License-Identifier: MIT
# tests/tier: the disk tier's library suite (a real directory, real io_uring).
check_PROGRAMS += tests/tier/check_tier
TESTS += tests/tier/check_tier
tests_tier_check_tier_SOURCES = tests/tier/check_tier.c
tests_tier_check_tier_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_tier_check_tier_LDADD = src/tier/libpkvtier.la $(CHECK_LIBS)

# pagedkvd with --disk-cache as real processes (the daemon test harness, the naive backend).
check_PROGRAMS += tests/tier/check_tier_daemon
TESTS += tests/tier/check_tier_daemon
tests_tier_check_tier_daemon_SOURCES = tests/tier/check_tier_daemon.c
tests_tier_check_tier_daemon_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_tier_check_tier_daemon_LDADD = src/tier/libpkvtier.la $(DAEMON_TEST_LIBS)

# The --disk-* configuration keys (the daemon's parser, compiled in).
check_PROGRAMS += tests/tier/check_tier_conf
TESTS += tests/tier/check_tier_conf
tests_tier_check_tier_conf_SOURCES = tests/tier/check_tier_conf.c src/daemon/conf.c
tests_tier_check_tier_conf_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_tier_check_tier_conf_LDADD = src/common/libpkvcommon.la $(CHECK_LIBS)
