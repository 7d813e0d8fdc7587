/* SPDX-License-Identifier: MIT */
/* Liveness: clients killed at random points leak nothing; a dead daemon gives errors, never a hang; one daemon per socket. */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "harness.h"
#include "../suite_main.h"

static struct dmn D;

static void setup(void)
{
	ck_assert_int_eq(dmn_start(&D, NULL), 0);
}

static void teardown(void)
{
	if (D.pid > 0)
		ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}

static struct pkv_client *client(uint32_t timeout_ms)
{
	return test_client(D.sock, "p", 1 << 20, timeout_ms);
}

/* Operations done by the busy client, shared with the parent so kills land at random points of the work. */
static volatile uint32_t *progress;
#define STEP_DONE() __atomic_add_fetch(progress, 1, __ATOMIC_RELEASE)

/* Works forever: opens, prefills, forks, decodes, closes, with steps left open at times. */
static _Noreturn void busy_client(unsigned seed)
{
	struct pkv_client *c = client(5000);
	int32_t toks[64];
	uint32_t seqs[4];
	unsigned n = 0;

	if (!c)
		_exit(1);
	srand(seed);
	for (;;) {
		uint32_t s, nc, len = 8 + rand() % 40, k;

		for (uint32_t i = 0; i < 64; i++)
			toks[i] = (int32_t)((rand() % 4) * 100 + i); /* few prompts: prefix hits happen */
		if (pkv_seq_open(c, toks, len, &s, &nc))
			_exit(2);
		STEP_DONE();
		k = len - nc;
		{
			int e = run_step(c, s, toks, nc, k, NULL);

			if (e) {
				fprintf(stderr, "busy client: step of %u tokens at %u: %d (%s)\n", k, nc, e,
					pkv_last_error(c));
				_exit(3);
			}
			STEP_DONE();
		}
		if (rand() % 2) {
			uint32_t ch, one = 1;

			if (pkv_seq_fork(c, s, &ch) || pkv_step_begin(c, &ch, &one, toks + len, 1))
				_exit(4);
			STEP_DONE();
			if (rand() % 3 == 0)
				usleep(300); /* a window with the step open and the fork held */
			pkv_step_abort(c);
			pkv_seq_close(c, ch);
		}
		if (n < 4)
			seqs[n++] = s;
		else
			pkv_seq_close(c, s);
		if (n == 4 && rand() % 2) {
			for (unsigned i = 0; i < n; i++)
				pkv_seq_close(c, seqs[i]);
			n = 0;
		}
	}
}

START_TEST(test_random_sigkill_leaks_nothing)
{
	const char *env = getenv("PKV_KILL_ITERS");
	int iters = env ? atoi(env) : 200;
	char report[4096];

	progress = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert(progress != MAP_FAILED);
	srand(42);
	for (int i = 0; i < iters; i++) {
		uint32_t target = (uint32_t)(rand() % 8);
		struct timespec ts = { 0, (long)(rand() % 1500) * 1000L }, tick = { 0, 20000 };
		pid_t pid;
		int st;

		*progress = 0;
		pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0)
			busy_client(1000 + (unsigned)i);
		/* Wait until the client has done `target` operations (whatever the machine's load),
		 * then a random sliver more, so kills land anywhere in the work, mid-step included. */
		for (int w = 0; w < 100000 && __atomic_load_n(progress, __ATOMIC_ACQUIRE) < target; w++)
			nanosleep(&tick, NULL);
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		ck_assert_msg(WIFSIGNALED(st) || WEXITSTATUS(st) == 0, "client %d failed with %d before the kill",
			      i, WEXITSTATUS(st));
		ck_assert_msg(audit_until_clean(D.sock, 5000, report, sizeof(report)) == 0,
			      "after kill %d: %s", i, report);
	}
	ck_assert(dmn_alive(&D));
	/* The clients got far enough to be killed mid-work, not only mid-connect. */
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_JSON, report, sizeof(report)), 0);
	{
		const char *a = strstr(report, "\"attends\":");

		ck_assert_ptr_nonnull(a);
		ck_assert_int_ge(atol(a + 10), iters);
	}
}
END_TEST

