/* SPDX-License-Identifier: MIT */
/* Laying out and validating the shared region (header, SQ ring, CQ ring, error text, arena). */
#ifndef PKV_REGION_H
#define PKV_REGION_H

#include <stddef.h>
#include <stdint.h>
#include "common/proto.h"

/* Fills h with the layout of a region holding an arena of arena_bytes (rounded up to pages). */
int pkv_region_layout(uint64_t arena_bytes, uint32_t sq_entries, uint32_t cq_entries,
		      struct pkv_shm_hdr *h);

/*
 * Checks a header copied out of a peer's region of region_size bytes: magic,
 * version, entry sizes, power-of-two rings, every part inside the region,
 * aligned and not overlapping. -EPROTO (version) or -EINVAL with the reason.
 */
int pkv_region_check(const struct pkv_shm_hdr *h, uint64_t region_size, char *why, size_t why_len);

/* Whether [off, off + len) lies inside an arena of size bytes, without overflow. */
static inline int pkv_range_ok(uint64_t size, uint64_t off, uint64_t len)
{
	return off <= size && len <= size - off;
}

/* a * b into *out unless it overflows (then returns 0). */
static inline int pkv_mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
	return !__builtin_mul_overflow(a, b, out);
}

#endif
