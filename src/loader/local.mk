# SPDX-License-Identifier: MIT
# src/loader: the dlopen loader, host services (log, aligned alloc, thread pool) and per-batch dispatch.
noinst_LTLIBRARIES += src/loader/libpkvloader.la
src_loader_libpkvloader_la_SOURCES = \
	src/loader/host.c \
	src/loader/plugin.c \
	src/loader/options.c \
	src/loader/dispatch.c
# libpkvcommon: the spin gate (common/spin.c), one copy for the daemon, the client and the host pool.
src_loader_libpkvloader_la_LIBADD = src/common/libpkvcommon.la $(LIBS) $(PTHREAD_LIBS)
noinst_HEADERS += src/loader/loader.h
