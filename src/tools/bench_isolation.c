/* SPDX-License-Identifier: MIT */
/* pkv-bench isolation: a victim uid's decode latency, alone and while another uid runs each attack class. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "common/clock.h"
#include "pkv_paths.h"

/* The victim: SmolLM2-135M's attention shape, decoding at a 512-token context. */
#define L 30u
#define H 9u
#define KVH 3u
#define HD 64u
#define BS 16u
#define CTX 511u
#define BIG 8192u            /* tokens of the attacker's single attend */
#define FLOOD_PROMPT 16384u  /* tokens of the prefix the open flood walks */
#define FLOODERS 8
#define RINGERS 16           /* connections of the many_rings attack */
#define RING_CTX 8192u       /* context each of them decodes at */
#define WIDE_H 256u          /* the wide_rows attacker's pool: a row as wide as a pool may be (65,536) */
#define WIDE_KVH 8u
#define WIDE_HD 256u
#define WIDE_CTX 1024u       /* the context it decodes at */
#define WIDE_CHUNK 64u       /* its prefill's step size */
#define FORKS 48             /* children of the fork_copies attack */
#define FORK_BS 256u         /* its pool's block size */
#define MAX_SAMPLES 200000

#define UID_VICTIM 61101
#define UID_ATTACKER 61102

struct opts {
	char plugin_dir[PATH_MAX];
	char daemon[PATH_MAX];
	char ctl[PATH_MAX];
	char workers[16];
	double phase_s;
	int json;
	const char *only;            /* run the solo phase and these classes only (comma-separated) */
	const char *daemon_args[8];
	int n_daemon_args;
};

static struct opts O;
static char sock_path[108], dir_path[64];
static pid_t daemon_pid;
static int distinct_uids;


static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void become(uid_t uid)
{
	if (!distinct_uids)
		return;
	if (setresgid(uid, uid, uid) || setresuid(uid, uid, uid))
		_exit(2);
}

/* ---------------------------------------------------------------- daemon */

static int start_daemon(void)
{
	snprintf(dir_path, sizeof(dir_path), "/tmp/pkv-iso-XXXXXX");
	if (!mkdtemp(dir_path))
		return -errno;
	if (chmod(dir_path, 0755))
		return -errno;
	snprintf(sock_path, sizeof(sock_path), "%s/s", dir_path);
	daemon_pid = fork();
	if (daemon_pid == 0) {
		const char *lvl = getenv("PKV_BENCH_DAEMON_LOG");
		const char *argv[32] = { O.daemon, "-f", "--socket", sock_path, "--socket-mode", "0666",
					 "--plugin-dir", O.plugin_dir, "--backend", "cpu", "--workers", O.workers,
					 "--log-level", lvl ? lvl : "error" };
		int n = 14;

		for (int i = 0; i < O.n_daemon_args; i++)
			argv[n++] = O.daemon_args[i];
		argv[n] = NULL;
		execv(O.daemon, (char *const *)argv);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		struct pkv_connect_opts co = { .socket_path = sock_path, .timeout_ms = 1000 };
		struct pkv_client *c;

		if (!pkv_connect(&co, &c)) {
			pkv_disconnect(c);
			return 0;
		}
		if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid)
			return -ECHILD;
		sleep_ms(10);
	}
	return -ETIMEDOUT;
}

static int daemon_alive(void)
{
	return daemon_pid > 0 && waitpid(daemon_pid, NULL, WNOHANG) == 0;
}

static void stop_daemon(void)
{
	char lock[160];

	if (daemon_pid > 0 && daemon_alive()) {
		kill(daemon_pid, SIGTERM);
		waitpid(daemon_pid, NULL, 0);
	}
	snprintf(lock, sizeof(lock), "%s.lock", sock_path);
	unlink(lock);
	unlink(sock_path);
	rmdir(dir_path);
}

/* pagedkvctl audit, retried for a while (hang-ups are released asynchronously); 1 when clean. */
static int audit_clean(void)
{
	for (int i = 0; i < 50; i++) {
		pid_t pid = fork();
		int st;

		if (pid == 0) {
			int fd = open("/dev/null", O_WRONLY);

			dup2(fd, 1);
			dup2(fd, 2);
			execl(O.ctl, O.ctl, "--socket", sock_path, "audit", (char *)NULL);
			_exit(127);
		}
		if (pid < 0 || waitpid(pid, &st, 0) != pid)
			return 0;
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
			return 1;
		if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
			return -1; /* no pagedkvctl: unknown */
		sleep_ms(100);
	}
	return 0;
}

