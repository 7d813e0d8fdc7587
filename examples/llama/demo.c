/* SPDX-License-Identifier: MIT */
/* pkv-demo: N client processes share one long system prompt through pagedkvd. All start at once: the
 * first to open computes the prompt and the others wait for its KV instead of computing it again
 * (in-flight prefix sharing); with --staggered the others start once client 0 has its first token.
 * Shows live progress (a redrawn table on a terminal, one line per phase otherwise), then each answer,
 * a table (TTFT, tokens/s, prompt tokens from the shared prefix) and the daemon's peak KV memory
 * against what unshared caches would need. Samples as SmolLM2's model card recommends (temperature
 * 0.2, top-p 0.9) unless --greedy. */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "opts.h"
#include "session.h"

#define MAX_CLIENTS 8
/* Even at the model card's temperature, client 0's answer loops ("then Select Account" over and
 * over) without a penalty; 1.3 ends the loop on all eight questions. */
#define REPEAT_PENALTY 1.3

static const char *const default_questions[] = {
	"How do I reset my password?",
	"Can I get a refund after 20 days?",
	"What are your support hours on weekends?",
	"How do I export my notes to PDF?",
	"Is my data encrypted?",
	"How many devices can I sync?",
	"Do you offer student discounts?",
	"How do I delete my account?",
};

/* About 500 tokens: the kind of long, fixed instruction block every conversation of an app shares. */
static const char system_prompt[] =
	"You are Nova, the customer support assistant of Lumen Notes, a note-taking application for "
	"desktop and mobile. Answer in two or three short, friendly sentences. Use only the facts below; "
	"if the answer is not in them, say you will pass the question to a human colleague.\n"
	"Facts about Lumen Notes:\n"
	"1. Accounts. Users sign up with an email address. To reset a password, open Settings, choose "
	"Account, then Reset password; a link valid for 30 minutes is sent by email. Accounts can be "
	"deleted in Settings, Account, Delete account; deletion is final after 14 days.\n"
	"2. Plans. The Free plan syncs up to 2 devices and stores 500 notes. The Plus plan costs 4 dollars "
	"a month, syncs up to 10 devices and has no note limit. Students with a university email get Plus "
	"for half price. Plans renew monthly and can be cancelled at any time.\n"
	"3. Refunds. Purchases can be refunded in full within 30 days by writing to billing through the "
	"Help menu. After 30 days, refunds are given only when the service was unavailable for more than "
	"48 hours in the billing month.\n"
	"4. Support hours. Human support answers Monday to Friday from 8 am to 8 pm Central European Time, "
	"and on Saturdays from 10 am to 4 pm. There is no human support on Sundays or public holidays, "
	"but this assistant is available at all times.\n"
	"5. Export. Any note or notebook can be exported as PDF, Markdown or plain text: open the note, "
	"choose the Share menu, then Export, and pick the format. Whole notebooks are exported as a zip "
	"file containing one file per note. Images are embedded in PDF exports.\n"
	"6. Security. Notes are encrypted in transit with TLS and at rest with AES-256. Plus users can turn "
	"on end-to-end encryption for individual notebooks; then not even Lumen staff can read them, and a "
	"lost recovery key cannot be replaced. Two-factor sign-in is available for every plan.\n"
	"7. Sync. Changes sync within a few seconds when online. Offline edits are kept on the device and "
	"merged on the next connection; when the same note was edited on two devices, both versions are "
	"kept and the older one is marked as a conflict copy.\n"
	"8. Tone. Be warm and concise, never invent features, prices or dates, and never ask for a "
	"password. Thank the user at the end of the answer.";

struct rec { /* child -> parent over a pipe */
	int kind; /* 1 token, 2 done, 3 failed, 4 model loaded: reading the prompt (prompt = its tokens) */
	uint32_t n_gen, prompt, reused;
	double ttft, tok_s;
	char piece[64];
	uint32_t piece_len;
	char err[448];    /* kind 3: why */
};

