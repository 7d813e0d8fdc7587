/* SPDX-License-Identifier: MIT */
/* Reading the reference files under tests/data and reporting where token ids differ from them. */
#ifndef PKV_TEST_REFDATA_H
#define PKV_TEST_REFDATA_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* tests/data/NAME of the source tree ($PKV_TOP_SRCDIR, set by make check; else the parent directory). */
static inline FILE *refdata_open(const char *name)
{
	char path[4096];
	const char *top = getenv("PKV_TOP_SRCDIR");
	FILE *f;

	snprintf(path, sizeof path, "%s/tests/data/%s", top ? top : "..", name);
	f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	return f;
}

/* One "# what: got ..., the reference ..." line on stderr, for a case whose ids differ. */
static inline void refdata_ids_differ(const char *what, const int32_t *got, int n, const int32_t *want, int nw)
{
	fprintf(stderr, "# %s: got", what);
	for (int i = 0; i < n; i++)
		fprintf(stderr, " %d", got[i]);
	fprintf(stderr, ", the reference");
	for (int i = 0; i < nw; i++)
		fprintf(stderr, " %d", want[i]);
	fprintf(stderr, "\n");
}

#endif
