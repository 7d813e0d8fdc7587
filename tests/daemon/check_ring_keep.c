/* SPDX-License-Identifier: MIT */
/* The worker sleeps holding the rings it owns: results, the loop out of the decode path, release, hostile doorbells, leaks. */
#include "config.h"
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <pagedkv/pagedkv.h>
#include "harness.h"
#include "../suite_main.h"

/* A default daemon: the worker spins spin_us (50 us) after an SQE, then sleeps holding the ring. */
static struct dmn D;

static void setup(void)
{
	ck_assert_int_eq(dmn_start(&D, NULL), 0);
	run_step_pause_us = 0;
}

static void teardown(void)
{
	run_step_pause_us = 0;
	if (D.pid > 0)
		ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}

/* A field of a /proc status file ("voluntary_ctxt_switches:"), or -1. */
static long proc_field(const char *path, const char *name)
{
	char line[256];
	long v = -1;
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, name, strlen(name))) {
			v = strtol(line + strlen(name), NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

/* How often the daemon's thread tid went to sleep (its main thread, D.pid, is the event loop). */
static long thread_sleeps(int tid)
{
	char path[96];

	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)D.pid, tid);
	return proc_field(path, "voluntary_ctxt_switches:");
}

/* Descriptors open in the daemon, and the watches of its epoll sets (the worker's: its eventfd + doorbells). */
static void daemon_fds(int *fds, int *watches)
{
	char path[320], link[64];
	struct dirent *e;
	DIR *dir;

	*fds = *watches = 0;
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)D.pid);
	dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	while ((e = readdir(dir))) {
		ssize_t n;

		if (e->d_name[0] == '.')
			continue;
		(*fds)++;
		snprintf(path, sizeof(path), "/proc/%d/fd/%s", (int)D.pid, e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		if (strcmp(link, "anon_inode:[eventpoll]"))
			continue;
		{
			char line[256];
			FILE *f;

			snprintf(path, sizeof(path), "/proc/%d/fdinfo/%s", (int)D.pid, e->d_name);
			f = fopen(path, "r");
			if (!f)
				continue;
			while (fgets(line, sizeof(line), f))
				*watches += !strncmp(line, "tfd:", 4);
			fclose(f);
		}
	}
	closedir(dir);
}

/* SQEs the loop has accounted for the daemon's (only) client: the worker's count joins when it hands the ring back. */
static long client_ops(void)
{
	char out[8192], *p;

	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_JSON, out, sizeof(out)), 0);
	p = strstr(out, "\"clients\":[");
	ck_assert_ptr_nonnull(p);
	p = strstr(p, "\"ops\":");
	ck_assert_ptr_nonnull(p);
	return strtol(p + 6, NULL, 10);
}

/* One layer of the open step at position p of toks, checked against the reference. */
static float layer_and_check(struct pkv_client *c, const int32_t *toks, uint32_t p, uint32_t layer)
{
	size_t qn = (size_t)T_HEADS * T_DIM;
	float got[T_HEADS * T_DIM], ref[T_HEADS * T_DIM];

	if (attend_layer(c, toks, p, 1, layer, got))
		return INFINITY;
	ref_attend(toks, p + 1, p, layer, ref);
	return max_diff(got, ref, qn);
}

START_TEST(test_kept_ring_serves_steps_without_the_loop)
{
	struct pkv_client *c = test_client(D.sock, "p", 4 << 20, 5000);
	int32_t toks[64];
	uint32_t seq, nc;
	long before, after;

	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 64, 1);
	ck_assert_int_eq(pkv_seq_open(c, toks, 20, &seq, &nc), 0);
	ck_assert_float_le(step_and_check(c, seq, toks, 20, 0, NULL), 1e-5f);
	ck_assert_float_le(step_and_check(c, seq, toks, 21, 20, NULL), 1e-5f);
	/*
	 * Each layer's attend comes 1 ms after the last completion, far past
	 * the worker's spin: it sleeps holding the ring, and the client's
	 * doorbell wakes it, not the loop. Handing the ring back when idle (as
	 * before) woke the loop at least once per attend: 80 here.
	 */
	before = thread_sleeps((int)D.pid);
	ck_assert_int_ge(before, 0);
	run_step_pause_us = 1000;
	for (uint32_t n = 22; n <= 61; n++)
		ck_assert_float_le(step_and_check(c, seq, toks, n, n - 1, NULL), 1e-5f);
	run_step_pause_us = 0;
	after = thread_sleeps((int)D.pid);
	ck_assert_msg(after - before < 20, "the loop slept %ld times during 80 attends", after - before);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/* The daemon's worker thread (named pkv-worker) now, or -1. */
