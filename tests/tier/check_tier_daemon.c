/* SPDX-License-Identifier: MIT */
/* pagedkvd with --disk-cache, as real processes: round trip, restart, SIGKILL during spill, corruption, full disk, uids. */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "../daemon/harness.h"
#include "tier/tier.h"
#include "../suite_main.h"

#define NTOK 40u                   /* 2 full blocks published + a partial one */
#define NCACHED 32u                /* (NTOK - 1) / T_BS whole blocks */
#define OUT_FLOATS ((size_t)T_LAYERS * (NTOK - NCACHED) * T_HEADS * T_DIM)
#define UID_A 61011
#define UID_B 61012

static struct dmn D;
static char tdir[64];
static int have_dir;
/*
 * --disk-wait-ms of the next start(): far beyond what a loaded sanitizer build
 * needs to read two blocks, except in the tests of the deadline itself.
 */
#define WAIT_MS_ANY_LOAD "60000"
static const char *wait_ms = WAIT_MS_ANY_LOAD;

static void prompt(uint32_t which, int32_t *t)
{
	for (uint32_t i = 0; i < NTOK; i++)
		t[i] = (int32_t)(which * 131 + 3 * i + 1);
}

/*
 * Starts (or restarts) the daemon on the tier directory. After a SIGKILL the
 * dead daemon's listening socket can outlive it for a moment (its io_uring
 * is torn down asynchronously), so a connect alone may reach the corpse:
 * ready means a status request got its answer.
 */
static int start(void)
{
	const char *extra[] = { "--disk-cache", tdir, "--socket-mode", "0666", "--disk-wait-ms", wait_ms, NULL };
	char out[2048];
	int r;

	if (have_dir) {
		r = dmn_restart(&D, extra);
	} else {
		have_dir = 1;
		r = dmn_start(&D, extra);
	}
	for (int i = 0; !r && i < 500; i++) {
		if (!ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_TEXT, out, sizeof(out)))
			return 0;
		usleep(10000);
	}
	return r ? r : -ETIMEDOUT;
}

static void setup(void)
{
	snprintf(tdir, sizeof(tdir), "/tmp/pkv-tierd-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tdir));
	snprintf(tdir + strlen(tdir), sizeof(tdir) - strlen(tdir), "/tier");
	memset(&D, 0, sizeof(D));
	have_dir = 0;
	wait_ms = WAIT_MS_ANY_LOAD;
	ck_assert_int_eq(start(), 0);
	ck_assert_int_eq(chmod(D.dir, 0755), 0);
}

static void teardown(void)
{
	char cmd[160];

	dmn_stop(&D);
	dmn_cleanup(&D);
	tdir[strlen(tdir) - 5] = 0;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tdir);
	ck_assert_int_eq(system(cmd), 0);
}

/*
 * Opens prompt `which` as uid (0 = this process), computes what is not
 * cached and, when out is given, returns the outputs of positions
 * NCACHED..NTOK-1 in it (only when n_cached == NCACHED, else garbage-free
 * zeros). Returns n_cached or -1. Runs in a child so that the uid can change.
 */
