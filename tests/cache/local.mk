# SPDX-License-Identifier: MIT
# tests/cache: Check suites of the cache manager (unit rules, prefix/LRU/pins, randomized model test).
check_PROGRAMS += tests/cache/test-cache-seq tests/cache/test-cache-prefix
TESTS += tests/cache/test-cache-seq tests/cache/test-cache-prefix
noinst_HEADERS += tests/cache/helpers.h

tests_cache_test_cache_seq_SOURCES = tests/cache/test_cache_seq.c
tests_cache_test_cache_seq_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cache_test_cache_seq_LDADD = src/cache/libpkvcache.la $(CHECK_LIBS)

# Reaches into cache_int.h to forge collisions and corrupt state for audit.
tests_cache_test_cache_prefix_SOURCES = tests/cache/test_cache_prefix.c
tests_cache_test_cache_prefix_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(XXHASH_CFLAGS)
tests_cache_test_cache_prefix_LDADD = src/cache/libpkvcache.la $(CHECK_LIBS)
