/* SPDX-License-Identifier: MIT */
/* pkv-bench tier: disk tier spill/fetch bandwidth against a plain O_DIRECT loop, start-up with 1M blocks, open latency. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <liburing.h>
#include <pagedkv/pagedkv.h>
#include "common/msg.h"
#include "common/proto.h"
#include "tier/tier.h"
#include "bench_stats.h"

struct opts {
	const char *dir;
	uint32_t blocks, batch, qd, runs;
	uint32_t startup_blocks;
	const char *daemon, *plugin_dir, *startup_dir;
	int json;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void rm_rf(const char *path)
{
	char cmd[4300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
	if (system(cmd))
		fprintf(stderr, "pkv-bench tier: could not remove %s\n", path);
}

/* SmolLM2-135M's block: 30 layers, 3 KV heads of 64, f16, 16 tokens = 360 KiB of K and V. */
static const struct pkv_tier_fp SMOL = { .model_id = 0x534d4f4c, .num_layers = 30, .num_kv_heads = 3,
					 .head_dim = 64, .cache_dtype = PKV_DTYPE_F16, .block_size = 16 };

/* splitmix64: keys as uniform as the XXH3-128 keys the cache makes. */
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static struct pkv_key key_of(uint32_t chain, uint32_t i)
{
	uint64_t s = ((uint64_t)chain << 32) | i;

	return (struct pkv_key){ mix(s), mix(s ^ 0x5555555555555555ull) };
}

static const struct pkv_key NS = { 0x1111, 0x2222 };

static struct pkv_tier *open_tier(const char *dir, unsigned qd, char *why, size_t len)
{
	struct pkv_tier_config cfg = { .dir = dir, .budget = 1ull << 40, .uid_share = 100, .queue_depth = qd };
	struct pkv_tier *t;

	return pkv_tier_open(&cfg, &t, why, len) ? NULL : t;
}

/* Spills n blocks as chains of `batch`; returns seconds from the first copy to the last write done. */
static double spill_n(struct pkv_tier *t, int cls, const struct pkv_tier_fp *fp, uint32_t n, uint32_t batch,
		      uint32_t base)
{
	size_t kvb = pkv_tier_kv_bytes(fp);
	int32_t tok[4096];
	double t0 = now_s();

	for (uint32_t i = 0; i < n; i++) {
		uint32_t ch = base + i / batch, j = i % batch;
		struct pkv_tier_block b = { key_of(ch, j), j ? key_of(ch, j - 1) : NS, NS, 1000, tok };
		void *kv;
		int r;

		for (uint32_t k = 0; k < fp->block_size; k++)
			tok[k] = (int32_t)(ch * 131 + j * fp->block_size + k);
		/* A full staging area: wait for the tier thread, as a busy loop would see it. */
		while ((r = pkv_tier_spill_begin(t, cls, &b, &kv)) == -EAGAIN)
			pkv_tier_wait_io(t);
		if (r)
			continue;
		memset(kv, (int)(i & 0xff), kvb);
		pkv_tier_spill_commit(t, kv);
	}
	pkv_tier_drain(t);
	return now_s() - t0;
}

/* The daemon's pool as write-behind sees it: 64 blocks' KV that the tier thread copies from. */
#define POOL_SRC 64u
static uint8_t *pool_src;

static void copy_src(void *ud, int32_t tag, void *kv)
{
	size_t kvb = pkv_tier_kv_bytes(&SMOL);

	(void)ud;
	memcpy(kv, pool_src + (size_t)(tag % POOL_SRC) * kvb, kvb);
}

/*
 * The daemon's path under LRU pressure (write-behind): blocks are queued
 * and the tier thread copies, seals and writes them; the caller copies
 * nothing. Seconds from the first queued block to the last write done.
 */
static double spill_behind_n(struct pkv_tier *t, int cls, uint32_t n, uint32_t batch, uint32_t base)
{
	int32_t tok[16];
	double t0 = now_s();

	for (uint32_t i = 0; i < n; i++) {
		uint32_t ch = base + i / batch, j = i % batch;
		struct pkv_tier_block b = { key_of(ch, j), j ? key_of(ch, j - 1) : NS, NS, 1000, tok };
		int r;

		for (uint32_t k = 0; k < 16; k++)
			tok[k] = (int32_t)(ch * 131 + j * 16 + k);
		/* Write-behind takes half the staging at most: wait for the tier thread, as eviction would. */
		while ((r = pkv_tier_spill_later(t, cls, &b, copy_src, NULL, (int32_t)i)) == -EAGAIN)
			pkv_tier_wait_io(t);
	}
	pkv_tier_drain(t);
	return now_s() - t0;
}

