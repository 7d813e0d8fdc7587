# SPDX-License-Identifier: MIT
# pkv-bench-tier: the disk tier's benchmark (run as `pkv-bench tier [--json]`).
pkglibexec_PROGRAMS += src/tools/pkv-bench-tier
src_tools_pkv_bench_tier_SOURCES = src/tools/bench_tier.c src/tools/bench_stats.h
src_tools_pkv_bench_tier_CFLAGS = $(AM_CFLAGS) $(URING_CFLAGS)
src_tools_pkv_bench_tier_LDADD = src/tier/libpkvtier.la src/client/libpagedkv.la $(URING_LIBS)
