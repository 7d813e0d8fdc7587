/* SPDX-License-Identifier: MIT */
/* Soak: 64 clients of 4 uids, honest and hostile, killed at random; audit clean, no fd or memory growth. */
#include "config.h"
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "harness.h"
#include "../suite_main.h"

#define CLIENTS 64
#define UIDS 4
#define UID0 61201
/* Default length in make check; PKV_SOAK_S=600 for a long run. */
#define DEFAULT_S 60
#define ROUNDS 4
/*
 * Growth allowed between the first and the last round (RSS, KiB): allocator
 * noise plus the pools' KV pages, touched for the first time as blocks get
 * used (about 10 pools of 512 KiB here).
 */
#define RSS_SLACK_KB (16 * 1024)

static struct dmn D;

enum role { HONEST_DECODE, HONEST_PREFILL, HOSTILE_FLOOD, HOSTILE_GARBAGE };

static uint32_t rnd(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

/* Errors an honest client may meet when the daemon refuses it fairly (quotas, a full pool). */
static int fair(int r)
{
	return r == 0 || r == -ENOSPC || r == -EDQUOT || r == -EUSERS || r == -ENOMEM;
}

/* Exit statuses of an honest client: served, refused fairly, or wronged. */
#define SERVED 0
#define REFUSED 3
#define WRONGED 1

static int verdict(int r)
{
	if (r && !fair(r))
		fprintf(stderr, "honest client (pid %d) wronged: %s\n", (int)getpid(), strerror(-r));
	return !r ? SERVED : fair(r) ? REFUSED : WRONGED;
}

/* Decodes one sequence step by step. */
static int honest_decode(uint32_t seed)
{
	struct pkv_client *c = test_client(D.sock, "m", 1 << 20, 10000);
	int32_t toks[200];
	uint32_t s, nc;
	int r;

	if (!c)
		return REFUSED; /* at connect/attach under the per-uid caps */
	for (int i = 0; i < 200; i++)
		toks[i] = (int32_t)(rnd(&seed) % 1000);
	r = pkv_seq_open(c, toks, 24, &s, &nc);
	if (!r)
		r = run_step(c, s, toks, nc, 24 - nc, NULL);
	for (uint32_t p = 24; !r && p < 200; p++)
		r = run_step(c, s, toks, p, 1, NULL);
	pkv_disconnect(c);
	return verdict(r);
}

/* Prompts sharing prefixes in a cross-user pool: opens, prefills, closes. */
static int honest_prefill(uint32_t seed)
{
	struct pkv_client *c;
	struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = 1 << 20, .timeout_ms = 10000 };
	struct pkv_pool_params pp;
	int32_t toks[96];
	int r = 0;

	if (pkv_connect(&o, &c))
		return REFUSED;
	test_pool_params(&pp, "shared");
	pp.flags = PKV_POOL_SHARE_ACROSS_USERS;
	if (pkv_pool_attach(c, &pp)) {
		pkv_disconnect(c);
		return REFUSED;
	}
	for (int it = 0; it < 40 && fair(r); it++) {
		uint32_t n = 17 + rnd(&seed) % 79, s, nc;

		for (uint32_t i = 0; i < n; i++)
			toks[i] = i < 48 ? (int32_t)i : (int32_t)(rnd(&seed) % 1000);
		r = pkv_seq_open(c, toks, n, &s, &nc);
		if (r)
			continue;
		r = run_step(c, s, toks, nc, n - nc, NULL);
		/*
		 * The producer of a prefix it waited for was killed (this soak kills
		 * clients): as pagedkv.h says, close, re-open and compute the rest.
		 */
		for (int again = 0; r == -ESTALE && again < 4; again++) {
			pkv_seq_close(c, s);
			r = pkv_seq_open(c, toks, n, &s, &nc);
			if (!r)
				r = run_step(c, s, toks, nc, n - nc, NULL);
		}
		if (fair(r))
			r = pkv_seq_close(c, s);
	}
	pkv_disconnect(c);
	return verdict(r);
}

/* Takes what it can: sequences, reservations, forks and pins, and holds them. */
static int hostile_flood(uint32_t seed)
{
	struct pkv_client *c = test_client(D.sock, (seed & 1) ? "m" : "flood", 1 << 20, 10000);
	int32_t toks[300];
	uint32_t s, nc, child, n;

	if (!c)
		return 0;
	for (int i = 0; i < 300; i++)
		toks[i] = i;
	for (int i = 0; i < 4096; i++) {
		if (pkv_seq_open(c, toks, 1 + rnd(&seed) % 64, &s, &nc))
			break;
		if (rnd(&seed) % 4 == 0)
			pkv_seq_fork(c, s, &child);
		if (rnd(&seed) % 8 == 0) {
			n = 1 + rnd(&seed) % 300;
			if (!pkv_step_begin(c, &s, &n, toks, 1) && rnd(&seed) % 2)
				pkv_step_abort(c);
		}
		pkv_pin(c, toks, 32);
	}
	pause(); /* held until killed */
	return 0;
}

/* Speaks the raw protocol wrongly: bad opcodes, offsets, attends out of step. */
static int hostile_garbage(uint32_t seed)
{
	struct pkv_msg_attach m;
	struct raw r;
	char why[512];

	if (raw_open(&r, D.sock, 1 << 16, F_SEAL_SHRINK | F_SEAL_GROW))
		return 0;
	if (raw_hello(&r, PKV_PROTO_VERSION, r.size, 1, why, sizeof(why))) {
		raw_close(&r);
		return 0;
	}
	raw_attach_msg(&m, "m");
	raw_attach(&r, &m, why, sizeof(why));
	for (int i = 0; i < 20000; i++) {
		struct pkv_sqe e;
		struct pkv_cqe cq;

		memset(&e, 0, sizeof(e));
		e.opcode = (uint8_t)(rnd(&seed) % 16);
		e.layer = rnd(&seed) % 4;
		e.seq = rnd(&seed) % 8;
		e.n = rnd(&seed) % 70000;
		for (int k = 0; k < 4; k++)
			e.off[k] = rnd(&seed) % 2 ? rnd(&seed) % (1 << 16) : (uint64_t)rnd(&seed) << 20;
		if (raw_call(&r, &e, &cq))
			break; /* disconnected for a corrupted ring, or killed: either is fair */
	}
	raw_close(&r);
	return 0;
}