/* Fetches the chains written by spill_n, one submission per chain; returns seconds, *got blocks served. */
static double fetch_n(struct pkv_tier *t, int cls, const struct pkv_tier_fp *fp, uint32_t n, uint32_t batch,
		      uint32_t base, uint64_t *got)
{
	struct pkv_key *keys = malloc(batch * sizeof(*keys));
	int32_t *tok = malloc((size_t)batch * fp->block_size * sizeof(*tok));
	double t0 = now_s();

	*got = 0;
	for (uint32_t c = 0; keys && tok && c < n / batch; c++) {
		struct pkv_tier_fetch *f;
		int r;

		for (uint32_t j = 0; j < batch; j++) {
			keys[j] = key_of(base + c, j);
			for (uint32_t k = 0; k < fp->block_size; k++)
				tok[j * fp->block_size + k] = (int32_t)((base + c) * 131 + j * fp->block_size + k);
		}
		r = pkv_tier_fetch(t, cls, 0, NS, NS, keys, tok, batch, 60000, &f);
		if (r > 0)
			*got += (uint64_t)r;
		pkv_tier_fetch_done(t, f);
	}
	free(keys);
	free(tok);
	return now_s() - t0;
}

/*
 * The reference: the same bytes, written then read sequentially with
 * O_DIRECT through io_uring at the same queue depth and request size, on
 * the same filesystem. Returns seconds for write and read.
 */
static int ref_loop(const char *dir, size_t rec, uint32_t n, unsigned qd, double *w_s, double *r_s)
{
	char path[4300];
	struct io_uring ring;
	struct iovec iov;
	uint8_t *buf;
	int fd, r = -1;

	snprintf(path, sizeof(path), "%s/reference.dat", dir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
	if (fd < 0)
		fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (posix_memalign((void **)&buf, 4096, rec * qd)) {
		close(fd);
		return -ENOMEM;
	}
	memset(buf, 0x5a, rec * qd);
	if (io_uring_queue_init(2 * qd, &ring, 0))
		goto out;
	iov = (struct iovec){ buf, rec * qd };
	io_uring_register_buffers(&ring, &iov, 1);
	for (int pass = 0; pass < 2; pass++) {
		uint32_t sub = 0, done = 0, infl = 0;
		double t0 = now_s();

		while (done < n) {
			struct io_uring_cqe *cqe;

			while (infl < qd && sub < n) {
				struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
				uint8_t *b = buf + (sub % qd) * rec;

				if (pass == 0)
					io_uring_prep_write_fixed(sqe, fd, b, rec, (uint64_t)sub * rec, 0);
				else
					io_uring_prep_read_fixed(sqe, fd, b, rec, (uint64_t)sub * rec, 0);
				sub++;
				infl++;
			}
			io_uring_submit_and_wait(&ring, 1);
			while (!io_uring_peek_cqe(&ring, &cqe)) {
				if (cqe->res < 0) {
					fprintf(stderr, "pkv-bench tier: reference I/O: %s\n", strerror(-cqe->res));
					io_uring_cqe_seen(&ring, cqe);
					goto out_ring;
				}
				io_uring_cqe_seen(&ring, cqe);
				infl--;
				done++;
			}
		}
		*(pass ? r_s : w_s) = now_s() - t0;
	}
	r = 0;
out_ring:
	io_uring_queue_exit(&ring);
out:
	free(buf);
	close(fd);
	unlink(path);
	return r;
}

struct bw {
	double spill_gbps, fetch_gbps, ref_w_gbps, ref_r_gbps, behind_gbps, ratio_spill, ratio_behind;
	double dev_w_gbps, dev_r_gbps;
	int direct;
};

static int bench_bandwidth(const struct opts *o, struct bw *res)
{
	double sp[16], fe[16], rw[16], rr[16], dw[16], dr[16], sb[16], qs[16], qb[16];
	char dir[4200], why[256];
	uint32_t runs = o->runs;   /* 1..16: main refuses more */
	size_t rec;

	for (uint32_t r = 0; r < runs; r++) {
		struct pkv_tier_stats st;
		struct pkv_tier *t;
		uint64_t got;
		double ws = 0, rs = 0, ws0 = 0, rs0 = 0, s_s, f_s;
		int cls;

		snprintf(dir, sizeof(dir), "%s/bw", o->dir);
		rm_rf(dir);
		t = open_tier(dir, o->qd, why, sizeof(why));
		if (!t) {
			fprintf(stderr, "pkv-bench tier: %s\n", why);
			return -1;
		}
		cls = pkv_tier_class(t, &SMOL);
		if (cls < 0)
			return -1;
		/* A record: 256-byte header, 16 token ids, the KV, padded to 4 KiB (src/tier/tier_int.h). */
		if (ref_loop(o->dir, (pkv_tier_kv_bytes(&SMOL) + 256 + 64 + 4095) / 4096 * 4096, o->blocks,
			     o->qd, &ws0, &rs0))
			return -1;
		s_s = spill_n(t, cls, &SMOL, o->blocks, o->batch, 0);
		f_s = fetch_n(t, cls, &SMOL, o->blocks, o->batch, 0, &got);
		pkv_tier_stats(t, &st);
		rec = st.blocks ? st.bytes / st.blocks : 0;
		res->direct = st.direct;
		if (st.blocks != o->blocks || got != (uint64_t)(o->blocks / o->batch) * o->batch) {
			fprintf(stderr, "pkv-bench tier: %llu of %u blocks stored, %llu fetched\n",
				(unsigned long long)st.blocks, o->blocks, (unsigned long long)got);
			pkv_tier_close(t);
			return -1;
		}
		sp[r] = (double)rec * o->blocks / s_s / 1e9;
		fe[r] = (double)rec * (double)got / f_s / 1e9;
		dw[r] = st.write_ns ? (double)st.write_bytes / (double)st.write_ns : 0;
		dr[r] = st.read_ns ? (double)st.read_bytes / (double)st.read_ns : 0;
		sb[r] = (double)rec * o->blocks / spill_behind_n(t, cls, o->blocks, o->batch, 1u << 20) / 1e9;
		pkv_tier_close(t);
		if (ref_loop(dir, rec, o->blocks, o->qd, &ws, &rs))
			return -1;
		/*
		 * The device's speed drifts within a run (a VM's disk): the reference
		 * runs before and after the tier and the faster of the two counts.
		 */
		rw[r] = (double)rec * o->blocks / (ws < ws0 ? ws : ws0) / 1e9;
		rr[r] = (double)rec * o->blocks / (rs < rs0 ? rs : rs0) / 1e9;
		qs[r] = sp[r] / rw[r];
		qb[r] = sb[r] / rw[r];
		fprintf(stderr, "run %u: spill %.2f GB/s, write-behind %.2f (reference write %.2f), fetch %.2f GB/s (reference read %.2f)\n",
			r, sp[r], sb[r], rw[r], fe[r], rr[r]);
		rm_rf(dir);
	}
	res->spill_gbps = bench_median(sp, runs);
	res->behind_gbps = bench_median(sb, runs);
	res->ratio_spill = bench_median(qs, runs);
	res->ratio_behind = bench_median(qb, runs);
	res->fetch_gbps = bench_median(fe, runs);
	res->ref_w_gbps = bench_median(rw, runs);
	res->ref_r_gbps = bench_median(rr, runs);
	res->dev_w_gbps = bench_median(dw, runs);
	res->dev_r_gbps = bench_median(dr, runs);
	return 0;
}

static long rss_bytes(void)
{
	long pages = 0, res = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &res) != 2)
			res = 0;
		fclose(f);
	}
	return res * sysconf(_SC_PAGESIZE);
}