static int find_thread(const char *name)
{
	char path[320], comm[32];
	struct dirent *e;
	int tid = -1;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)D.pid);
	dir = opendir(path);
	if (!dir)
		return -1;
	while (tid < 0 && (e = readdir(dir))) {
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)D.pid, e->d_name);
		if ((f = fopen(path, "r"))) {
			if (fgets(comm, sizeof(comm), f) && !strncmp(comm, name, strlen(name)) &&
			    (comm[strlen(name)] == '\n' || !comm[strlen(name)]))
				tid = atoi(e->d_name);
			fclose(f);
		}
	}
	closedir(dir);
	return tid;
}

/*
 * The daemon's thread of that name (pkv-worker, pkv-backend1), or -1 after
 * 5 s: the daemon binds its socket after starting its threads, but a thread
 * names itself once it runs.
 */
static int thread_tid(const char *name)
{
	int tid = find_thread(name);

	for (int t = 0; tid < 0 && t < 500; t++) {
		usleep(10000);
		tid = find_thread(name);
	}
	return tid;
}

static int worker_tid(void)
{
	return thread_tid("pkv-worker");
}

/* The thread's scheduling policy once it is want, or as it is after ms. */
static int policy_within(int tid, int want, int ms)
{
	int p = sched_getscheduler(tid);

	for (int i = 0; p != want && i < ms; i++) {
		usleep(1000);
		p = sched_getscheduler(tid);
	}
	return p;
}

/*
 * A client of D saying it computes on more threads than there are CPUs,
 * with a 20-token sequence of prompt seed `seed` (toks: 64) prefilled.
 */
static struct pkv_client *client_on_every_cpu(int32_t *toks, int32_t seed, uint32_t *seq)
{
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 4 << 20, .timeout_ms = 5000,
				      .compute_threads = 4096 };
	struct pkv_pool_params pp;
	struct pkv_client *c;
	uint32_t nc;

	ck_assert_int_eq(pkv_connect(&o, &c), 0);
	test_pool_params(&pp, "p");
	ck_assert_int_eq(pkv_pool_attach(c, &pp), 0);
	make_prompt(toks, 64, seed);
	ck_assert_int_eq(pkv_seq_open(c, toks, 20, seq, &nc), 0);
	ck_assert_float_le(step_and_check(c, *seq, toks, 20, 0, NULL), 1e-5f);
	return c;
}

