/* SPDX-License-Identifier: MIT */
/* Range-checked numeric options: strtoul alone takes "abc" as 0 and "-1" as 4294967295. */
#include "opts.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagedkv/types.h>

static int whole(const char *arg, uint64_t *v)
{
	char *end;

	if (!arg || !isdigit((unsigned char)*arg))
		return -1;
	errno = 0;
	*v = strtoull(arg, &end, 10);
	return errno || *end ? -1 : 0;
}

int opt_u32(const char *prog, const char *flag, const char *arg, uint32_t lo, uint32_t hi, uint32_t *out)
{
	uint64_t v;

	if (whole(arg, &v) || v < lo || v > hi) {
		fprintf(stderr, "%s: %s: '%s' is not a whole number from %" PRIu32 " to %" PRIu32 "\n", prog, flag,
			arg, lo, hi);
		return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

int opt_int(const char *prog, const char *flag, const char *arg, int lo, int hi, int *out)
{
	uint32_t v;

	if (lo < 0 || opt_u32(prog, flag, arg, (uint32_t)lo, (uint32_t)hi, &v))
		return -1;
	*out = (int)v;
	return 0;
}

int opt_u64(const char *prog, const char *flag, const char *arg, uint64_t *out)
{
	if (whole(arg, out)) {
		fprintf(stderr, "%s: %s: '%s' is not a whole number from 0 to %" PRIu64 "\n", prog, flag, arg,
			UINT64_MAX);
		return -1;
	}
	return 0;
}

int opt_kv_dtype(const char *prog, const char *flag, const char *arg, uint32_t *out)
{
	static const char *const names[] = { [PKV_DTYPE_F32] = "f32", [PKV_DTYPE_F16] = "f16",
					     [PKV_DTYPE_BF16] = "bf16" };

	for (uint32_t t = 0; t < sizeof(names) / sizeof(names[0]); t++)
		if (arg && !strcmp(arg, names[t])) {
			*out = t;
			return 0;
		}
	fprintf(stderr, "%s: %s: '%s' is not f32, f16 or bf16\n", prog, flag, arg ? arg : "");
	return -1;
}

int opt_float(const char *prog, const char *flag, const char *arg, float lo, float hi, float *out)
{
	char *end;
	float v;

	errno = 0;
	v = arg && *arg ? strtof(arg, &end) : NAN;
	if (!arg || !*arg || errno || *end || !(v >= lo && v <= hi)) {
		fprintf(stderr, "%s: %s: '%s' is not a number from %g to %g\n", prog, flag, arg ? arg : "", lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

int opt_refused(const char *prog)
{
	fprintf(stderr, "%s: '%s --help' lists the options\n", prog, prog);
	return 2;
}

int opt_need_model(const char *prog)
{
	fprintf(stderr, "%s: -m MODEL.gguf is required (scripts/fetch-model prints the path of SmolLM2-135M-Instruct)\n",
		prog);
	return 2;
}
