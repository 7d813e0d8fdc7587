# SPDX-License-Identifier: MIT
# tests/service: pagedkvd as a service (socket activation, sd_notify, SIGHUP, pid file), its settings
# and messages, and the man pages against every program's --help.
check_PROGRAMS += tests/service/check_service
TESTS += tests/service/check_service
tests_service_check_service_SOURCES = tests/service/check_service.c
tests_service_check_service_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_service_check_service_LDADD = $(DAEMON_TEST_LIBS)

check_PROGRAMS += tests/service/check_settings
TESTS += tests/service/check_settings
tests_service_check_settings_SOURCES = tests/service/check_settings.c src/daemon/conf.c
tests_service_check_settings_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_service_check_settings_LDADD = src/common/libpkvcommon.la $(CHECK_LIBS)

TESTS += tests/service/man-flags
dist_check_SCRIPTS += tests/service/man-flags
TESTS += tests/service/cli-messages
dist_check_SCRIPTS += tests/service/cli-messages
