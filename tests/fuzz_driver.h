/* SPDX-License-Identifier: MIT */
/* What a fuzz target gives the tests' one standalone driver (tests/fuzz_driver.c) besides LLVMFuzzerTestOneInput. */
#ifndef PKV_TEST_FUZZ_DRIVER_H
#define PKV_TEST_FUZZ_DRIVER_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One fuzz target's description: its name, input bound, default mutations and valid seeds. */
struct pkv_fuzz_target {
	const char *name;        /* in the TAP line */
	size_t max_len;          /* longest input worth building (mutations never grow past it) */
	long default_iters;      /* mutations when PKV_FUZZ_ITERS is unset */
	/* Fills seeds[0..max) with malloc'd valid inputs of every kind; returns how many. */
	int (*seeds)(uint8_t **seeds, size_t *lens, int max);
	/* Optional: appends what the run reached (counters) to the TAP line. */
	void (*summary)(char *buf, size_t len);
};

/* Defined by each fuzz target's seed file. */
extern const struct pkv_fuzz_target pkv_fuzz_target;

#endif