/* ---------------------------------------------------------------- clients */

static struct pkv_client *client(size_t arena, const char *pool, uint32_t layers, uint32_t heads,
				 uint32_t kvh, uint32_t hd, uint32_t blocks)
{
	struct pkv_connect_opts co = { .socket_path = sock_path, .arena_bytes = arena, .timeout_ms = 10000 };
	struct pkv_pool_params p = { 0 };
	struct pkv_client *c;

	if (pkv_connect(&co, &c))
		return NULL;
	if (!pool)
		return c;
	p.name = pool;
	p.geo = (struct pkv_geometry){ layers, heads, kvh, hd, PKV_DTYPE_BF16, BS, blocks };
	p.act_dtype = PKV_DTYPE_F32;
	p.model_id = 0x150;
	p.window_left = -1;
	if (pkv_pool_attach(c, &p)) {
		pkv_disconnect(c);
		return NULL;
	}
	return c;
}

struct tensors {
	float *q, *k, *v, *o;
};

static int tensors(struct pkv_client *c, struct tensors *t, uint32_t rows, uint32_t heads, uint32_t kvh,
		   uint32_t hd)
{
	t->q = pkv_alloc(c, (size_t)rows * heads * hd * 4);
	t->o = pkv_alloc(c, (size_t)rows * heads * hd * 4);
	t->k = pkv_alloc(c, (size_t)rows * kvh * hd * 4);
	t->v = pkv_alloc(c, (size_t)rows * kvh * hd * 4);
	if (!t->q || !t->o || !t->k || !t->v)
		return -ENOMEM;
	for (size_t i = 0; i < (size_t)rows * heads * hd; i++)
		t->q[i] = (float)((i * 7) % 13) * 0.01f;
	for (size_t i = 0; i < (size_t)rows * kvh * hd; i++) {
		t->k[i] = (float)((i * 5) % 11) * 0.01f;
		t->v[i] = (float)((i * 3) % 17) * 0.01f;
	}
	return 0;
}

/* Steps toks[from..n) of seq in chunks over `layers` layers (the sequence holds toks[0..from) already). */
static int step_chunks(struct pkv_client *c, uint32_t seq, const int32_t *toks, uint32_t from, uint32_t n,
		       uint32_t chunk, uint32_t layers, const struct tensors *t)
{
	int r = 0;

	for (uint32_t done = from; !r && done < n; done += chunk) {
		uint32_t k = n - done < chunk ? n - done : chunk;

		r = pkv_step_begin(c, &seq, &k, toks + done, 1);
		for (uint32_t l = 0; !r && l < layers; l++)
			r = pkv_attend(c, l, t->q, t->k, t->v, t->o);
		if (!r)
			r = pkv_step_end(c);
	}
	return r;
}

/* Prefills toks[0..n) into a new sequence of c in steps of `chunk`, all `layers`. */
static int prefill(struct pkv_client *c, const int32_t *toks, uint32_t n, uint32_t chunk, uint32_t layers,
		   const struct tensors *t, uint32_t *seq)
{
	uint32_t nc;
	int r = pkv_seq_open(c, toks, 1, seq, &nc);

	return r ? r : step_chunks(c, *seq, toks, 0, n, chunk, layers, t);
}

/*
 * The victim (in its own process and uid): attaches its pool under attack,
 * prefills, then decodes one token per step for phase_s, truncating back to
 * the prompt now and then so every step costs the same. Writes the step
 * latencies, then its error count, to fd.
 */
