/* SPDX-License-Identifier: MIT */
/* The standalone fuzz driver every fuzz target shares (no libFuzzer needed): seeds, corpus files, then mutations; TAP. */
/*
 * Usage: FUZZ_TARGET [FILE|DIR...]: runs the target's built-in seeds and the
 * given corpus files (a directory: every file in it), then PKV_FUZZ_ITERS
 * random mutations of them (default: the target's); PKV_FUZZ_SEED sets the
 * generator seed. An input that crashes or breaks an invariant aborts, so
 * reaching the end is the pass.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fuzz_driver.h"

#define MAX_SEEDS 256

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* One to eight edits of the kinds that reach parsers' edge cases. */
static void mutate(uint8_t *b, size_t *len, size_t max)
{
	static const uint64_t wide[] = { 0, 1, 0x7fffffff, 0x80000000, 0xffffffff, 4096, 64, ~0ull, 1ull << 63,
					 1ull << 32 };
	int k = 1 + (int)(next() % 8);

	while (k--) {
		size_t i = *len ? next() % *len : 0;

		switch (next() % 8) {
		case 0: if (*len) b[i] ^= (uint8_t)(1u << (next() % 8)); break;
		case 1: if (*len) b[i] = (uint8_t)next(); break;
		case 2: *len = i; break; /* truncate */
		case 3: if (*len < max) b[(*len)++] = (uint8_t)next(); break;
		case 4: /* an interesting value into a 32-bit field */
			if (i + 4 <= *len) {
				uint32_t x = (uint32_t)wide[next() % 7];

				memcpy(b + i, &x, 4);
			}
			break;
		case 5: /* ... or into a 64-bit length or offset */
			if (i + 8 <= *len) {
				uint64_t x = next() % 2 ? wide[next() % 10] : UINT64_MAX - next() % 4096;

				memcpy(b + i, &x, 8);
			}
			break;
		case 6: if (i + 4 <= *len) memset(b + i, 0xff, 4); break;
		default: { /* copy a chunk within the input */
			size_t from = *len ? next() % *len : 0, n = next() % 32;

			if (from + n <= *len && i + n <= *len)
				memmove(b + i, b + from, n);
		}
		}
	}
}

/* Adds a file's first max bytes as a seed. */
static int add_file(const char *path, uint8_t **seeds, size_t *lens, int n, size_t max)
{
	FILE *f;

	if (n >= MAX_SEEDS || !(f = fopen(path, "rb")))
		return n;
	seeds[n] = malloc(max);
	if (!seeds[n]) {
		fclose(f);
		return n;
	}
	lens[n] = fread(seeds[n], 1, max, f);
	fclose(f);
	return n + 1;
}

static int add_path(const char *path, uint8_t **seeds, size_t *lens, int n, size_t max)
{
	struct dirent *de;
	struct stat st;
	DIR *d;

	if (stat(path, &st) || !S_ISDIR(st.st_mode))
		return add_file(path, seeds, lens, n, max);
	d = opendir(path);
	while (d && (de = readdir(d))) {
		char p[4096];

		if (de->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/%s", path, de->d_name);
		n = add_file(p, seeds, lens, n, max);
	}
	if (d)
		closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	const struct pkv_fuzz_target *t = &pkv_fuzz_target;
	static uint8_t *seeds[MAX_SEEDS];
	static size_t lens[MAX_SEEDS];
	const char *env = getenv("PKV_FUZZ_ITERS");
	long iters = env ? atol(env) : t->default_iters;
	int n, builtin, i;
	uint8_t *buf;
	char extra[256] = "";

	if (getenv("PKV_FUZZ_SEED"))
		rng = strtoull(getenv("PKV_FUZZ_SEED"), NULL, 0) | 1;
	n = builtin = t->seeds(seeds, lens, MAX_SEEDS);
	for (i = 1; i < argc; i++)
		n = add_path(argv[i], seeds, lens, n, t->max_len);
	buf = malloc(t->max_len);
	if (!buf || n <= 0) {
		printf("Bail out! %s: no seeds or no memory\n", t->name);
		return 1;
	}
	for (i = 0; i < n; i++)
		LLVMFuzzerTestOneInput(seeds[i], lens[i]);
	for (long it = 0; it < iters; it++) {
		int s = (int)(next() % (uint64_t)n);
		size_t len = lens[s] < t->max_len ? lens[s] : t->max_len;

		memcpy(buf, seeds[s], len);
		mutate(buf, &len, t->max_len);
		LLVMFuzzerTestOneInput(buf, len);
	}
	if (t->summary)
		t->summary(extra, sizeof(extra));
	printf("1..1\nok 1 - %s: %d seeds, %d corpus files, %ld mutations%s, no crash\n", t->name, builtin,
	       n - builtin, iters, extra);
	free(buf);
	for (i = 0; i < n; i++)
		free(seeds[i]);
	return 0;
}
