# SPDX-License-Identifier: MIT
# src/loader: the dlopen loader, host services (log, aligned alloc, thread pool) and per-batch dispatch.
noinst_LTLIBRARIES += src/loader/libpkvloader.la
src_loader_libpkvloader_la_SOURCES = \
	src/loader/host.c \
	src/loader/plugin.c \
	src/loader/options.c \
	src/loader/dispatch.c
src_loader_libpkvloader_la_LIBADD = $(LIBS) $(PTHREAD_LIBS)
noinst_HEADERS += src/loader/loader.h