static void child(enum role role, uint32_t uid, uint32_t seed)
{
	int r = 0;

	if (setresgid(uid, uid, uid) || setresuid(uid, uid, uid))
		_exit(2);
	signal(SIGPIPE, SIG_IGN);
	switch (role) {
	case HONEST_DECODE: r = honest_decode(seed); break;
	case HONEST_PREFILL: r = honest_prefill(seed); break;
	case HOSTILE_FLOOD: r = hostile_flood(seed); break;
	case HOSTILE_GARBAGE: r = hostile_garbage(seed); break;
	}
	_exit(r);
}

static int daemon_fds(void)
{
	char path[64];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)D.pid);
	dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

static long daemon_rss_kb(void)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)D.pid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6))
			kb = strtol(line + 6, NULL, 10);
	fclose(f);
	return kb;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

START_TEST(test_soak_many_uids_honest_hostile_and_killed)
{
	static const char *const extra[] = { "--socket-mode", "0666", "--uid-block-share", "40", NULL };
	const char *env = getenv("PKV_SOAK_S");
	unsigned total_s = env && atoi(env) > 0 ? (unsigned)atoi(env) : DEFAULT_S;
	unsigned round_ms = total_s * 1000 / ROUNDS;
	uint32_t seed = 0x5eed1234;
	int fds1 = 0, unfair = 0, served = 0;
	long rss1 = 0;
	char rep[4096];

	ck_assert_int_eq(dmn_start(&D, extra), 0);
	ck_assert_int_eq(chmod(D.dir, 0755), 0);
	for (int round = 0; round < ROUNDS; round++) {
		pid_t pids[CLIENTS];
		int killed[CLIENTS] = { 0 }, st;

		for (int i = 0; i < CLIENTS; i++) {
			enum role role = (enum role)(i % 4);
			uint32_t uid = UID0 + (uint32_t)(i / 16), s = rnd(&seed);

			pids[i] = fork();
			ck_assert_int_ge(pids[i], 0);
			if (pids[i] == 0)
				child(role, uid, s);
		}
		/* Random SIGKILLs while they run; the flooders are always killed at the end. */
		for (unsigned t = 0; t < round_ms; t += 100) {
			int v = (int)(rnd(&seed) % CLIENTS);

			sleep_ms(100);
			if (rnd(&seed) % 4 == 0 && !killed[v]) {
				kill(pids[v], SIGKILL);
				killed[v] = 1;
			}
			ck_assert(dmn_alive(&D));
		}
		for (int i = 0; i < CLIENTS; i++) {
			if (i % 4 == HOSTILE_FLOOD || i % 4 == HOSTILE_GARBAGE) {
				kill(pids[i], SIGKILL);
				killed[i] = 1;
			}
		}
		for (int i = 0; i < CLIENTS; i++) {
			/* Honest clients finish by themselves (their work is bounded). */
			ck_assert_int_eq(waitpid(pids[i], &st, 0), pids[i]);
			if (killed[i])
				continue;
			served += WIFEXITED(st) && WEXITSTATUS(st) == SERVED && i % 4 <= HONEST_PREFILL;
			if (!(WIFEXITED(st) && (WEXITSTATUS(st) == SERVED || WEXITSTATUS(st) == REFUSED))) {
				fprintf(stderr, "round %d: client %d (role %d) ended with status 0x%x\n", round, i,
					i % 4, st);
				unfair++;
			}
		}
		ck_assert(dmn_alive(&D));
		rep[0] = 0;
		ck_assert_msg(audit_until_clean(D.sock, 10000, rep, sizeof(rep)) == 0, "audit: %s", rep);
		if (round == 0) {
			fds1 = daemon_fds();
			rss1 = daemon_rss_kb();
		}
		fprintf(stderr, "# round %d: %d honest clients served so far, daemon %d fds, %ld KiB RSS\n",
			round, served, daemon_fds(), daemon_rss_kb());
	}
	ck_assert_int_eq(unfair, 0);
	ck_assert_int_gt(served, 0); /* the hostile ones did not starve everybody */
	/*
	 * Every connection of every round is gone: the descriptors of the first
	 * round's end (the audit's own connection is freed asynchronously: wait
	 * for it, bounded by a count of tries, not a clock).
	 */
	for (int i = 0; i < 100 && daemon_fds() > fds1; i++)
		sleep_ms(50);
	ck_assert_int_le(daemon_fds(), fds1);
#if !defined(__SANITIZE_ADDRESS__)
	ck_assert_int_le(daemon_rss_kb(), rss1 + RSS_SLACK_KB);
#else
	/* The quarantine keeps freed memory resident under ASan; its leak check at exit stands in. */
	(void)rss1;
#endif
	ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("daemon-soak");
	TCase *t = tcase_create("soak");
	const char *env = getenv("PKV_SOAK_S");

	tcase_set_timeout(t, 120 + (env && atoi(env) > 0 ? atoi(env) * 2 : DEFAULT_S * 2));
	tcase_add_test(t, test_soak_many_uids_honest_hostile_and_killed);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return suite_main_as_root(suite);
}
