/* SPDX-License-Identifier: MIT */
/* The arena allocator: a sorted free list, first fit, neighbours merged on free. */
#include "config.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "client/arena.h"

#define ALIGN 64u

static int grow(struct pkv_extent **v, size_t *cap, size_t need)
{
	struct pkv_extent *n;
	size_t c;

	if (need <= *cap)
		return 0;
	c = *cap ? *cap * 2 : 16;
	while (c < need)
		c *= 2;
	n = realloc(*v, c * sizeof(**v));
	if (!n)
		return -ENOMEM;
	*v = n;
	*cap = c;
	return 0;
}

int pkv_arena_init(struct pkv_arena *a, uint64_t size)
{
	memset(a, 0, sizeof(*a));
	a->size = size & ~(uint64_t)(ALIGN - 1);
	if (grow(&a->free, &a->cap_free, 1))
		return -ENOMEM;
	a->free[0] = (struct pkv_extent){ 0, a->size };
	a->n_free = a->size ? 1 : 0;
	return 0;
}

void pkv_arena_fini(struct pkv_arena *a)
{
	free(a->free);
	free(a->used);
	memset(a, 0, sizeof(*a));
}

int64_t pkv_arena_alloc(struct pkv_arena *a, uint64_t len)
{
	uint64_t off;
	size_t i;

	if (len == 0)
		len = 1;
	if (len > a->size)
		return -ENOMEM;
	len = (len + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
	if (grow(&a->used, &a->cap_used, a->n_used + 1))
		return -ENOMEM;
	for (i = 0; i < a->n_free; i++)
		if (a->free[i].len >= len)
			break;
	if (i == a->n_free)
		return -ENOMEM;
	off = a->free[i].off;
	a->free[i].off += len;
	a->free[i].len -= len;
	if (!a->free[i].len) {
		memmove(&a->free[i], &a->free[i + 1], (a->n_free - i - 1) * sizeof(a->free[0]));
		a->n_free--;
	}
	a->used[a->n_used++] = (struct pkv_extent){ off, len };
	return (int64_t)off;
}

int pkv_arena_free(struct pkv_arena *a, uint64_t off)
{
	struct pkv_extent e;
	size_t i, u;

	for (u = 0; u < a->n_used; u++)
		if (a->used[u].off == off)
			break;
	if (u == a->n_used)
		return -EINVAL;
	e = a->used[u];
	a->used[u] = a->used[--a->n_used];
	if (grow(&a->free, &a->cap_free, a->n_free + 1))
		return -ENOMEM; /* leaks the block rather than corrupting the list */
	for (i = 0; i < a->n_free && a->free[i].off < e.off; i++)
		;
	memmove(&a->free[i + 1], &a->free[i], (a->n_free - i) * sizeof(a->free[0]));
	a->free[i] = e;
	a->n_free++;
	if (i + 1 < a->n_free && a->free[i].off + a->free[i].len == a->free[i + 1].off) {
		a->free[i].len += a->free[i + 1].len;
		memmove(&a->free[i + 1], &a->free[i + 2], (a->n_free - i - 2) * sizeof(a->free[0]));
		a->n_free--;
	}
	if (i > 0 && a->free[i - 1].off + a->free[i - 1].len == a->free[i].off) {
		a->free[i - 1].len += a->free[i].len;
		memmove(&a->free[i], &a->free[i + 1], (a->n_free - i - 1) * sizeof(a->free[0]));
		a->n_free--;
	}
	return 0;
}