static void victim(int fd)
{
	static uint64_t lat[MAX_SAMPLES];
	struct pkv_client *c;
	struct tensors t;
	int32_t toks[CTX + 300], errors = 0;
	uint32_t seq, n = 0, pos = CTX;
	uint64_t end;
	int r;

	become(UID_VICTIM);
	for (uint32_t i = 0; i < CTX + 300; i++)
		toks[i] = (int32_t)(i * 31 % 5000);
	c = client(32 << 20, "model", L, H, KVH, HD, 256);
	r = c ? tensors(c, &t, CTX, H, KVH, HD) : -ECONNREFUSED;
	if (!r)
		r = prefill(c, toks, CTX, CTX, L, &t, &seq);
	if (r)
		errors = 1000000; /* could not even start */
	end = pkv_now_ns() + (uint64_t)(O.phase_s * 1e9);
	while (!r && pkv_now_ns() < end && n < MAX_SAMPLES) {
		uint64_t t0 = pkv_now_ns();
		uint32_t one = 1;

		if (pos == CTX + 256) {
			r = pkv_seq_truncate(c, seq, CTX);
			pos = CTX;
			if (r)
				break;
			t0 = pkv_now_ns();
		}
		r = pkv_step_begin(c, &seq, &one, toks + pos, 1);
		for (uint32_t l = 0; !r && l < L; l++)
			r = pkv_attend(c, l, t.q, t.k, t.v, t.o);
		if (!r)
			r = pkv_step_end(c);
		if (r)
			break;
		pos++;
		lat[n++] = pkv_now_ns() - t0;
	}
	if (r && errors < 1000000)
		errors = r == -ETIMEDOUT ? -1 : 1; /* -1: a step hung past the client's 10 s timeout */
	if (write(fd, &n, sizeof(n)) != sizeof(n) || write(fd, lat, n * sizeof(*lat)) != (ssize_t)(n * sizeof(*lat)) ||
	    write(fd, &errors, sizeof(errors)) != sizeof(errors))
		_exit(3);
	_exit(0);
}

/* ---------------------------------------------------------------- attacks (run until killed) */

/* One attend over BIG new tokens, again and again. */
static void attack_big(int ready)
{
	static int32_t toks[BIG];
	struct pkv_client *c = client((size_t)BIG * (H + 2 * KVH + H) * HD * 4 + (8 << 20), "big", L, H, KVH,
				      HD, BIG / BS + 16);
	struct tensors t;
	uint32_t seq, nc, n;

	if (!c || tensors(c, &t, BIG, H, KVH, HD))
		_exit(4);
	for (uint32_t i = 0; i < BIG; i++)
		toks[i] = (int32_t)i;
	if (write(ready, "r", 1) != 1)
		_exit(3);
	for (;;) {
		n = BIG - 1;
		if (pkv_seq_open(c, toks, 1, &seq, &nc))
			_exit(5);
		if (!pkv_step_begin(c, &seq, &n, toks + 1, 1)) {
			pkv_attend(c, 0, t.q, t.k, t.v, t.o);
			pkv_step_abort(c);
		}
		pkv_seq_close(c, seq);
	}
}

/* FLOODERS processes opening (and closing) a long cached prompt as fast as they can. */
static void attack_opens(int ready)
{
	static int32_t toks[FLOOD_PROMPT];
	struct pkv_client *c = client(16 << 20, "flood", 1, 1, 1, 8, FLOOD_PROMPT / BS + 64);
	struct tensors t;
	uint32_t seq, nc;

	if (!c || tensors(c, &t, 1024, 1, 1, 8))
		_exit(4);
	for (uint32_t i = 0; i < FLOOD_PROMPT; i++)
		toks[i] = (int32_t)(i * 7 + 1);
	/* A one-layer, one-head pool: the prefix to walk is cheap to build. */
	if (prefill(c, toks, FLOOD_PROMPT, 1024, 1, &t, &seq))
		_exit(5);
	for (int i = 0; i < FLOODERS; i++)
		if (fork() == 0) {
			struct pkv_client *f = client(1 << 20, "flood", 1, 1, 1, 8, FLOOD_PROMPT / BS + 64);

			if (!f)
				_exit(4);
			for (;;)
				if (!pkv_seq_open(f, toks, FLOOD_PROMPT, &seq, &nc))
					pkv_seq_close(f, seq);
		}
	if (write(ready, "r", 1) != 1)
		_exit(3);
	for (;;)
		pause();
}

/*
 * RINGERS processes of one uid, each decoding one token at a RING_CTX
 * context in a loop (layer 0 of a one-layer pool; the prompt is shared, so
 * it is prefilled once): many connections' decode attends of ~0.85 ms here, each
 * under a slice, queued at once. Round robin per connection would put the
 * victim's attend behind every one of them.
 */
