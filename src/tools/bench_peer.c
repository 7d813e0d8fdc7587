/* SPDX-License-Identifier: MIT */
/* The llama-bench peer of pkv-bench e2e: runs the binary the user named and reads its JSON output. */
#include "bench_peer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PEER_OUT_MAX (1 << 20) /* llama-bench prints well under a kilobyte per test */

/* The number after "key": inside [obj, end), or -ENOENT. The key is searched with its quotes and colon
 * so "n_gen" never matches inside "n_gen_xyz" or a string value. */
static int json_num(const char *obj, const char *end, const char *key, double *v)
{
	char pat[40];
	size_t pl = (size_t)snprintf(pat, sizeof pat, "\"%s\":", key);
	for (const char *p = obj; p + pl <= end; p++) {
		if (memcmp(p, pat, pl))
			continue;
		p += pl;
		while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
			p++;
		char *e;
		*v = strtod(p, &e);
		return e > p && e <= end ? 0 : -ENOENT;
	}
	return -ENOENT;
}

int peer_parse_json(const char *json, long n_prompt, long n_gen, double *avg_ts)
{
	int depth = 0, in_str = 0;
	const char *obj = NULL;
	for (const char *p = json; *p; p++) {
		if (in_str) {
			if (*p == '\\' && p[1])
				p++;
			else if (*p == '"')
				in_str = 0;
			continue;
		}
		if (*p == '"') {
			in_str = 1;
		} else if (*p == '{') {
			if (depth++ == 0)
				obj = p;
		} else if (*p == '}' && depth > 0 && --depth == 0) {
			double np, ng, ts;
			if (!json_num(obj, p, "n_prompt", &np) && !json_num(obj, p, "n_gen", &ng) &&
			    !json_num(obj, p, "avg_ts", &ts) && np == (double)n_prompt && ng == (double)n_gen && ts > 0) {
				*avg_ts = ts;
				return 0;
			}
		}
	}
	return -ENOENT;
}

/* Runs argv with stdout captured (stderr to /dev/null: llama.cpp logs there); NUL-terminated, malloc'd. */
static int run_capture(char *const argv[], char **out)
{
	int fd[2];
	if (pipe(fd))
		return -errno;
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(fd[0]);
		close(fd[1]);
		return -e;
	}
	if (pid == 0) {
		int dn = open("/dev/null", O_WRONLY);
		dup2(fd[1], 1);
		if (dn >= 0)
			dup2(dn, 2);
		close(fd[0]);
		close(fd[1]);
		execv(argv[0], argv);
		_exit(127);
	}
	close(fd[1]);
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);
	int r = buf ? 0 : -ENOMEM;
	for (ssize_t n; !r;) {
		if (len + 1 == cap) {
			char *nb = cap < PEER_OUT_MAX ? realloc(buf, cap * 2) : NULL;
			if (!nb) {
				r = -E2BIG;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		n = read(fd[0], buf + len, cap - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd[0]);
	int st;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (!r && (!WIFEXITED(st) || WEXITSTATUS(st)))
		r = -EIO;
	if (r) {
		free(buf);
		return r;
	}
	buf[len] = 0;
	*out = buf;
	return 0;
}

static int one_test(const char *path, const char *model, int threads, long p, long n, long d, double *ts)
{
	char t[16], ps[24], ns[24], ds[24];
	snprintf(t, sizeof t, "%d", threads);
	snprintf(ps, sizeof ps, "%ld", p);
	snprintf(ns, sizeof ns, "%ld", n);
	snprintf(ds, sizeof ds, "%ld", d);
	/* -fa 0: llama.cpp's flash attention is slower on this CPU path; -r 1: our caller alternates reps */
	char *argv[] = { (char *)path, "-m", (char *)model, "-t", t, "-p", ps, "-n", ns, "-d", ds,
			 "-fa", "0", "-r", "1", "-o", "json", NULL };
	char *out = NULL;
	int r = run_capture(argv, &out);
	if (r)
		return r;
	r = peer_parse_json(out, p, n, ts) ? -EIO : 0;
	free(out);
	return r;
}

int peer_llama_bench(const char *path, const char *model, int threads, uint32_t prompt_len, uint32_t decode_len,
		     struct peer_result *out)
{
	int r = one_test(path, model, threads, prompt_len, 0, 0, &out->pp_tok_s);
	if (!r)
		r = one_test(path, model, threads, 0, decode_len, prompt_len, &out->tg_tok_s);
	return r;
}