START_TEST(test_exit_with_open_step_releases)
{
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pkv_client *c = client(5000);
		int32_t toks[20] = { 0 };
		uint32_t s, nc, n = 20;

		if (!c || pkv_seq_open(c, toks, 20, &s, &nc) || pkv_step_begin(c, &s, &n, toks, 1))
			_exit(1);
		_exit(0); /* no disconnect, step open, sequence held */
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_int_eq(child_status(st), 0);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

START_TEST(test_dead_daemon_gives_errors_not_hang)
{
	struct pkv_client *c = client(3000), *c2;
	int32_t toks[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	uint32_t s, nc;
	int r;

	ck_assert_ptr_nonnull(c);
	ck_assert_int_eq(pkv_seq_open(c, toks, 8, &s, &nc), 0);
	dmn_kill(&D);
	/* Returning at all is the point (a hang would hit the test's timeout); no stopwatch needed. */
	r = pkv_seq_open(c, toks, 8, &s, &nc);
	ck_assert_msg(r == -ECONNRESET || r == -ETIMEDOUT, "got %d", r);
	ck_assert_int_eq(pkv_nop(c), -ECONNRESET);
	/* A restarted daemon replaces the stale socket; the old connection stays dead. */
	ck_assert_int_eq(dmn_restart(&D, NULL), 0);
	ck_assert_int_eq(pkv_nop(c), -ECONNRESET);
	c2 = client(3000);
	ck_assert_ptr_nonnull(c2);
	ck_assert_int_eq(pkv_nop(c2), 0);
	pkv_disconnect(c2);
	pkv_disconnect(c);
}
END_TEST

START_TEST(test_sigterm_finishes_and_exits_zero)
{
	struct pkv_client *c = client(3000);
	int32_t toks[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	uint32_t s, nc;

	ck_assert_ptr_nonnull(c);
	ck_assert_int_eq(pkv_seq_open(c, toks, 8, &s, &nc), 0);
	ck_assert_int_eq(run_step(c, s, toks, 0, 8, NULL), 0);
	ck_assert_int_eq(dmn_stop(&D), 0);
	ck_assert_int_eq(pkv_nop(c), -ECONNRESET);
	pkv_disconnect(c);
	/* It removed its socket on the way out. */
	ck_assert_int_ne(access(D.sock, F_OK), 0);
}
END_TEST

START_TEST(test_second_daemon_on_same_socket_refused)
{
	struct dmn second = D;
	int st = dmn_run_to_exit(&second, NULL);

	char lock[sizeof(D.sock) + 8];

	/* It ran (not 127: exec failed) and refused (not 0) to take the socket. */
	ck_assert_int_gt(st, 0);
	ck_assert_int_ne(st, 127);
	/* It left the first one's lock alone, so a third is refused too (one once took the socket). */
	snprintf(lock, sizeof(lock), "%s.lock", D.sock);
	ck_assert_int_eq(access(lock, F_OK), 0);
	st = dmn_run_to_exit(&second, NULL);
	ck_assert_int_gt(st, 0);
	ck_assert_int_ne(st, 127);
	/* The first one still serves. */
	{
		struct pkv_client *c = client(3000);

		ck_assert_ptr_nonnull(c);
		ck_assert_int_eq(pkv_nop(c), 0);
		pkv_disconnect(c);
	}
}
END_TEST

/*
 * Clients that say hello and hang up at once while others connect: the
 * daemon closes the first ones' fds while new connections reuse the numbers
 * (regression: a queued doorbell read once ate a new client's hello).
 */
START_TEST(test_churn_of_connections_loses_no_hello)
{
	for (int round = 0; round < 20; round++) {
		pid_t pids[6];

		for (int i = 0; i < 6; i++) {
			pids[i] = fork();
			ck_assert_int_ge(pids[i], 0);
			if (pids[i] == 0) {
				struct pkv_connect_opts o = { .socket_path = D.sock, .timeout_ms = 3000 };
				struct pkv_client *c;

				for (int k = 0; k < 3; k++) {
					if (pkv_connect(&o, &c))
						_exit(1);
					if (k == 2 && pkv_nop(c))
						_exit(2);
					pkv_disconnect(c);
				}
				_exit(0);
			}
		}
		for (int i = 0; i < 6; i++) {
			int st;

			ck_assert_int_eq(waitpid(pids[i], &st, 0), pids[i]);
			ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "round %d client %d: %d", round, i,
				      WEXITSTATUS(st));
		}
	}
}
END_TEST

START_TEST(test_socket_mode_and_group_applied)
{
	static const char *const extra[] = { "--socket-mode", "0640", "--socket-group", "nogroup", NULL };
	static const char *const mode_only[] = { "--socket-mode", "0640", NULL };
	struct group *g = getgrnam("nogroup");
	int as_root = geteuid() == 0 && g;
	struct stat st;

	ck_assert_int_eq(dmn_stop(&D), 0);
	ck_assert_int_eq(dmn_restart(&D, as_root ? extra : mode_only), 0);
	ck_assert_int_eq(stat(D.sock, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0640);
	if (as_root)
		ck_assert_uint_eq(st.st_gid, g->gr_gid);
}
END_TEST

/* A client of a 16-block pool in the harness geometry, sharing scope narrowed by salt. */
static struct pkv_client *pin_client(const char *salt)
{
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 1 << 20, .timeout_ms = 5000 };
	struct pkv_pool_params p;
	struct pkv_client *c;

	ck_assert_int_eq(pkv_connect(&o, &c), 0);
	test_pool_params(&p, "pin16");
	p.geo.num_blocks = 16;
	p.cache_salt = salt;
	p.cache_salt_len = strlen(salt);
	ck_assert_int_eq(pkv_pool_attach(c, &p), 0);
	return c;
}

/* Can c prefill n_blocks whole blocks (n_blocks * 16 + 1 tokens)? 0 or -errno. */
static int try_prefill(struct pkv_client *c, const int32_t *toks, uint32_t n_blocks)
{
	uint32_t seq, nc, n = n_blocks * T_BS;
	int r;

	ck_assert_int_eq(pkv_seq_open(c, toks, n + 1, &seq, &nc), 0);
	r = pkv_step_begin(c, &seq, &n, toks, 1);
	if (!r)
		ck_assert_int_eq(pkv_step_abort(c), 0);
	ck_assert_int_eq(pkv_seq_close(c, seq), 0);
	return r;
}

START_TEST(test_salted_pins_cannot_take_the_pool)
{
	struct pkv_client *pinner[4], *victim;
	int32_t toks[300];
	int pinned = 0, r = -1;

	for (int i = 0; i < 300; i++)
		toks[i] = i + 1;
	/* Four connections, each with its own salt, each pins 4 blocks of its own. */
	for (int k = 0; k < 4; k++) {
		char salt[16];
		uint32_t seq, nc, n = 4 * T_BS;

		snprintf(salt, sizeof(salt), "s%d", k);
		pinner[k] = pin_client(salt);
		ck_assert_int_eq(pkv_seq_open(pinner[k], toks, n + 1, &seq, &nc), 0);
		/* Every layer attended: step_end commits nothing less. */
		ck_assert_int_eq(run_step(pinner[k], seq, toks, 0, n, NULL), 0);
		ck_assert_int_eq(pkv_seq_close(pinner[k], seq), 0);
		r = pkv_pin(pinner[k], toks, n + 1);
		ck_assert_msg(r == (int)n || r == -ENOSPC, "pin: %d", r);
		pinned += r > 0 ? r / (int)T_BS : 0;
	}
	/* The pool-wide cap (half the pool) held: another client still gets the other half. */
	ck_assert_int_le(pinned, 8);
	victim = pin_client("victim");
	ck_assert_int_eq(try_prefill(victim, toks, 8), 0);
	/* Pins go with their connection: once the pinners hang up, the whole pool is free to use. */
	for (int k = 0; k < 4; k++)
		pkv_disconnect(pinner[k]);
	for (int t = 0; t < 500 && (r = try_prefill(victim, toks, 16)) == -ENOSPC; t++)
		usleep(10000);
	ck_assert_int_eq(r, 0);
	pkv_disconnect(victim);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, NULL, 0), 0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("daemon-liveness");
	TCase *t = tcase_create("liveness");

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 300);
	tcase_add_test(t, test_random_sigkill_leaks_nothing);
	tcase_add_test(t, test_exit_with_open_step_releases);
	tcase_add_test(t, test_dead_daemon_gives_errors_not_hang);
	tcase_add_test(t, test_sigterm_finishes_and_exits_zero);
	tcase_add_test(t, test_second_daemon_on_same_socket_refused);
	tcase_add_test(t, test_churn_of_connections_loses_no_hello);
	tcase_add_test(t, test_socket_mode_and_group_applied);
	tcase_add_test(t, test_salted_pins_cannot_take_the_pool);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return suite_main(suite());
}
