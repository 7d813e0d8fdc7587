# SPDX-License-Identifier: MIT
# src/daemon: pagedkvd (event loop, sessions, pools, worker) and its man page.
noinst_LTLIBRARIES += src/daemon/libpkvvalidate.la
src_daemon_libpkvvalidate_la_SOURCES = src/daemon/validate.c
src_daemon_libpkvvalidate_la_LIBADD = src/common/libpkvcommon.la $(LIBM)

sbin_PROGRAMS += src/daemon/pagedkvd
src_daemon_pagedkvd_SOURCES = src/daemon/main.c src/daemon/conf.c src/daemon/loop.c \
	src/daemon/session.c src/daemon/pool.c src/daemon/worker.c src/daemon/ctl.c \
	src/daemon/tenant.c src/daemon/sd.c src/daemon/sigbus.c src/daemon/tier_glue.c src/daemon/accept.c \
	src/daemon/rate.c
src_daemon_pagedkvd_CFLAGS = $(AM_CFLAGS) $(URING_CFLAGS)
# Lets a pagedkvd run from the build tree find the build tree's plugins (see running_uninstalled()).
src_daemon_pagedkvd_CPPFLAGS = $(AM_CPPFLAGS) -DPKV_BUILD_DIR=\"$(abs_top_builddir)\"
src_daemon_pagedkvd_LDADD = src/daemon/libpkvvalidate.la src/cache/libpkvcache.la \
	src/loader/libpkvloader.la src/tier/libpkvtier.la src/common/libpkvcommon.la $(URING_LIBS) $(XXHASH_LIBS) \
	$(PTHREAD_LIBS) $(LIBM)
noinst_HEADERS += src/daemon/daemon.h src/daemon/tenant.h src/daemon/conf.h src/daemon/validate.h \
	src/daemon/sd.h src/daemon/sigbus.h src/daemon/tier_glue.h src/daemon/rate.h
dist_man_MANS += man/pagedkvd.8
