/* SPDX-License-Identifier: MIT */
/* pkv-bench ipc: ring round trips (hot/cold), no-op throughput, 30-layer step overhead, coalescing speedup (own and shared prompts). */
#include "config.h"
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "common/clock.h"
#include "loader/loader.h"
#include "bench_stats.h"
#include "pkv_paths.h"

/* SmolLM2-135M attention shape. */
#define L 30u
#define H 9u
#define KVH 3u
#define HD 64u
#define BS 16u
#define NBLK 256u
#define CTX 128u
/* The shared-prefix variant: a common system prompt of SYS tokens, then SOWN of each client's own. */
#define SYS 512u
#define SOWN 64u

struct opts {
	const char *socket;
	char plugin_dir[PATH_MAX];
	int json;
	int quick;
	char workers[16];  /* backend threads, daemon and in-process alike ("0": one per CPU) */
	const char *daemon_args[8]; /* extra pagedkvd arguments for private daemons */
	int n_daemon_args;
	int n_counts;       /* client counts for the coalescing comparison */
	int counts[8];
	int profile;        /* print CPU time and context switches per thread to stderr */
	int shared_only;    /* only the shared-prompt coalescing comparison */
	int step_only;      /* only the 30-layer steps */
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t pct(uint64_t *v, size_t n, double p)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return v[(size_t)(p * (double)(n - 1))];
}

/* ---------------------------------------------------------------- private daemon */

static char self_dir[2048];

static int find_exe(char *out, size_t len)
{
	const char *env = getenv("PKV_PAGEDKVD");
	const char *cand[] = { "%s/../daemon/pagedkvd", "%s/../../daemon/pagedkvd", NULL };

	if (env && *env) {
		snprintf(out, len, "%s", env);
		return access(out, X_OK);
	}
	for (int i = 0; cand[i]; i++) {
		snprintf(out, len, cand[i], self_dir);
		if (!access(out, X_OK))
			return 0;
	}
	snprintf(out, len, "%s/pagedkvd", PKV_SBIN_DIR);
	return access(out, X_OK);
}

struct priv {
	pid_t pid;
	char dir[64], sock[128];
};

static int start_daemon(struct priv *p, const struct opts *o, int coalesce)
{
	char exe[PATH_MAX];

	if (find_exe(exe, sizeof(exe))) {
		fprintf(stderr, "pkv-bench ipc: pagedkvd not found (set PKV_PAGEDKVD or give --socket)\n");
		return -ENOENT;
	}
	snprintf(p->dir, sizeof(p->dir), "/tmp/pkv-bench-XXXXXX");
	if (!mkdtemp(p->dir))
		return -errno;
	snprintf(p->sock, sizeof(p->sock), "%s/s", p->dir);
	p->pid = fork();
	if (p->pid == 0) {
		const char *lvl = getenv("PKV_BENCH_DAEMON_LOG");
		const char *argv[32] = { exe, "-f", "--socket", p->sock, "--plugin-dir", o->plugin_dir,
					 "--workers", o->workers, "--log-level", lvl ? lvl : "error" };
		int n = 10;

		if (!coalesce)
			argv[n++] = "--no-coalesce";
		for (int i = 0; i < o->n_daemon_args; i++)
			argv[n++] = o->daemon_args[i];
		argv[n] = NULL;
		execv(exe, (char *const *)argv);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		struct pkv_connect_opts co = { .socket_path = p->sock, .timeout_ms = 1000 };
		struct pkv_client *c;
		struct timespec ts = { 0, 10000000 };

		if (!pkv_connect(&co, &c)) {
			pkv_disconnect(c);
			return 0;
		}
		if (waitpid(p->pid, NULL, WNOHANG) == p->pid)
			return -ECHILD;
		nanosleep(&ts, NULL);
	}
	return -ETIMEDOUT;
}

static void stop_daemon(struct priv *p)
{
	char lock[160];

	if (p->pid > 0) {
		kill(p->pid, SIGTERM);
		waitpid(p->pid, NULL, 0);
	}
	snprintf(lock, sizeof(lock), "%s.lock", p->sock);
	unlink(lock);
	unlink(p->sock);
	rmdir(p->dir);
}

/* Prints every daemon thread's CPU time and context switches (the --profile diagnosis). */
static void profile_daemon(pid_t pid, const char *tag)
{
	long hz = sysconf(_SC_CLK_TCK);

	for (int tid = pid, i = 0; i < 4096; i++, tid++) {
		char path[96], buf[1024], *p;
		unsigned long ut = 0, st = 0, vol = 0, invol = 0;
		char comm[32] = "?";
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, tid);
		if (!(f = fopen(path, "r")))
			continue;
		if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')'))) {
			char *q = strchr(buf, '(');

			if (q && p - q - 1 < (long)sizeof(comm)) {
				memcpy(comm, q + 1, (size_t)(p - q - 1));
				comm[p - q - 1] = 0;
			}
			sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
		}
		fclose(f);
		snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid, tid);
		if ((f = fopen(path, "r"))) {
			while (fgets(buf, sizeof(buf), f)) {
				sscanf(buf, "voluntary_ctxt_switches: %lu", &vol);
				sscanf(buf, "nonvoluntary_ctxt_switches: %lu", &invol);
			}
			fclose(f);
		}
		fprintf(stderr, "profile %s daemon %s (%d): cpu %.0f ms, csw %lu voluntary %lu not\n", tag, comm, tid,
			(double)(ut + st) * 1000.0 / (double)hz, vol, invol);
	}
}

