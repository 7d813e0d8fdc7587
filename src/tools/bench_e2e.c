/* SPDX-License-Identifier: MIT */
/* pkv-bench e2e: end-to-end model figures through pagedkvd — single-stream prefill and decode, aggregate
 * decode with 8 conversations in one process and in 8 processes, and TTFT behind a 1,000-token shared
 * system prompt, cold and warm; optionally llama.cpp's llama-bench on the same model, alternating with
 * ours rep by rep. Medians over --reps runs. */
#include "config.h"
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../examples/llama/engine.h"
#include "../../examples/llama/opts.h"
#include "../../examples/llama/session.h"
#include "bench_e2e_burst.h"
#include "bench_peer.h"
#include "bench_stats.h"
#include "common/msg.h"

struct opts {
	struct session_opts so;
	int reps, json, single_only, burst;
	int agg8_only; /* --agg8-only: only the 8-process figure (quick A/B runs of the IPC path) */
	uint32_t prompt_len, decode_len;
	const char *peer; /* llama-bench binary, or NULL */
};

/* Text of about n tokens; `salt` makes its start unique so it never hits the prefix cache. */
static int32_t *make_prompt(const struct tokenizer *t, uint32_t n, unsigned salt, int *out_n)
{
	static const char *words[] = { "river", "stone", "garden", "lamp", "orbit", "violin", "harbor",
				       "maple", "signal", "copper", "meadow", "thunder", "pencil", "canyon" };
	size_t cap = (size_t)n * 12 + 64, len = 0;
	char *s = malloc(cap);
	int32_t *ids = NULL;
	len += (size_t)snprintf(s, cap, "Session %u.", salt);
	for (unsigned i = 0; len + 16 < cap && i < n; i++)
		len += (size_t)snprintf(s + len, cap - len, " %s", words[(i * 7 + salt + i / 14) % 14]);
	int k = tok_encode(t, s, len, t->add_bos, 0, &ids);
	free(s);
	if (k > (int)n)
		k = (int)n;
	*out_n = k;
	return ids;
}

/*
 * A fixed amount of work, whatever the text: the conversation generates max_new tokens even past an
 * end token (as llama-bench does). Otherwise each run's random prompts end some conversations early,
 * the aggregate figures count different work from run to run, and the 8-process figure measures the
 * run's tail, with fewer processes than CPUs, as much as its throughput.
 */
static struct conv *run_one(struct engine *e, const int32_t *ids, uint32_t n, uint32_t max_new,
			    conv_token_fn fn, void *arg)
{
	struct sampler smp;
	sampler_init(&smp, 0, 0, 1, 1);
	struct conv *c = engine_conv_new(e, &smp, fn, arg);
	if (c)
		c->ignore_eos = 1;
	if (!c || engine_submit(e, c, ids, n, max_new) || engine_run(e) < 0 || c->state != CONV_DONE)
		return NULL;
	return c;
}

/* The attention side's counters when the first token came: the decode attends are what follows. */
struct first_mark {
	struct pkv_attn *attn;
	struct pkv_stats st;
	int taken;
};

static void mark_first(struct conv *cv, int32_t tok, void *arg)
{
	struct first_mark *m = arg;

	(void)cv, (void)tok;
	if (!m->taken && m->attn->ops->stats)
		m->taken = !m->attn->ops->stats(m->attn->ctx, &m->st);
}

/*
 * Prefill and decode rates of one conversation (run_one: decode_len tokens, past any end token).
 * Through the daemon also: the decode attends' mean round trip, the daemon's time in it and its backend's (µs).
 */
