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

# examples/plugin_naive.c without the window feature: the worker then cuts a long row's key pieces
# on block boundaries (check_tenant).
check_LTLIBRARIES += tests/daemon/pkv_naive_nowin.la
tests_daemon_pkv_naive_nowin_la_SOURCES = examples/plugin_naive.c
tests_daemon_pkv_naive_nowin_la_CPPFLAGS = $(AM_CPPFLAGS) \
	-DNAIVE_FEATURES="(PKV_FEAT_SOFTCAP | PKV_FEAT_LSE | PKV_FEAT_COPY_VIEW)"
tests_daemon_pkv_naive_nowin_la_LDFLAGS = -module -avoid-version -shared -rpath /nowhere
tests_daemon_pkv_naive_nowin_la_LIBADD = $(LIBM)

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

check_PROGRAMS += tests/daemon/check_inflight
TESTS += tests/daemon/check_inflight
tests_daemon_check_inflight_SOURCES = tests/daemon/check_inflight.c
tests_daemon_check_inflight_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_inflight_LDADD = $(DAEMON_TEST_LIBS)
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
check_PROGRAMS += tests/daemon/check_rate
TESTS += tests/daemon/check_rate
tests_daemon_check_rate_SOURCES = tests/daemon/check_rate.c src/daemon/rate.c
tests_daemon_check_rate_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_rate_LDADD = $(CHECK_LIBS) $(LIBM)

check_PROGRAMS += tests/daemon/check_conf
TESTS += tests/daemon/check_conf
tests_daemon_check_conf_SOURCES = tests/daemon/check_conf.c src/daemon/conf.c
tests_daemon_check_conf_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_conf_LDADD = src/common/libpkvcommon.la $(CHECK_LIBS)

check_PROGRAMS += tests/daemon/check_client_attn
TESTS += tests/daemon/check_client_attn
tests_daemon_check_client_attn_SOURCES = tests/daemon/check_client_attn.c
tests_daemon_check_client_attn_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_client_attn_LDADD = $(DAEMON_TEST_LIBS)
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

check_PROGRAMS += tests/daemon/check_tenant
TESTS += tests/daemon/check_tenant
tests_daemon_check_tenant_SOURCES = tests/daemon/check_tenant.c
tests_daemon_check_tenant_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_tenant_LDADD = $(DAEMON_TEST_LIBS)

# Soak: PKV_SOAK_S=600 for a long run (default about a minute).
check_PROGRAMS += tests/daemon/check_soak
TESTS += tests/daemon/check_soak
tests_daemon_check_soak_SOURCES = tests/daemon/check_soak.c
tests_daemon_check_soak_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_soak_LDADD = $(DAEMON_TEST_LIBS)
# Issue 9 classes 1, 3, 6 (cache side): real uids (setresuid in forked children; skipped when not root).
check_PROGRAMS += tests/daemon/check_cache_isolation
TESTS += tests/daemon/check_cache_isolation
tests_daemon_check_cache_isolation_SOURCES = tests/daemon/check_cache_isolation.c
tests_daemon_check_cache_isolation_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_cache_isolation_LDADD = $(DAEMON_TEST_LIBS)
# The SIGBUS handler on real faults (unit test; the daemon's use is in check_isolation_mem).
check_PROGRAMS += tests/daemon/check_sigbus
TESTS += tests/daemon/check_sigbus
tests_daemon_check_sigbus_SOURCES = tests/daemon/check_sigbus.c src/daemon/sigbus.c
tests_daemon_check_sigbus_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_sigbus_LDADD = $(CHECK_LIBS) $(PTHREAD_LIBS)

# Issue 9's memory classes with real processes and uids: hugetlbfs regions, SIGBUS in the daemon,
# per-uid arena bytes, and control replies of any size. fstatfs_shim lets a hugetlbfs region past
# the filesystem check (LD_PRELOAD, test only) to prove the SIGBUS handler inside pagedkvd.
check_LTLIBRARIES += tests/daemon/pkv_fstatfs_shim.la
tests_daemon_pkv_fstatfs_shim_la_SOURCES = tests/daemon/fstatfs_shim.c
tests_daemon_pkv_fstatfs_shim_la_LDFLAGS = -module -avoid-version -shared -rpath /nowhere

check_PROGRAMS += tests/daemon/check_isolation_mem
TESTS += tests/daemon/check_isolation_mem
tests_daemon_check_isolation_mem_SOURCES = tests/daemon/check_isolation_mem.c
tests_daemon_check_isolation_mem_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_isolation_mem_LDADD = $(DAEMON_TEST_LIBS)

check_PROGRAMS += tests/daemon/check_isolation_huge
TESTS += tests/daemon/check_isolation_huge
tests_daemon_check_isolation_huge_SOURCES = tests/daemon/check_isolation_mem.c
tests_daemon_check_isolation_huge_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -DHUGE_TESTS
tests_daemon_check_isolation_huge_LDADD = $(DAEMON_TEST_LIBS)

check_PROGRAMS += tests/daemon/check_isolation_conn
TESTS += tests/daemon/check_isolation_conn
tests_daemon_check_isolation_conn_SOURCES = tests/daemon/check_isolation_conn.c
tests_daemon_check_isolation_conn_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_isolation_conn_LDADD = $(DAEMON_TEST_LIBS)

# Step boundaries the worker runs itself (a daemon that holds idle rings for a second).
check_PROGRAMS += tests/daemon/check_step_worker
TESTS += tests/daemon/check_step_worker
tests_daemon_check_step_worker_SOURCES = tests/daemon/check_step_worker.c
tests_daemon_check_step_worker_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_step_worker_LDADD = $(DAEMON_TEST_LIBS)

# The worker sleeping on the doorbells of the rings it holds (a default daemon).
check_PROGRAMS += tests/daemon/check_ring_keep
TESTS += tests/daemon/check_ring_keep
tests_daemon_check_ring_keep_SOURCES = tests/daemon/check_ring_keep.c
tests_daemon_check_ring_keep_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_daemon_check_ring_keep_LDADD = $(DAEMON_TEST_LIBS)
