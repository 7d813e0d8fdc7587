# SPDX-License-Identifier: MIT
# tests/cache: Check suites of the cache manager (unit rules, prefix/LRU/pins, randomized model test).
cache_tests = tests/cache/test-cache-seq tests/cache/test-cache-prefix tests/cache/test-cache-random \
	tests/cache/test-cache-nomem tests/cache/test-cache-bounds tests/cache/test-cache-inflight \
	tests/cache/test-cache-inflight-random
check_PROGRAMS += $(cache_tests)
TESTS += $(cache_tests)
noinst_HEADERS += tests/cache/helpers.h

tests_cache_test_cache_seq_SOURCES = tests/cache/test_cache_seq.c
tests_cache_test_cache_seq_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cache_test_cache_seq_LDADD = src/cache/libpkvcache.la $(CHECK_LIBS)

# Reaches into cache_int.h to forge collisions and corrupt state for audit.
tests_cache_test_cache_prefix_SOURCES = tests/cache/test_cache_prefix.c
tests_cache_test_cache_prefix_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(XXHASH_CFLAGS)
tests_cache_test_cache_prefix_LDADD = src/cache/libpkvcache.la $(CHECK_LIBS)

# PKV_RANDOM_SEED replays a failure (the seed is printed); PKV_RANDOM_OPS runs longer.
tests_cache_test_cache_random_SOURCES = tests/cache/test_cache_random.c
tests_cache_test_cache_random_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(XXHASH_CFLAGS)
tests_cache_test_cache_random_LDADD = src/cache/libpkvcache.la $(CHECK_LIBS)

# Replaces malloc to fail the n-th allocation; skipped (77) in sanitizer builds.
tests_cache_test_cache_nomem_SOURCES = tests/cache/test_cache_nomem.c
tests_cache_test_cache_nomem_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cache_test_cache_nomem_LDADD = src/cache/libpkvcache.la $(CHECK_LIBS)

# Reaches into cache_int.h to see which buffers a step keeps.
tests_cache_test_cache_bounds_SOURCES = tests/cache/test_cache_bounds.c
tests_cache_test_cache_bounds_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(XXHASH_CFLAGS)
tests_cache_test_cache_bounds_LDADD = src/cache/libpkvcache.la $(CHECK_LIBS)
tests_cache_test_cache_inflight_SOURCES = tests/cache/test_cache_inflight.c
tests_cache_test_cache_inflight_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cache_test_cache_inflight_LDADD = src/cache/libpkvcache.la $(CHECK_LIBS)

# PKV_RANDOM_SEED / PKV_RANDOM_OPS as for test-cache-random.
tests_cache_test_cache_inflight_random_SOURCES = tests/cache/test_cache_inflight_random.c
tests_cache_test_cache_inflight_random_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cache_test_cache_inflight_random_LDADD = src/cache/libpkvcache.la $(CHECK_LIBS)
