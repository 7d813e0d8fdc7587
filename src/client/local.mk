# SPDX-License-Identifier: MIT
# src/client: libpagedkv, the client library (exports only the pkv_* API through a version script).
lib_LTLIBRARIES += src/client/libpagedkv.la
src_client_libpagedkv_la_SOURCES = src/client/client.c src/client/arena.c src/client/local_attn.c
# the loader (dlopen, host services) carries libpkvcommon with it
src_client_libpagedkv_la_LIBADD = src/loader/libpkvloader.la
src_client_libpagedkv_la_LDFLAGS = -version-info 1:0:0 \
	-Wl,--version-script=$(srcdir)/src/client/libpagedkv.sym
EXTRA_src_client_libpagedkv_la_DEPENDENCIES = src/client/libpagedkv.sym
noinst_HEADERS += src/client/arena.h src/client/local_attn.h
EXTRA_DIST += src/client/libpagedkv.sym src/client/pagedkv.pc.in
pkgconfig_DATA += src/client/pagedkv.pc
