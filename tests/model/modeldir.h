/* SPDX-License-Identifier: MIT */
/* Where model tests find their files: $PKV_TEST_MODEL_DIR, else the tree's tests/data (stories260K.gguf
 * ships there), else $PKV_TOP_SRCDIR/../shared/models. */
#ifndef PKV_TEST_MODELDIR_H
#define PKV_TEST_MODELDIR_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Fills buf with the path of `file`; returns 0 when it is readable, -1 otherwise (buf then names
 * the last place looked). */
static inline int model_path(const char *file, char *buf, size_t len)
{
	const char *d = getenv("PKV_TEST_MODEL_DIR");
	const char *top = getenv("PKV_TOP_SRCDIR");

	if (d && *d) {
		snprintf(buf, len, "%s/%s", d, file);
		return access(buf, R_OK) == 0 ? 0 : -1;
	}
	snprintf(buf, len, "%s/tests/data/%s", top ? top : "..", file);
	if (access(buf, R_OK) == 0)
		return 0;
	snprintf(buf, len, "%s/../shared/models/%s", top ? top : "..", file);
	return access(buf, R_OK) == 0 ? 0 : -1;
}

#define SMOLLM2_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

/*
 * SmolLM2-135M-Instruct for the tests that need it: $PKV_SMOLLM2_MODEL, else
 * model_path's places, else where scripts/fetch-model puts it
 * (~/.cache/pagedkv/models). Returns 0 when buf names a readable file.
 */
static inline int smollm2_path(char *buf, size_t len)
{
	const char *env = getenv("PKV_SMOLLM2_MODEL"), *home = getenv("HOME");

	if (env && *env)
		snprintf(buf, len, "%s", env);
	else if (model_path(SMOLLM2_FILE, buf, len) && home)
		snprintf(buf, len, "%s/.cache/pagedkv/models/%s", home, SMOLLM2_FILE);
	return access(buf, R_OK) == 0 ? 0 : -1;
}

#endif