static int open_prompt(uid_t uid, uint32_t which, float *out)
{
	float *shared = out ? calloc(OUT_FLOATS, sizeof(float)) : NULL;
	int p[2], st, nc = -1;
	pid_t pid;

	ck_assert_int_eq(pipe(p), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		float *o = calloc((size_t)T_LAYERS * NTOK * T_HEADS * T_DIM, sizeof(float));
		struct pkv_client *c;
		int32_t toks[NTOK];
		uint32_t s, n_cached;
		int res = -1;

		close(p[0]);
		if (uid && (setgid(uid) || setuid(uid)))
			_exit(2);
		prompt(which, toks);
		c = test_client(D.sock, "tier", 4 << 20, 5000);
		if (c && o && !pkv_seq_open(c, toks, NTOK, &s, &n_cached) &&
		    !run_step(c, s, toks, n_cached, NTOK - n_cached, o))
			res = (int)n_cached;
		if (write(p[1], &res, sizeof(res)) != sizeof(res))
			_exit(3);
		/* Rows of positions NCACHED.. of every layer, in the same order whatever n_cached was. */
		if (res >= 0 && (uint32_t)res <= NCACHED)
			for (uint32_t l = 0; l < T_LAYERS; l++) {
				size_t rows = NTOK - (uint32_t)res, skip = NCACHED - (uint32_t)res;
				const float *src = o + (l * rows + skip) * T_HEADS * T_DIM;

				if (write(p[1], src, (NTOK - NCACHED) * T_HEADS * T_DIM * sizeof(float)) < 0)
					_exit(3);
			}
		if (c)
			pkv_disconnect(c);
		_exit(0);
	}
	close(p[1]);
	ck_assert_int_eq(read(p[0], &nc, sizeof(nc)), (ssize_t)sizeof(nc));
	/* The rows are read even when the caller does not want them: a closed pipe would kill the child. */
	if (nc >= 0 && (uint32_t)nc <= NCACHED) {
		size_t got = 0, want = OUT_FLOATS * sizeof(float);
		float *dst = out ? out : malloc(want);

		ck_assert_ptr_nonnull(dst);
		while (got < want) {
			ssize_t k = read(p[0], (char *)dst + got, want - got);

			ck_assert_int_gt(k, 0);
			got += (size_t)k;
		}
		if (!out)
			free(dst);
	}
	close(p[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_int_eq(child_status(st), 0);
	free(shared);
	return nc;
}

static void ctl_ok(uint32_t cmd, char *out, size_t len)
{
	ck_assert_int_eq(ctl_cmd(D.sock, cmd, PKV_FMT_TEXT, out, len), 0);
}

/* Spill by flushing RAM: every flushed block goes to disk, and the flush waits for the writes. */
static void spill_all(void)
{
	char out[4096];

	ctl_ok(PKV_CTL_FLUSH, out, sizeof(out));
}

START_TEST(test_spill_fetch_bit_exact)
{
	static float ram[OUT_FLOATS], disk[OUT_FLOATS];
	char out[4096];

	ck_assert_int_eq(open_prompt(0, 1, NULL), 0);        /* cold: computes everything */
	ck_assert_int_eq(open_prompt(0, 1, ram), NCACHED);   /* RAM-warm */
	spill_all();
	ctl_ok(PKV_CTL_STATUS, out, sizeof(out));
	ck_assert_msg(strstr(out, "disk tier") && strstr(out, " 2 blocks,"), "%s", out);
	/* RAM holds nothing now: the hit can only come from disk. */
	ck_assert_int_eq(open_prompt(0, 1, disk), NCACHED);
	ck_assert_int_eq(memcmp(ram, disk, sizeof(ram)), 0);
	ctl_ok(PKV_CTL_STATUS, out, sizeof(out));
	ck_assert_msg(strstr(out, "hits 2 of"), "%s", out);
	ck_assert_int_eq(audit_until_clean(D.sock, 2000, out, sizeof(out)), 0);
	/* flush --disk empties the tier; status --json shows it. */
	ctl_ok(PKV_CTL_FLUSH_DISK, out, sizeof(out));
	ck_assert_msg(strstr(out, "disk tier: 2 blocks dropped"), "%s", out);
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_JSON, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "\"disk_tier\":{\"blocks\":0,"), "%s", out);
}
END_TEST

START_TEST(test_restart_keeps_prefix)
{
	static float ram[OUT_FLOATS], disk[OUT_FLOATS];

	ck_assert_int_eq(open_prompt(0, 2, NULL), 0);
	ck_assert_int_eq(open_prompt(0, 2, ram), NCACHED);
	/* SIGTERM frees the pool: its cached blocks are spilled, then the tier closes. */
	ck_assert_int_eq(dmn_stop(&D), 0);
	ck_assert_int_eq(start(), 0);
	ck_assert_int_eq(open_prompt(0, 2, disk), NCACHED);
	ck_assert_int_eq(memcmp(ram, disk, sizeof(ram)), 0);
}
END_TEST

