# SPDX-License-Identifier: MIT
# examples: what a library user reads first (hello_client.c, plugin_naive.c), and the model client (llama/).
include $(srcdir)/examples/llama/local.mk

# The smallest correct backend: the daemon tests serve with it, and make check holds it to pkv-conformance.
check_LTLIBRARIES += examples/pkv_naive.la
examples_pkv_naive_la_SOURCES = examples/plugin_naive.c
examples_pkv_naive_la_LDFLAGS = -module -avoid-version -shared -rpath /nowhere
examples_pkv_naive_la_LIBADD = $(LIBM)

# The first client program: compiled in make check and run against a private daemon serving plugin_naive.
check_PROGRAMS += examples/hello_client
examples_hello_client_SOURCES = examples/hello_client.c
examples_hello_client_LDADD = src/client/libpagedkv.la

TESTS += examples/check-examples
dist_check_SCRIPTS += examples/check-examples
