# SPDX-License-Identifier: MIT
# tests/backend: loader tests with deliberately broken plugins, and the conformance suite run on the CPU plugin.

# One toy backend source, built once per defect. -rpath makes libtool build a
# shared module even though it is never installed.
TOY_LDFLAGS = -module -avoid-version -shared -rpath /nowhere
check_LTLIBRARIES += \
	tests/backend/pkv_toy_good.la \
	tests/backend/pkv_toy_nosym.la \
	tests/backend/pkv_toy_badabi.la \
	tests/backend/pkv_toy_small.la \
	tests/backend/pkv_toy_noinit.la \
	tests/backend/pkv_toy_initfail.la \
	tests/backend/pkv_toy_nodecode.la \
	tests/backend/pkv_toy_narrow.la \
	tests/backend/pkv_toy_abiold.la \
	tests/backend/pkv_toy_abinew.la
tests_backend_pkv_toy_good_la_SOURCES = tests/backend/test_plugin.c
tests_backend_pkv_toy_good_la_LDFLAGS = $(TOY_LDFLAGS)
tests_backend_pkv_toy_nosym_la_SOURCES = tests/backend/test_plugin.c
tests_backend_pkv_toy_nosym_la_CPPFLAGS = $(AM_CPPFLAGS) -DDEFECT_NO_SYMBOL
tests_backend_pkv_toy_nosym_la_LDFLAGS = $(TOY_LDFLAGS)
tests_backend_pkv_toy_badabi_la_SOURCES = tests/backend/test_plugin.c
tests_backend_pkv_toy_badabi_la_CPPFLAGS = $(AM_CPPFLAGS) -DDEFECT_BAD_ABI
tests_backend_pkv_toy_badabi_la_LDFLAGS = $(TOY_LDFLAGS)
tests_backend_pkv_toy_small_la_SOURCES = tests/backend/test_plugin.c
tests_backend_pkv_toy_small_la_CPPFLAGS = $(AM_CPPFLAGS) -DDEFECT_SMALL_STRUCT
tests_backend_pkv_toy_small_la_LDFLAGS = $(TOY_LDFLAGS)
tests_backend_pkv_toy_noinit_la_SOURCES = tests/backend/test_plugin.c
tests_backend_pkv_toy_noinit_la_CPPFLAGS = $(AM_CPPFLAGS) -DDEFECT_NULL_INIT
tests_backend_pkv_toy_noinit_la_LDFLAGS = $(TOY_LDFLAGS)
tests_backend_pkv_toy_initfail_la_SOURCES = tests/backend/test_plugin.c
tests_backend_pkv_toy_initfail_la_CPPFLAGS = $(AM_CPPFLAGS) -DDEFECT_INIT_FAILS
tests_backend_pkv_toy_initfail_la_LDFLAGS = $(TOY_LDFLAGS)
tests_backend_pkv_toy_nodecode_la_SOURCES = tests/backend/test_plugin.c
tests_backend_pkv_toy_nodecode_la_CPPFLAGS = $(AM_CPPFLAGS) -DDEFECT_NO_DECODE_METHOD
tests_backend_pkv_toy_nodecode_la_LDFLAGS = $(TOY_LDFLAGS)
tests_backend_pkv_toy_narrow_la_SOURCES = tests/backend/test_plugin.c
tests_backend_pkv_toy_narrow_la_CPPFLAGS = $(AM_CPPFLAGS) -DDEFECT_NARROW_CAPS
tests_backend_pkv_toy_narrow_la_LDFLAGS = $(TOY_LDFLAGS)
# The same toy built against an older, smaller and a newer, larger struct layout.
tests_backend_pkv_toy_abiold_la_SOURCES = tests/backend/test_plugin.c
tests_backend_pkv_toy_abiold_la_CPPFLAGS = $(AM_CPPFLAGS) -DLAYOUT_OLD
tests_backend_pkv_toy_abiold_la_LDFLAGS = $(TOY_LDFLAGS)
tests_backend_pkv_toy_abinew_la_SOURCES = tests/backend/test_plugin.c
tests_backend_pkv_toy_abinew_la_CPPFLAGS = $(AM_CPPFLAGS) -DLAYOUT_NEW
tests_backend_pkv_toy_abinew_la_LDFLAGS = $(TOY_LDFLAGS)

check_PROGRAMS += tests/backend/check_loader tests/backend/check_host tests/backend/check_cpu
TESTS += tests/backend/check_loader tests/backend/check_host tests/backend/check_cpu
tests_backend_check_loader_SOURCES = tests/backend/check_loader.c
tests_backend_check_loader_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_backend_check_loader_LDADD = src/loader/libpkvloader.la $(CHECK_LIBS)
tests_backend_check_host_SOURCES = tests/backend/check_host.c
tests_backend_check_host_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_backend_check_host_LDADD = src/loader/libpkvloader.la $(CHECK_LIBS)
tests_backend_check_cpu_SOURCES = tests/backend/check_cpu.c
tests_backend_check_cpu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_backend_check_cpu_LDADD = src/loader/libpkvloader.la $(CHECK_LIBS) $(LIBM)

# make check runs pkv-conformance (src/conformance) on the CPU plugin, once per kernel variant.
TESTS += tests/backend/conformance-cpu tests/backend/conformance-cpu-fill
dist_check_SCRIPTS += tests/backend/conformance-cpu tests/backend/conformance-cpu-fill
# Its exit status after a bail-out (toy plugins whose load or init fails).
TESTS += tests/backend/conformance-exit
dist_check_SCRIPTS += tests/backend/conformance-exit
# pagedkvd's backend options and --list-backends, end to end.
TESTS += tests/backend/daemon-options
dist_check_SCRIPTS += tests/backend/daemon-options