static int single_stream(struct session *s, const struct opts *o, unsigned salt, double *prefill, double *decode,
			 double *attend_us, double *daemon_us, double *backend_us, double *sleeps)
{
	struct engine e;
	struct first_mark m = { .attn = &s->attn, .st = PKV_STATS_INIT };
	struct pkv_stats end = PKV_STATS_INIT;
	int n;
	int32_t *ids = make_prompt(&s->tok, o->prompt_len, salt, &n);
	if (!ids || engine_init(&e, &s->lc, &s->tok, 256, 1))
		return -ENOMEM;
	struct conv *c = run_one(&e, ids, (uint32_t)n, o->decode_len, mark_first, &m);
	free(ids);
	if (!c) {
		engine_free(&e);
		return -EIO;
	}
	*prefill = n / (c->t_first - c->t_submit);
	*decode = c->n_gen > 1 ? (c->n_gen - 1) / (c->t_done - c->t_first) : 0;
	*attend_us = *daemon_us = *backend_us = *sleeps = 0;
	if (m.taken && !s->attn.ops->stats(s->attn.ctx, &end) && end.attends > m.st.attends) {
		double k = (double)(end.attends - m.st.attends);

		*attend_us = (double)(end.attend_wait_ns - m.st.attend_wait_ns) / k / 1e3;
		*backend_us = (double)(end.attend_backend_ns - m.st.attend_backend_ns) / k / 1e3;
		*daemon_us = (double)(end.attend_daemon_ns - m.st.attend_daemon_ns) / k / 1e3;
		*sleeps = (double)(end.client_sleeps - m.st.client_sleeps) / k;
	}
	engine_free(&e);
	return 0;
}

static int agg_inproc(struct session *s, const struct opts *o, unsigned salt, double *tok_s)
{
	struct engine e;
	struct sampler smp;
	if (engine_init(&e, &s->lc, &s->tok, 256, 8))
		return -ENOMEM;
	sampler_init(&smp, 0, 0, 1, 1);
	for (unsigned i = 0; i < 8; i++) {
		int n;
		int32_t *ids = make_prompt(&s->tok, 16, salt * 8 + i, &n);
		struct conv *c = engine_conv_new(&e, &smp, NULL, NULL);
		if (c)
			c->ignore_eos = 1; /* the same work as the 8 processes' (run_one) */
		if (!ids || !c || engine_submit(&e, c, ids, (uint32_t)n, o->decode_len)) {
			free(ids);
			engine_free(&e);
			return -ENOMEM;
		}
		free(ids);
	}
	double t0 = engine_now();
	int r = engine_run(&e);
	double dt = engine_now() - t0;
	uint64_t gen = 0;
	for (struct conv *c = e.convs; c; c = c->next)
		gen += c->n_gen;
	engine_free(&e);
	*tok_s = dt > 0 ? (double)gen / dt : 0;
	return r;
}

/* What one of the 8 processes reports: tokens made and CPU time spent making them. */
struct agg_report {
	uint32_t gen;
	uint64_t cpu_ns;
};

/* The 8-process run's figures beyond tok/s, to split a gap between throughput and CPU per token. */
struct agg_cpu {
	double clients_us_per_tok; /* the processes' CPU time over the decode, per token */
	double daemon_us_per_tok;  /* pagedkvd's over the same window (0 in-process, or unreadable) */
	double idle_pct;           /* the machine's idle CPU time over the window */
};

static uint64_t cpu_ns(clockid_t id)
{
	struct timespec t;

	return clock_gettime(id, &t) ? 0 : (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* pagedkvd's pid from the socket's peer credentials (a connection that says nothing); 0 if none. */
static pid_t daemon_pid(const char *sock)
{
	struct ucred cr = { 0 };
	socklen_t len = sizeof(cr);
	int fd = pkv_sock_connect(sock, 5000);

	if (fd < 0)
		return 0;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len))
		cr.pid = 0;
	close(fd);
	return cr.pid;
}

/* CPU time of every thread of pid (their schedstat: ns run), or 0. */
static uint64_t proc_cpu_ns(pid_t pid)
{
	char path[64];
	uint64_t sum = 0;
	DIR *d;
	struct dirent *e;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	if (pid <= 0 || !(d = opendir(path)))
		return 0;
	while ((e = readdir(d))) {
		char f[sizeof(path) + sizeof(e->d_name) + 16];
		unsigned long long ns;
		FILE *fp;

		if (e->d_name[0] == '.')
			continue;
		snprintf(f, sizeof(f), "%s/%s/schedstat", path, e->d_name);
		if ((fp = fopen(f, "r"))) {
			if (fscanf(fp, "%llu", &ns) == 1)
				sum += ns;
			fclose(fp);
		}
	}
	closedir(d);
	return sum;
}

