# SPDX-License-Identifier: MIT
# src/tools/pkv-prefix-demo: N chat sessions sharing a system prompt through the cache manager (scripts/demo runs it).
noinst_PROGRAMS += src/tools/pkv-prefix-demo
src_tools_pkv_prefix_demo_SOURCES = src/tools/prefix_demo.c
src_tools_pkv_prefix_demo_LDADD = src/cache/libpkvcache.la