struct client {
	pid_t pid;
	int fd;
	int started, prefilling, done, failed;
	double t_start;
	struct rec last;
	char *text;
	size_t len;
};

static int wr_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t w = write(fd, c, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

struct child_ctx {
	int fd;
	const struct tokenizer *tok;
	struct conv *cv;
};

static void child_tok(struct conv *cv, int32_t t, void *arg)
{
	struct child_ctx *c = arg;
	struct rec r = { .kind = 1, .n_gen = cv->n_gen };
	r.piece_len = (uint32_t)tok_piece(c->tok, t, 0, r.piece, sizeof r.piece);
	wr_all(c->fd, &r, sizeof r);
}

struct sampling {
	float temp, top_p, repeat_penalty;
	uint64_t seed;
};

static int child_main(int fd, const struct session_opts *so, const char *question, uint32_t max_new,
		      const struct sampling *sp, int idx)
{
	struct session s;
	struct engine e;
	struct sampler smp;
	char err[512];
	struct rec r = { .kind = 3 };
	int32_t *ids;
	if (session_open(&s, so, err, sizeof err)) {
		snprintf(r.err, sizeof r.err, "%.447s", err);
		wr_all(fd, &r, sizeof r);
		return 1;
	}
	if (engine_init(&e, &s.lc, &s.tok, 256, 1)) {
		snprintf(r.err, sizeof r.err, "out of memory");
		wr_all(fd, &r, sizeof r);
		return 1;
	}
	sampler_init(&smp, sp->temp, 0, sp->top_p, sp->seed + (uint64_t)idx);
	smp.repeat_penalty = sp->repeat_penalty;
	struct child_ctx cc = { .fd = fd, .tok = &s.tok };
	struct conv *cv = engine_conv_new(&e, &smp, child_tok, &cc);
	int n = chat_turn(&s.tok, system_prompt, question, 1, 0, &ids);
	int er = n <= 0 ? n : engine_submit(&e, cv, ids, (uint32_t)n, max_new);
	struct rec pre = { .kind = 4, .prompt = n > 0 ? (uint32_t)n : 0 };
	wr_all(fd, &pre, sizeof pre);
	if (!er)
		er = engine_run(&e);
	if (er < 0 || cv->state != CONV_DONE) {
		/* most often pagedkvd went away or refused a step: its reason is in the attention's error */
		snprintf(r.err, sizeof r.err, "generation stopped: %s", er < 0 ? strerror(-er) : "conversation failed");
		wr_all(fd, &r, sizeof r);
		return 1;
	}
	free(ids);
	r.kind = 2;
	r.n_gen = cv->n_gen;
	r.prompt = cv->prompt_tokens;
	r.reused = cv->reused_tokens;
	r.ttft = cv->t_first - cv->t_submit;
	r.tok_s = cv->n_gen > 1 && cv->t_done > cv->t_first ? (cv->n_gen - 1) / (cv->t_done - cv->t_first) : 0;
	wr_all(fd, &r, sizeof r);
	engine_free(&e);
	session_close(&s);
	return 0;
}

static int spawn(struct client *c, const struct session_opts *so, const char *q, uint32_t max_new,
		 const struct sampling *sp, int idx)
{
	int p[2];
	if (pipe(p))
		return -errno;
	c->pid = fork();
	if (c->pid < 0)
		return -errno;
	if (c->pid == 0) {
		close(p[0]);
		_exit(child_main(p[1], so, q, max_new, sp, idx));
	}
	close(p[1]);
	c->fd = p[0];
	c->started = 1;
	c->t_start = engine_now();
	return 0;
}

static const char *state(const struct client *c, char *buf, size_t len)
{
	if (!c->started)
		return "waiting for client 0's first token";
	if (c->failed)
		return "FAILED";
	if (c->done)
		return "done";
	if (c->last.n_gen)
		return "generating";
	if (c->prefilling) {
		snprintf(buf, len, "reading its %u-token prompt (%.0f s)", c->last.prompt, engine_now() - c->t_start);
		return buf;
	}
	return "loading the model";
}

static void draw(struct client *c, int n, const char *const *q, int first)
{
	char buf[96];
	if (!first)
		printf("\033[%dA", n);
	for (int i = 0; i < n; i++)
		printf("\033[2K  client %d  %-42.42s  %4u tokens  %s\n", i, q[i], c[i].last.n_gen,
		       state(&c[i], buf, sizeof buf));
	fflush(stdout);
}

/* Not a terminal: one line per phase of each client instead of a redrawn table. */
static void log_phase(const struct client *c, int i, const char *what)
{
	printf("  client %d: %s (%.1f s)\n", i, what, engine_now() - c->t_start);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", 1, 0, 'm' }, { "socket", 1, 0, 1 }, { "clients", 1, 0, 'c' },
		{ "max-new", 1, 0, 'n' }, { "threads", 1, 0, 't' }, { "help", 0, 0, 'h' },
		{ "ctx", 1, 0, 8 }, { "max-seqs", 1, 0, 9 }, { "temp", 1, 0, 10 }, { "top-p", 1, 0, 11 },
		{ "seed", 1, 0, 12 }, { "greedy", 0, 0, 13 }, { "repeat-penalty", 1, 0, 14 },
		{ "staggered", 0, 0, 15 }, { "kv-dtype", 1, 0, 20 }, { "client-attention", 0, 0, 21 },
		{ "daemon-attention", 0, 0, 22 }, { 0 } };
	static const char prog[] = "pkv-demo";
	/* SmolLM2-Instruct's model card samples with temperature 0.2 and top-p 0.9; greedy loops
	 * ("then Select Account" twenty times) on client 0's question. */
	struct sampling sp = { .temp = 0.2f, .top_p = 0.9f, .repeat_penalty = REPEAT_PENALTY, .seed = 1 };
	struct session_opts so = { .threads = 1 };
	uint32_t max_new = 96, nc32 = 4;
	int nc, c, tty = isatty(1), bad = 0, staggered = 0;
	struct client cl[MAX_CLIENTS] = { 0 };
	while ((c = getopt_long(argc, argv, "m:c:n:t:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': so.model = optarg; break;
		case 1: so.socket = optarg; break;
		case 'c': bad |= opt_u32(prog, "-c/--clients", optarg, 1, MAX_CLIENTS, &nc32); break;
		case 'n': bad |= opt_u32(prog, "-n/--max-new", optarg, 1, 4096, &max_new); break;
		case 't': bad |= opt_int(prog, "-t/--threads", optarg, 0, 1024, &so.threads); break;
		case 8: bad |= opt_u32(prog, "--ctx", optarg, 16, 1u << 20, &so.ctx); break;
		case 9: bad |= opt_u32(prog, "--max-seqs", optarg, 1, 4096, &so.max_seqs); break;
		case 20: bad |= opt_kv_dtype(prog, "--kv-dtype", optarg, &so.kv_dtype); break;
		case 21: so.attention = SESSION_ATTN_CLIENT; break;
		case 22: so.attention = SESSION_ATTN_DAEMON; break;
		case 10: bad |= opt_float(prog, "--temp", optarg, 0, 10, &sp.temp); break;
		case 11: bad |= opt_float(prog, "--top-p", optarg, 0, 1, &sp.top_p); break;
		case 12: bad |= opt_u64(prog, "--seed", optarg, &sp.seed); break;
		case 13: sp.temp = 0; sp.repeat_penalty = 1; break;
		case 14: bad |= opt_float(prog, "--repeat-penalty", optarg, 1, 10, &sp.repeat_penalty); break;
		case 15: staggered = 1; break;
		default:
			return opt_refused(prog);
		case 'h':
			printf("usage: pkv-demo -m MODEL [options]\n"
				"  -m, --model PATH       GGUF chat model (ChatML or Llama 3 template)\n"
				"      --socket PATH      pagedkvd socket (default $PAGEDKV_SOCKET, "
				"$XDG_RUNTIME_DIR/pagedkv.sock)\n"
				"  -c, --clients N        client processes, 1 to %d (default 4)\n"
				"  -n, --max-new N        tokens per answer at most, 1 to 4096 (default 96)\n"
				"  -t, --threads N        compute threads per client, 0 to 1024 (default 1; 0: all CPUs)\n"
				"      --temp T           sampling temperature, 0 to 10 (default 0.2, the model card's)\n"
				"      --top-p P          nucleus sampling, 0 to 1 (default 0.9, the model card's)\n"
				"      --seed S           random seed; client i uses S+i (default 1)\n"
				"      --repeat-penalty R the reply's repeated tokens weigh R times less, 1 to 10\n"
				"                         (default %.1f; 1: off)\n"
				"      --greedy           greedy decoding without penalty: the same answers every run\n"
				"      --staggered        start clients 1.. once client 0 has its first token (by\n"
				"                         default all start at once and share the prompt in flight)\n"
				OPT_POOL_HELP OPT_ATTENTION_HELP
				"  -h, --help             this text\n"
				"Needs a running pagedkvd (scripts/demo starts one).\n", MAX_CLIENTS, REPEAT_PENALTY);
			return 0;
		}
	}
	if (bad)
		return 2;
	nc = (int)nc32;
	if (!so.model)
		return opt_need_model(prog);
	/* The parent attaches to the same pool to watch the blocks in use. */
	struct session mon;
	char err[512];
	struct session_opts mo = so;
	mo.max_tokens = 1;
	if (session_open(&mon, &mo, err, sizeof err)) {
		fprintf(stderr, "pkv-demo: %s\n", err);
		return 1;
	}
	uint32_t bs = 16, peak = 0;
	int32_t *sys_ids;
	int n_sys = chat_turn(&mon.tok, system_prompt, "", 1, 0, &sys_ids);
	printf("pkv-demo: %d clients share a %d-token system prompt through pagedkvd (%s)\n\n", nc,
	       n_sys > 0 ? n_sys : 0, so.socket ? so.socket : "default socket");
	if (n_sys > 0)
		free(sys_ids);
	signal(SIGPIPE, SIG_IGN);
	for (int i = 0; i < (staggered ? 1 : nc); i++)
		if (spawn(&cl[i], &so, default_questions[i], max_new, &sp, i)) {
			fprintf(stderr, "pkv-demo: fork failed\n");
			return 1;
		}
	if (tty)
		draw(cl, nc, default_questions, 1);
	else
		for (int i = 0; i < (staggered ? 1 : nc); i++)
			log_phase(&cl[i], i, "started, loading the model");
	int remaining = nc;
	while (remaining > 0) {
		struct pollfd pf[MAX_CLIENTS];
		int idx[MAX_CLIENTS], np = 0;
		for (int i = 0; i < nc; i++)
			if (cl[i].started && !cl[i].done && !cl[i].failed) {
				pf[np].fd = cl[i].fd;
				pf[np].events = POLLIN;
				idx[np++] = i;
			}
		if (np == 0)
			break;
		poll(pf, (nfds_t)np, 100);
		for (int k = 0; k < np; k++) {
			struct client *x = &cl[idx[k]];
			struct rec r;
			if (!(pf[k].revents & (POLLIN | POLLHUP)))
				continue;
			ssize_t got = read(x->fd, &r, sizeof r);
			if (got != (ssize_t)sizeof r) {
				x->failed = 1;
				remaining--;
				if (!tty)
					log_phase(x, idx[k], "FAILED: the client process ended");
				continue;
			}
			if (r.kind == 4) {
				x->prefilling = 1;
				x->last.prompt = r.prompt;
				if (!tty) {
					char what[96];
					snprintf(what, sizeof what, "model loaded, reading its %u-token prompt", r.prompt);
					log_phase(x, idx[k], what);
				}
			} else if (r.kind == 1) {
				char *t = realloc(x->text, x->len + r.piece_len + 1);
				if (t) {
					x->text = t;
					memcpy(t + x->len, r.piece, r.piece_len);
					x->len += r.piece_len;
					t[x->len] = 0;
				}
				x->last.n_gen = r.n_gen;
				if (!tty && r.n_gen == 1)
					log_phase(x, idx[k], "first token");
				/* --staggered: client 0's first token, its prompt is cached: start the others */
				if (staggered && idx[k] == 0 && r.n_gen == 1)
					for (int i = 1; i < nc; i++) {
						if (spawn(&cl[i], &so, default_questions[i], max_new, &sp, i))
							cl[i].failed = 1, remaining--;
						else if (!tty)
							log_phase(&cl[i], i, "started");
					}
			} else {
				x->last = r;
				x->done = r.kind == 2;
				x->failed = r.kind == 3;
				remaining--;
				if (!tty) {
					char what[512];
					if (x->done)
						snprintf(what, sizeof what, "done, %u tokens", r.n_gen);
					else
						snprintf(what, sizeof what, "FAILED: %.400s", r.err);
					log_phase(x, idx[k], what);
				}
			}
		}
		struct pkv_stats st = PKV_STATS_INIT;
		if (mon.attn.ops->stats(mon.attn.ctx, &st) == 0 && st.in_use_blocks > peak)
			peak = st.in_use_blocks;
		if (tty)
			draw(cl, nc, default_questions, 0);
	}
	for (int i = 0; i < nc; i++)
		if (cl[i].pid > 0) {
			int stt;
			waitpid(cl[i].pid, &stt, 0);
			close(cl[i].fd);
		}
	printf("\n");
	uint32_t unshared = 0;
	int failed = 0;
	for (int i = 0; i < nc; i++) {
		printf("--- client %d: %s\n%s\n\n", i, default_questions[i], cl[i].text ? cl[i].text : "");
		if (!cl[i].done)
			printf("    FAILED: %s\n\n", cl[i].last.err[0] ? cl[i].last.err :
			       cl[i].started ? "the client process ended without a result (see above)" : "not started");
		failed += !cl[i].done;
		unshared += (cl[i].last.prompt + cl[i].last.n_gen + bs - 1) / bs;
	}
	if (failed == nc) {
		fprintf(stderr, "pkv-demo: every client failed; the first error: %s\n",
			cl[0].last.err[0] ? cl[0].last.err : "unknown (see above)");
		session_close(&mon);
		for (int i = 0; i < nc; i++)
			free(cl[i].text);
		return 1;
	}
	printf("%-7s %8s %12s %9s %8s\n", "client", "prompt", "from_shared", "ttft_ms", "tok/s");
	for (int i = 0; i < nc; i++)
		printf("%-7d %8u %12u %9.1f %8.1f%s\n", i, cl[i].last.prompt, cl[i].last.reused, cl[i].last.ttft * 1e3,
		       cl[i].last.tok_s, cl[i].done ? "" : "  (failed, see above)");
	printf("\n  prompt       tokens in the client's prompt (the shared system prompt and its question)\n"
	       "  from_shared  prompt tokens whose KV was already in pagedkvd's cache: not computed again\n"
	       "  ttft_ms      time to first token, milliseconds (the client with from_shared 0 computed the prompt)\n"
	       "  tok/s        generation speed after the first token\n\n");
	/* One block holds K and V of bs tokens for every layer and KV head, f32 (the pool's dtype). */
	double block_mib = 2.0 * mon.m.hp.n_layers * mon.m.hp.n_kv_heads * mon.m.hp.head_dim * 4 * bs / (1 << 20);
	printf("KV memory: %u blocks = %.1f MiB instead of %u = %.1f MiB without sharing: %.1f× less\n"
	       "(peak blocks in use in pagedkvd; %u tokens per block, %.2f MiB each)\n",
	       peak, peak * block_mib, unshared, unshared * block_mib, peak ? (double)unshared / peak : 0.0, bs,
	       block_mib);
	session_close(&mon);
	for (int i = 0; i < nc; i++)
		free(cl[i].text);
	return failed ? 1 : 0;
}
