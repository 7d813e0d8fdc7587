# SPDX-License-Identifier: MIT
# src/conformance: pkv-conformance, the one correctness runner for any backend, installed for plugin authors.
# Plain C against the loader sources only (no Check, no liburing), so it also builds with cc alone.
# ref.c is the tree's one reference attention; the daemon and CUDA tests link it too (libpkvref).
noinst_LTLIBRARIES += src/conformance/libpkvref.la
src_conformance_libpkvref_la_SOURCES = src/conformance/ref.c src/conformance/ref.h
src_conformance_libpkvref_la_LIBADD = $(LIBM)
bin_PROGRAMS += src/conformance/pkv-conformance
src_conformance_pkv_conformance_SOURCES = src/conformance/conformance.c
src_conformance_pkv_conformance_LDADD = src/conformance/libpkvref.la src/loader/libpkvloader.la $(LIBM)
dist_man_MANS += man/pkv-conformance.1 man/pagedkv-backend.7