START_TEST(test_flipped_block_never_served)
{
	static float ram[OUT_FLOATS], again[OUT_FLOATS];
	char path[160], out[4096];
	FILE *ls;
	int fd;
	uint8_t b;

	ck_assert_int_eq(open_prompt(0, 3, NULL), 0);
	ck_assert_int_eq(open_prompt(0, 3, ram), NCACHED);
	ck_assert_int_eq(dmn_stop(&D), 0);
	/* Flip a bit in the KV of the second record slot (the first is the chain's tail, spilled first). */
	snprintf(out, sizeof(out), "ls %s/*.dat", tdir);
	ls = popen(out, "r");
	ck_assert_ptr_nonnull(ls);
	ck_assert_ptr_nonnull(fgets(path, sizeof(path), ls));
	pclose(ls);
	path[strcspn(path, "\n")] = 0;
	fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, 4096 + 600), 1);
	b ^= 1;
	ck_assert_int_eq(pwrite(fd, &b, 1, 4096 + 600), 1);
	close(fd);
	ck_assert_int_eq(start(), 0);
	/* Whichever block it was, the chain is cut there: fewer tokens cached, outputs still right. */
	ck_assert_int_lt(open_prompt(0, 3, again), NCACHED);
	ctl_ok(PKV_CTL_STATUS, out, sizeof(out));
	ck_assert_msg(strstr(out, " 1 corrupt dropped"), "%s", out);
}
END_TEST

START_TEST(test_truncated_file_never_served)
{
	char cmd[200], out[4096];

	ck_assert_int_eq(open_prompt(0, 4, NULL), 0);
	ck_assert_int_eq(dmn_stop(&D), 0);
	snprintf(cmd, sizeof(cmd), "for f in %s/*.dat; do truncate -s 1000 $f; done", tdir);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(start(), 0);
	ck_assert_int_eq(open_prompt(0, 4, NULL), 0);
	ctl_ok(PKV_CTL_STATUS, out, sizeof(out));
	ck_assert_msg(strstr(out, " 2 corrupt dropped"), "%s", out);
}
END_TEST

START_TEST(test_uid_b_does_not_find_uid_a)
{
	ck_assert_int_eq(open_prompt(UID_A, 5, NULL), 0);
	ck_assert_int_eq(dmn_stop(&D), 0);
	ck_assert_int_eq(start(), 0);
	ck_assert_int_eq(open_prompt(UID_B, 5, NULL), 0);
	ck_assert_int_eq(open_prompt(UID_A, 5, NULL), NCACHED);
}
END_TEST

START_TEST(test_full_disk_ram_goes_on)
{
	struct rlimit rl, old;
	char out[4096];

	/* The daemon alone inherits a 64 KiB file-size limit: its records file fills after a few blocks. */
	ck_assert_int_eq(dmn_stop(&D), 0);
	ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
	rl = old;
	rl.rlim_cur = 64 << 10;
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	ck_assert_int_eq(start(), 0);
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
	for (uint32_t w = 10; w < 30; w++)
		ck_assert_int_eq(open_prompt(0, w, NULL), 0);
	spill_all();
	ctl_ok(PKV_CTL_STATUS, out, sizeof(out));
	/* EFBIG, or ENOSPC for a write the limit cut short: either way a logged reason. */
	ck_assert_msg(strstr(out, "spilling stopped: write: "), "%s", out);
	/* RAM keeps working: prefill, then a RAM hit. */
	ck_assert_int_eq(open_prompt(0, 40, NULL), 0);
	ck_assert_int_eq(open_prompt(0, 40, NULL), NCACHED);
	ck_assert_int_eq(audit_until_clean(D.sock, 2000, out, sizeof(out)), 0);
}
END_TEST

/*
 * A client that keeps the daemon spilling: distinct prompts, and a RAM
 * flush (every cached block to disk) after every 4. It writes a byte to
 * `ready` after its first flush, so the kill lands while spills go on.
 */
static pid_t churn(uint32_t seed, int ready)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pkv_client *c = test_client(D.sock, "tier", 4 << 20, 5000);
		int32_t toks[NTOK];

		for (uint32_t w = 0; c && w < 100000; w++) {
			uint32_t s, nc;

			prompt(seed * 100000 + w, toks);
			if (pkv_seq_open(c, toks, NTOK, &s, &nc) || run_step(c, s, toks, nc, NTOK - nc, NULL))
				break;
			pkv_seq_close(c, s);
			if (w % 4 == 3) {
				char out[256];

				ctl_cmd(D.sock, PKV_CTL_FLUSH, PKV_FMT_TEXT, out, sizeof(out));
				if (w == 3 && write(ready, "r", 1) != 1)
					break;
			}
		}
		_exit(0);
	}
	return pid;
}

