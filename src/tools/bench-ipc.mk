# SPDX-License-Identifier: MIT
# pkv-bench-ipc: ring round trips, no-op throughput, 30-layer step overhead and coalescing (pkv-bench ipc).
pkglibexec_PROGRAMS += src/tools/pkv-bench-ipc
src_tools_pkv_bench_ipc_SOURCES = src/tools/bench_ipc.c src/tools/bench_stats.h
src_tools_pkv_bench_ipc_CPPFLAGS = $(AM_CPPFLAGS) -DPKV_SBIN_DIR=\"$(sbindir)\"
src_tools_pkv_bench_ipc_LDADD = src/client/libpagedkv.la src/loader/libpkvloader.la $(PTHREAD_LIBS) $(LIBM)
