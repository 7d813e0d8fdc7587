/* SPDX-License-Identifier: MIT */
/* pkv-chat: an interactive multi-turn chat; each turn re-opens the conversation with its whole
 * history so only the new tokens are computed (the rest comes back from the prefix cache). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "opts.h"
#include "session.h"

struct stream {
	const struct tokenizer *tok;
};

static void on_tok(struct conv *cv, int32_t t, void *arg)
{
	struct stream *s = arg;
	char piece[256];
	size_t l = tok_piece(s->tok, t, 0, piece, sizeof piece);
	fwrite(piece, 1, l, stdout);
	fflush(stdout);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: pkv-chat -m MODEL [options]\n"
		"  -m, --model PATH       GGUF model with a ChatML or Llama 3 chat template\n"
		"  -s, --system TEXT      system prompt (default: the model's)\n"
		"      --socket PATH      pagedkvd socket (default $PAGEDKV_SOCKET, $XDG_RUNTIME_DIR/pagedkv.sock)\n"
		"      --in-process       contiguous in-process attention instead of the daemon\n"
		"  -n, --max-new N        tokens per answer at most, 1 to 1048576 (default 256)\n"
		OPT_SAMPLING_HELP OPT_POOL_HELP OPT_ATTENTION_HELP
		"  -t, --threads N        compute threads, 0 to 1024 (default 0: $PKV_THREADS or all CPUs)\n"
		"  -h, --help             this text\n"
		"Sampling defaults: --temp 0.7 --top-k 40 --top-p 0.9. Type a message and press Enter;\n"
		"/stats shows prefix reuse and speed, /quit leaves.\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", 1, 0, 'm' }, { "system", 1, 0, 's' }, { "socket", 1, 0, 1 },
		{ "in-process", 0, 0, 2 }, { "max-new", 1, 0, 'n' }, { "temp", 1, 0, 4 }, { "top-k", 1, 0, 5 },
		{ "top-p", 1, 0, 6 }, { "seed", 1, 0, 7 }, { "threads", 1, 0, 't' }, { "help", 0, 0, 'h' },
		{ "ctx", 1, 0, 8 }, { "max-seqs", 1, 0, 9 }, { "kv-dtype", 1, 0, 20 },
		{ "client-attention", 0, 0, 21 }, { "daemon-attention", 0, 0, 22 }, { 0 } };
	static const char prog[] = "pkv-chat";
	struct session_opts so = { 0 };
	const char *system = NULL;
	uint32_t max_new = 256, top_k = 40;
	float temp = 0.7f, top_p = 0.9f;
	uint64_t seed = 1;
	char err[512], *line = NULL;
	size_t cap = 0;
	int c, rc = 1, bad = 0;

	while ((c = getopt_long(argc, argv, "m:s:n:t:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': so.model = optarg; break;
		case 's': system = optarg; break;
		case 1: so.socket = optarg; break;
		case 2: so.in_process = 1; break;
		case 'n': bad |= opt_u32(prog, "-n/--max-new", optarg, 1, 1u << 20, &max_new); break;
		case 4: bad |= opt_float(prog, "--temp", optarg, 0, 10, &temp); break;
		case 5: bad |= opt_u32(prog, "--top-k", optarg, 0, 1000000, &top_k); break;
		case 6: bad |= opt_float(prog, "--top-p", optarg, 0, 1, &top_p); break;
		case 7: bad |= opt_u64(prog, "--seed", optarg, &seed); break;
		case 8: bad |= opt_u32(prog, "--ctx", optarg, 16, 1u << 20, &so.ctx); break;
		case 9: bad |= opt_u32(prog, "--max-seqs", optarg, 1, 4096, &so.max_seqs); break;
		case 20: bad |= opt_kv_dtype(prog, "--kv-dtype", optarg, &so.kv_dtype); break;
		case 21: so.attention = SESSION_ATTN_CLIENT; break;
		case 22: so.attention = SESSION_ATTN_DAEMON; break;
		case 't': bad |= opt_int(prog, "-t/--threads", optarg, 0, 1024, &so.threads); break;
		case 'h': usage(stdout); return 0;
		default: return opt_refused(prog);
		}
	}
	if (bad)
		return 2;
	if (!so.model)
		return opt_need_model(prog);
	so.offer_in_process = 1;
	struct session s;
	if (session_open(&s, &so, err, sizeof err)) {
		fprintf(stderr, "pkv-chat: %s\n", err);
		return 1;
	}
	if (!chat_available(&s.tok)) {
		fprintf(stderr, "pkv-chat: this model has no chat template pkv-chat knows (ChatML, Llama 3); "
				"use pkv-generate --raw\n");
		goto out_session;
	}
	struct engine e;
	struct sampler smp;
	struct stream st = { .tok = &s.tok };
	if (engine_init(&e, &s.lc, &s.tok, 256, 1))
		goto out_session;
	sampler_init(&smp, temp, top_k, top_p, seed);
	struct conv *cv = engine_conv_new(&e, &smp, on_tok, &st);
	uint64_t turns = 0, reused = 0, prompt = 0, gen = 0;
	double gen_time = 0, last_ttft = 0;
	fprintf(stderr, "pkv-chat: %s, attention via %s. /stats, /quit\n", so.model, s.attn.name);
	for (;;) {
		ssize_t n;
		fputs("> ", stdout);
		fflush(stdout);
		if ((n = getline(&line, &cap, stdin)) < 0)
			break;
		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
			line[--n] = 0;
		if (!n)
			continue;
		if (!strcmp(line, "/quit") || !strcmp(line, "/exit"))
			break;
		if (!strcmp(line, "/stats")) {
			struct pkv_stats ps = PKV_STATS_INIT;
			printf("turns %llu, prompt tokens %llu of which %llu reused from the cache (%.0f%%), "
			       "last TTFT %.1f ms, decode %.1f tok/s\n",
			       (unsigned long long)turns, (unsigned long long)prompt, (unsigned long long)reused,
			       prompt ? 100.0 * (double)reused / (double)prompt : 0.0, last_ttft * 1e3,
			       gen_time > 0 ? (double)gen / gen_time : 0.0);
			if (s.attn.ops->stats(s.attn.ctx, &ps) == 0)
				printf("cache: %u blocks: %u in use, %u cached, %u free\n", ps.num_blocks,
				       ps.in_use_blocks, ps.cached_blocks, ps.free_blocks);
			continue;
		}
		int32_t *ids;
		int prev_ended = cv->n_hist && tok_is_eog(&s.tok, cv->hist[cv->n_hist - 1]);
		int nt = chat_turn(&s.tok, system, line, cv->n_hist == 0, prev_ended, &ids);
		if (nt <= 0 || engine_submit(&e, cv, ids, (uint32_t)nt, max_new)) {
			fprintf(stderr, "pkv-chat: cannot queue the message\n");
			free(nt > 0 ? ids : NULL);
			break;
		}
		free(ids);
		int r = engine_run(&e);
		printf("\n");
		if (r < 0 || cv->state == CONV_FAILED) {
			fprintf(stderr, "pkv-chat: generation failed: %s\n", strerror(r < 0 ? -r : -cv->err));
			break;
		}
		turns++;
		/* this turn's prompt is everything not already in the cache before it */
		prompt += cv->n_hist - cv->n_gen;
		reused += cv->reused_tokens + (cv->n_hist - cv->n_gen - cv->prompt_tokens);
		gen += cv->n_gen > 1 ? cv->n_gen - 1 : 0;
		gen_time += cv->t_done - cv->t_first;
		last_ttft = cv->t_first - cv->t_submit;
	}
	rc = 0;
	engine_free(&e);
out_session:
	free(line);
	session_close(&s);
	return rc;
}
