# SPDX-License-Identifier: MIT
# tests/daemon: process tests of pagedkvd + libpagedkv, the protocol fuzz target.
# The daemons these tests start serve attention with examples/plugin_naive.c (examples/local.mk).
# The one pagedkvd launcher, shared with tests/model.
check_LTLIBRARIES += tests/daemon/libpkvtestlaunch.la
tests_daemon_libpkvtestlaunch_la_SOURCES = tests/daemon/launch.c tests/daemon/launch.h
tests_daemon_libpkvtestlaunch_la_LIBADD = src/common/libpkvcommon.la

check_LTLIBRARIES += tests/daemon/libpkvtestharness.la
tests_daemon_libpkvtestharness_la_SOURCES = tests/daemon/harness.c tests/daemon/harness.h
tests_daemon_libpkvtestharness_la_LIBADD = tests/daemon/libpkvtestlaunch.la src/client/libpagedkv.la src/common/libpkvcommon.la \
	src/conformance/libpkvref.la $(LIBM)

DAEMON_TEST_LIBS = tests/daemon/libpkvtestharness.la src/client/libpagedkv.la \
	src/common/libpkvcommon.la $(CHECK_LIBS) $(LIBM)

check_PROGRAMS += tests/daemon/check_daemon
TESTS += tests/daemon/check_daemon
tests_daemon_check_daemon_SOURCES = tests/daemon/check_daemon.c
tests_daemon_check_daemon_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_daemon_LDADD = $(DAEMON_TEST_LIBS)

check_PROGRAMS += tests/daemon/check_hostile
TESTS += tests/daemon/check_hostile
tests_daemon_check_hostile_SOURCES = tests/daemon/check_hostile.c
tests_daemon_check_hostile_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_hostile_LDADD = $(DAEMON_TEST_LIBS)

check_PROGRAMS += tests/daemon/check_liveness
TESTS += tests/daemon/check_liveness
tests_daemon_check_liveness_SOURCES = tests/daemon/check_liveness.c
tests_daemon_check_liveness_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_liveness_LDADD = $(DAEMON_TEST_LIBS)

check_PROGRAMS += tests/daemon/check_connect
TESTS += tests/daemon/check_connect
tests_daemon_check_connect_SOURCES = tests/daemon/check_connect.c
tests_daemon_check_connect_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_connect_LDADD = $(DAEMON_TEST_LIBS)

check_PROGRAMS += tests/daemon/check_scope
TESTS += tests/daemon/check_scope
tests_daemon_check_scope_SOURCES = tests/daemon/check_scope.c
tests_daemon_check_scope_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_scope_LDADD = $(DAEMON_TEST_LIBS)

# Fuzz target: LLVMFuzzerTestOneInput in fuzz_proto.c; make check runs the standalone driver.
# libFuzzer build: clang -fsanitize=fuzzer,address -Iinclude -Isrc -Ibuild tests/daemon/fuzz_proto.c
#   src/daemon/validate.c src/common/region.c -lm
check_PROGRAMS += tests/daemon/fuzz_proto
TESTS += tests/daemon/fuzz_proto
tests_daemon_fuzz_proto_SOURCES = tests/daemon/fuzz_proto.c tests/daemon/fuzz_proto_seeds.c tests/daemon/fuzz_proto.h \
	tests/fuzz_driver.c tests/fuzz_driver.h
tests_daemon_fuzz_proto_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/tests
tests_daemon_fuzz_proto_LDADD = src/daemon/libpkvvalidate.la src/common/libpkvcommon.la $(LIBM)

# Unit test of the configuration parser.
check_PROGRAMS += tests/daemon/check_conf
TESTS += tests/daemon/check_conf
tests_daemon_check_conf_SOURCES = tests/daemon/check_conf.c src/daemon/conf.c
tests_daemon_check_conf_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_conf_LDADD = src/common/libpkvcommon.la $(CHECK_LIBS)

check_PROGRAMS += tests/daemon/check_cpu
TESTS += tests/daemon/check_cpu
tests_daemon_check_cpu_SOURCES = tests/daemon/check_cpu.c
tests_daemon_check_cpu_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_cpu_LDADD = $(DAEMON_TEST_LIBS)

check_PROGRAMS += tests/daemon/check_ring
TESTS += tests/daemon/check_ring
tests_daemon_check_ring_SOURCES = tests/daemon/check_ring.c
tests_daemon_check_ring_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_ring_LDADD = src/common/libpkvcommon.la $(CHECK_LIBS) $(PTHREAD_LIBS)
