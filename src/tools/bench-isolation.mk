# SPDX-License-Identifier: MIT
# pkv-bench-isolation: a victim uid's decode latency while another uid attacks (pkv-bench isolation).
pkglibexec_PROGRAMS += src/tools/pkv-bench-isolation
src_tools_pkv_bench_isolation_SOURCES = src/tools/bench_isolation.c
src_tools_pkv_bench_isolation_CPPFLAGS = $(AM_CPPFLAGS) -DPKV_SBIN_DIR=\"$(sbindir)\" -DPKV_BIN_DIR=\"$(bindir)\"
src_tools_pkv_bench_isolation_LDADD = src/client/libpagedkv.la