START_TEST(test_client_on_every_cpu_is_not_spun_for)
{
	struct pkv_client *c;
	int32_t toks[64];
	uint32_t seq;
	long before, after;
	int tid;

	/*
	 * A daemon whose spin gate always says a core is idle: its worker
	 * would spin through the client's gaps on any machine, so only the
	 * hint can make it sleep.
	 */
	ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
	setenv("PAGEDKV_SPIN_POLICY", "always", 1);
	ck_assert_int_eq(dmn_start(&D, NULL), 0);
	unsetenv("PAGEDKV_SPIN_POLICY");
	tid = worker_tid();
	ck_assert_int_gt(tid, 0);
	c = client_on_every_cpu(toks, 3, &seq);
	/*
	 * The client says it computes on more threads than there are CPUs:
	 * between its attends (200 us apart, within the gap the worker would
	 * otherwise learn and spin through on an idle core) the worker must
	 * leave the CPUs to it and sleep after every attend. Without the hint
	 * it slept 1-2 times in all here.
	 */
	run_step_pause_us = 200;
	before = thread_sleeps(tid);
	ck_assert_int_ge(before, 0);
	for (uint32_t n = 21; n <= 60; n++)
		ck_assert_float_le(step_and_check(c, seq, toks, n, n - 1, NULL), 1e-5f);
	after = thread_sleeps(tid);
	run_step_pause_us = 0;
	ck_assert_msg(after - before >= 40, "the worker slept %ld times over 80 attends 200 us apart",
		      after - before);
	/*
	 * With a step of that client open the worker waits for a free core
	 * instead of preempting one (SCHED_BATCH); with none, it is an ordinary
	 * thread again.
	 */
	{
		uint32_t k = 1;

		ck_assert_int_eq(pkv_step_begin(c, &seq, &k, toks + 60, 1), 0);
		ck_assert_int_eq(attend_layer(c, toks, 60, 1, 0, NULL), 0);
		ck_assert_int_eq(policy_within(tid, SCHED_BATCH, 2000), SCHED_BATCH);
		for (uint32_t l = 1; l < T_LAYERS; l++)
			ck_assert_int_eq(attend_layer(c, toks, 60, 1, l, NULL), 0);
		ck_assert_int_eq(pkv_step_end(c), 0);
		ck_assert_int_eq(policy_within(tid, SCHED_OTHER, 2000), SCHED_OTHER);
	}
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/* How many CPUs the thread may run on once that is want, or as it is after ms. */
static int cpus_within(int tid, int want, int ms)
{
	cpu_set_t m;
	int n = -1;

	for (int i = 0; i <= ms; i++) {
		n = sched_getaffinity(tid, sizeof(m), &m) ? -1 : CPU_COUNT(&m);
		if (n == want)
			break;
		usleep(1000);
	}
	return n;
}

/*
 * A client on every CPU with a step open and attended. It claims every CPU,
 * so it sleeps for each attend: the worker then runs only on the CPU it
 * sleeps on (one CPU has nothing to pin to: the mask stays whole). *tid: the
 * worker; *all: our CPU count (the daemon inherits our mask).
 */
static struct pkv_client *followed_client(int32_t *toks, int32_t seed, uint32_t *seq, int *tid, int *all)
{
	struct pkv_client *c;
	cpu_set_t mine;
	uint32_t k = 1;

	ck_assert_int_eq(sched_getaffinity(0, sizeof(mine), &mine), 0);
	*all = CPU_COUNT(&mine);
	*tid = worker_tid();
	ck_assert_int_gt(*tid, 0);
	c = client_on_every_cpu(toks, seed, seq);
	ck_assert_int_eq(pkv_step_begin(c, seq, &k, toks + 20, 1), 0);
	for (uint32_t l = 0; l < T_LAYERS; l++)
		ck_assert_int_eq(attend_layer(c, toks, 20, 1, l, NULL), 0);
	ck_assert_int_eq(cpus_within(*tid, *all >= 2 ? 1 : *all, 2000), *all >= 2 ? 1 : *all);
	return c;
}

START_TEST(test_lone_client_on_every_cpu_is_served_where_it_sleeps)
{
	struct pkv_client *c, *other;
	int32_t toks[64], otoks[20];
	uint32_t seq, oseq, nc, k;
	int tid, all;

	c = followed_client(toks, 4, &seq, &tid, &all);
	/* A second client stepping beside it: the worker serves both from every CPU again. */
	other = test_client(D.sock, "p", 4 << 20, 5000);
	ck_assert_ptr_nonnull(other);
	make_prompt(otoks, 20, 5);
	ck_assert_int_eq(pkv_seq_open(other, otoks, 20, &oseq, &nc), 0);
	ck_assert_uint_lt(nc, 20);
	k = 20 - nc;
	ck_assert_int_eq(pkv_step_begin(other, &oseq, &k, otoks + nc, 1), 0);
	for (uint32_t l = 0; l < T_LAYERS; l++)
		ck_assert_int_eq(attend_layer(other, otoks, nc, k, l, NULL), 0);
	ck_assert_int_eq(cpus_within(tid, all, 2000), all);
	ck_assert_int_eq(pkv_step_end(other), 0);
	ck_assert_int_eq(pkv_step_end(c), 0);
	ck_assert_int_eq(pkv_seq_close(other, oseq), 0);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	pkv_disconnect(other);
	pkv_disconnect(c);
	ck_assert_int_eq(cpus_within(tid, all, 2000), all);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/*
 * While the worker follows a client that claims every CPU, that client's
 * cores are lent to the backend and a call splits over its threads: decode
 * steps over a context long enough to be cut in two (600 tokens, the CPU
 * backend cuts at 256 keys and more) must match the reference, step after
 * step. The daemon reads the machine as busy (PAGEDKV_SPIN_POLICY=never),
 * so only the lent cores can send work to its second backend thread.
 */
START_TEST(test_followed_clients_split_attends_match_reference)
{
	static const char *const two_threads[] = { "--workers", "2", NULL };
	static int32_t toks[640];
	static char cpu[1024];
	const char *dir = getenv("PKV_PLUGIN_BUILD_DIR");
	struct pkv_client *c;
	cpu_set_t mine;
	uint32_t seq;
	int helper, r;
	long woken;

	/* The CPU backend (the test daemon's naive one never splits) with two threads (it has one). */
	snprintf(cpu, sizeof(cpu), "%s/cpu/.libs/pkv_cpu.so", dir ? dir : "plugins");
	ck_assert_int_eq(access(cpu, R_OK), 0);
	ck_assert_int_eq(dmn_stop(&D), 0);
	harness_backend = cpu;
	setenv("PAGEDKV_SPIN_POLICY", "never", 1);
	r = dmn_restart(&D, two_threads);
	harness_backend = NULL;
	unsetenv("PAGEDKV_SPIN_POLICY");
	ck_assert_int_eq(r, 0);
	helper = thread_tid("pkv-backend1");
	ck_assert_int_gt(helper, 0);
	c = client_on_every_cpu(toks, 9, &seq);
	make_prompt(toks, 640, 9); /* the same first 64 tokens, and more */
	ck_assert_float_le(step_and_check(c, seq, toks, 600, 20, NULL), 1e-5f);
	/* A layer's compute between attends: the worker goes quiet mid-step and follows. */
	run_step_pause_us = 1000;
	woken = thread_sleeps(helper);
	for (uint32_t n = 601; n <= 616; n++)
		ck_assert_float_le(step_and_check(c, seq, toks, n, n - 1, NULL), 1e-5f);
	run_step_pause_us = 0;
	/* Followed only with two CPUs or more: then the second thread was woken for the split calls. */
	ck_assert_int_eq(sched_getaffinity(0, sizeof(mine), &mine), 0);
	if (CPU_COUNT(&mine) >= 2)
		ck_assert_int_gt(thread_sleeps(helper), woken);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

/* A uid that is not ours: another user's client, for the one-uid rules of the worker. */
#define OTHER_UID 61013

/*
 * A client's hints decide how the worker serves its own uid only: while a
 * connection of another uid exists, the worker of a hinting client that
 * claims every CPU neither follows it onto one CPU nor runs as SCHED_BATCH
 * (the other uid's attends would wait out the hinting client's slices),
 * and it does both again once that uid has left. Needs root.
 */
START_TEST(test_another_uid_undoes_a_clients_hints)
{
	static const char *const open_socket[] = { "--socket-mode", "0666", NULL };
	struct pkv_client *c;
	int32_t toks[64];
	uint32_t seq, k;
	int tid, all, go[2], ready[2], st;
	pid_t pid;
	char ch;

	/* A daemon another uid may reach. */
	ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
	ck_assert_int_eq(dmn_start(&D, open_socket), 0);
	ck_assert_int_eq(chmod(D.dir, 0755), 0);
	c = followed_client(toks, 6, &seq, &tid, &all);
	ck_assert_int_eq(policy_within(tid, SCHED_BATCH, 2000), SCHED_BATCH);
	/* A control connection of another uid (a pagedkvctl) runs no attend: the hints still count. */
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		char out[4096];

		if (setgid(OTHER_UID) || setuid(OTHER_UID))
			_exit(3);
		for (int i = 0; i < 20; i++)
			if (ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_TEXT, out, sizeof(out)))
				_exit(4);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_int_eq(child_status(st), 0);
	ck_assert_int_eq(policy_within(tid, SCHED_OTHER, 100), SCHED_BATCH);
	ck_assert_int_eq(pipe(go), 0);
	ck_assert_int_eq(pipe(ready), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 1 << 20, .timeout_ms = 5000 };
		struct pkv_client *other;

		if (setgid(OTHER_UID) || setuid(OTHER_UID) || pkv_connect(&o, &other))
			_exit(3);
		if (write(ready[1], "r", 1) != 1 || read(go[0], &ch, 1) != 1)
			_exit(4);
		pkv_disconnect(other);
		_exit(0);
	}
	close(ready[1]);
	close(go[0]);
	ck_assert_int_eq(read(ready[0], &ch, 1), 1);
	/*
	 * Undone as that uid connects, though the worker sleeps in our open step
	 * and has no turn before the ring's keep time (1 s): the loop unpins it
	 * and gives it SCHED_OTHER back, so that uid's first attend does not
	 * wait for our CPU.
	 */
	ck_assert_int_eq(policy_within(tid, SCHED_OTHER, 100), SCHED_OTHER);
	ck_assert_int_eq(cpus_within(tid, all, 100), all);
	ck_assert_int_eq(pkv_step_end(c), 0);
	/* The same client steps on beside the idle connection of another uid. */
	k = 1;
	ck_assert_int_eq(pkv_step_begin(c, &seq, &k, toks + 21, 1), 0);
	for (uint32_t l = 0; l < T_LAYERS; l++)
		ck_assert_int_eq(attend_layer(c, toks, 21, 1, l, NULL), 0);
	ck_assert_int_eq(policy_within(tid, SCHED_OTHER, 2000), SCHED_OTHER);
	ck_assert_int_eq(cpus_within(tid, all, 2000), all);
	ck_assert_int_eq(pkv_step_end(c), 0);
	ck_assert_int_eq(write(go[1], "q", 1), 1);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_int_eq(child_status(st), 0);
	/* That uid gone, the client's hints count again (the loop counts it out on the hang-up). */
	usleep(100000);
	k = 1;
	ck_assert_int_eq(pkv_step_begin(c, &seq, &k, toks + 22, 1), 0);
	for (uint32_t l = 0; l < T_LAYERS; l++)
		ck_assert_int_eq(attend_layer(c, toks, 22, 1, l, NULL), 0);
	ck_assert_int_eq(policy_within(tid, SCHED_BATCH, 2000), SCHED_BATCH);
	ck_assert_int_eq(pkv_step_end(c), 0);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	pkv_disconnect(c);
	close(go[1]);
	close(ready[0]);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_ring_idle_mid_step_goes_back_and_still_serves)
{
	struct pkv_client *c = test_client(D.sock, "p", 4 << 20, 5000);
	int32_t toks[32];
	uint32_t seq, nc, one = 1;
	long ops = 0;
	int back = 0;

	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 32, 2);
	ck_assert_int_eq(pkv_seq_open(c, toks, 20, &seq, &nc), 0);
	ck_assert_float_le(step_and_check(c, seq, toks, 20, 0, NULL), 1e-5f);
	ck_assert_int_eq(pkv_step_begin(c, &seq, &one, toks + 20, 1), 0);
	ck_assert_float_le(layer_and_check(c, toks, 20, 0), 1e-5f);
	/*
	 * The client stops mid-step. Its ring goes back to the loop after the
	 * worker's keep time (1 s in a step): the worker's SQE count then joins
	 * the connection's.
	 */
	ops = client_ops();
	for (int t = 0; t < 100 && !back; t++) {
		usleep(50000);
		back = client_ops() > ops;
	}
	ck_assert_msg(back, "the worker kept an idle ring for 5 s");
	/* The step goes on through the loop's hand-off as before. */
	ck_assert_float_le(layer_and_check(c, toks, 20, 1), 1e-5f);
	ck_assert_int_eq(pkv_step_end(c), 0);
	ck_assert_float_le(step_and_check(c, seq, toks, 22, 21, NULL), 1e-5f);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_hang_up_mid_step_releases_the_ring)
{
	int32_t toks[32];
	uint32_t seq, nc, one = 1;

	make_prompt(toks, 32, 3);
	for (int i = 0; i < 5; i++) {
		struct pkv_client *c = test_client(D.sock, "p", 4 << 20, 5000);

		ck_assert_ptr_nonnull(c);
		ck_assert_int_eq(pkv_seq_open(c, toks, 20, &seq, &nc), 0);
		ck_assert_float_le(step_and_check(c, seq, toks, 20, nc, NULL), 1e-5f);
		ck_assert_int_eq(pkv_step_begin(c, &seq, &one, toks + 20, 1), 0);
		ck_assert_float_le(layer_and_check(c, toks, 20, 0), 1e-5f);
		/* Gone mid-step, its ring on the sleeping worker: the step is aborted and everything released. */
		pkv_disconnect(c);
		ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
	}
	/* The same prompt opens from the cache (its committed blocks survived the aborts). */
	{
		struct pkv_client *c = test_client(D.sock, "p", 4 << 20, 5000);

		ck_assert_ptr_nonnull(c);
		ck_assert_int_eq(pkv_seq_open(c, toks, 21, &seq, &nc), 0);
		ck_assert_uint_ge(nc, 16);
		pkv_disconnect(c);
	}
}
END_TEST

