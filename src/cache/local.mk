# SPDX-License-Identifier: MIT
# src/cache: the cache manager, a convenience library the daemon, the tests and the tools link.
noinst_LTLIBRARIES += src/cache/libpkvcache.la
src_cache_libpkvcache_la_SOURCES = \
	src/cache/pool.c \
	src/cache/prefix.c \
	src/cache/seq.c \
	src/cache/step.c \
	src/cache/audit.c \
	src/cache/inflight.c \
	src/cache/adopt.c
src_cache_libpkvcache_la_CFLAGS = $(AM_CFLAGS) $(XXHASH_CFLAGS)
noinst_HEADERS += src/cache/cache.h src/cache/cache_int.h src/cache/bounds.h