START_TEST(test_sigkill_during_spill)
{
	struct pkv_tier_config cfg = { .dir = tdir, .budget = 1ull << 30, .uid_share = 100 };
	unsigned kills = 0, seed = (unsigned)time(NULL);
	struct pkv_tier_stats st;
	struct pkv_tier *t;
	uint64_t dropped;
	int64_t checked;
	char why[256];
	int p[2];

	fprintf(stderr, "sigkill loop: seed %u\n", seed);
	srand(seed);
	ck_assert_int_eq(pipe(p), 0);
	for (int i = 0; i < 100; i++) {
		struct pollfd pfd = { p[0], POLLIN, 0 };
		pid_t c = churn((uint32_t)i, p[1]);
		char b;

		/* Kill at a random moment while the client spills continuously. */
		ck_assert_msg(poll(&pfd, 1, 10000) == 1, "iteration %d: the client never flushed", i);
		ck_assert_int_eq(read(p[0], &b, 1), 1);
		usleep((useconds_t)(rand() % 20000));
		ck_assert_int_eq(dmn_alive(&D), 1);
		dmn_kill(&D);
		kills++;
		kill(c, SIGKILL);   /* it would wait out its timeout on the dead daemon */
		waitpid(c, NULL, 0);
		ck_assert_int_eq(start(), 0);
	}
	ck_assert_uint_ge(kills, 100);
	close(p[0]);
	close(p[1]);
	dmn_stop(&D);
	/* Every block the index holds after 100 crashes must read back intact. */
	ck_assert_int_eq(pkv_tier_open(&cfg, &t, why, sizeof(why)), 0);
	pkv_tier_stats(t, &st);
	checked = pkv_tier_check_all(t, &dropped);
	fprintf(stderr, "sigkill loop: %u kills, %lld blocks checked, %llu dropped\n", kills,
		(long long)checked, (unsigned long long)dropped);
	ck_assert_int_eq(checked, (int64_t)st.blocks);
	ck_assert_int_gt(checked, 0);
	ck_assert_uint_eq(dropped, 0);
	pkv_tier_close(t);
	ck_assert_int_eq(start(), 0);
}
END_TEST

START_TEST(test_write_behind_under_pressure)
{
	static float ram[OUT_FLOATS], disk[OUT_FLOATS];
	unsigned long long behind = 0;
	char out[4096];
	const char *p;

	ck_assert_int_eq(open_prompt(0, 200, NULL), 0);
	ck_assert_int_eq(open_prompt(0, 200, ram), NCACHED);
	/* 60 more prompts of 2 cached blocks each through a 64-block pool: LRU eviction throughout. */
	for (uint32_t w = 201; w < 261; w++)
		ck_assert_int_eq(open_prompt(0, w, NULL), 0);
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_JSON, out, sizeof(out)), 0);
	p = strstr(out, "\"spilled_behind\":");
	ck_assert_ptr_nonnull(p);
	ck_assert_int_eq(sscanf(p, "\"spilled_behind\":%llu", &behind), 1);
	/* The tier thread copied blocks ahead of their eviction... */
	ck_assert_msg(behind > 0, "%s", out);
	p = strstr(out, "\"spilled\":");
	fprintf(stderr, "write-behind: %llu of %.40s\n", behind, p ? p : "?");
	/* ... and what comes back from disk is exactly what RAM had. */
	ck_assert_int_eq(open_prompt(0, 200, disk), NCACHED);
	ck_assert_int_eq(memcmp(ram, disk, sizeof(ram)), 0);
	for (uint32_t w = 201; w < 261; w += 7)
		ck_assert_int_eq(open_prompt(0, w, NULL), NCACHED);
	ctl_ok(PKV_CTL_STATUS, out, sizeof(out));
	ck_assert_msg(strstr(out, " 0 corrupt dropped"), "%s", out);
	ck_assert_int_eq(audit_until_clean(D.sock, 2000, out, sizeof(out)), 0);
}
END_TEST

/* ---- an open waiting for the disk parks itself, not the daemon */

static char gate[96];

/* Restarts the daemon with its tier's reads held back until gate exists (the test hook), deadline dl ms. */
static void restart_gated(const char *dl)
{
	snprintf(gate, sizeof(gate), "%.80s.gate", tdir);
	unlink(gate);
	ck_assert_int_eq(dmn_stop(&D), 0);
	wait_ms = dl;
	ck_assert_int_eq(setenv("PAGEDKV_TIER_TEST_READ_GATE", gate, 1), 0);
	ck_assert_int_eq(start(), 0);
	unsetenv("PAGEDKV_TIER_TEST_READ_GATE");
}

