# SPDX-License-Identifier: MIT
# examples/pkv-prefix-demo: N chat sessions sharing a system prompt through the cache manager (scripts/demo runs it).
noinst_PROGRAMS += examples/pkv-prefix-demo
examples_pkv_prefix_demo_SOURCES = examples/prefix_demo.c
examples_pkv_prefix_demo_LDADD = src/cache/libpkvcache.la