/* ---------------------------------------------------------------- clients */

/* A client of pool `name` created with `flags` (PKV_POOL_*), or only connected when name is NULL. */
static struct pkv_client *bench_client_pool(const char *sock, uint32_t spin_us, const char *name, uint32_t flags)
{
	struct pkv_connect_opts co = { .socket_path = sock, .arena_bytes = 8 << 20, .timeout_ms = 10000,
				       .spin_us = spin_us };
	struct pkv_pool_params p = { 0 };
	struct pkv_client *c;
	int r = pkv_connect(&co, &c);

	if (r) {
		fprintf(stderr, "pkv-bench ipc: connect %s: %s\n", sock, pkv_strerror(r));
		return NULL;
	}
	if (!name)
		return c;
	p.name = name;
	p.flags = flags;
	p.geo = (struct pkv_geometry){ L, H, KVH, HD, PKV_DTYPE_BF16, BS, NBLK };
	p.act_dtype = PKV_DTYPE_F32;
	p.model_id = 0x5e1f;
	p.window_left = -1;
	r = pkv_pool_attach(c, &p);
	if (r) {
		fprintf(stderr, "pkv-bench ipc: attach: %s: %s\n", pkv_strerror(r), pkv_last_error(c));
		pkv_disconnect(c);
		return NULL;
	}
	return c;
}

static struct pkv_client *bench_client(const char *sock, uint32_t spin_us, int attach)
{
	return bench_client_pool(sock, spin_us, attach ? "bench-ipc" : NULL, 0);
}

/* A client of a pool whose clients attend themselves; NULL (and why) when the backend does not load here. */
static struct pkv_client *client_attn_client(const char *sock, const struct opts *o)
{
	struct pkv_client *c;
	struct pkv_stats st = PKV_STATS_INIT;

	/* the backend the reference loads: the same file as the daemon's */
	if (!getenv("PAGEDKV_PLUGIN_DIR") || !*getenv("PAGEDKV_PLUGIN_DIR"))
		setenv("PAGEDKV_PLUGIN_DIR", o->plugin_dir, 1);
	c = bench_client_pool(sock, 1000000, "bench-ipc-ca", PKV_POOL_CLIENT_ATTENTION);
	if (c && (pkv_stats(c, &st) || !st.attention_in_client)) {
		fprintf(stderr, "pkv-bench ipc: no client attention: %s\n", pkv_last_error(c));
		pkv_disconnect(c);
		c = NULL;
	}
	return c;
}

struct tensors {
	float *q, *k, *v, *o;
};

static int alloc_tensors(struct pkv_client *c, struct tensors *t, uint32_t rows)
{
	t->q = pkv_alloc(c, (size_t)rows * H * HD * 4);
	t->o = pkv_alloc(c, (size_t)rows * H * HD * 4);
	t->k = pkv_alloc(c, (size_t)rows * KVH * HD * 4);
	t->v = pkv_alloc(c, (size_t)rows * KVH * HD * 4);
	if (!t->q || !t->o || !t->k || !t->v)
		return -ENOMEM;
	for (size_t i = 0; i < (size_t)rows * H * HD; i++)
		t->q[i] = sinf((float)i * 0.01f);
	for (size_t i = 0; i < (size_t)rows * KVH * HD; i++) {
		t->k[i] = cosf((float)i * 0.013f);
		t->v[i] = sinf((float)i * 0.017f);
	}
	return 0;
}

/*
 * Opens a sequence of ctx - 1 tokens and prefills it, leaving one decode
 * position. Tokens are the client's own (seed), or with shared the first SYS
 * are the same for every client (a chat app's system prompt): the daemon's
 * prefix-share table then hands every client the same blocks for them.
 */
static int prefill_ctx(struct pkv_client *c, int32_t seed, int shared, uint32_t ctx, uint32_t *seq, uint32_t *cached)
{
	int32_t toks[SYS + SOWN];
	uint32_t nc, n = ctx - 1;
	struct tensors t;
	int r;

	for (uint32_t i = 0; i < ctx; i++)
		toks[i] = shared && i < SYS ? 7 + (int32_t)i : seed * 1000 + (int32_t)i;
	r = pkv_seq_open(c, toks, n, seq, &nc);
	if (r || alloc_tensors(c, &t, n))
		return r ? r : -ENOMEM;
	if (cached)
		*cached = nc;
	n -= nc;
	r = pkv_step_begin(c, seq, &n, toks + nc, 1);
	for (uint32_t l = 0; !r && l < L; l++)
		r = pkv_attend(c, l, t.q, t.k, t.v, t.o);
	if (!r)
		r = pkv_step_end(c);
	pkv_free(c, t.q);
	pkv_free(c, t.k);
	pkv_free(c, t.v);
	pkv_free(c, t.o);
	return r;
}

static int prefill(struct pkv_client *c, int32_t seed, uint32_t *seq)
{
	return prefill_ctx(c, seed, 0, CTX, seq, NULL);
}

/* ---------------------------------------------------------------- measurements */

/* Coalescing pairs per client count, and of how many alternated runs (each this many steps per client). */
#define COAL_PAIRS 7
#define COAL_STEPS 150

