# SPDX-License-Identifier: MIT
# tests/tier: the disk tier's library suite (a real directory, real io_uring).
check_PROGRAMS += tests/tier/check_tier
TESTS += tests/tier/check_tier
tests_tier_check_tier_SOURCES = tests/tier/check_tier.c
tests_tier_check_tier_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_tier_check_tier_LDADD = src/tier/libpkvtier.la $(CHECK_LIBS)
