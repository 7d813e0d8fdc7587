/* SPDX-License-Identifier: MIT */
/* First-fit allocator over the client's arena (offsets, 64-byte aligned, coalescing free list). */
#ifndef PKV_ARENA_H
#define PKV_ARENA_H

#include <stddef.h>
#include <stdint.h>

struct pkv_extent {
	uint64_t off, len;
};

struct pkv_arena {
	uint64_t size;
	struct pkv_extent *free; /* sorted by offset, never adjacent */
	size_t n_free, cap_free;
	struct pkv_extent *used; /* unsorted: live allocations */
	size_t n_used, cap_used;
};

int pkv_arena_init(struct pkv_arena *a, uint64_t size);
void pkv_arena_fini(struct pkv_arena *a);
/* Returns the offset of a new block of len bytes, or -ENOMEM. */
int64_t pkv_arena_alloc(struct pkv_arena *a, uint64_t len);
/* Frees the block at off; -EINVAL when off is not a live allocation. */
int pkv_arena_free(struct pkv_arena *a, uint64_t off);

#endif