/* Decodes token tok at the end of seq's context and aborts the step, until killed (or the daemon is gone). */
static void __attribute__((noreturn)) decode_forever(struct pkv_client *c, uint32_t seq, int32_t tok,
						     const struct tensors *t)
{
	for (uint32_t fails = 0, one; fails < 1000;) {
		one = 1;
		if (!pkv_step_begin(c, &seq, &one, &tok, 1)) {
			fails = 0;
			pkv_attend(c, 0, t->q, t->k, t->v, t->o);
			pkv_step_abort(c);
		} else {
			fails++;
		}
	}
	_exit(6);
}

/*
 * One decode step after another at WIDE_CTX tokens in a pool whose rows are
 * as wide as a pool's may be: each attend is one query row of WIDE_CTX x
 * 65,536 units, milliseconds long. Run whole, every victim layer that came
 * after one waited for it; split over keys, for about one slice.
 */
static void attack_wide(int ready)
{
	static int32_t toks[WIDE_CTX + 1];
	struct pkv_client *c = client((size_t)WIDE_CHUNK * (2 * WIDE_H + 2 * WIDE_KVH) * WIDE_HD * 4 + (8 << 20),
				      "wide", 1, WIDE_H, WIDE_KVH, WIDE_HD, WIDE_CTX / BS + 16);
	struct tensors t;
	uint32_t seq;

	if (!c || tensors(c, &t, WIDE_CHUNK, WIDE_H, WIDE_KVH, WIDE_HD))
		_exit(4);
	for (uint32_t i = 0; i <= WIDE_CTX; i++)
		toks[i] = (int32_t)(i * 7 + 3);
	if (prefill(c, toks, WIDE_CTX, WIDE_CHUNK, 1, &t, &seq))
		_exit(5);
	if (write(ready, "r", 1) != 1)
		_exit(3);
	decode_forever(c, seq, toks[WIDE_CTX], &t);
}

static void attack_rings(int ready)
{
	static int32_t toks[RING_CTX + 1];
	uint32_t n_blocks = RING_CTX / BS + 4 * RINGERS + 16;

	for (uint32_t i = 0; i <= RING_CTX; i++)
		toks[i] = (int32_t)(i * 13 + 5);
	for (int i = 0; i < RINGERS; i++) {
		int go[2];
		char ch;

		if (pipe(go))
			_exit(4);
		if (fork() == 0) {
			struct pkv_client *c = client(8 << 20, "rings", 1, H, KVH, HD, n_blocks);
			struct tensors t;
			uint32_t seq, nc;
			int r;

			close(go[0]);
			close(ready); /* the phase must see EOF there if the attack fails to start */
			if (!c || tensors(c, &t, 1024, H, KVH, HD))
				_exit(4);
			if (pkv_seq_open(c, toks, RING_CTX, &seq, &nc)) {
				fprintf(stderr, "pkv-bench isolation: ringer %d: open: %s\n", i, pkv_last_error(c));
				_exit(5);
			}
			if (nc < RING_CTX && (r = step_chunks(c, seq, toks, nc, RING_CTX, 1024, 1, &t))) {
				fprintf(stderr, "pkv-bench isolation: ringer %d: prefill from %u: %s (%s)\n", i, nc,
					pkv_strerror(r), pkv_last_error(c));
				_exit(5);
			}
			if (write(go[1], "r", 1) != 1)
				_exit(3);
			decode_forever(c, seq, toks[RING_CTX], &t);
		}
		close(go[1]);
		/* One after the other: each later one finds the prompt cached. */
		if (read(go[0], &ch, 1) != 1)
			_exit(5);
		close(go[0]);
	}
	if (write(ready, "r", 1) != 1)
		_exit(3);
	for (;;)
		pause();
}

/*
 * Copy-on-write on demand: FORKS children of a one-token sequence in a pool
 * of FORK_BS-token blocks (5.9 MiB each over 30 layers), all stepped one
 * token at once and aborted, again and again: every begin copies each
 * child's shared last block (~280 MiB).
 */