struct coal_pair {
	double on, off;        /* medians of the runs, tokens per second */
	double speedup, lo, hi; /* median, least and greatest of the pairs' on / off */
	int pairs;
};

struct results {
	uint64_t noop_hot_p50, noop_hot_p99, noop_cold_p50, attend_hot_p50;
	double noop_ops, step_daemon_us, step_inproc_us, step_overhead_pct;
	int have_step_client;
	double step_client_us, step_client_overhead_pct;  /* the same steps in a client-attention pool */
	double step_client_bound_us;                       /* ... of which its begin and end round trips */
	int coal_head, coal_sh_head; /* the count that gives the headline figure (8 clients if measured) */
	struct coal_pair coal[8];
	struct coal_pair coal_sh[8];
	int coal_sh_unshared;  /* clients that found less than the system prompt cached */
	int have_step, have_coal, have_coal_sh;
};

static int bench_noop(const char *sock, const struct opts *o, struct results *res)
{
	size_t n_hot = o->quick ? 2000 : 50000, n_cold = o->quick ? 50 : 400;
	uint64_t *v = malloc(sizeof(uint64_t) * n_hot), t0;
	struct pkv_client *c = bench_client(sock, 1000000, 0);
	long total = o->quick ? 20000 : 2000000;
	int r = 0;

	if (!c || !v)
		return -ENOMEM;
	for (size_t i = 0; i < 2000; i++)
		pkv_nop(c);
	for (size_t i = 0; i < n_hot && !r; i++) {
		t0 = pkv_now_ns();
		r = pkv_nop(c);
		v[i] = pkv_now_ns() - t0;
	}
	res->noop_hot_p99 = pct(v, n_hot, 0.99);
	res->noop_hot_p50 = pct(v, n_hot, 0.50);
	/* Cold: the daemon has gone to sleep (idle well past its spin window) before each op. */
	for (size_t i = 0; i < n_cold && !r; i++) {
		struct timespec ts = { 0, 2000000 };

		nanosleep(&ts, NULL);
		t0 = pkv_now_ns();
		r = pkv_nop(c);
		v[i] = pkv_now_ns() - t0;
	}
	res->noop_cold_p50 = pct(v, n_cold, 0.50);
	/* Throughput with batching: 64 in flight per batch. */
	t0 = pkv_now_ns();
	for (long done = 0; done < total && !r; done += 64) {
		uint64_t tk[64];

		for (int i = 0; i < 64 && !r; i++)
			r = pkv_nop_async(c, &tk[i]);
		for (int i = 0; i < 64 && !r; i++)
			r = pkv_wait(c, tk[i]);
	}
	res->noop_ops = (double)total / ((double)(pkv_now_ns() - t0) / 1e9);
	pkv_disconnect(c);
	free(v);
	return r;
}

static int bench_attend(const char *sock, const struct opts *o, struct results *res)
{
	size_t n = o->quick ? 300 : 5000;
	uint64_t *v = malloc(sizeof(uint64_t) * n), t0;
	struct pkv_client *c = bench_client(sock, 1000000, 1);
	int32_t tok = 7;
	uint32_t seq, one = 1;
	struct tensors t;
	int r;

	if (!c || !v)
		return -ENOMEM;
	r = prefill(c, 1, &seq);
	if (!r)
		r = alloc_tensors(c, &t, 1);
	/* One decode step kept open: every attend appends the same slot (ctx 128) and attends. */
	if (!r)
		r = pkv_step_begin(c, &seq, &one, &tok, 1);
	for (size_t i = 0; i < 200 && !r; i++)
		r = pkv_attend(c, 0, t.q, t.k, t.v, t.o);
	for (size_t i = 0; i < n && !r; i++) {
		t0 = pkv_now_ns();
		r = pkv_attend(c, (uint32_t)(i % L), t.q, t.k, t.v, t.o);
		v[i] = pkv_now_ns() - t0;
	}
	if (!r)
		r = pkv_step_abort(c);
	res->attend_hot_p50 = pct(v, n, 0.5);
	if (r)
		fprintf(stderr, "pkv-bench ipc: attend: %s (%s)\n", pkv_strerror(r), pkv_last_error(c));
	pkv_disconnect(c);
	free(v);
	return r;
}

/* The same 30 decode attends called in-process through the loader, no daemon, no rings. */
struct inproc {
	struct pkv_host *host;
	struct pkv_plugin plug;
	struct pkv_dispatch d;
	struct pkv_attn_batch b;
	int32_t cu_q[2], cu_k[2], bt[CTX / BS], csl[1];
	int64_t slot[1];
	float *q, *k, *v, *out;
	int loaded, opened;
};

static void inproc_close(struct inproc *ip)
{
	if (ip->opened)
		pkv_dispatch_close(&ip->d);
	if (ip->loaded)
		pkv_plugin_unload(&ip->plug);
	if (ip->host)
		pkv_host_destroy(ip->host);
	free(ip->q);
	free(ip->k);
	free(ip->v);
	free(ip->out);
	memset(ip, 0, sizeof(*ip));
}