static void gate_open(void)
{
	int fd = open(gate, O_CREAT | O_WRONLY, 0600);

	ck_assert_int_ge(fd, 0);
	close(fd);
}

/* Waits (bounded) until the daemon's status says n opens wait for the disk. */
static void until_waiting(unsigned n)
{
	char out[4096], want[64];
	int i;

	snprintf(want, sizeof(want), "\"opens_waiting\":%u,", n);
	for (i = 0; i < 3000; i++) {
		ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_JSON, out, sizeof(out)), 0);
		if (strstr(out, want))
			return;
		usleep(10000);
	}
	ck_abort_msg("never %u opens waiting: %s", n, out);
}

/* A child that opens prompt `which` and computes the rest; writes n_cached (or -1) to fd once done. */
static pid_t open_async(uint32_t which, int fd)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pkv_client *c = test_client(D.sock, "tier", 4 << 20, 120000);
		int32_t toks[NTOK];
		uint32_t s, n_cached;
		int res = -1;

		prompt(which, toks);
		if (c && !pkv_seq_open(c, toks, NTOK, &s, &n_cached) &&
		    !run_step(c, s, toks, n_cached, NTOK - n_cached, NULL))
			res = (int)n_cached;
		if (write(fd, &res, sizeof(res)) != sizeof(res))
			_exit(3);
		_exit(0);
	}
	return pid;
}

static int pipe_ready(int fd)
{
	struct pollfd p = { fd, POLLIN, 0 };

	return poll(&p, 1, 0);
}

/* The tier's "hits" (blocks its reads served) from the daemon's status. */
static unsigned tier_hits(void)
{
	char out[4096];
	const char *h;

	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_JSON, out, sizeof(out)), 0);
	h = strstr(out, "\"disk_tier\":{");
	h = h ? strstr(h, "\"hits\":") : NULL;
	ck_assert_msg(h != NULL, "%s", out);
	return (unsigned)strtoul(h + 7, NULL, 10);
}

/* Reads one child's n_cached from the pipe and reaps it. */
static int reap_open(pid_t pid, int fd)
{
	int nc = -1, st;

	ck_assert_int_eq(read(fd, &nc, sizeof(nc)), (ssize_t)sizeof(nc));
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_int_eq(child_status(st), 0);
	return nc;
}

/* Prompt `which` computed once, then on disk only, the daemon restarted with its reads gated (deadline dl ms). */
static void on_disk_only(uint32_t which, const char *dl)
{
	ck_assert_int_eq(open_prompt(0, which, NULL), 0);
	spill_all();
	restart_gated(dl);
}

/* A gated test's end: no open left waiting, its pipe closed, the gate removed. */
static void gated_done(int p[2])
{
	until_waiting(0);
	close(p[0]);
	close(p[1]);
	unlink(gate);
}

START_TEST(test_open_waiting_for_disk_stalls_no_one)
{
	int p[2];
	pid_t a;

	/* A deadline far beyond anything B needs: A can only complete once the gate opens. */
	on_disk_only(7, WAIT_MS_ANY_LOAD);
	ck_assert_int_eq(pipe(p), 0);
	a = open_async(7, p[1]);
	until_waiting(1);
	/* Meanwhile uid B (another uid when root) opens and computes prompt after prompt. */
	for (uint32_t w = 50; w < 58; w++)
		ck_assert_int_eq(open_prompt(geteuid() == 0 ? UID_B : 0, w, NULL), 0);
	ck_assert_int_eq(open_prompt(geteuid() == 0 ? UID_B : 0, 50, NULL), NCACHED);
	/* ... and A's open is still parked: nothing stalled behind it, and it did not jump the gate. */
	ck_assert_int_eq(pipe_ready(p[0]), 0);
	until_waiting(1);
	gate_open();
	ck_assert_int_eq(reap_open(a, p[0]), NCACHED);   /* every block came from disk */
	gated_done(p);
}
END_TEST

