/* SPDX-License-Identifier: MIT */
/* Inside the tier: the record format and the contract between the common layer and a byte-moving backend. */
#ifndef PKV_TIER_INT_H
#define PKV_TIER_INT_H

#include <stdint.h>
#include "tier/tier.h"

/*
 * A record is one block as it lies in a backend: a 256-byte header, the
 * block's token ids, then K and V of every layer (layer 0 K, layer 0 V,
 * layer 1 K, ...), padded to a multiple of 4 KiB so that O_DIRECT can move
 * it. sum is XXH3-64 over bytes [16, used): everything but magic and sum.
 */
#define TIER_REC_MAGIC 0x31434552564b50ull   /* "PKVREC1" */
#define TIER_REC_VERSION 1u
#define TIER_REC_HDR 256u
#define TIER_ALIGN 4096u

struct tier_rec_hdr {
	uint64_t magic;
	uint64_t sum;
	uint32_t version, used;       /* bytes covered by sum, from the record's start */
	uint32_t uid, n_tokens;
	struct pkv_key key, parent, ns;
	struct pkv_tier_fp fp;
	uint64_t fp_hash;
	uint32_t kv_off, kv_bytes;
	uint64_t stamp;
};

/* Layout of the records of one fingerprint. */
struct tier_layout {
	uint32_t kv_off, kv_bytes, used, rec_size;
};

uint64_t pkv_tier_fp_hash(const struct pkv_tier_fp *fp);
/* 0, or -EINVAL when a block of this fingerprint cannot be a record (too big). */
int pkv_tier_layout(const struct pkv_tier_fp *fp, struct tier_layout *l);
/* Fills the header (tokens and KV already in place) and the checksum. */
void pkv_tier_rec_seal(void *rec, const struct tier_layout *l, const struct pkv_tier_fp *fp,
		       const struct pkv_tier_block *b, uint64_t stamp);
/* 0 when rec is exactly the block expected, else -EBADMSG (torn, corrupt or another block). */
int pkv_tier_rec_check(const void *rec, const struct tier_layout *l, const struct pkv_tier_fp *fp,
		       struct pkv_key key, struct pkv_key parent, struct pkv_key ns, const int32_t *tokens);

/* The checks that need no caller: intact, this fingerprint, this key (pkv_tier_check_all). */
int pkv_tier_rec_check_self(const void *rec, const struct tier_layout *l, const struct pkv_tier_fp *fp,
			    struct pkv_key key);

/*
 * What a backend keeps beside each record so that the index can be rebuilt
 * without reading records: the common layer hands it over with every put
 * and gets it back, per stored record, from scan.
 */
struct tier_entry {
	struct pkv_key key, parent;
	uint32_t uid;
	uint64_t stamp, sum;
};

enum { TIO_PUT = 1, TIO_GET };

/* One I/O request; owned by the common layer, carried by the backend until reaped. */
struct tier_io {
	struct tier_io *next;
	int op, cls;
	uint64_t loc;                 /* put: set by the backend on success; get: where to read */
	void *buf;                    /* inside the staging arena */
	uint32_t len;
	struct tier_entry ent;        /* put */
	int res;                      /* 0 or -errno, set before done */
	uint64_t t0;                  /* submission time (ns) */
	void *owner;                  /* the common layer's request */
	uint32_t idx;
};

struct tier_scan_cb {
	void *ud;
	/* A stored class: returns its id (the common layer's) or -errno to skip its records. */
	int (*cls)(void *ud, const struct pkv_tier_fp *fp);
	/* A stored record; returning < 0 makes the backend forget it (and free its place). */
	int (*entry)(void *ud, int cls, uint64_t loc, const struct tier_entry *e);
	/* Up to n entries follow (a size hint; -errno aborts the scan). */
	int (*reserve)(void *ud, uint64_t n);
};

/*
 * A backend only moves bytes. It keeps, per class, records and their
 * entries, and answers puts and gets asynchronously: submit queues (never
 * more than the queue depth the common layer keeps to), reap hands back
 * finished requests through done. A put is reported done only once its
 * record and its entry are both stored: from then on a scan returns it.
 * Called from the tier thread only, except open, scan and close.
 */
struct tier_backend {
	const char *name;
	int (*open)(const struct pkv_tier_config *cfg, void **impl, char *why, size_t why_len);
	void (*close)(void *impl);
	/* The staging arena (fixed for the tier's life): a backend may register it with the kernel. */
	void (*arena)(void *impl, void *base, size_t len);
	int (*scan)(void *impl, const struct tier_scan_cb *cb);
	/* Makes storage for a class the scan did not find. */
	int (*class_open)(void *impl, int cls, const struct pkv_tier_fp *fp, uint32_t rec_size);
	int (*submit)(void *impl, struct tier_io *io);
	/*
	 * Submits what was queued and reaps; wait_ns: < 0 blocks until at least
	 * one is done, > 0 blocks at most that long, 0 not at all. Returns how many.
	 */
	int (*reap)(void *impl, int64_t wait_ns, void (*done)(void *ud, struct tier_io *io), void *ud);
	void (*del)(void *impl, int cls, uint64_t loc);
	int (*wipe)(void *impl);
	int (*direct)(void *impl);
};

extern const struct tier_backend pkv_tier_disk;

#define TIER_MAX_CLASSES 64

#endif