static void attack_forks(int ready)
{
	struct pkv_connect_opts co = { .socket_path = sock_path, .arena_bytes = 8 << 20, .timeout_ms = 10000 };
	struct pkv_pool_params p = { 0 };
	static uint32_t kids[FORKS], ones[FORKS];
	static int32_t toks[FORKS];
	struct pkv_client *c;
	struct tensors t;
	uint32_t seq, nc, one = 1;

	p.name = "forks";
	p.geo = (struct pkv_geometry){ L, H, KVH, HD, PKV_DTYPE_BF16, FORK_BS, FORKS + 8 };
	p.act_dtype = PKV_DTYPE_F32;
	p.model_id = 0x151;
	p.window_left = -1;
	if (pkv_connect(&co, &c) || pkv_pool_attach(c, &p) || tensors(c, &t, FORKS, H, KVH, HD))
		_exit(4);
	toks[0] = 7;
	if (pkv_seq_open(c, toks, 1, &seq, &nc) || pkv_step_begin(c, &seq, &one, toks, 1))
		_exit(5);
	for (uint32_t l = 0; l < L; l++)
		if (pkv_attend(c, l, t.q, t.k, t.v, t.o))
			_exit(5);
	if (pkv_step_end(c))
		_exit(5);
	for (int i = 0; i < FORKS; i++) {
		if (pkv_seq_fork(c, seq, &kids[i]))
			_exit(5);
		ones[i] = 1;
	}
	if (write(ready, "r", 1) != 1)
		_exit(3);
	for (;;)
		if (!pkv_step_begin(c, kids, ones, toks, FORKS))
			pkv_step_abort(c);
}

/* Connections that never say hello: as many as the daemon lets in, churned. */
static void attack_conns(int ready)
{
	static int fds[60000];
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct rlimit rl;
	int n = 0, signalled = 0;

	if (!getrlimit(RLIMIT_NOFILE, &rl)) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock_path);
	for (uint64_t i = 0;; i++) {
		int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

		if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof(a)) < 0) {
			close(s);
			s = -1;
		}
		if (s >= 0 && n < (int)(sizeof(fds) / sizeof(fds[0]))) {
			fds[n++] = s;
		} else {
			if (s >= 0)
				close(s);
			/* Full (here or there): churn the oldest half. */
			for (int k = 0; k < n / 2; k++)
				close(fds[k]);
			memmove(fds, fds + n / 2, (size_t)(n - n / 2) * sizeof(*fds));
			n -= n / 2;
			if (!signalled && write(ready, "r", 1) == 1)
				signalled = 1;
		}
		if (!signalled && i == 20000 && write(ready, "r", 1) == 1)
			signalled = 1;
	}
}

/*
 * Connects and hangs up at once, again and again: never more than one
 * connection before its hello, so no cap refuses it; each costs the daemon
 * a connection's whole life (accept, a session, the hang-up).
 */
static void attack_churn(int ready)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int signalled = 0;

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock_path);
	for (uint64_t i = 0;; i++) {
		int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

		if (s >= 0) {
			if (connect(s, (struct sockaddr *)&a, sizeof(a)))
				usleep(100); /* a full backlog: try again */
			close(s);
		}
		if (!signalled && i == 1000 && write(ready, "r", 1) == 1)
			signalled = 1;
	}
}

/*
 * Connects, says hello (a 1 MiB shared region) and hangs up, in a loop: each
 * costs the daemon a hello's work on the loop (the region mapped, checked,
 * unmapped) besides the connection's.
 */
static void attack_hello_churn(int ready)
{
	int signalled = 0;

	for (uint64_t i = 0;; i++) {
		struct pkv_client *c = client(1 << 20, NULL, 0, 0, 0, 0, 0);

		if (c)
			pkv_disconnect(c);
		else
			usleep(100); /* refused (a limit): try again */
		if (!signalled && i == 100 && write(ready, "r", 1) == 1)
			signalled = 1;
	}
}

/* Squats: the victim's pool name with another geometry, the budget, sequences and pins. */
static void attack_squat(int ready)
{
	struct pkv_client *held[96];
	int32_t toks[64];
	int n = 0;

	for (int i = 0; i < 64; i++)
		toks[i] = i;
	/* The victim's name, another geometry. */
	held[n] = client(1 << 20, "model", L, H, KVH, HD / 2, 64);
	n += held[n] != NULL;
	/* Pools of 256 MiB until refused. */
	for (int i = 0; i < 16 && n < 96; i++) {
		char name[32];

		snprintf(name, sizeof(name), "squat-%d", i);
		held[n] = client(1 << 20, name, L, H, KVH, HD, 690); /* 254 MiB */
		if (!held[n])
			break;
		n++;
	}
	/* Sequences over many connections, until refused everywhere. */
	while (n < 96) {
		struct pkv_client *c = client(1 << 20, "seqs", 2, 1, 1, 8, 4096);
		uint32_t seq, nc;

		if (!c)
			break;
		held[n++] = c;
		while (!pkv_seq_open(c, toks, 64, &seq, &nc))
			;
	}
	if (write(ready, "r", 1) != 1)
		_exit(3);
	for (;;)
		pause();
}

