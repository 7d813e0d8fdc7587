# SPDX-License-Identifier: MIT
# pkv-bench-e2e: model end-to-end figures (prefill, decode, aggregate decode, cold/warm TTFT), with llama-bench as an optional same-run peer.
pkglibexec_PROGRAMS += src/tools/pkv-bench-e2e
src_tools_pkv_bench_e2e_SOURCES = src/tools/bench_e2e.c src/tools/bench_stats.h src/tools/bench_e2e_burst.c src/tools/bench_e2e_burst.h \
	src/tools/bench_peer.c src/tools/bench_peer.h
src_tools_pkv_bench_e2e_LDADD = examples/llama/libpkvmodel.la src/common/libpkvcommon.la
