# SPDX-License-Identifier: MIT
# pkv-bench-cache: the cache manager's benchmark (run as `pkv-bench cache [--json]`).
pkglibexec_PROGRAMS += src/tools/pkv-bench-cache
src_tools_pkv_bench_cache_SOURCES = src/tools/bench_cache.c src/tools/bench_stats.h
src_tools_pkv_bench_cache_CFLAGS = $(AM_CFLAGS) $(XXHASH_CFLAGS)
src_tools_pkv_bench_cache_LDADD = src/cache/libpkvcache.la
