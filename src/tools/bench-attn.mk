# SPDX-License-Identifier: MIT
# pkv-bench-attn: decode KV GB/s and prefill GFLOP/s of an attention backend vs STREAM read, same run.
pkglibexec_PROGRAMS += src/tools/pkv-bench-attn
src_tools_pkv_bench_attn_SOURCES = src/tools/bench_attn.c src/tools/bench_stats.h
src_tools_pkv_bench_attn_CFLAGS = $(AM_CFLAGS) -O2
src_tools_pkv_bench_attn_LDADD = src/loader/libpkvloader.la $(LIBM)