static int inproc_open(const struct opts *o, struct inproc *ip)
{
	struct pkv_pool_desc desc = { PKV_BACKEND_ABI_VERSION, sizeof(desc),
				      { L, H, KVH, HD, PKV_DTYPE_BF16, BS, NBLK }, PKV_DTYPE_F32 };
	struct pkv_attn_batch *b = &ip->b;
	char err[512];
	int r;

	memset(ip, 0, sizeof(*ip));
	ip->q = calloc(H * HD, 4);
	ip->k = calloc(KVH * HD, 4);
	ip->v = calloc(KVH * HD, 4);
	ip->out = calloc(H * HD, 4);
	if (!ip->q || !ip->k || !ip->v || !ip->out) {
		inproc_close(ip);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < CTX / BS; i++)
		ip->bt[i] = (int32_t)i;
	for (size_t i = 0; i < H * HD; i++)
		ip->q[i] = sinf((float)i * 0.01f);
	r = pkv_host_create((unsigned)atoi(o->workers), PKV_LOG_ERROR, &ip->host);
	if (!r) {
		r = pkv_plugin_load("cpu", NULL, o->plugin_dir, NULL, ip->host, &ip->plug, err, sizeof(err));
		ip->loaded = !r;
		if (!r) {
			r = pkv_dispatch_open(&ip->d, &ip->plug, &ip->plug, &desc, err, sizeof(err));
			ip->opened = !r;
		}
		if (r)
			fprintf(stderr, "pkv-bench ipc: in-process reference: %s\n", err);
	}
	if (r) {
		inproc_close(ip);
		return r;
	}
	ip->cu_q[1] = 1;
	ip->cu_k[1] = CTX;
	ip->csl[0] = CTX - 1;
	ip->slot[0] = CTX - 1;
	memset(b, 0, sizeof(*b));
	b->abi_version = PKV_BACKEND_ABI_VERSION;
	b->struct_size = sizeof(*b);
	b->num_seqs = 1;
	b->total_q = 1;
	b->act_dtype = PKV_DTYPE_F32;
	b->q = ip->q;
	b->k_new = ip->k;
	b->v_new = ip->v;
	b->o = ip->out;
	b->q_stride_tok = b->o_stride_tok = H * HD;
	b->q_stride_head = b->o_stride_head = HD;
	b->kv_stride_tok = KVH * HD;
	b->kv_stride_head = HD;
	b->cu_seq_lens_q = ip->cu_q;
	b->cu_seq_lens_k = ip->cu_k;
	b->max_length_q = 1;
	b->max_length_k = CTX;
	b->block_tables = ip->bt;
	b->max_blocks_per_seq = CTX / BS;
	b->cache_seqlens = ip->csl;
	b->slot_mapping = ip->slot;
	b->window_left = -1;
	for (int w = 0; w < 20 && !r; w++)
		r = pkv_dispatch_attend(&ip->d, b);
	if (r)
		inproc_close(ip);
	return r;
}

static int inproc_step(struct inproc *ip, uint64_t *ns)
{
	uint64_t t0 = pkv_now_ns();
	int r = 0;

	for (uint32_t l = 0; l < L && !r; l++) {
		ip->b.layer = l;
		r = pkv_dispatch_attend(&ip->d, &ip->b);
	}
	*ns = pkv_now_ns() - t0;
	return r;
}

/*
 * One 30-layer decode step at ctx 128 through the daemon, opened and aborted
 * so the context stays 128; *bound_ns (may be NULL): the begin's and the
 * abort's round trips together.
 */
static int daemon_step_split(struct pkv_client *c, uint32_t seq, const struct tensors *t, uint64_t *ns,
			     uint64_t *bound_ns)
{
	uint64_t t0 = pkv_now_ns(), t1, t2;
	int32_t tok = 7;
	uint32_t one = 1;
	int r = pkv_step_begin(c, &seq, &one, &tok, 1);

	t1 = pkv_now_ns();
	for (uint32_t l = 0; l < L && !r; l++)
		r = pkv_attend(c, l, t->q, t->k, t->v, t->o);
	t2 = pkv_now_ns();
	if (!r)
		r = pkv_step_abort(c);
	*ns = pkv_now_ns() - t0;
	if (bound_ns)
		*bound_ns = *ns - (t2 - t1);
	return r;
}

static int daemon_step(struct pkv_client *c, uint32_t seq, const struct tensors *t, uint64_t *ns)
{
	return daemon_step_split(c, seq, t, ns, NULL);
}

/*
 * 30-layer decode steps through the daemon against the same steps
 * in-process, in alternating rounds: the host time-slices this machine's
 * vCPUs for seconds at a time, and a reference measured a minute apart
 * read 327-501 us between runs. The overhead is the median of the rounds'
 * ratios (each round's medians), the step times the medians of the rounds'.
 */
#define STEP_ROUNDS 10

