/* SPDX-License-Identifier: MIT */
/* pkv-generate: runs many prompts as concurrent conversations with continuous batching and prints
 * their outputs and per-conversation statistics (TTFT, tokens/s, prefix tokens reused). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "opts.h"
#include "session.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: pkv-generate -m MODEL [options] [PROMPT...]\n"
		"  -m, --model PATH       GGUF model (llama or qwen2 architecture)\n"
		"  -n, --max-new N        tokens to generate per prompt, 1 to 1048576 (default 64)\n"
		"  -f, --file PATH        read prompts from PATH, one per line\n"
		"      --socket PATH      pagedkvd socket (default $PAGEDKV_SOCKET, $XDG_RUNTIME_DIR/pagedkv.sock)\n"
		"      --in-process       contiguous in-process attention instead of the daemon\n"
		"  -P, --parallel N       conversations running at once, 0 to 65536 (default 0: all)\n"
		"  -b, --budget N         tokens per forward step, 1 to 65536 (default 256)\n"
		"  -s, --system TEXT      system prompt (chat models)\n"
		"      --raw              no chat template: prompts are plain text (BOS per the model)\n"
		OPT_SAMPLING_HELP OPT_POOL_HELP OPT_ATTENTION_HELP
		"  -t, --threads N        compute threads, 0 to 1024 (default 0: $PKV_THREADS or all CPUs)\n"
		"  -q, --quiet            print only the statistics table\n"
		"  -S, --stream           print conversation 0's tokens as they come\n"
		"      --idle-ms N        wait N ms after attaching before the first prompt (measurement: a\n"
		"                         server idle between its start and its first request)\n"
		"  -h, --help             this text\n"
		"Sampling is greedy unless --temp is given.\n");
}

static char *read_line_list(const char *path, char ***lines, int *n)
{
	FILE *f = fopen(path, "r");
	char *buf = NULL;
	size_t cap = 0;
	ssize_t len;
	if (!f)
		return strerror(errno);
	while ((len = getline(&buf, &cap, f)) >= 0) {
		while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
			buf[--len] = 0;
		if (!len)
			continue;
		char **nl = realloc(*lines, (size_t)(*n + 1) * sizeof *nl);
		if (!nl)
			break;
		*lines = nl;
		(*lines)[(*n)++] = strdup(buf);
	}
	free(buf);
	fclose(f);
	return NULL;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", 1, 0, 'm' }, { "max-new", 1, 0, 'n' }, { "file", 1, 0, 'f' },
		{ "socket", 1, 0, 1 }, { "in-process", 0, 0, 2 }, { "parallel", 1, 0, 'P' },
		{ "budget", 1, 0, 'b' }, { "system", 1, 0, 's' }, { "raw", 0, 0, 3 }, { "temp", 1, 0, 4 },
		{ "top-k", 1, 0, 5 }, { "top-p", 1, 0, 6 }, { "seed", 1, 0, 7 }, { "threads", 1, 0, 't' },
		{ "quiet", 0, 0, 'q' }, { "stream", 0, 0, 'S' }, { "help", 0, 0, 'h' }, { "ctx", 1, 0, 8 },
		{ "max-seqs", 1, 0, 9 }, { "idle-ms", 1, 0, 10 }, { "kv-dtype", 1, 0, 20 },
		{ "client-attention", 0, 0, 21 }, { "daemon-attention", 0, 0, 22 }, { 0 } };
	static const char prog[] = "pkv-generate";
	struct session_opts so = { 0 };
	const char *file = NULL, *system = NULL;
	uint32_t max_new = 64, parallel = 0, budget = 256, top_k = 0, idle_ms = 0;
	float temp = 0, top_p = 1;
	uint64_t seed = 1;
	int raw = 0, quiet = 0, stream = 0, c, rc = 1, bad = 0;
	char **prompts = NULL, err[512];
	int n_prompts = 0;

	while ((c = getopt_long(argc, argv, "m:n:f:P:b:s:t:qSh", lo, NULL)) != -1) {
		switch (c) {
		case 'm': so.model = optarg; break;
		case 'n': bad |= opt_u32(prog, "-n/--max-new", optarg, 1, 1u << 20, &max_new); break;
		case 'f': file = optarg; break;
		case 1: so.socket = optarg; break;
		case 2: so.in_process = 1; break;
		case 'P': bad |= opt_u32(prog, "-P/--parallel", optarg, 0, 65536, &parallel); break;
		case 'b': bad |= opt_u32(prog, "-b/--budget", optarg, 1, 65536, &budget); break;
		case 's': system = optarg; break;
		case 3: raw = 1; break;
		case 4: bad |= opt_float(prog, "--temp", optarg, 0, 10, &temp); break;
		case 5: bad |= opt_u32(prog, "--top-k", optarg, 0, 1000000, &top_k); break;
		case 6: bad |= opt_float(prog, "--top-p", optarg, 0, 1, &top_p); break;
		case 7: bad |= opt_u64(prog, "--seed", optarg, &seed); break;
		case 8: bad |= opt_u32(prog, "--ctx", optarg, 16, 1u << 20, &so.ctx); break;
		case 9: bad |= opt_u32(prog, "--max-seqs", optarg, 1, 4096, &so.max_seqs); break;
		case 20: bad |= opt_kv_dtype(prog, "--kv-dtype", optarg, &so.kv_dtype); break;
		case 21: so.attention = SESSION_ATTN_CLIENT; break;
		case 22: so.attention = SESSION_ATTN_DAEMON; break;
		case 10: bad |= opt_u32(prog, "--idle-ms", optarg, 0, 600000, &idle_ms); break;
		case 't': bad |= opt_int(prog, "-t/--threads", optarg, 0, 1024, &so.threads); break;
		case 'q': quiet = 1; break;
		case 'S': stream = 1; break;
		case 'h': usage(stdout); return 0;
		default: return opt_refused(prog);
		}
	}
	if (bad)
		return 2;
	if (!so.model)
		return opt_need_model(prog);
	so.offer_in_process = 1;
	if (file) {
		char *e = read_line_list(file, &prompts, &n_prompts);
		if (e) {
			fprintf(stderr, "pkv-generate: %s: %s\n", file, e);
			return 1;
		}
	}
	for (int i = optind; i < argc; i++) {
		char **nl = realloc(prompts, (size_t)(n_prompts + 1) * sizeof *nl);
		if (!nl)
			return 1;
		prompts = nl;
		prompts[n_prompts++] = strdup(argv[i]);
	}
	if (n_prompts == 0) {
		fprintf(stderr, "pkv-generate: no prompts (give them as arguments or with -f)\n");
		return 2;
	}
	so.max_tokens = budget;
	struct session s;
	if (session_open(&s, &so, err, sizeof err)) {
		fprintf(stderr, "pkv-generate: %s\n", err);
		goto out_prompts;
	}
	if (idle_ms) {
		struct timespec ts = { idle_ms / 1000, (long)(idle_ms % 1000) * 1000000 };
		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
	}
	int chat = !raw && chat_available(&s.tok);
	struct engine e;
	if (engine_init(&e, &s.lc, &s.tok, budget, parallel ? parallel : (uint32_t)n_prompts)) {
		fprintf(stderr, "pkv-generate: out of memory\n");
		goto out_session;
	}
	struct sampler smp;
	struct conv **cv = calloc((size_t)n_prompts, sizeof *cv);
	for (int i = 0; i < n_prompts && cv; i++) {
		int32_t *ids;
		int n;
		sampler_init(&smp, temp, top_k, top_p, seed + (uint64_t)i);
		cv[i] = engine_conv_new(&e, &smp, NULL, NULL);
		if (chat)
			n = chat_turn(&s.tok, system, prompts[i], 1, 0, &ids);
		else
			n = tok_encode(&s.tok, prompts[i], strlen(prompts[i]), s.tok.add_bos, 0, &ids);
		if (n == 0)
			fprintf(stderr, "pkv-generate: prompt %d is empty (no tokens, and --raw adds no BOS here)\n", i);
		if (!cv[i] || n <= 0 || engine_submit(&e, cv[i], ids, (uint32_t)n, max_new)) {
			if (n > 0)
				fprintf(stderr, "pkv-generate: cannot queue prompt %d\n", i);
			if (n >= 0)
				free(ids);
			goto out_engine;
		}
		free(ids);
	}
	double t0 = engine_now();
	int last_shown = 0;
	int r;
	while ((r = engine_step(&e)) > 0) {
		if (stream && cv[0]->n_gen > (uint32_t)last_shown) {
			char piece[256];
			for (uint32_t k = cv[0]->turn_start + (uint32_t)last_shown; k < cv[0]->turn_start + cv[0]->n_gen; k++) {
				size_t l = tok_piece(&s.tok, cv[0]->hist[k], 0, piece, sizeof piece);
				fwrite(piece, 1, l, stdout);
			}
			fflush(stdout);
			last_shown = (int)cv[0]->n_gen;
		}
	}
	double wall = engine_now() - t0;
	if (stream)
		printf("\n");
	if (r < 0) {
		fprintf(stderr, "pkv-generate: step failed: %s\n", strerror(-r));
		goto out_engine;
	}
	uint64_t gen_total = 0;
	int failed = 0;
	for (int i = 0; i < n_prompts; i++) {
		failed += cv[i]->state == CONV_FAILED;
		struct conv *k = cv[i];
		gen_total += k->n_gen;
		if (quiet)
			continue;
		printf("--- [%d] %s\n", i, prompts[i]);
		if (k->state == CONV_FAILED)
			printf("(failed: %s)\n", k->err == -ENOSPC ? "the pool is full (a longer --ctx or fewer conversations)"
							      : strerror(-k->err));
		char piece[256];
		for (uint32_t j = k->turn_start; j < k->n_hist; j++) {
			size_t l = tok_piece(&s.tok, k->hist[j], 0, piece, sizeof piece);
			fwrite(piece, 1, l, stdout);
		}
		printf("\n");
	}
	/* in_flight: the reused tokens another conversation was still computing when this one arrived */
	printf("\n%-5s %8s %8s %9s %6s %9s %8s\n", "conv", "prompt", "reused", "in_flight", "gen", "ttft_ms",
	       "tok/s");
	for (int i = 0; i < n_prompts; i++) {
		struct conv *k = cv[i];
		double dt = k->t_done - k->t_first;
		printf("%-5d %8u %8u %9u %6u %9.1f %8.1f\n", i, k->prompt_tokens, k->reused_tokens,
		       k->inflight_tokens, k->n_gen,
		       k->t_first > 0 ? (k->t_first - k->t_submit) * 1e3 : 0.0,
		       k->n_gen > 1 && dt > 0 ? (k->n_gen - 1) / dt : 0.0);
	}
	struct pkv_stats st = PKV_STATS_INIT;
	printf("total: %llu tokens generated in %.2f s (%.1f tok/s aggregate), %llu steps, attention: %s\n",
	       (unsigned long long)gen_total, wall, wall > 0 ? gen_total / wall : 0.0,
	       (unsigned long long)e.steps, s.attn.name);
	if (s.attn.ops->stats(s.attn.ctx, &st) == 0)
		printf("cache: %u blocks, %u in use, %u cached, %u free; prefix hits %llu of %llu looked-up tokens\n",
		       st.num_blocks, st.in_use_blocks, st.cached_blocks, st.free_blocks,
		       (unsigned long long)st.prefix_hit_tokens, (unsigned long long)st.prefix_lookup_tokens);
	/* a conversation that failed is a failed run, whatever the others did */
	rc = failed ? 1 : 0;
	if (failed)
		fprintf(stderr, "pkv-generate: %d of %d conversations failed\n", failed, n_prompts);
out_engine:
	free(cv);
	engine_free(&e);
out_session:
	session_close(&s);
out_prompts:
	for (int i = 0; i < n_prompts; i++)
		free(prompts[i]);
	free(prompts);
	return rc;
}
