/* SPDX-License-Identifier: MIT */
/* pkv-demo: N client processes share one long system prompt through pagedkvd. Client 0 starts cold;
 * the others start once it has its first token and find the prompt's KV in the daemon's cache.
 * Shows live progress, then each answer and a table (TTFT, tokens/s, prompt tokens from the shared
 * prefix) and the daemon's peak blocks in use against what unshared caches would need. */
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
#include "session.h"

#define MAX_CLIENTS 8

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
	int kind; /* 1 token, 2 done, 3 failed */
	uint32_t n_gen, prompt, reused;
	double ttft, tok_s;
	char piece[64];
	uint32_t piece_len;
};

struct client {
	pid_t pid;
	int fd;
	int started, done, failed;
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

static int child_main(int fd, const struct session_opts *so, const char *question, uint32_t max_new)
{
	struct session s;
	struct engine e;
	struct sampler smp;
	char err[512];
	struct rec r = { .kind = 3 };
	int32_t *ids;
	if (session_open(&s, so, err, sizeof err)) {
		snprintf(r.piece, sizeof r.piece, "%.63s", err);
		fprintf(stderr, "pkv-demo client: %s\n", err);
		wr_all(fd, &r, sizeof r);
		return 1;
	}
	if (engine_init(&e, &s.lc, &s.tok, 256, 1))
		return 1;
	sampler_init(&smp, 0, 0, 1, 1);
	struct child_ctx cc = { .fd = fd, .tok = &s.tok };
	struct conv *cv = engine_conv_new(&e, &smp, child_tok, &cc);
	int n = chatml_turn(&s.tok, system_prompt, question, 1, 0, &ids);
	if (n <= 0 || engine_submit(&e, cv, ids, (uint32_t)n, max_new) || engine_run(&e) < 0 ||
	    cv->state != CONV_DONE) {
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

static int spawn(struct client *c, const struct session_opts *so, const char *q, uint32_t max_new)
{
	int p[2];
	if (pipe(p))
		return -errno;
	c->pid = fork();
	if (c->pid < 0)
		return -errno;
	if (c->pid == 0) {
		close(p[0]);
		_exit(child_main(p[1], so, q, max_new));
	}
	close(p[1]);
	c->fd = p[0];
	c->started = 1;
	return 0;
}

static void draw(struct client *c, int n, const char *const *q, int first)
{
	if (!first)
		printf("\033[%dA", n);
	for (int i = 0; i < n; i++) {
		const char *st = !c[i].started ? "waiting for client 0's first token" :
				 c[i].failed ? "FAILED" : c[i].done ? "done" : "generating";
		printf("\033[2K  client %d  %-42.42s  %4u tokens  %s\n", i, q[i], c[i].last.n_gen, st);
	}
	fflush(stdout);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", 1, 0, 'm' }, { "socket", 1, 0, 1 }, { "clients", 1, 0, 'c' },
		{ "max-new", 1, 0, 'n' }, { "threads", 1, 0, 't' }, { "help", 0, 0, 'h' }, { 0 } };
	struct session_opts so = { .threads = 1 };
	uint32_t max_new = 96;
	int nc = 4, c, tty = isatty(1);
	struct client cl[MAX_CLIENTS] = { 0 };
	while ((c = getopt_long(argc, argv, "m:c:n:t:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': so.model = optarg; break;
		case 1: so.socket = optarg; break;
		case 'c': nc = atoi(optarg); break;
		case 'n': max_new = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 't': so.threads = atoi(optarg); break;
		case 'h':
		default:
			fprintf(c == 'h' ? stdout : stderr,
				"usage: pkv-demo -m MODEL [--socket PATH] [-c CLIENTS (1..8)] [-n MAX_NEW] [-t THREADS]\n");
			return c == 'h' ? 0 : 2;
		}
	}
	if (!so.model || nc < 1 || nc > MAX_CLIENTS) {
		fprintf(stderr, "pkv-demo: -m MODEL is required and -c must be 1..%d\n", MAX_CLIENTS);
		return 2;
	}
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
	int n_sys = chatml_turn(&mon.tok, system_prompt, "", 1, 0, &sys_ids);
	printf("pkv-demo: %d clients share a %d-token system prompt through pagedkvd (%s)\n\n", nc,
	       n_sys > 0 ? n_sys : 0, so.socket ? so.socket : "default socket");
	if (n_sys > 0)
		free(sys_ids);
	signal(SIGPIPE, SIG_IGN);
	if (spawn(&cl[0], &so, default_questions[0], max_new)) {
		fprintf(stderr, "pkv-demo: fork failed\n");
		return 1;
	}
	if (tty)
		draw(cl, nc, default_questions, 1);
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
				continue;
			}
			if (r.kind == 1) {
				char *t = realloc(x->text, x->len + r.piece_len + 1);
				if (t) {
					x->text = t;
					memcpy(t + x->len, r.piece, r.piece_len);
					x->len += r.piece_len;
					t[x->len] = 0;
				}
				x->last.n_gen = r.n_gen;
				/* client 0's first token: its prompt is in the cache, start the others */
				if (idx[k] == 0 && r.n_gen == 1)
					for (int i = 1; i < nc; i++)
						if (spawn(&cl[i], &so, default_questions[i], max_new))
							cl[i].failed = 1, remaining--;
			} else {
				x->last = r;
				x->done = r.kind == 2;
				x->failed = r.kind == 3;
				remaining--;
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
		failed += !cl[i].done;
		unshared += (cl[i].last.prompt + cl[i].last.n_gen + bs - 1) / bs;
	}
	printf("%-7s %8s %14s %9s %8s\n", "client", "prompt", "from_shared", "ttft_ms", "tok/s");
	for (int i = 0; i < nc; i++)
		printf("%-7d %8u %14u %9.1f %8.1f%s\n", i, cl[i].last.prompt, cl[i].last.reused, cl[i].last.ttft * 1e3,
		       cl[i].last.tok_s, cl[i].done ? "" : "  (failed)");
	printf("\ndaemon: peak %u KV blocks in use (%u tokens per block); without sharing the same "
	       "conversations need %u\n", peak, bs, unshared);
	session_close(&mon);
	for (int i = 0; i < nc; i++)
		free(cl[i].text);
	return failed ? 1 : 0;
}