/* The eventfds of this process, as a bit set over the first 256 descriptors. */
static void own_eventfds(unsigned char *set)
{
	char path[64], link[64];

	memset(set, 0, 256);
	for (int fd = 0; fd < 256; fd++) {
		ssize_t n;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		set[fd] = !strcmp(link, "anon_inode:[eventfd]");
	}
}

/*
 * A client whose ring the worker holds mid-step turns hostile on its
 * doorbell: it makes the shared file description blocking, rings it
 * without submitting anything, and eats the count. The worker never reads
 * or writes that descriptor, so nothing of this can block it, and another
 * client's steps go on being served, with the right results.
 */
START_TEST(test_hostile_doorbell_leaves_others_served)
{
	unsigned char before[256], after[256];
	struct pkv_client *h, *c;
	int32_t toks[64], htoks[32];
	uint32_t seq, hseq, nc, one = 1;
	int bell = -1, st;
	pid_t pid;

	own_eventfds(before);
	h = test_client(D.sock, "p", 4 << 20, 5000);
	ck_assert_ptr_nonnull(h);
	own_eventfds(after);
	for (int fd = 0; fd < 256; fd++)
		if (after[fd] && !before[fd])
			bell = fd;
	ck_assert_int_ge(bell, 0);
	make_prompt(htoks, 32, 4);
	ck_assert_int_eq(pkv_seq_open(h, htoks, 20, &hseq, &nc), 0);
	ck_assert_float_le(step_and_check(h, hseq, htoks, 20, 0, NULL), 1e-5f);
	ck_assert_int_eq(pkv_step_begin(h, &hseq, &one, htoks + 20, 1), 0);
	ck_assert_float_le(layer_and_check(h, htoks, 20, 0), 1e-5f);

	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		uint64_t v = 1;

		if (fcntl(bell, F_SETFL, 0))
			_exit(2);
		for (;;) {
			if (write(bell, &v, sizeof(v)) != sizeof(v) || read(bell, &v, sizeof(v)) != sizeof(v))
				_exit(3);
			v = 1;
		}
	}
	c = test_client(D.sock, "p", 4 << 20, 5000);
	ck_assert_ptr_nonnull(c);
	make_prompt(toks, 64, 5);
	ck_assert_int_eq(pkv_seq_open(c, toks, 20, &seq, &nc), 0);
	ck_assert_float_le(step_and_check(c, seq, toks, 20, 0, NULL), 1e-5f);
	run_step_pause_us = 500;
	for (uint32_t n = 21; n <= 50; n++)
		ck_assert_float_le(step_and_check(c, seq, toks, n, n - 1, NULL), 1e-5f);
	run_step_pause_us = 0;
	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFSIGNALED(st), "the hostile child stopped by itself (status %d)", child_status(st));
	/* The hostile one's own step still completes once it submits. */
	ck_assert_float_le(layer_and_check(h, htoks, 20, 1), 1e-5f);
	ck_assert_int_eq(pkv_step_end(h), 0);
	pkv_disconnect(h);
	pkv_disconnect(c);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_many_connections_leak_no_fds_nor_watches)
{
	int32_t toks[32];
	uint32_t seq, nc, one = 1;
	int fds0, w0, fds1, w1;

	make_prompt(toks, 32, 6);
	/* A first client, so that whatever a daemon opens once (a pool, its backend) is open before counting. */
	{
		struct pkv_client *c = test_client(D.sock, "p", 4 << 20, 5000);

		ck_assert_ptr_nonnull(c);
		ck_assert_int_eq(pkv_seq_open(c, toks, 20, &seq, &nc), 0);
		ck_assert_float_le(step_and_check(c, seq, toks, 20, 0, NULL), 1e-5f);
		pkv_disconnect(c);
		ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
	}
	for (int t = 0; t < 50; t++) {
		daemon_fds(&fds0, &w0); /* settled: the audit's connection closed */
		usleep(10000);
	}
	daemon_fds(&fds0, &w0);
	ck_assert_int_ge(w0, 1); /* the worker's own eventfd */
	for (int i = 0; i < 40; i++) {
		struct pkv_client *c = test_client(D.sock, "p", 4 << 20, 5000);

		ck_assert_ptr_nonnull(c);
		ck_assert_int_eq(pkv_seq_open(c, toks, 20, &seq, &nc), 0);
		ck_assert_float_le(step_and_check(c, seq, toks, 21, nc, NULL), 1e-5f);
		/* Half of them leave mid-step, the ring on the worker. */
		if (i & 1) {
			ck_assert_int_eq(pkv_step_begin(c, &seq, &one, toks + 21, 1), 0);
			ck_assert_float_le(layer_and_check(c, toks, 21, 0), 1e-5f);
		}
		pkv_disconnect(c);
	}
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
	/* The last control connection (the audit's) closes asynchronously. */
	for (int t = 0; t < 500; t++) {
		daemon_fds(&fds1, &w1);
		if (fds1 <= fds0 && w1 <= w0)
			break;
		usleep(10000);
	}
	ck_assert_int_le(fds1, fds0);
	ck_assert_int_eq(w1, w0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("ring_keep");
	TCase *t = tcase_create("keep");

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, test_kept_ring_serves_steps_without_the_loop);
	tcase_add_test(t, test_client_on_every_cpu_is_not_spun_for);
	tcase_add_test(t, test_lone_client_on_every_cpu_is_served_where_it_sleeps);
	tcase_add_test(t, test_followed_clients_split_attends_match_reference);
	/* Needs root to become another uid; not added (so not counted) otherwise. */
	if (geteuid() == 0)
		tcase_add_test(t, test_another_uid_undoes_a_clients_hints);
	tcase_add_test(t, test_ring_idle_mid_step_goes_back_and_still_serves);
	tcase_add_test(t, test_hang_up_mid_step_releases_the_ring);
	tcase_add_test(t, test_hostile_doorbell_leaves_others_served);
	tcase_add_test(t, test_many_connections_leak_no_fds_nor_watches);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return suite_main(suite());
}
