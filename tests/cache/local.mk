# SPDX-License-Identifier: MIT
# tests/cache: Check suites of the cache manager (unit rules, prefix/LRU/pins, randomized model test).
cache_test_programs = tests/cache/test-cache-seq
check_PROGRAMS += $(cache_test_programs)
TESTS += $(cache_test_programs)
noinst_HEADERS += tests/cache/helpers.h

tests_cache_test_cache_seq_SOURCES = tests/cache/test_cache_seq.c
tests_cache_test_cache_seq_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cache_test_cache_seq_LDADD = src/cache/libpkvcache.la $(CHECK_LIBS)