/* The machine's idle and total CPU time so far (/proc/stat, clock ticks). */
static void cpu_ticks(unsigned long long *idle, unsigned long long *total)
{
	unsigned long long v[8] = { 0 };
	FILE *fp = fopen("/proc/stat", "r");

	*idle = *total = 0;
	if (!fp)
		return;
	if (fscanf(fp, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
		   &v[6], &v[7]) == 8) {
		*idle = v[3] + v[4];
		for (int i = 0; i < 8; i++)
			*total += v[i];
	}
	fclose(fp);
}

/* 8 processes, one conversation each, released together by closing a pipe. */
static int agg_procs(const struct opts *o, unsigned salt, double *tok_s, struct agg_cpu *cpu)
{
	int go[2], res[2];
	pid_t kids[8];
	if (pipe(go) || pipe(res))
		return -errno;
	for (unsigned i = 0; i < 8; i++) {
		kids[i] = fork();
		if (kids[i] < 0)
			return -errno;
		if (kids[i] == 0) {
			struct session s;
			struct session_opts so = o->so;
			struct engine e;
			char err[512], b;
			struct agg_report rep = { 0 };
			close(go[1]);
			close(res[0]);
			so.threads = 1;
			int opened = session_open(&s, &so, err, sizeof err) == 0;

			if (opened && so.attention == SESSION_ATTN_CLIENT && strcmp(s.attn.name, SESSION_CLIENT_ATTENTION)) {
				/* the daemon attends after all (session_open said why): not the arm asked for */
				snprintf(err, sizeof err, "no client attention");
				opened = 0;
			}
			if (opened && engine_init(&e, &s.lc, &s.tok, 256, 1) == 0) {
				int n;
				int32_t *ids = make_prompt(&s.tok, 16, salt * 8 + i + 1000, &n);
				if (read(go[0], &b, 1) < 0) /* EOF when the parent closes: start */
					_exit(1);
				uint64_t c0 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
				struct conv *c = run_one(&e, ids, (uint32_t)n, o->decode_len, NULL, NULL);
				rep.cpu_ns = cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - c0;
				rep.gen = c ? c->n_gen : 0;
				free(ids);
			} else {
				fprintf(stderr, "pkv-bench e2e: client: %s\n", err);
			}
			if (write(res[1], &rep, sizeof rep) != sizeof rep)
				_exit(1);
			_exit(rep.gen ? 0 : 1);
		}
	}
	close(go[0]);
	close(res[1]);
	sleep(1); /* let every client load and attach before the clock starts */
	pid_t dpid = o->so.in_process ? 0 : daemon_pid(o->so.socket);
	unsigned long long i0, n0, i1, n1;
	uint64_t d0 = proc_cpu_ns(dpid), clients_ns = 0;
	cpu_ticks(&i0, &n0);
	double t0 = engine_now();
	close(go[1]);
	uint64_t total = 0;
	struct agg_report rep;
	int ok = 0;
	while (read(res[0], &rep, sizeof rep) == (ssize_t)sizeof rep) {
		total += rep.gen;
		clients_ns += rep.cpu_ns;
		ok += rep.gen > 0;
	}
	double dt = engine_now() - t0;
	uint64_t d1 = proc_cpu_ns(dpid);
	cpu_ticks(&i1, &n1);
	close(res[0]);
	cpu->clients_us_per_tok = total ? (double)clients_ns / 1e3 / (double)total : 0;
	cpu->daemon_us_per_tok = total && d1 > d0 ? (double)(d1 - d0) / 1e3 / (double)total : 0;
	cpu->idle_pct = n1 > n0 ? 100.0 * (double)(i1 - i0) / (double)(n1 - n0) : 0;
	for (unsigned i = 0; i < 8; i++) {
		int st;
		waitpid(kids[i], &st, 0);
	}
	*tok_s = dt > 0 ? (double)total / dt : 0;
	return ok == 8 ? 0 : -EIO;
}