/*
 * Not an attack: one process of the other uid that only computes, never
 * talks to the daemon. The victim's tail behind plain competition for a
 * core, the floor for an attacker whose flood keeps one CPU busy.
 */
static void attack_hog(int ready)
{
	volatile uint64_t x = 0;

	if (write(ready, "r", 1) != 1)
		_exit(3);
	for (;;)
		x++;
}

/* ---------------------------------------------------------------- phases */

struct phase {
	const char *name;
	void (*attack)(int ready);
	int reference;               /* a yardstick, not an attack: outside worst_p99_ratio */
	int ran;                     /* not left out by --only */
	uint32_t steps;
	double p50_us, p99_us, ratio;
	int errors, hangs, alive, audit;
};

static int run_phase(struct phase *ph, double solo_p99)
{
	static uint64_t lat[MAX_SAMPLES];
	int vp[2], rp[2], st;
	pid_t atk = 0, vic;
	uint32_t n = 0;
	int32_t errors = 0;
	char c;

	if (pipe(vp) || pipe(rp))
		return -errno;
	if (ph->attack) {
		atk = fork();
		if (atk == 0) {
			close(rp[0]);
			setpgid(0, 0);
			if (distinct_uids && !strcmp(ph->name, "connection_flood")) {
				/* raise the descriptor limit while still allowed to */
				struct rlimit rl = { 65536, 65536 };

				setrlimit(RLIMIT_NOFILE, &rl);
			}
			become(UID_ATTACKER);
			signal(SIGPIPE, SIG_IGN);
			ph->attack(rp[1]);
			_exit(0);
		}
		setpgid(atk, atk);
		close(rp[1]);
		if (read(rp[0], &c, 1) != 1)
			fprintf(stderr, "pkv-bench isolation: attack %s did not start\n", ph->name);
		sleep_ms(300);
	} else {
		close(rp[1]);
	}
	vic = fork();
	if (vic == 0) {
		close(vp[0]);
		victim(vp[1]);
	}
	close(vp[1]);
	if (read(vp[0], &n, sizeof(n)) != sizeof(n))
		n = 0;
	if (n > MAX_SAMPLES)
		n = MAX_SAMPLES;   /* the count comes from another process: never past lat[] */
	for (size_t got = 0; got < n * sizeof(*lat);) {
		ssize_t r = read(vp[0], (char *)lat + got, n * sizeof(*lat) - got);

		if (r <= 0) {
			n = (uint32_t)(got / sizeof(*lat));
			break;
		}
		got += (size_t)r;
	}
	if (read(vp[0], &errors, sizeof(errors)) != sizeof(errors))
		errors = 1;
	close(vp[0]);
	close(rp[0]);
	waitpid(vic, &st, 0);
	if (atk > 0) {
		kill(-atk, SIGKILL);
		kill(atk, SIGKILL);
		waitpid(atk, &st, 0);
		/* its forked children (open flood) are in its process group */
		while (waitpid(-atk, &st, WNOHANG) > 0)
			;
	}
	ph->steps = n;
	ph->errors = errors > 0 ? errors : 0;
	ph->hangs = errors < 0;
	/* A step that took longer than the client's own timeout is a hang, even if it ended. */
	for (uint32_t i = 0; i < n; i++)
		ph->hangs += lat[i] > 10000000000ull;
	if (n) {
		qsort(lat, n, sizeof(*lat), cmp_u64);
		ph->p50_us = lat[n / 2] / 1e3;
		ph->p99_us = lat[(size_t)((n - 1) * 0.99)] / 1e3;
	}
	ph->ratio = solo_p99 > 0 ? ph->p99_us / solo_p99 : 0;
	ph->alive = daemon_alive();
	ph->audit = ph->alive ? audit_clean() : 0;
	return 0;
}

/* ---------------------------------------------------------------- main */

