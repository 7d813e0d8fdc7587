# SPDX-License-Identifier: MIT
# src/tier: the prefix-cache tier below RAM (common layer + the disk backend), linked by the daemon, tests and pkv-bench.
noinst_LTLIBRARIES += src/tier/libpkvtier.la
src_tier_libpkvtier_la_SOURCES = src/tier/tier.c src/tier/record.c src/tier/disk.c
src_tier_libpkvtier_la_CFLAGS = $(AM_CFLAGS) $(URING_CFLAGS) $(XXHASH_CFLAGS)
src_tier_libpkvtier_la_LIBADD = src/common/libpkvcommon.la $(URING_LIBS) $(XXHASH_LIBS) $(PTHREAD_LIBS)
noinst_HEADERS += src/tier/tier.h src/tier/tier_int.h

# Its tests and its benchmark are registered here, so the tier is one include in Makefile.am.
include $(srcdir)/tests/tier/local.mk
include $(srcdir)/src/tools/bench-tier.mk