/* TTFT of a new conversation behind a ~1,000-token system prompt: cold (never seen) and warm (same
 * system prompt, a different question, after one conversation has used it). */
static int ttft(struct session *s, const struct opts *o, unsigned salt, double *cold, double *warm)
{
	struct engine e;
	int ns, nq1, nq2;
	int32_t *sys = make_prompt(&s->tok, 1000, salt + 5000, &ns);
	int32_t *q1 = make_prompt(&s->tok, 12, salt + 6000, &nq1), *q2 = make_prompt(&s->tok, 12, salt + 7000, &nq2);
	int32_t *a = malloc((size_t)(ns + 16) * sizeof *a), *b = malloc((size_t)(ns + 16) * sizeof *b);
	if (!sys || !q1 || !q2 || !a || !b || engine_init(&e, &s->lc, &s->tok, 256, 1))
		return -ENOMEM;
	memcpy(a, sys, (size_t)ns * sizeof *a);
	memcpy(a + ns, q1 + 1, (size_t)(nq1 - 1) * sizeof *a); /* skip the question's BOS */
	memcpy(b, sys, (size_t)ns * sizeof *b);
	memcpy(b + ns, q2 + 1, (size_t)(nq2 - 1) * sizeof *b);
	struct conv *c1 = run_one(&e, a, (uint32_t)(ns + nq1 - 1), 1, NULL, NULL);
	struct conv *c2 = c1 ? run_one(&e, b, (uint32_t)(ns + nq2 - 1), 1, NULL, NULL) : NULL;
	int r = c1 && c2 ? 0 : -EIO;
	if (!r) {
		*cold = (c1->t_first - c1->t_submit) * 1e3;
		*warm = (c2->t_first - c2->t_submit) * 1e3;
	}
	engine_free(&e);
	free(sys);
	free(q1);
	free(q2);
	free(a);
	free(b);
	return r;
}

/*
 * Another arm of the 8-process figure in the same run: in-process attention
 * (o: in_process set, the reference) or a client-attention pool.
 */
