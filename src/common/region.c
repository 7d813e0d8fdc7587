/* SPDX-License-Identifier: MIT */
/* Region layout (client side) and header validation (daemon side). */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "common/region.h"

#define PAGE 4096u

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

static int is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

int pkv_region_layout(uint64_t arena_bytes, uint32_t sq_entries, uint32_t cq_entries,
		      struct pkv_shm_hdr *h)
{
	uint64_t off;

	if (!is_pow2(sq_entries) || !is_pow2(cq_entries) || sq_entries > PKV_RING_MAX_ENTRIES ||
	    cq_entries > PKV_RING_MAX_ENTRIES || arena_bytes == 0 || arena_bytes > (1ull << 40))
		return -EINVAL;
	memset(h, 0, sizeof(*h));
	h->magic = PKV_SHM_MAGIC;
	h->version = PKV_PROTO_VERSION;
	h->hdr_size = sizeof(*h);
	h->sq_entries = sq_entries;
	h->cq_entries = cq_entries;
	h->sqe_size = sizeof(struct pkv_sqe);
	h->cqe_size = sizeof(struct pkv_cqe);
	h->ring_head_off = PKV_RING_HEAD_OFF;
	h->ring_tail_off = PKV_RING_TAIL_OFF;
	h->ring_flags_off = PKV_RING_FLAGS_OFF;
	off = align_up(sizeof(*h), 64);
	h->sq_ring_off = off;
	off += PKV_RING_CTL_SIZE;
	h->sq_sqes_off = off;
	off += (uint64_t)sq_entries * sizeof(struct pkv_sqe);
	h->cq_ring_off = align_up(off, 64);
	off = h->cq_ring_off + PKV_RING_CTL_SIZE;
	h->cq_cqes_off = off;
	off += (uint64_t)cq_entries * sizeof(struct pkv_cqe);
	h->err_off = align_up(off, 64);
	h->err_len = PKV_ERR_LEN;
	off = h->err_off + PKV_ERR_LEN;
	h->arena_off = align_up(off, PAGE);
	h->arena_size = align_up(arena_bytes, PAGE);
	h->region_size = h->arena_off + h->arena_size;
	return 0;
}

/* One part of the region, for the bounds and overlap checks. */
struct part {
	const char *name;
	uint64_t off, len;
};

int pkv_region_check(const struct pkv_shm_hdr *h, uint64_t region_size, char *why, size_t why_len)
{
	struct part parts[5];
	uint64_t sq_len, cq_len;
	size_t i, j;

	if (why_len)
		why[0] = 0;
	if (h->magic != PKV_SHM_MAGIC) {
		snprintf(why, why_len, "shared region: bad magic 0x%08x", h->magic);
		return -EINVAL;
	}
	if (h->version != PKV_PROTO_VERSION) {
		snprintf(why, why_len, "shared region: version %u, daemon speaks %u", h->version,
			 PKV_PROTO_VERSION);
		return -EPROTO;
	}
	if (h->hdr_size < sizeof(*h) || h->hdr_size > 4096 || h->features != 0 ||
	    h->sqe_size != sizeof(struct pkv_sqe) || h->cqe_size != sizeof(struct pkv_cqe)) {
		snprintf(why, why_len, "shared region: unsupported header (size %u, features 0x%x, sqe %u, cqe %u)",
			 h->hdr_size, h->features, h->sqe_size, h->cqe_size);
		return -EINVAL;
	}
	if (h->region_size != region_size) {
		snprintf(why, why_len, "shared region: header says %llu bytes, memfd has %llu",
			 (unsigned long long)h->region_size, (unsigned long long)region_size);
		return -EINVAL;
	}
	if (!is_pow2(h->sq_entries) || !is_pow2(h->cq_entries) ||
	    h->sq_entries > PKV_RING_MAX_ENTRIES || h->cq_entries > PKV_RING_MAX_ENTRIES) {
		snprintf(why, why_len, "shared region: ring sizes %u/%u are not powers of two <= %u",
			 h->sq_entries, h->cq_entries, PKV_RING_MAX_ENTRIES);
		return -EINVAL;
	}
	if (h->ring_head_off % 4 || h->ring_tail_off % 4 || h->ring_flags_off % 4 ||
	    h->ring_head_off > PKV_RING_CTL_SIZE - 4 || h->ring_tail_off > PKV_RING_CTL_SIZE - 4 ||
	    h->ring_flags_off > PKV_RING_CTL_SIZE - 4 || h->ring_head_off == h->ring_tail_off ||
	    h->ring_head_off == h->ring_flags_off || h->ring_tail_off == h->ring_flags_off ||
	    /* the wake word, flags + 8, must be a word of its own too */
	    h->ring_flags_off + 8 > PKV_RING_CTL_SIZE - 4 || h->ring_head_off == h->ring_flags_off + 8 ||
	    h->ring_tail_off == h->ring_flags_off + 8) {
		snprintf(why, why_len, "shared region: bad ring control layout");
		return -EINVAL;
	}
	if (h->sq_ring_off % 64 || h->cq_ring_off % 64 || h->sq_sqes_off % 64 || h->cq_cqes_off % 64 ||
	    h->arena_off % 64 || h->err_off % 8 || h->err_len < 16 || h->err_len > 4096) {
		snprintf(why, why_len, "shared region: misaligned part");
		return -EINVAL;
	}
	sq_len = (uint64_t)h->sq_entries * h->sqe_size;
	cq_len = (uint64_t)h->cq_entries * h->cqe_size;
	parts[0] = (struct part){ "sq ring", h->sq_ring_off, PKV_RING_CTL_SIZE };
	parts[1] = (struct part){ "sq entries", h->sq_sqes_off, sq_len };
	parts[2] = (struct part){ "cq ring", h->cq_ring_off, PKV_RING_CTL_SIZE };
	parts[3] = (struct part){ "cq entries", h->cq_cqes_off, cq_len };
	parts[4] = (struct part){ "error text", h->err_off, h->err_len };
	for (i = 0; i < 5; i++) {
		if (parts[i].off < h->hdr_size || !pkv_range_ok(region_size, parts[i].off, parts[i].len)) {
			snprintf(why, why_len, "shared region: %s outside the region", parts[i].name);
			return -EINVAL;
		}
	}
	if (h->arena_off < h->hdr_size || !pkv_range_ok(region_size, h->arena_off, h->arena_size) ||
	    h->arena_size == 0) {
		snprintf(why, why_len, "shared region: arena outside the region");
		return -EINVAL;
	}
	for (i = 0; i < 5; i++) {
		/* Overlap with the arena or another part would let one write corrupt another. */
		if (parts[i].off < h->arena_off + h->arena_size && h->arena_off < parts[i].off + parts[i].len) {
			snprintf(why, why_len, "shared region: %s overlaps the arena", parts[i].name);
			return -EINVAL;
		}
		for (j = i + 1; j < 5; j++)
			if (parts[i].off < parts[j].off + parts[j].len &&
			    parts[j].off < parts[i].off + parts[i].len) {
				snprintf(why, why_len, "shared region: %s overlaps %s", parts[i].name,
					 parts[j].name);
				return -EINVAL;
			}
	}
	return 0;
}
