# SPDX-License-Identifier: MIT
# Tools: the pkv-bench dispatcher (each benchmark is its own pkv-bench-NAME, built by its area).
bin_PROGRAMS += src/tools/pkv-bench
src_tools_pkv_bench_SOURCES = src/tools/pkv_bench.c

# One fragment per benchmark, owned by the area it measures.
include $(srcdir)/src/tools/bench-cache.mk
include $(srcdir)/src/tools/bench-attn.mk
include $(srcdir)/src/tools/bench-ipc.mk
include $(srcdir)/src/tools/bench-e2e.mk
include $(srcdir)/src/tools/bench-isolation.mk
include $(srcdir)/src/tools/ctl.mk