struct startup {
	uint32_t blocks;
	double open_s, fill_s;
	double index_bytes_per_block, rss_bytes_per_block;
};

/* Fills a tier with n one-page records, then times reopening it (index rebuilt from the entries). */
static int bench_startup(const struct opts *o, struct startup *res)
{
	/* The smallest record: one layer, one KV head of 16, f32, 16 tokens -> 4 KiB on disk. */
	static const struct pkv_tier_fp tiny = { .model_id = 7, .num_layers = 1, .num_kv_heads = 1,
						 .head_dim = 16, .cache_dtype = PKV_DTYPE_F32, .block_size = 16 };
	double opens[5];
	char dir[4200], why[256];
	struct pkv_tier_stats st;
	struct pkv_tier *t;
	int cls;

	snprintf(dir, sizeof(dir), "%s", o->startup_dir ? o->startup_dir : o->dir);
	if (!o->startup_dir)
		snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/startup");
	t = open_tier(dir, o->qd, why, sizeof(why));
	if (!t || (cls = pkv_tier_class(t, &tiny)) < 0) {
		fprintf(stderr, "pkv-bench tier: %s\n", why);
		return -1;
	}
	pkv_tier_stats(t, &st);
	/* A kept directory (--startup-dir) that already holds the blocks is reused as it is. */
	if (st.blocks != o->startup_blocks) {
		pkv_tier_close(t);
		rm_rf(dir);
		t = open_tier(dir, o->qd, why, sizeof(why));
		if (!t || (cls = pkv_tier_class(t, &tiny)) < 0)
			return -1;
		fprintf(stderr, "filling a tier with %u blocks...\n", o->startup_blocks);
		res->fill_s = spill_n(t, cls, &tiny, o->startup_blocks, 64, 1u << 20);
	}
	pkv_tier_close(t);
	for (int i = 0; i < 5; i++) {
		long rss0 = rss_bytes();
		double t0 = now_s();

		t = open_tier(dir, o->qd, why, sizeof(why));
		opens[i] = now_s() - t0;
		if (!t)
			return -1;
		pkv_tier_stats(t, &st);
		res->blocks = (uint32_t)st.blocks;
		res->index_bytes_per_block = st.blocks ? (double)pkv_tier_index_bytes(t) / (double)st.blocks : 0;
		res->rss_bytes_per_block = st.blocks ? (double)(rss_bytes() - rss0) / (double)st.blocks : 0;
		pkv_tier_close(t);
	}
	res->open_s = bench_median(opens, 5);
	if (!o->startup_dir)
		rm_rf(dir);
	return res->blocks == o->startup_blocks ? 0 : -1;
}