static int agg_procs_arm(const struct opts *o, unsigned salt, double *tok_s, double *cpu_us, const char *what)
{
	struct agg_cpu cpu = { 0 };
	int r = agg_procs(o, salt, tok_s, &cpu);

	/* everything the work cost per token: the 8 processes' CPU and pagedkvd's */
	*cpu_us = cpu.clients_us_per_tok + cpu.daemon_us_per_tok;
	if (r)
		fprintf(stderr, "pkv-bench e2e: 8 processes with %s failed: %s\n", what, strerror(-r));
	return r;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", 1, 0, 'm' }, { "socket", 1, 0, 1 }, { "in-process", 0, 0, 2 }, { "json", 0, 0, 3 },
		{ "reps", 1, 0, 'r' }, { "threads", 1, 0, 't' }, { "prompt", 1, 0, 'p' }, { "decode", 1, 0, 'n' },
		{ "peer-llama-bench", 1, 0, 4 }, { "single", 0, 0, 5 }, { "no-burst", 0, 0, 6 },
		{ "agg8-only", 0, 0, 7 }, { "kv-dtype", 1, 0, 8 }, { "client-attention", 0, 0, 9 },
		{ "help", 0, 0, 'h' }, { 0 } };
	/* Through pagedkvd the daemon attends unless --client-attention: each arm says who attends. */
	struct opts o = { .so = { .threads = 2, .attention = SESSION_ATTN_DAEMON },
			  .reps = 3, .prompt_len = 512, .decode_len = 64, .burst = 1 };
	int c;
	char err[512];
	while ((c = getopt_long(argc, argv, "m:r:t:p:n:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': o.so.model = optarg; break;
		case 1: o.so.socket = optarg; break;
		case 2: o.so.in_process = 1; break;
		case 3: o.json = 1; break;
		case 4: o.peer = optarg; break;
		case 5: o.single_only = 1; break;
		case 6: o.burst = 0; break;
		case 7: o.agg8_only = 1; break;
		case 8:
			if (opt_kv_dtype("pkv-bench e2e", "--kv-dtype", optarg, &o.so.kv_dtype))
				return 2;
			break;
		case 9: o.so.attention = SESSION_ATTN_CLIENT; break;
		case 'r': o.reps = atoi(optarg); break;
		case 't': o.so.threads = atoi(optarg); break;
		case 'p': o.prompt_len = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'n': o.decode_len = (uint32_t)strtoul(optarg, NULL, 10); break;
		default:
			fprintf(c == 'h' ? stdout : stderr,
				"usage: pkv-bench e2e -m MODEL [--socket PATH | --in-process] [--json] [--reps N] [--agg8-only]\n"
				"       [-t THREADS] [-p PROMPT_TOKENS (512)] [-n DECODE_TOKENS (64)]\n"
				"       [--single] [--peer-llama-bench PATH] [--no-burst] [--kv-dtype f32|f16|bf16]\n"
				"       [--client-attention]\n"
				"Runs through pagedkvd (start it first) unless --in-process. --single: only the\n"
				"single-stream figures. --peer-llama-bench: also run llama.cpp's llama-bench on the\n"
				"same model and threads (prefill; decode after the prompt), alternating with ours.\n"
				"--no-burst: skip the bursts of 8 conversations behind one prompt (with and without\n"
				"in-flight prefix sharing). Through pagedkvd the 8-process figure is also\n"
				"measured with in-process attention in every run (agg8_procs_vs_inproc_attn), and in\n"
				"a pool whose clients attend themselves (agg8_procs_client_attn_vs_inproc_attn; the\n"
				"backend from $PAGEDKV_PLUGIN_DIR, else the installed one). --client-attention: every\n"
				"figure through pagedkvd in such a pool. Run it under\n"
				"flock /tmp/pkv-bench.lock so benchmarks never overlap.\n");
			return c == 'h' ? 0 : 2;
		}
	}
	if (o.single_only || o.agg8_only)
		o.burst = 0;
	if (o.single_only && o.agg8_only) {
		fprintf(stderr, "pkv-bench e2e: --single and --agg8-only exclude each other\n");
		return 2;
	}
	if (!o.so.model || o.reps < 1 || o.reps > 99) {
		fprintf(stderr, "pkv-bench e2e: -m MODEL is required (--reps 1..99)\n");
		return 2;
	}
	o.so.max_tokens = 256;
	/*
	 * Within a uid's half of pagedkvd's default 1 GiB budget, which also
	 * counts the cache's index; through pagedkvd, with room for the
	 * client-attention arm's pool (8 short conversations) beside it.
	 */
	o.so.kv_mib = o.so.in_process || o.so.attention == SESSION_ATTN_CLIENT || o.single_only ? 480 : 416;
	struct session s;
	if (session_open(&s, &o.so, err, sizeof err)) {
		fprintf(stderr, "pkv-bench e2e: %s\n", err);
		return 1;
	}
	double at[99] = { 0 }, ad[99] = { 0 }, ab[99] = { 0 }, as[99] = { 0 };
	double pf[99], dc[99], ai[99] = { 0 }, ap[99] = { 0 }, tc[99] = { 0 }, tw[99] = { 0 }, ppf[99], pdc[99];
	double acl[99] = { 0 }, adm[99] = { 0 }, aid[99] = { 0 }, api[99] = { 0 }, apr[99] = { 0 };
	double apc[99] = { 0 }, apcr[99] = { 0 }, cpi[99] = { 0 }, cpc[99] = { 0 };
	/* Through pagedkvd, the 8 processes also run with in-process attention, alternated: the ratio is same-run. */
	struct opts oi = o, oc = o;
	int pair8 = !o.so.in_process && !o.single_only;
	/* ... and, unless the main arm already is one, in a pool whose clients attend themselves */
	int client8 = pair8 && o.so.attention != SESSION_ATTN_CLIENT;

	oi.so.in_process = 1;
	oi.so.socket = NULL;
	oc.so.attention = SESSION_ATTN_CLIENT;
	oc.so.kv_mib = 64;
	for (int i = 0; i < o.reps; i++) {
		unsigned salt = (unsigned)getpid() * 131u + (unsigned)i * 17u;
		struct peer_result pr;
		struct agg_cpu ac = { 0 };
		int r;
		pf[i] = dc[i] = ai[i] = ap[i] = tc[i] = tw[i] = 0;
		/* odd runs take the in-process arm first, even ones after */
		if (pair8 && (i & 1) && (r = agg_procs_arm(&oi, salt, &api[i], &cpi[i], "in-process attention"))) {
			session_close(&s);
			return 1;
		}
		if ((!o.agg8_only && (r = single_stream(&s, &o, salt, &pf[i], &dc[i], &at[i], &ad[i], &ab[i], &as[i]))) ||
		    (!o.single_only && ((!o.agg8_only && (r = agg_inproc(&s, &o, salt, &ai[i]))) ||
					(r = agg_procs(&o, salt, &ap[i], &ac)) ||
					(!o.agg8_only && (r = ttft(&s, &o, salt, &tc[i], &tw[i])))))) {
			fprintf(stderr, "pkv-bench e2e: run %d failed: %s\n", i, strerror(-r));
			session_close(&s);
			return 1;
		}
		acl[i] = ac.clients_us_per_tok;
		adm[i] = ac.daemon_us_per_tok;
		aid[i] = ac.idle_pct;
		if (pair8 && !(i & 1) && (r = agg_procs_arm(&oi, salt, &api[i], &cpi[i], "in-process attention"))) {
			session_close(&s);
			return 1;
		}
		/*
		 * Last in odd runs, next to the in-process arm in even ones. An arm,
		 * not the figure: without the backend in this process's plugin
		 * directory the run goes on without it.
		 */
		if (client8 && agg_procs_arm(&oc, salt, &apc[i], &cpc[i], "client attention")) {
			fprintf(stderr, "pkv-bench e2e: no client-attention arm (set $PAGEDKV_PLUGIN_DIR to the "
				"daemon's plugin directory)\n");
			client8 = 0;
		}
		apr[i] = api[i] > 0 ? ap[i] / api[i] : 0;
		apcr[i] = api[i] > 0 ? apc[i] / api[i] : 0;
		if (o.peer) {
			/* our pool's threads would take the peer's CPUs while they spin */
			tpool_idle(s.tp);
			if ((r = peer_llama_bench(o.peer, o.so.model, tpool_size(s.tp), o.prompt_len, o.decode_len, &pr))) {
				fprintf(stderr, "pkv-bench e2e: %s failed: %s\n", o.peer, strerror(-r));
				session_close(&s);
				return 1;
			}
			ppf[i] = pr.pp_tok_s;
			pdc[i] = pr.tg_tok_s;
		}
		if (!o.json)
			fprintf(stderr, "run %d: prefill %.1f tok/s, decode %.1f tok/s, agg8 %.1f / %.1f tok/s, "
				"ttft %.0f / %.0f ms; peer prefill %.1f, decode %.1f tok/s\n", i, pf[i], dc[i], ai[i],
				ap[i], tc[i], tw[i], o.peer ? ppf[i] : 0, o.peer ? pdc[i] : 0);
	}
	/* Bursts behind one system prompt: in-flight sharing on and off, alternated, in one process and in 8. */
	struct burst_figures bf[2][2][99];
	double bx[2][2][3][99], bm[2][2][3];
	for (int i = 0; o.burst && i < o.reps; i++)
		for (int procs = 0; procs < 2; procs++)
			for (int on = 1; on >= 0; on--) {
				unsigned salt = (unsigned)getpid() * 131u + (unsigned)i * 17u + 4u * (unsigned)procs + (unsigned)on;
				struct burst_figures *f = &bf[procs][on][i];
				int r = e2e_burst(&o.so, procs, on, salt, f);

				if (r) {
					fprintf(stderr, "pkv-bench e2e: burst run %d failed: %s\n", i, strerror(-r));
					session_close(&s);
					return 1;
				}
				bx[procs][on][0][i] = (double)f->computed_tokens / f->ideal_tokens;
				bx[procs][on][1][i] = f->ttft_mean_ms;
				bx[procs][on][2][i] = f->ttft_p99_ms;
			}
	for (int procs = 0; o.burst && procs < 2; procs++)
		for (int on = 0; on < 2; on++)
			for (int k = 0; k < 3; k++)
				bm[procs][on][k] = bench_median(bx[procs][on][k], o.reps);
	double m_at = bench_median(at, o.reps), m_ad = bench_median(ad, o.reps), m_ab = bench_median(ab, o.reps),
	       m_as = bench_median(as, o.reps);
	double m_pf = bench_median(pf, o.reps), m_dc = bench_median(dc, o.reps), m_ai = bench_median(ai, o.reps),
	       m_ap = bench_median(ap, o.reps), m_tc = bench_median(tc, o.reps), m_tw = bench_median(tw, o.reps);
	double m_ppf = o.peer ? bench_median(ppf, o.reps) : 0, m_pdc = o.peer ? bench_median(pdc, o.reps) : 0;
	double m_acl = bench_median(acl, o.reps), m_adm = bench_median(adm, o.reps), m_aid = bench_median(aid, o.reps);
	double m_api = bench_median(api, o.reps), m_apr = bench_median(apr, o.reps);
	double m_apc = bench_median(apc, o.reps), m_apcr = bench_median(apcr, o.reps);
	double m_cpi = bench_median(cpi, o.reps), m_cpc = bench_median(cpc, o.reps);
	if (o.json) {
		printf("{\"model\": \"%s\", \"attention\": \"%s\", \"kv_dtype\": \"%s\", \"isa\": \"%s\", \"threads\": %d, "
		       "\"reps\": %d, \"prompt_tokens\": %u, \"decode_tokens\": %u, "
		       "\"prefill_tok_s\": %.1f, \"decode_tok_s\": %.1f",
		       o.so.model, s.attn.name,
		       o.so.kv_dtype == PKV_DTYPE_F16 ? "f16" : o.so.kv_dtype == PKV_DTYPE_BF16 ? "bf16" : "f32",
		       s.m.output.packed ? "avx512vnni" : pkv_dot_ops()->isa, tpool_size(s.tp), o.reps, o.prompt_len,
		       o.decode_len, m_pf, m_dc);
		if (m_at > 0)
			printf(", \"decode_attend_us\": %.1f, \"decode_attend_daemon_us\": %.1f, "
			       "\"decode_attend_backend_us\": %.1f, \"decode_attend_handoff_us\": %.1f, "
			       "\"decode_client_sleeps_per_attend\": %.2f", m_at, m_ad, m_ab, m_at - m_ab, m_as);
		if (!o.single_only)
			printf(", \"agg8_inproc_tok_s\": %.1f, \"agg8_procs_tok_s\": %.1f, \"ttft_cold_ms\": %.1f, "
			       "\"ttft_warm_ms\": %.1f, \"ttft_warm_over_cold\": %.4f, \"agg8_clients_cpu_us_per_tok\": %.1f, "
			       "\"agg8_daemon_cpu_us_per_tok\": %.1f, \"agg8_idle_pct\": %.1f", m_ai, m_ap, m_tc, m_tw,
			       m_tc > 0 ? m_tw / m_tc : 0, m_acl, m_adm, m_aid);
		if (pair8)
			printf(", \"agg8_procs_inproc_attn_tok_s\": %.1f, \"agg8_procs_vs_inproc_attn\": %.3f, "
			       "\"agg8_inproc_attn_cpu_us_per_tok\": %.1f", m_api, m_apr, m_cpi);
		if (client8)
			printf(", \"agg8_procs_client_attn_tok_s\": %.1f, \"agg8_procs_client_attn_vs_inproc_attn\": %.3f, "
			       "\"agg8_client_attn_cpu_us_per_tok\": %.1f", m_apc, m_apcr, m_cpc);
		if (o.peer)
			printf(", \"peer_prefill_tok_s\": %.1f, \"peer_decode_tok_s\": %.1f, "
			       "\"prefill_vs_peer\": %.3f, \"decode_vs_peer\": %.3f",
			       m_ppf, m_pdc, m_ppf > 0 ? m_pf / m_ppf : 0, m_pdc > 0 ? m_dc / m_pdc : 0);
		for (int procs = 0; o.burst && procs < 2; procs++) {
			const char *w = procs ? "procs" : "inproc";

			printf(", \"burst8_%s_prompt_tokens_ideal\": %u, \"burst8_%s_computed_over_ideal\": %.3f, "
			       "\"burst8_%s_computed_over_ideal_nosharing\": %.3f, \"burst8_%s_ttft_mean_ms\": %.1f, "
			       "\"burst8_%s_ttft_p99_ms\": %.1f, \"burst8_%s_ttft_mean_ms_nosharing\": %.1f, "
			       "\"burst8_%s_ttft_p99_ms_nosharing\": %.1f, \"burst8_%s_ttft_mean_ratio\": %.3f, "
			       "\"burst8_%s_ttft_p99_ratio\": %.3f",
			       w, bf[procs][1][0].ideal_tokens, w, bm[procs][1][0], w, bm[procs][0][0], w,
			       bm[procs][1][1], w, bm[procs][1][2], w, bm[procs][0][1], w, bm[procs][0][2], w,
			       bm[procs][1][1] / bm[procs][0][1], w, bm[procs][1][2] / bm[procs][0][2]);
		}
		printf("}\n");
	} else {
		printf("pkv-bench e2e: %s via %s, %d threads, median of %d\n", o.so.model, s.attn.name,
		       tpool_size(s.tp), o.reps);
		printf("  prefill (%u-token prompt)      %8.1f tok/s\n", o.prompt_len, m_pf);
		printf("  decode, single stream          %8.1f tok/s\n", m_dc);
		if (!o.single_only) {
			printf("  decode, 8 convs in 1 process   %8.1f tok/s aggregate\n", m_ai);
			printf("  decode, 8 processes            %8.1f tok/s aggregate; CPU per token %.0f us "
			       "(clients) + %.0f us (pagedkvd), %.1f %% idle\n", m_ap, m_acl, m_adm, m_aid);
			if (pair8)
				printf("  same, attention in-process     %8.1f tok/s aggregate (through pagedkvd %.3fx, "
				       "median of the runs' ratios)\n", m_api, m_apr);
			if (client8)
				printf("  same, client attention pool    %8.1f tok/s aggregate (%.3fx in-process)\n",
				       m_apc, m_apcr);
			printf("  TTFT behind 1000-token prompt  %8.1f ms cold, %.1f ms warm (%.3f of cold)\n", m_tc,
			       m_tw, m_tc > 0 ? m_tw / m_tc : 0);
		}
		if (o.peer) {
			printf("  llama.cpp prefill              %8.1f tok/s (ours %.3fx)\n", m_ppf,
			       m_ppf > 0 ? m_pf / m_ppf : 0);
			printf("  llama.cpp decode after prompt  %8.1f tok/s (ours %.3fx)\n", m_pdc,
			       m_pdc > 0 ? m_dc / m_pdc : 0);
		}
		for (int procs = 0; o.burst && procs < 2; procs++)
			printf("  burst of 8 (%s): computed %.2fx of one prompt + questions (%.2fx without "
			       "in-flight sharing), TTFT mean %.0f / p99 %.0f ms (%.0f / %.0f ms without)\n",
			       procs ? "8 processes" : "1 process", bm[procs][1][0], bm[procs][0][0], bm[procs][1][1],
			       bm[procs][1][2], bm[procs][0][1], bm[procs][0][2]);
	}
	session_close(&s);
	return 0;
}