static int find(char *out, size_t len, const char *env, const char *const *cand, const char *self,
		const char *fallback)
{
	const char *e = getenv(env);

	if (e && *e) {
		snprintf(out, len, "%s", e);
		return access(out, X_OK);
	}
	for (int i = 0; cand[i]; i++) {
		snprintf(out, len, cand[i], self);
		if (!access(out, X_OK))
			return 0;
	}
	snprintf(out, len, "%s", fallback);
	return access(out, X_OK);
}

/* Whether name is one of the comma-separated names in list. */
static int listed(const char *list, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == '\0'))
			return 1;
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: pkv-bench isolation [--json] [--phase-s S] [--workers N] [--plugin-dir DIR]\n"
		   "                           [--daemon-arg ARG]... [--only CLASS[,CLASS]...]\n"
		   "  Starts a private pagedkvd (PKV_PAGEDKVD to pick the binary) and measures a victim\n"
		   "  uid's decode step latency alone, then while another uid runs each attack class.\n"
		   "  Classes: big_attend, wide_rows, open_flood, connection_flood, connection_churn, hello_churn, many_rings,\n"
		   "  fork_copies, quota_squat;\n"
		   "  cpu_hog (a reference, outside worst_p99_ratio): the other uid only computes.\n"
		   "  Needs root for two real uids (otherwise both run as the caller, said in the output).\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, NULL, 'j' }, { "phase-s", required_argument, NULL, 't' },
		{ "workers", required_argument, NULL, 'w' }, { "plugin-dir", required_argument, NULL, 'p' },
		{ "daemon-arg", required_argument, NULL, 'a' }, { "only", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	static const char *const dcand[] = { "%s/../daemon/pagedkvd", "%s/../../daemon/pagedkvd", NULL };
	static const char *const ccand[] = { "%s/pagedkvctl", "%s/../pagedkvctl", NULL };
	struct phase ph[] = {
		{ .name = "solo" }, { .name = "big_attend", .attack = attack_big },
		{ .name = "wide_rows", .attack = attack_wide },
		{ .name = "open_flood", .attack = attack_opens },
		{ .name = "connection_flood", .attack = attack_conns },
		{ .name = "connection_churn", .attack = attack_churn },
		{ .name = "hello_churn", .attack = attack_hello_churn },
		{ .name = "many_rings", .attack = attack_rings },
		{ .name = "fork_copies", .attack = attack_forks },
		{ .name = "quota_squat", .attack = attack_squat },
		{ .name = "cpu_hog", .attack = attack_hog, .reference = 1 },
	};
	char exe[PATH_MAX], self[2048];
	int crashes = 0, hangs = 0, audits_ok = 1, attacks = 0, c;
	const char *sep = "";
	double worst = 0;
	ssize_t n;

	signal(SIGPIPE, SIG_IGN);
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = 0;
	snprintf(self, sizeof(self), "%s", dirname(exe));
	snprintf(O.plugin_dir, sizeof(O.plugin_dir), "%s/../../plugins/cpu/.libs", self);
	if (access(O.plugin_dir, R_OK))
		snprintf(O.plugin_dir, sizeof(O.plugin_dir), "%s/../../../plugins/cpu/.libs", self);
	if (access(O.plugin_dir, R_OK))
		snprintf(O.plugin_dir, sizeof(O.plugin_dir), "%s", PKV_PLUGIN_DIR);
	snprintf(O.workers, sizeof(O.workers), "1");
	O.phase_s = 3;
	while ((c = getopt_long(argc, argv, "jt:w:p:a:o:h", lo, NULL)) != -1) {
		switch (c) {
		case 'j': O.json = 1; break;
		case 't': O.phase_s = atof(optarg); break;
		case 'w': snprintf(O.workers, sizeof(O.workers), "%u", (unsigned)atoi(optarg)); break;
		case 'p': snprintf(O.plugin_dir, sizeof(O.plugin_dir), "%s", optarg); break;
		case 'a':
			if (O.n_daemon_args < 8)
				O.daemon_args[O.n_daemon_args++] = optarg;
			break;
		case 'o': O.only = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (O.phase_s <= 0 || O.phase_s > 600) {
		fprintf(stderr, "pkv-bench isolation: --phase-s must be in (0, 600]\n");
		return 2;
	}
	/* Every name --only gives must be a class, once: a typo would otherwise measure nothing and pass. */
	if (O.only) {
		size_t names = 1, classes = 0;

		for (const char *p = O.only; *p; p++)
			names += *p == ',';
		for (size_t i = 1; i < sizeof(ph) / sizeof(ph[0]); i++)
			classes += listed(O.only, ph[i].name);
		if (classes != names) {
			fprintf(stderr, "pkv-bench isolation: --only %s: a name that is no class, or one twice\n",
				O.only);
			usage(stderr);
			return 2;
		}
	}
	if (find(O.daemon, sizeof(O.daemon), "PKV_PAGEDKVD", dcand, self, PKV_SBIN_DIR "/pagedkvd")) {
		fprintf(stderr, "pkv-bench isolation: pagedkvd not found (set PKV_PAGEDKVD)\n");
		return 1;
	}
	find(O.ctl, sizeof(O.ctl), "PKV_PAGEDKVCTL", ccand, self, PKV_BIN_DIR "/pagedkvctl");
	distinct_uids = geteuid() == 0;
	if (start_daemon()) {
		fprintf(stderr, "pkv-bench isolation: cannot start pagedkvd (%s)\n", O.daemon);
		stop_daemon();
		return 1;
	}
	for (size_t i = 0; i < sizeof(ph) / sizeof(ph[0]); i++) {
		if (i && O.only && !listed(O.only, ph[i].name)) {
			ph[i].alive = 1;
			ph[i].audit = 1;
			continue;
		}
		if (!daemon_alive()) {
			/* a crash ends the run: the next phases would measure a new daemon */
			ph[i].alive = 0;
			crashes++;
			break;
		}
		run_phase(&ph[i], i ? ph[0].p99_us : 0);
		ph[i].ran = 1;
		attacks += !ph[i].reference && i;
		crashes += !ph[i].alive;
		hangs += ph[i].hangs;
		audits_ok &= ph[i].audit == 1;
		if (i && !ph[i].reference && ph[i].ratio > worst)
			worst = ph[i].ratio;
		if (!O.json)
			printf("%-17s steps %6u  p50 %9.1f us  p99 %9.1f us  p99/solo %6.2f  errors %d  hang %d  "
			       "daemon %s  audit %s%s\n", ph[i].name, ph[i].steps, ph[i].p50_us, ph[i].p99_us,
			       i ? ph[i].ratio : 1.0, ph[i].errors, ph[i].hangs, ph[i].alive ? "up" : "DEAD",
			       ph[i].audit == 1 ? "clean" : ph[i].audit < 0 ? "n/a" : "DIRTY",
			       ph[i].reference ? "  (reference)" : "");
	}
	stop_daemon();
	if (O.json) {
		printf("{\"workers\":%s,\"phase_s\":%.1f,\"distinct_uids\":%s,\"phases\":[", O.workers, O.phase_s,
		       distinct_uids ? "true" : "false");
		for (size_t i = 0; i < sizeof(ph) / sizeof(ph[0]); i++) {
			if (!ph[i].ran)
				continue; /* left out by --only */
			printf("%s{\"name\":\"%s\",\"steps\":%u,\"p50_us\":%.1f,\"p99_us\":%.1f,\"p99_ratio\":%.2f,"
			       "\"victim_errors\":%d,\"hangs\":%d,\"daemon_alive\":%s,\"audit_clean\":%s,"
			       "\"reference\":%s}", sep,
			       ph[i].name, ph[i].steps, ph[i].p50_us, ph[i].p99_us, i ? ph[i].ratio : 1.0,
			       ph[i].errors, ph[i].hangs, ph[i].alive ? "true" : "false",
			       ph[i].audit == 1 ? "true" : ph[i].audit < 0 ? "null" : "false",
			       ph[i].reference ? "true" : "false");
			sep = ",";
		}
		/* No attack class measured (--only cpu_hog): nothing to meet or miss. */
		printf("],\"crashes\":%d,\"hangs\":%d,\"worst_p99_ratio\":%.2f,\"target_p99_ratio\":3,"
		       "\"target_met\":%s}\n", crashes, hangs, worst,
		       !attacks ? "null" : !crashes && !hangs && audits_ok && worst <= 3.0 ? "true" : "false");
	}
	return crashes || hangs ? 1 : 0;
}