static int bench_step30(const char *sock, const struct opts *o, struct results *res)
{
	size_t per = o->quick ? 5 : 20;
	double dm[STEP_ROUNDS], im[STEP_ROUNDS], cm[STEP_ROUNDS], ratio[STEP_ROUNDS], cratio[STEP_ROUNDS];
	double cbm[STEP_ROUNDS];
	uint64_t *dv = malloc(sizeof(uint64_t) * per), *iv = malloc(sizeof(uint64_t) * per), ns;
	uint64_t *cv = malloc(sizeof(uint64_t) * per), *cb = malloc(sizeof(uint64_t) * per);
	struct pkv_client *c = bench_client(sock, 1000000, 1), *cc = NULL;
	struct inproc ip;
	struct tensors t, ct;
	uint32_t seq, cseq;
	int r = -ENOMEM;

	if (!c || !dv || !iv || !cv || !cb)
		goto out;
	r = prefill(c, 1, &seq);
	if (!r)
		r = alloc_tensors(c, &t, 1);
	if (!r)
		r = inproc_open(o, &ip);
	if (r)
		goto out;
	/* A third arm where it can run: the same steps attended in this process over the daemon's pool. */
	cc = client_attn_client(sock, o);
	if (cc && (prefill(cc, 1, &cseq) || alloc_tensors(cc, &ct, 1))) {
		pkv_disconnect(cc);
		cc = NULL;
	}
	for (int w = 0; w < 5 && !r; w++)
		r = daemon_step(c, seq, &t, &ns);
	for (int w = 0; cc && w < 5 && !r; w++)
		r = daemon_step(cc, cseq, &ct, &ns);
	for (int k = 0; k < STEP_ROUNDS && !r; k++) {
		for (size_t s = 0; s < per && !r; s++)
			r = daemon_step(c, seq, &t, &dv[s]);
		for (size_t s = 0; s < per && !r; s++)
			r = inproc_step(&ip, &iv[s]);
		for (size_t s = 0; cc && s < per && !r; s++)
			r = daemon_step_split(cc, cseq, &ct, &cv[s], &cb[s]);
		dm[k] = (double)pct(dv, per, 0.5) / 1000.0;
		im[k] = (double)pct(iv, per, 0.5) / 1000.0;
		cm[k] = cc ? (double)pct(cv, per, 0.5) / 1000.0 : 0;
		cbm[k] = cc ? (double)pct(cb, per, 0.5) / 1000.0 : 0;
		ratio[k] = dm[k] / im[k];
		cratio[k] = cm[k] / im[k];
	}
	inproc_close(&ip);
	if (!r) {
		res->step_overhead_pct = 100.0 * (bench_median(ratio, STEP_ROUNDS) - 1.0);
		res->step_daemon_us = bench_median(dm, STEP_ROUNDS);
		res->step_inproc_us = bench_median(im, STEP_ROUNDS);
		res->have_step_client = cc != NULL;
		res->step_client_overhead_pct = 100.0 * (bench_median(cratio, STEP_ROUNDS) - 1.0);
		res->step_client_us = bench_median(cm, STEP_ROUNDS);
		res->step_client_bound_us = bench_median(cbm, STEP_ROUNDS);
	}
out:
	if (r)
		fprintf(stderr, "pkv-bench ipc: 30-layer steps: %s (%s)\n", pkv_strerror(r), c ? pkv_last_error(c) : "");
	if (c)
		pkv_disconnect(c);
	if (cc)
		pkv_disconnect(cc);
	free(dv);
	free(iv);
	free(cv);
	free(cb);
	return r;
}

/* 8 decoding client processes; returns aggregate decode tokens/s, or < 0. */
/*
 * n_clients processes decode in lockstep (one step = 30 attends, aborted so
 * the context stays). Each prefills its context first: its own 128 tokens,
 * or (shared) the common SYS-token prompt plus SOWN of its own, prefilled one
 * client after the other so that every client after the first finds the
 * prompt's blocks in the prefix-share table. *unshared (shared only): how
 * many clients found less than the prompt cached.
 */