START_TEST(test_open_past_deadline_goes_on_with_ram)
{
	char out[4096];
	int p[2], st;
	pid_t a, gone;

	on_disk_only(8, "300");
	/* Past the deadline the open completes with what RAM has: nothing. */
	ck_assert_int_eq(open_prompt(0, 8, NULL), 0);
	/*
	 * RAM forgets the recomputed blocks again (the disk has them already), and
	 * the daemon comes back gated with a deadline no load reaches: the next
	 * client must still be waiting when it is killed.
	 */
	spill_all();
	restart_gated(WAIT_MS_ANY_LOAD);
	/* A client that hangs up while its open waits: its reads are given back. */
	ck_assert_int_eq(pipe(p), 0);
	gone = open_async(8, p[1]);
	until_waiting(1);
	kill(gone, SIGKILL);
	ck_assert_int_eq(waitpid(gone, &st, 0), gone);
	until_waiting(0);
	gate_open();
	/* The abandoned reads finish unseen; the blocks are still on disk and found now. */
	a = open_async(8, p[1]);
	ck_assert_int_eq(reap_open(a, p[0]), NCACHED);
	ctl_ok(PKV_CTL_STATUS, out, sizeof(out));
	ck_assert_msg(strstr(out, " 0 corrupt dropped"), "%s", out);
	ck_assert_int_eq(audit_until_clean(D.sock, 2000, out, sizeof(out)), 0);
	gated_done(p);
}
END_TEST

/*
 * A burst of opens of one prompt only the disk holds (a chat app's system
 * prompt after a restart): the first reads it, the others wait for those
 * reads instead of reading it again, and all find every block.
 */
START_TEST(test_concurrent_opens_read_once)
{
	int p[2];
	pid_t kids[3];

	on_disk_only(9, WAIT_MS_ANY_LOAD);
	ck_assert_int_eq(pipe(p), 0);
	for (unsigned i = 0; i < 3; i++) {
		kids[i] = open_async(9, p[1]);
		until_waiting(i + 1);
	}
	gate_open();
	for (unsigned i = 0; i < 3; i++)
		ck_assert_int_eq(reap_open(kids[i], p[0]), NCACHED);
	/* One chain of NCACHED / T_BS blocks served by the disk, not one per open. */
	ck_assert_uint_eq(tier_hits(), NCACHED / T_BS);
	gated_done(p);
}
END_TEST

/* The open being waited for hangs up: the one waiting reads the chain itself, nothing is lost. */
START_TEST(test_waited_for_open_hangs_up)
{
	char out[4096];
	int p[2], st;
	pid_t gone, b;

	on_disk_only(10, WAIT_MS_ANY_LOAD);
	ck_assert_int_eq(pipe(p), 0);
	gone = open_async(10, p[1]);
	until_waiting(1);
	b = open_async(10, p[1]);
	until_waiting(2);
	kill(gone, SIGKILL);
	ck_assert_int_eq(waitpid(gone, &st, 0), gone);
	/* B starts its own reads (the dead open's are abandoned): one open waiting, for its own. */
	until_waiting(1);
	gate_open();
	ck_assert_int_eq(reap_open(b, p[0]), NCACHED);
	gated_done(p);
	ck_assert_int_eq(audit_until_clean(D.sock, 2000, out, sizeof(out)), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("tier-daemon");
	TCase *tc = tcase_create("daemon");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 600); /* 100 SIGKILLs and restarts of a sanitizer build, on a loaded machine */
	tcase_add_test(tc, test_spill_fetch_bit_exact);
	tcase_add_test(tc, test_restart_keeps_prefix);
	tcase_add_test(tc, test_flipped_block_never_served);
	tcase_add_test(tc, test_truncated_file_never_served);
	/* Two uids need setuid children. */
	if (geteuid() == 0)
		tcase_add_test(tc, test_uid_b_does_not_find_uid_a);
	else
		fprintf(stderr, "check_tier_daemon: not root, the two-uid test is not run\n");
	tcase_add_test(tc, test_full_disk_ram_goes_on);
	tcase_add_test(tc, test_sigkill_during_spill);
	tcase_add_test(tc, test_write_behind_under_pressure);
	tcase_add_test(tc, test_open_waiting_for_disk_stalls_no_one);
	tcase_add_test(tc, test_open_past_deadline_goes_on_with_ram);
	tcase_add_test(tc, test_concurrent_opens_read_once);
	tcase_add_test(tc, test_waited_for_open_hangs_up);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