/* ---- open of a 546-token prefix through a real pagedkvd: cold, RAM-warm, disk-warm */

#define PREFIX 546u
#define PREFIX_BLOCKS ((PREFIX - 1) / 16)   /* whole blocks a lookup of it can find */

struct opens {
	double cold_ms, ram_ms, disk_ms, flush_ms, attach_ms;
	double cold_open_ms, ram_open_ms, disk_open_ms, flush_open_ms, attach_open_ms;
	uint32_t cold_cached, ram_cached, disk_cached, flush_cached, attach_cached;
	/* BURST conversations opening the prompt at once from disk: the slowest's times, blocks read. */
	double burst_ms, burst_open_ms, burst_blocks;
	uint32_t burst_fewest_cached;
};

#define BURST 8u

/* The daemon's anonymous memory (its pools), from /proc, in bytes; -1 if unreadable. */
static long rss_anon(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssAnon: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb < 0 ? -1 : kb * 1024;
}

static pid_t start_daemon(const struct opts *o, const char *sock, const char *tdir)
{
	pid_t pid = fork();

	if (pid == 0) {
		execl(o->daemon, o->daemon, "-f", "--socket", sock, "--disk-cache", tdir, "--backend", "cpu",
		      "--plugin-dir", o->plugin_dir, "--log-level", "warn", "--memory-budget", "1G",
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; pid > 0 && i < 500; i++) {
		struct pkv_connect_opts co = { .socket_path = sock, .arena_bytes = 1 << 20, .timeout_ms = 2000 };
		struct pkv_client *c;

		if (!pkv_connect(&co, &c)) {
			pkv_disconnect(c);
			return pid;
		}
		usleep(10000);
	}
	return -1;
}

/* A control command; its output (NUL-terminated, the caller frees it) when out is given. */
static int ctl_run(const char *sock, uint32_t cmd, uint32_t fmt, char **out)
{
	struct pkv_msg_hello h = { { PKV_MSG_HELLO, sizeof(h) }, PKV_PROTO_VERSION, PKV_ROLE_CTL, 0 };
	struct pkv_msg_ctl m = { { PKV_MSG_CTL, sizeof(m) }, cmd, fmt };
	struct pkv_msg_reply rep;
	int s = pkv_sock_connect(sock, 5000), r = -EPROTO, status = 0;
	char *buf = NULL;
	size_t n = 0;

	if (s < 0)
		return s;
	if (pkv_msg_send(s, &h, sizeof(h), NULL, 0) ||
	    pkv_msg_recv(s, &rep, sizeof(rep), NULL, 0, NULL, 5000) < (ssize_t)PKV_REPLY_HDR_SIZE || rep.status ||
	    pkv_msg_send(s, &m, sizeof(m), NULL, 0))
		goto out;
	r = pkv_recv_output(s, 60000, &buf, &n, &status);
	if (!r)
		r = status;
	if (!r && out) {
		*out = realloc(buf, n + 1);
		if (!*out)
			r = -ENOMEM;
		else
			(*out)[n] = 0;
		buf = NULL;
	}
out:
	free(buf);
	close(s);
	return r;
}

/* pagedkvctl flush: RAM drops every cached block (each one spilled) and answers once they are on disk. */
static int ctl_flush(const char *sock)
{
	return ctl_run(sock, PKV_CTL_FLUSH, PKV_FMT_TEXT, NULL);
}

/* Blocks the daemon's disk tier has served so far (status "hits"); -1 if unknown. */
static long tier_hits(const char *sock)
{
	char *st = NULL, *h;
	long n = -1;

	if (!ctl_run(sock, PKV_CTL_STATUS, PKV_FMT_JSON, &st) && (h = strstr(st, "\"disk_tier\":{")) &&
	    (h = strstr(h, "\"hits\":")))
		n = strtol(h + 7, NULL, 10);
	free(st);
	return n;
}

static void stop_daemon(pid_t pid)
{
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
}

/* The benchmark's pool: SmolLM2-135M's shape, 1024 blocks (360 MiB). */
#define SMOL_POOL_BYTES (30ull * 2 * 1024 * 16 * 3 * 64 * 2)

static int attach_smol(const char *sock, size_t arena, struct pkv_client **c)
{
	struct pkv_connect_opts co = { .socket_path = sock, .arena_bytes = arena, .timeout_ms = 60000 };
	struct pkv_pool_params pp = { .name = "smol", .geo = { 30, 9, 3, 64, PKV_DTYPE_F16, 16, 1024 },
				      .act_dtype = PKV_DTYPE_F32, .model_id = 0x534d4f4c, .window_left = -1 };

	if (pkv_connect(&co, c))
		return -1;
	if (pkv_pool_attach(*c, &pp)) {
		pkv_disconnect(*c);
		return -1;
	}
	return 0;
}

/* One conversation's first step: open the prompt, compute what is not cached through every layer. */
static int open_and_prefill(const char *sock, const int32_t *tok, double *ms, double *open_ms, uint32_t *n_cached)
{
	struct pkv_client *c;
	uint32_t seq, k;
	float *q, *kk, *v, *out;
	double t0;
	int r;

	if (attach_smol(sock, 256 << 20, &c))
		return -1;
	r = 0;
	q = pkv_alloc(c, (size_t)PREFIX * 9 * 64 * 4);
	kk = pkv_alloc(c, (size_t)PREFIX * 3 * 64 * 4);
	v = pkv_alloc(c, (size_t)PREFIX * 3 * 64 * 4);
	out = pkv_alloc(c, (size_t)PREFIX * 9 * 64 * 4);
	if (r || !q || !kk || !v || !out) {
		pkv_disconnect(c);
		return -1;
	}
	for (size_t i = 0; i < (size_t)PREFIX * 9 * 64; i++)
		q[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
	for (size_t i = 0; i < (size_t)PREFIX * 3 * 64; i++) {
		kk[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
		v[i] = (float)((i * 9973u) % 1000) * 1e-3f - 0.5f;
	}
	/* Timed: what a client waits for before its first logits, less the model's own matmuls. */
	t0 = now_s();
	r = pkv_seq_open(c, tok, PREFIX, &seq, n_cached);
	*open_ms = (now_s() - t0) * 1e3;
	k = PREFIX - *n_cached;
	if (!r)
		r = pkv_step_begin(c, &seq, &k, tok + *n_cached, 1);
	for (uint32_t l = 0; !r && l < 30; l++)
		r = pkv_attend(c, l, q, kk, v, out);
	if (!r)
		r = pkv_step_end(c);
	*ms = (now_s() - t0) * 1e3;
	pkv_disconnect(c);
	return r;
}

/*
 * BURST processes open and prefill the prompt at once while only the disk
 * holds it (a chat app's conversations behind one system prompt after a
 * restart): the slowest one's times, and how many blocks the disk served
 * for all of them.
 */
static int open_burst(const char *sock, const int32_t *tok, struct opens *res)
{
	struct { int r; uint32_t cached; double ms, open_ms; } got;
	int go[2], done[2], r = 0;
	long hits0 = tier_hits(sock), hits1;
	pid_t kids[BURST];
	char ch = 'g';

	if (hits0 < 0 || pipe(go))
		return -1;
	if (pipe(done)) {
		close(go[0]);
		close(go[1]);
		return -1;
	}
	for (uint32_t i = 0; i < BURST; i++) {
		kids[i] = fork();
		if (kids[i] == 0) {
			got.r = read(go[0], &ch, 1) == 1 ? open_and_prefill(sock, tok, &got.ms, &got.open_ms, &got.cached)
							 : -1;
			_exit(write(done[1], &got, sizeof(got)) == (ssize_t)sizeof(got) ? 0 : 1);
		}
		if (kids[i] < 0)
			r = -1;
	}
	res->burst_ms = res->burst_open_ms = 0;
	res->burst_fewest_cached = PREFIX;
	for (uint32_t i = 0; i < BURST; i++)
		if (kids[i] > 0 && write(go[1], &ch, 1) != 1)
			r = -1;
	for (uint32_t i = 0; i < BURST; i++) {
		if (kids[i] <= 0)
			continue;
		if (read(done[0], &got, sizeof(got)) != (ssize_t)sizeof(got) || got.r)
			r = -1;
		else {
			res->burst_ms = got.ms > res->burst_ms ? got.ms : res->burst_ms;
			res->burst_open_ms = got.open_ms > res->burst_open_ms ? got.open_ms : res->burst_open_ms;
			if (got.cached < res->burst_fewest_cached)
				res->burst_fewest_cached = got.cached;
		}
	}
	for (uint32_t i = 0; i < BURST; i++)
		if (kids[i] > 0)
			waitpid(kids[i], NULL, 0);
	close(go[0]);
	close(go[1]);
	close(done[0]);
	close(done[1]);
	hits1 = tier_hits(sock);
	if (hits1 < hits0)
		return -1;
	res->burst_blocks = (double)(hits1 - hits0);
	return r;
}

/*
 * A restarted daemon whose pool an engine attached at its start (as vLLM
 * allocates its KV pool before serving): the conversation comes once the
 * pool's memory is faulted in (the daemon's anonymous memory grew by the
 * pool's size, at most 60 s).
 */
static int restarted_pool_ready(const struct opts *o, const char *sock, const char *tdir, const int32_t *tok,
				double *ms, double *open_ms, uint32_t *cached)
{
	struct pkv_client *engine;
	pid_t pid = start_daemon(o, sock, tdir);
	long rss0;
	int r = -1;

	if (pid < 0)
		return -1;
	rss0 = rss_anon(pid);
	if (attach_smol(sock, 1 << 20, &engine))
		fprintf(stderr, "pkv-bench tier: the engine's attach after the restart failed\n");
	else {
		for (int i = 0; i < 6000 && rss_anon(pid) - rss0 < (long)(SMOL_POOL_BYTES * 98 / 100); i++)
			usleep(10000);
		r = open_and_prefill(sock, tok, ms, open_ms, cached);
		pkv_disconnect(engine);
	}
	stop_daemon(pid);
	return r;
}

static int bench_opens_once(const struct opts *o, struct opens *res)
{
	char sock[4200], tdir[4200];
	int32_t tok[PREFIX];
	pid_t pid;
	int r;

	snprintf(sock, sizeof(sock), "%s/pagedkv.sock", o->dir);
	snprintf(tdir, sizeof(tdir), "%s/opens", o->dir);
	rm_rf(tdir);
	for (uint32_t i = 0; i < PREFIX; i++)
		tok[i] = (int32_t)((i * 7919u) % 49152u);
	pid = start_daemon(o, sock, tdir);
	if (pid < 0)
		return -1;
	r = open_and_prefill(sock, tok, &res->cold_ms, &res->cold_open_ms, &res->cold_cached);
	if (!r)
		r = open_and_prefill(sock, tok, &res->ram_ms, &res->ram_open_ms, &res->ram_cached);
	/* Disk only, same daemon: the pool's memory is already faulted in. */
	if (!r)
		r = ctl_flush(sock);
	if (!r)
		r = open_and_prefill(sock, tok, &res->flush_ms, &res->flush_open_ms, &res->flush_cached);
	if (!r)
		r = ctl_flush(sock);
	if (!r)
		r = open_burst(sock, tok, res);
	/* A restart: the prompt's blocks now exist on disk only (spilled again at shutdown: already there). */
	stop_daemon(pid);
	if (!r)
		r = restarted_pool_ready(o, sock, tdir, tok, &res->disk_ms, &res->disk_open_ms, &res->disk_cached);
	/* Worst case: the conversation's own attach creates the pool, whose memory is still being faulted in. */
	if (!r) {
		pid = start_daemon(o, sock, tdir);
		r = pid < 0 ? -1 : open_and_prefill(sock, tok, &res->attach_ms, &res->attach_open_ms,
						    &res->attach_cached);
		if (pid > 0)
			stop_daemon(pid);
	}
	if (r)
		fprintf(stderr, "pkv-bench tier: cached cold %u, RAM %u, flushed %u, restarted %u, at attach %u\n",
			res->cold_cached, res->ram_cached, res->flush_cached, res->disk_cached, res->attach_cached);
	rm_rf(tdir);
	return r;
}

/* Medians over o->runs rounds of every figure (n_cached from the last round: they never vary). */
static int bench_opens(const struct opts *o, struct opens *res)
{
	enum { F = 13 };
	double v[F][16];
	uint32_t runs = o->runs;   /* 1..16: main refuses more */

	for (uint32_t i = 0; i < runs; i++) {
		double *f[F] = { &res->cold_ms, &res->ram_ms, &res->disk_ms, &res->flush_ms, &res->attach_ms,
				 &res->cold_open_ms, &res->ram_open_ms, &res->disk_open_ms, &res->flush_open_ms,
				 &res->attach_open_ms, &res->burst_ms, &res->burst_open_ms, &res->burst_blocks };

		if (bench_opens_once(o, res)) {
			fprintf(stderr, "pkv-bench tier: the 546-token opens failed (round %u)\n", i);
			return -1;
		}
		for (int k = 0; k < F; k++)
			v[k][i] = *f[k];
		if (i + 1 == runs)
			for (int k = 0; k < F; k++)
				*f[k] = bench_median(v[k], runs);
	}
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: pkv-bench tier [--json] [--dir DIR] [--blocks N] [--batch N] [--qd N] [--runs N]\n"
		   "                      [--startup-blocks N] [--daemon PATH --plugin-dir DIR]\n"
		   "  --dir DIR            where the tier files go (default $TMPDIR or /var/tmp); removed after\n"
		   "  --blocks N           SmolLM2-135M blocks (360 KiB) spilled and fetched per run (default 1024)\n"
		   "  --batch N            blocks per fetch submission (default 64)\n"
		   "  --qd N               I/O queue depth of the tier and of the reference loop (default 64)\n"
		   "  --runs N             rounds, each figure their median (1..16, default 3)\n"
		   "  --startup-blocks N   blocks on disk for the start-up figure (default 1000000; 0 = skip)\n"
		   "  --startup-dir DIR    keep (and reuse) the start-up tier there instead of refilling it\n"
		   "  --daemon PATH        pagedkvd for the 546-token open figure (with --plugin-dir: the cpu backend)\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, NULL, 'j' }, { "dir", required_argument, NULL, 'd' },
		{ "blocks", required_argument, NULL, 'b' }, { "batch", required_argument, NULL, 'B' },
		{ "qd", required_argument, NULL, 'q' }, { "runs", required_argument, NULL, 'r' },
		{ "startup-blocks", required_argument, NULL, 's' }, { "daemon", required_argument, NULL, 'D' },
		{ "plugin-dir", required_argument, NULL, 'P' }, { "help", no_argument, NULL, 'h' },
		{ "startup-dir", required_argument, NULL, 'S' },
		{ NULL, 0, NULL, 0 }
	};
	struct opts o = { .blocks = 1024, .batch = 64, .qd = 64, .runs = 3, .startup_blocks = 1000000 };
	char base[4096];
	struct bw bw = { 0 };
	struct startup su = { 0 };
	struct opens op = { 0 };
	int c, have_su = 0, have_op = 0;

	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'j': o.json = 1; break;
		case 'd': o.dir = optarg; break;
		case 'b': o.blocks = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'B': o.batch = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'q': o.qd = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'r': o.runs = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 's': o.startup_blocks = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'D': o.daemon = optarg; break;
		case 'P': o.plugin_dir = optarg; break;
		case 'S': o.startup_dir = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!o.batch || !o.qd || !o.runs || o.blocks < o.batch || o.batch > 4096) {
		usage(stderr);
		return 2;
	}
	if (o.runs > 16) {
		fprintf(stderr, "pkv-bench tier: --runs takes 1..16\n");
		return 2;
	}
	snprintf(base, sizeof(base), "%s/pkv-bench-tier.XXXXXX",
		 o.dir ? o.dir : getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp");
	if (!mkdtemp(base)) {
		fprintf(stderr, "pkv-bench tier: %s: %s\n", base, strerror(errno));
		return 1;
	}
	o.dir = base;
	pool_src = malloc((size_t)POOL_SRC * pkv_tier_kv_bytes(&SMOL));
	if (!pool_src)
		return 1;
	for (size_t i = 0; i < (size_t)POOL_SRC * pkv_tier_kv_bytes(&SMOL); i++)
		pool_src[i] = (uint8_t)(i * 2654435761u >> 13);
	if (bench_bandwidth(&o, &bw)) {
		rm_rf(base);
		return 1;
	}
	if (o.startup_blocks)
		have_su = !bench_startup(&o, &su);
	if (o.daemon && o.plugin_dir)
		have_op = !bench_opens(&o, &op);
	rm_rf(base);
	free(pool_src);

	if (o.json) {
		printf("{\"bench\":\"tier\",\"block_bytes\":%llu,\"blocks\":%u,\"batch\":%u,\"queue_depth\":%u,"
		       "\"runs\":%u,\"o_direct\":%s,\"spill_gbps\":%.3f,\"fetch_gbps\":%.3f,"
		       "\"reference_write_gbps\":%.3f,\"reference_read_gbps\":%.3f,"
		       "\"spill_vs_reference\":%.3f,\"fetch_vs_reference\":%.3f,"
		       "\"write_behind_gbps\":%.3f,\"write_behind_vs_reference\":%.3f,"
		       "\"spill_vs_reference_run_median\":%.3f,\"write_behind_vs_reference_run_median\":%.3f,"
		       "\"device_write_gbps\":%.3f,\"device_read_gbps\":%.3f",
		       (unsigned long long)pkv_tier_kv_bytes(&SMOL), o.blocks, o.batch, o.qd, o.runs,
		       bw.direct ? "true" : "false", bw.spill_gbps, bw.fetch_gbps, bw.ref_w_gbps, bw.ref_r_gbps,
		       bw.ref_w_gbps ? bw.spill_gbps / bw.ref_w_gbps : 0, bw.ref_r_gbps ? bw.fetch_gbps / bw.ref_r_gbps : 0,
		       bw.behind_gbps, bw.ref_w_gbps ? bw.behind_gbps / bw.ref_w_gbps : 0, bw.ratio_spill, bw.ratio_behind,
		       bw.dev_w_gbps, bw.dev_r_gbps);
		if (have_su)
			printf(",\"startup\":{\"blocks\":%u,\"open_s\":%.4f,\"fill_s\":%.2f,"
			       "\"index_bytes_per_block\":%.1f,\"rss_bytes_per_block\":%.1f}",
			       su.blocks, su.open_s, su.fill_s, su.index_bytes_per_block, su.rss_bytes_per_block);
		else
			printf(",\"startup\":null");
		if (have_op)
			printf(",\"open_546\":{\"cold_ms\":%.2f,\"ram_warm_ms\":%.2f,\"disk_warm_ms\":%.2f,"
			       "\"cold_open_ms\":%.2f,\"ram_warm_open_ms\":%.2f,\"disk_warm_open_ms\":%.2f,"
			       "\"cold_cached\":%u,\"ram_cached\":%u,\"disk_cached\":%u,"
			       "\"disk_vs_ram\":%.2f,\"disk_vs_cold\":%.3f,"
			       "\"flushed_ms\":%.2f,\"flushed_open_ms\":%.2f,\"flushed_cached\":%u,"
			       "\"flushed_vs_ram\":%.2f,\"flushed_vs_cold\":%.3f,"
			       "\"at_attach_ms\":%.2f,\"at_attach_open_ms\":%.2f,\"at_attach_cached\":%u,"
			       "\"at_attach_vs_ram\":%.2f,\"burst_opens\":%u,\"burst_slowest_ms\":%.2f,"
			       "\"burst_slowest_open_ms\":%.2f,\"burst_fewest_cached\":%u,\"burst_disk_blocks\":%.0f,"
			       "\"burst_reads_per_prompt\":%.2f}",
			       op.cold_ms, op.ram_ms, op.disk_ms, op.cold_open_ms, op.ram_open_ms, op.disk_open_ms,
			       op.cold_cached, op.ram_cached, op.disk_cached,
			       op.ram_ms ? op.disk_ms / op.ram_ms : 0, op.cold_ms ? op.disk_ms / op.cold_ms : 0,
			       op.flush_ms, op.flush_open_ms, op.flush_cached,
			       op.ram_ms ? op.flush_ms / op.ram_ms : 0, op.cold_ms ? op.flush_ms / op.cold_ms : 0,
			       op.attach_ms, op.attach_open_ms, op.attach_cached,
			       op.ram_ms ? op.attach_ms / op.ram_ms : 0, BURST, op.burst_ms, op.burst_open_ms,
			       op.burst_fewest_cached, op.burst_blocks, op.burst_blocks / PREFIX_BLOCKS);
		else
			printf(",\"open_546\":null");
		printf("}\n");
		return 0;
	}
	printf("disk tier, %u blocks of %llu KiB (SmolLM2-135M), fetch batches of %u, queue depth %u, %s, median of %u\n",
	       o.blocks, (unsigned long long)(pkv_tier_kv_bytes(&SMOL) >> 10), o.batch, o.qd,
	       bw.direct ? "O_DIRECT" : "buffered", o.runs);
	printf("  spill %.2f GB/s vs reference write %.2f GB/s (%.0f%%)\n", bw.spill_gbps, bw.ref_w_gbps,
	       bw.ref_w_gbps ? 100 * bw.spill_gbps / bw.ref_w_gbps : 0);
	printf("  write-behind %.2f GB/s vs reference write %.2f GB/s (%.0f%%)\n", bw.behind_gbps, bw.ref_w_gbps,
	       bw.ref_w_gbps ? 100 * bw.behind_gbps / bw.ref_w_gbps : 0);
	printf("  fetch %.2f GB/s vs reference read %.2f GB/s (%.0f%%)\n", bw.fetch_gbps, bw.ref_r_gbps,
	       bw.ref_r_gbps ? 100 * bw.fetch_gbps / bw.ref_r_gbps : 0);
	if (have_su)
		printf("start-up with %u blocks: %.3f s; index %.1f bytes/block (RSS %.1f)\n", su.blocks, su.open_s,
		       su.index_bytes_per_block, su.rss_bytes_per_block);
	if (have_op)
		printf("open + prefill of a %u-token prefix: cold %.2f ms, RAM-warm %.2f ms (%u cached), disk-warm after a restart %.2f ms (%u cached)\n"
		       "  of which the open: cold %.2f ms, RAM-warm %.2f ms, disk-warm %.2f ms\n"
		       "  disk-warm in the same daemon after a RAM flush: %.2f ms (open %.2f ms, %u cached)\n"
		       "  disk-warm after a restart, the pool created by this request: %.2f ms (open %.2f ms, %u cached)\n"
		       "  %u conversations at once, disk-warm after a RAM flush: slowest %.2f ms (open %.2f ms), "
		       "fewest cached %u; %.0f blocks read (%.2fx the prompt's)\n",
		       PREFIX, op.cold_ms, op.ram_ms, op.ram_cached, op.disk_ms, op.disk_cached,
		       op.cold_open_ms, op.ram_open_ms, op.disk_open_ms, op.flush_ms, op.flush_open_ms,
		       op.flush_cached, op.attach_ms, op.attach_open_ms, op.attach_cached, BURST, op.burst_ms,
		       op.burst_open_ms, op.burst_fewest_cached, op.burst_blocks, op.burst_blocks / PREFIX_BLOCKS);
	return 0;
}