static double decode_clients(const char *sock, int n_clients, int steps, int profile, int shared, int *unshared)
{
	int go[2], done[2];
	pid_t pids[16];
	uint64_t t0, t1;
	char ch;

	if (pipe(go) || pipe(done))
		return -1;
	for (int i = 0; i < n_clients; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			struct pkv_client *c = bench_client(sock, 5, 1);
			uint32_t seq, one = 1;
			int32_t tok = 5;
			struct tensors t;
			uint32_t nc = 0;
			int r = c ? prefill_ctx(c, 100 + i, shared, shared ? SYS + SOWN : CTX, &seq, &nc) : -1;

			if (!r)
				r = alloc_tensors(c, &t, 1);
			/* 'r' ready, 'u' ready but the shared prompt was not (all) found cached. */
			ch = r ? 'x' : shared && i > 0 && nc < SYS ? 'u' : 'r';
			if (write(done[1], &ch, 1) != 1 || read(go[0], &ch, 1) != 1)
				_exit(1);
			for (int s = 0; s < steps && !r; s++) {
				r = pkv_step_begin(c, &seq, &one, &tok, 1);
				for (uint32_t l = 0; l < L && !r; l++)
					r = pkv_attend(c, l, t.q, t.k, t.v, t.o);
				if (!r)
					r = pkv_step_abort(c); /* context stays 128 */
			}
			if (profile) {
				struct pkv_stats st = PKV_STATS_INIT;
				struct rusage ru;
				double n;

				getrusage(RUSAGE_SELF, &ru);
				if (pkv_stats(c, &st))
					memset(&st, 0, sizeof(st));
				n = st.attends ? (double)st.attends : 1;
				/* Per attend: as the client waited, the daemon held it, the backend ran it (its share). */
				fprintf(stderr,
					"profile client %d: cpu %.0f ms, csw %ld voluntary %ld not; per attend wait %.1f us, "
					"daemon %.1f, backend %.1f, slept %.2f\n",
					i,
					(double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
						(double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3,
					ru.ru_nvcsw, ru.ru_nivcsw, (double)st.attend_wait_ns / n / 1e3,
					(double)st.attend_daemon_ns / n / 1e3, (double)st.attend_backend_ns / n / 1e3,
					(double)st.client_sleeps / n);
			}
			ch = r ? 'x' : 'd';
			if (write(done[1], &ch, 1) != 1)
				_exit(1);
			pkv_disconnect(c);
			_exit(r ? 1 : 0);
		}
		/* Shared: the next client opens only once this one's prompt is in the cache. */
		if (shared) {
			if (read(done[0], &ch, 1) != 1 || (ch != 'r' && ch != 'u')) {
				n_clients = i + 1;
				goto fail;
			}
			*unshared += ch == 'u';
		}
	}
	for (int i = 0; i < n_clients && !shared; i++)
		if (read(done[0], &ch, 1) != 1 || ch != 'r')
			goto fail;
	t0 = pkv_now_ns();
	for (int i = 0; i < n_clients; i++)
		if (write(go[1], "g", 1) != 1)
			goto fail;
	for (int i = 0; i < n_clients; i++)
		if (read(done[0], &ch, 1) != 1 || ch != 'd')
			goto fail;
	t1 = pkv_now_ns();
	for (int i = 0; i < n_clients; i++)
		waitpid(pids[i], NULL, 0);
	close(go[0]);
	close(go[1]);
	close(done[0]);
	close(done[1]);
	return (double)n_clients * steps / ((double)(t1 - t0) / 1e9);
fail:
	for (int i = 0; i < n_clients; i++) {
		kill(pids[i], SIGKILL);
		waitpid(pids[i], NULL, 0);
	}
	return -1;
}

/*
 * For each client count: two private daemons, coalescing on and off, each
 * warmed by one run, then measured in alternating pairs (on first in even
 * pairs, off first in odd ones: the machine drifts within a pair too). A
 * run lasts a fraction of a second and its rate moves by 2-3x from one run
 * to the next here (other tenants of the host), so the speedup is the
 * median of the pairs' ratios, not a ratio of medians taken minutes apart.
 * shared: the clients share a system prompt (decode_clients), the figures
 * go to coal_sh*.
 */
static int bench_coalesce(const struct opts *o, struct results *res, int shared)
{
	int steps = o->quick ? 5 : COAL_STEPS, pairs = o->quick ? 1 : COAL_PAIRS, ret = 0;
	struct coal_pair *out = shared ? res->coal_sh : res->coal;

	for (int c = 0; c < o->n_counts && !ret; c++) {
		double on[COAL_PAIRS], off[COAL_PAIRS], ratio[COAL_PAIRS];
		struct priv d[2] = { 0 }; /* [mode]: 1 coalescing, 0 not */
		int warm_unshared = 0; /* the warm-up runs find nothing cached yet: not counted */
		char tag[32];

		if (start_daemon(&d[1], o, 1) || start_daemon(&d[0], o, 0) ||
		    decode_clients(d[1].sock, o->counts[c], steps, 0, shared, &warm_unshared) < 0 ||
		    decode_clients(d[0].sock, o->counts[c], steps, 0, shared, &warm_unshared) < 0) {
			ret = -1;
			goto next;
		}
		for (int r = 0; r < pairs; r++)
			for (int k = 0; k < 2; k++) {
				int mode = (r + k) % 2 == 0;
				/* --profile: the clients of the last pair (the daemons' totals follow). */
				double tps = decode_clients(d[mode].sock, o->counts[c], steps,
							    o->profile && r == pairs - 1, shared, &res->coal_sh_unshared);

				if (tps < 0) {
					ret = -1;
					goto next;
				}
				(mode ? on : off)[r] = tps;
			}
		for (int r = 0; r < pairs; r++)
			ratio[r] = on[r] / off[r];
		out[c].speedup = bench_median(ratio, (size_t)pairs);
		out[c].lo = ratio[0];
		out[c].hi = ratio[pairs - 1];
		out[c].on = bench_median(on, (size_t)pairs);
		out[c].off = bench_median(off, (size_t)pairs);
		out[c].pairs = pairs;
		if (o->profile)
			for (int mode = 1; mode >= 0; mode--) {
				snprintf(tag, sizeof(tag), "%dc-%s%s", o->counts[c], shared ? "shared-" : "",
					 mode ? "on" : "off");
				profile_daemon(d[mode].pid, tag);
			}
next:
		for (int mode = 0; mode < 2; mode++)
			if (d[mode].pid > 0)
				stop_daemon(&d[mode]);
	}
	if (ret)
		return ret;
	/* The headline figure is the 8-client one (the last count when 8 is not asked for). */
	for (int c = 0; c < o->n_counts; c++)
		if (c == o->n_counts - 1 || o->counts[c] == 8) {
			*(shared ? &res->coal_sh_head : &res->coal_head) = c;
			break;
		}
	return 0;
}

/* The headline keys of one comparison: "<key>_speedup" and its companions. */
static void print_coal_json(const char *key, const struct coal_pair *p, int clients)
{
	printf("\"%s_speedup\":%.3f,\"%s_speedup_min\":%.3f,\"%s_speedup_max\":%.3f,\"%s_on_tok_per_s\":%.1f,"
	       "\"%s_off_tok_per_s\":%.1f,\"%s_clients\":%d,\"%s_pairs\":%d,",
	       key, p->speedup, key, p->lo, key, p->hi, key, p->on, key, p->off, key, clients, key, p->pairs);
}

static void print_coal_by_clients(const char *key, const struct coal_pair *p, const struct opts *o)
{
	printf("\"%s_by_clients\":[", key);
	for (int i = 0; i < o->n_counts; i++)
		printf("%s{\"clients\":%d,\"speedup\":%.3f,\"speedup_min\":%.3f,\"speedup_max\":%.3f,"
		       "\"on_tok_per_s\":%.1f,\"off_tok_per_s\":%.1f}",
		       i ? "," : "", o->counts[i], p[i].speedup, p[i].lo, p[i].hi, p[i].on, p[i].off);
	printf("]");
}

static void usage(FILE *f)
{
	fprintf(f, "usage: pkv-bench ipc [--json] [--socket PATH] [--plugin-dir DIR] [--workers N]\n"
		   "                     [--daemon-arg ARG]... [--quick] [--clients N,N...] [--profile] [--shared-only]\n"
		   "                     [--step-only]\n"
		   "  --clients: decoding client counts for the coalescing comparison (default 8).\n"
		   "  --profile: CPU time and context switches of every daemon thread and client, to stderr.\n"
		   "  --shared-only: only the coalescing comparison of clients sharing a system prompt.\n"
		   "  --step-only: only the 30-layer step figure (step30_*; for profiling the daemon).\n"
		   "  step30_*: 30-layer decode steps through the daemon and the same calls in-process,\n"
		   "    10 alternating rounds; the overhead is the median of the rounds' ratios.\n"
		   "  Without --socket (or $PAGEDKV_SOCKET) a private pagedkvd is started.\n"
		   "  The coalescing comparison always uses two private daemons (on, off), alternated in\n"
		   "    7 pairs of runs; coalesce*_speedup is the median of the pairs' ratios.\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, NULL, 'j' }, { "socket", required_argument, NULL, 's' },
		{ "plugin-dir", required_argument, NULL, 'p' }, { "quick", no_argument, NULL, 'q' },
		{ "workers", required_argument, NULL, 'w' },
		{ "daemon-arg", required_argument, NULL, 'a' },
		{ "clients", required_argument, NULL, 'c' }, { "profile", no_argument, NULL, 'P' },
		{ "shared-only", no_argument, NULL, 'S' }, { "step-only", no_argument, NULL, 'O' },
		{ "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 }
	};
	struct opts o = { 0 };
	struct results res = { 0 };
	struct priv priv = { 0 };
	double load[1];
	char exe[PATH_MAX];
	const char *sock;
	ssize_t n;
	int c;

	signal(SIGPIPE, SIG_IGN);
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = 0;
	snprintf(self_dir, sizeof(self_dir), "%s", dirname(exe));
	/* Build tree first (plugins/cpu/.libs beside src/tools/.libs), then the install. */
	snprintf(o.plugin_dir, sizeof(o.plugin_dir), "%s/../../plugins/cpu/.libs", self_dir);
	if (access(o.plugin_dir, R_OK))
		snprintf(o.plugin_dir, sizeof(o.plugin_dir), "%s/../../../plugins/cpu/.libs", self_dir);
	if (access(o.plugin_dir, R_OK))
		snprintf(o.plugin_dir, sizeof(o.plugin_dir), "%s", PKV_PLUGIN_DIR);
	o.socket = getenv("PAGEDKV_SOCKET");
	snprintf(o.workers, sizeof(o.workers), "0");
	while ((c = getopt_long(argc, argv, "js:p:qw:a:c:PSOh", lo, NULL)) != -1) {
		switch (c) {
		case 'j': o.json = 1; break;
		case 's': o.socket = optarg; break;
		case 'p': snprintf(o.plugin_dir, sizeof(o.plugin_dir), "%s", optarg); break;
		case 'q': o.quick = 1; break;
		case 'w': snprintf(o.workers, sizeof(o.workers), "%u", (unsigned)atoi(optarg)); break;
		case 'a':
			if (o.n_daemon_args == 8) {
				fprintf(stderr, "pkv-bench ipc: at most 8 --daemon-arg\n");
				return 2;
			}
			o.daemon_args[o.n_daemon_args++] = optarg;
			break;
		case 'c':
			o.n_counts = 0;
			for (char *t = strtok(optarg, ","); t && o.n_counts < 8; t = strtok(NULL, ",")) {
				int v = atoi(t);

				if (v < 1 || v > 16) {
					fprintf(stderr, "pkv-bench ipc: --clients takes counts 1..16\n");
					return 2;
				}
				o.counts[o.n_counts++] = v;
			}
			break;
		case 'P': o.profile = 1; break;
		case 'S': o.shared_only = 1; break;
		case 'O': o.step_only = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!o.n_counts)
		o.counts[o.n_counts++] = 8;
	if (o.shared_only) {
		res.have_coal_sh = !bench_coalesce(&o, &res, 1);
		goto report;
	}
	sock = o.socket;
	if (!sock) {
		if (start_daemon(&priv, &o, 1)) {
			fprintf(stderr, "pkv-bench ipc: cannot start a private daemon\n");
			return 1;
		}
		sock = priv.sock;
	}
	if (!o.step_only && (bench_noop(sock, &o, &res) || bench_attend(sock, &o, &res))) {
		stop_daemon(&priv);
		return 1;
	}
	res.have_step = !bench_step30(sock, &o, &res);
	if (priv.pid)
		stop_daemon(&priv);
	if (!o.step_only) {
		res.have_coal = !bench_coalesce(&o, &res, 0);
		res.have_coal_sh = !bench_coalesce(&o, &res, 1);
	}
report:
	if (getloadavg(load, 1) != 1)
		load[0] = -1;
	if (o.json) {
		printf("{\"loadavg_1m\":%.2f,", load[0]);
		if (!o.shared_only && !o.step_only)
			printf("\"noop_rtt_hot_ns_p50\":%llu,\"noop_rtt_hot_ns_p99\":%llu,\"noop_rtt_cold_ns_p50\":%llu,"
			       "\"attend_rtt_hot_ns_p50\":%llu,\"noop_ops_per_s\":%.0f,",
			       (unsigned long long)res.noop_hot_p50, (unsigned long long)res.noop_hot_p99,
			       (unsigned long long)res.noop_cold_p50, (unsigned long long)res.attend_hot_p50, res.noop_ops);
		if (o.shared_only)
			;
		else if (res.have_step) {
			printf("\"step30_overhead_pct\":%.2f,\"step30_daemon_us\":%.1f,\"step30_inproc_us\":%.1f,",
			       res.step_overhead_pct, res.step_daemon_us, res.step_inproc_us);
			if (res.have_step_client)
				printf("\"step30_client_attn_overhead_pct\":%.2f,\"step30_client_attn_us\":%.1f,"
				       "\"step30_client_attn_begin_end_us\":%.1f,",
				       res.step_client_overhead_pct, res.step_client_us, res.step_client_bound_us);
		} else
			printf("\"step30_overhead_pct\":null,");
		if (res.have_coal) {
			print_coal_json("coalesce", &res.coal[res.coal_head], o.counts[res.coal_head]);
			print_coal_by_clients("coalesce", res.coal, &o);
			printf(",");
		} else if (!o.shared_only && !o.step_only)
			printf("\"coalesce_speedup\":null,");
		if (res.have_coal_sh) {
			print_coal_json("coalesce_shared", &res.coal_sh[res.coal_sh_head], o.counts[res.coal_sh_head]);
			printf("\"coalesce_shared_prompt_tokens\":%u,\"coalesce_shared_own_tokens\":%u,"
			       "\"coalesce_shared_unshared_clients\":%d,",
			       SYS, SOWN, res.coal_sh_unshared);
			print_coal_by_clients("coalesce_shared", res.coal_sh, &o);
			printf("}\n");
		} else if (!o.step_only)
			printf("\"coalesce_shared_speedup\":null}\n");
		else
			printf("\"step_only\":true}\n");
		return 0;
	}
	printf("pkv-bench ipc (%s daemon; SmolLM2-135M attention shape, ctx %u; load average %.1f)\n",
	       o.socket ? "given" : "private", CTX, load[0]);
	if (o.shared_only)
		goto shared;
	if (o.step_only)
		goto step;
	printf("  no-op round trip, hot:   p50 %llu ns, p99 %llu ns   (target p50 <= 1000 ns)\n",
	       (unsigned long long)res.noop_hot_p50, (unsigned long long)res.noop_hot_p99);
	printf("  no-op round trip, cold:  p50 %llu ns               (target <= 30000 ns)\n",
	       (unsigned long long)res.noop_cold_p50);
	printf("  attend round trip, hot:  p50 %llu ns (decode, 1 seq, ctx %u)\n",
	       (unsigned long long)res.attend_hot_p50, CTX);
	printf("  no-op ops/s, batches of 64: %.0f          (target >= 1000000)\n", res.noop_ops);
step:
	if (res.have_step)
		printf("  30-layer decode step: %.1f us via daemon, %.1f us in-process: overhead %.1f%% (target <= 5%%)\n",
		       res.step_daemon_us, res.step_inproc_us, res.step_overhead_pct);
	if (res.have_step && res.have_step_client)
		printf("  same, client-attention pool: %.1f us: overhead %.1f%% (begin and end: %.1f us)\n",
		       res.step_client_us, res.step_client_overhead_pct, res.step_client_bound_us);
	for (int i = 0; res.have_coal && i < o.n_counts; i++)
		printf("  %d decoding clients: %.0f tok/s coalesced, %.0f tok/s not: speedup %.2fx (%.2f-%.2f)\n",
		       o.counts[i], res.coal[i].on, res.coal[i].off, res.coal[i].speedup, res.coal[i].lo, res.coal[i].hi);
shared:
	for (int i = 0; res.have_coal_sh && i < o.n_counts; i++)
		printf("  %d decoding clients, %u-token shared prompt + %u own: %.0f tok/s coalesced, %.0f tok/s not: "
		       "speedup %.2fx (%.2f-%.2f)\n", o.counts[i], SYS, SOWN, res.coal_sh[i].on, res.coal_sh[i].off,
		       res.coal_sh[i].speedup, res.coal_sh[i].lo, res.coal_sh[i].hi);
	if (res.have_coal_sh && res.coal_sh_unshared)
		printf("  (%d clients found less than the shared prompt cached)\n", res.coal_sh_unshared);
	return 0;
}
