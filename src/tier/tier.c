/* SPDX-License-Identifier: MIT */
/* The tier's common layer: index, per-uid LRU and budget, staging buffers, spill and fetch, the tier thread. */
#include "config.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "common/clock.h"
#include "common/keyed_hash.h"
#include "common/log.h"
#include "tier/tier_int.h"

#define MAX_UIDS 4096u
#define DEFAULT_STAGING (64ull << 20)
#define DEFAULT_QD 64u
#define FREE_UIDX 0xffffu
#define FETCH_STEP 4u        /* a waiting caller is told of every 4 more verified records */

/* One block in the index. 48 bytes, plus 8 in the hash table (kept at most half full). */
struct tblk {
	struct pkv_key key;
	uint64_t stamp;               /* LRU order: larger = more recent */
	uint64_t loc;                 /* the backend's place for it */
	int32_t prev, next;           /* the uid's LRU list (oldest first); next is the free list too */
	uint16_t cls, uidx;
	uint32_t pad;
};

/* A slot of the index's hash table: block index (-1 = empty) and the mixed key bits. */
struct hent {
	int32_t b;
	uint32_t h;
};

struct tuid {
	uint32_t uid;
	int32_t head, tail;           /* oldest, newest */
	uint64_t bytes, blocks;
	uint64_t pending;             /* bytes of its spills taken off the queue and not yet indexed */
	uint32_t fetch_pages;         /* staging its fetches hold (until given back, or read if abandoned) */
};

struct tcls {
	struct pkv_tier_fp fp;
	struct tier_layout l;
	int stored;                   /* the backend has storage for it */
};

struct spill {
	struct tier_io io;
	int cls;
	uint32_t pages;
	struct pkv_tier_block b;      /* tokens point into the record */
	struct spill *next;
	/* Write-behind (pkv_tier_spill_later): the KV is copied by copy(ud, tag, kv) before sealing. */
	pkv_tier_copy_fn copy;
	void *ud;
	int32_t tag;
	int copied, copied_here;      /* copied_here: by the tier thread, not by spill_forget */
	struct spill *wnext;          /* t->wb_flight: copied write-behind spills until their write is done */
};

struct pkv_tier_fetch {
	struct pkv_tier_fetch *next;
	int cls;
	uint32_t n, pages, next_io, done_ios, ok;
	uint32_t rec_size, kv_off;
	int complete, abandoned, self;
	int uidx;                     /* whose staging share it uses; -1: none (a check) */
	int expired;                  /* its deadline passed before it completed (the caller was told) */
	uint32_t lead;                /* leading records read and verified so far (a prefix of ok's) */
	uint32_t told;                /* lead when the caller was last notified */
	uint32_t avail;               /* the caller's snapshot of lead (poll): its records may be read */
	uint8_t *got;                 /* per record: its read completed */
	uint64_t deadline;            /* CLOCK_MONOTONIC ns */
	struct pkv_tier_fetch *pnext; /* the list of fetches whose caller waits (deadlines, notify) */
	uint8_t *buf;                 /* n records back to back in staging */
	struct pkv_key ns, parent;
	struct pkv_key *keys;
	int32_t *tokens;
	int *res;
	struct tier_io *ios;
};

struct pkv_tier {
	const struct tier_backend *be;
	void *impl;
	struct pkv_tier_config cfg;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv_work, cv_done;
	int started, stop, scanning;

	/* index (mu) */
	struct tblk *blk;
	uint32_t n_blk, cap_blk;
	int32_t free_head;
	struct hent *hash;
	uint32_t hash_mask, n_live;
	struct pkv_hash_secret slot_secret;  /* of hmix: slots clients cannot aim */
	uint32_t probe_max;
	struct tuid *uids;
	uint32_t n_uids;
	struct tcls cls[TIER_MAX_CLASSES];
	uint32_t n_cls;
	uint64_t clock;
	uint64_t bytes, pending_bytes;

	/* staging arena: 4 KiB pages, a bitmap of the used ones (mu) */
	uint8_t *arena;
	size_t arena_len;
	uint64_t *pagemap;
	uint32_t n_pages;

	/* work for the thread (mu) */
	struct spill *sq_head, *sq_tail;
	struct pkv_tier_fetch *fq_head, *fq_tail;
	struct pkv_tier_fetch *pend;  /* started and neither complete, expired nor given back */
	struct spill *begun;          /* the loop's spill between begin and commit */
	struct spill *copying;        /* the write-behind spill whose copy runs on the tier thread now */
	uint32_t n_taken;             /* spills off the queue, not yet submitted (mu dropped to copy, seal) */
	uint32_t n_later;             /* write-behind spills not yet freed: at most half the staging */
	struct spill *wb_flight;
	uint32_t inflight;
	uint64_t completions;
	uint32_t infl_dir[2];         /* reads, writes in flight: the device is busy while > 0 */
	uint64_t busy_since[2];
	uint64_t flush_req, flush_done;
	int64_t flush_count;
	int stopped;
	char stop_reason[128];

	/* stats (mu) */
	uint64_t lookups, hits, spilled, skipped, evicted, corrupt, spilled_behind;
	uint64_t read_bytes, read_ns, write_bytes, write_ns;
};

static int key_same(struct pkv_key a, struct pkv_key b)
{
	return a.lo == b.lo && a.hi == b.hi;
}

/* ------------------------------------------------------------ index */

/*
 * Keys are public (anyone computes the key of the tokens they send), so a
 * client could choose tokens whose keys share a slot and make every
 * tenant's probe walk a long run: the slot comes from a keyed hash
 * (SipHash under a per-tier random secret) instead of the key's own bits.
 * Each slot keeps the 32 hashed bits its position came from, so probing,
 * growing and deleting compare those and only touch a block's key on a
 * likely match (start-up inserts a million blocks).
 */
static uint32_t hmix(const struct pkv_tier *t, struct pkv_key k)
{
	return (uint32_t)pkv_keyed_hash128(&t->slot_secret, k.lo, k.hi);
}

static int32_t idx_find(const struct pkv_tier *t, struct pkv_key k)
{
	uint32_t h = hmix(t, k), i;

	if (!t->hash)
		return -1;
	for (i = h & t->hash_mask;; i = (i + 1) & t->hash_mask) {
		const struct hent *e = &t->hash[i];

		if (e->b < 0)
			return -1;
		if (e->h == h && key_same(t->blk[e->b].key, k))
			return e->b;
	}
}

static void hash_put(struct pkv_tier *t, int32_t b, uint32_t h)
{
	uint32_t i = h & t->hash_mask, run = 0;

	while (t->hash[i].b >= 0) {
		i = (i + 1) & t->hash_mask;
		run++;
	}
	t->hash[i] = (struct hent){ b, h };
	/* The longest probe run an insert met (stats): what a flood of aimed keys would lengthen. */
	if (run > t->probe_max)
		t->probe_max = run;
}

static int hash_grow(struct pkv_tier *t)
{
	uint32_t cap = t->hash ? 2 * (t->hash_mask + 1) : 1024, i;
	struct hent *old = t->hash;
	uint32_t old_n = t->hash ? t->hash_mask + 1 : 0;

	t->hash = malloc(cap * sizeof(*t->hash));
	if (!t->hash) {
		t->hash = old;
		return -ENOMEM;
	}
	memset(t->hash, 0xff, cap * sizeof(*t->hash));
	t->hash_mask = cap - 1;
	for (i = 0; i < old_n; i++)
		if (old[i].b >= 0)
			hash_put(t, old[i].b, old[i].h);
	free(old);
	return 0;
}

/* Backward-shift deletion, so lookups never stop early at a hole. */
static void hash_del(struct pkv_tier *t, int32_t b)
{
	uint32_t m = t->hash_mask, i = hmix(t, t->blk[b].key) & m, j, home;

	while (t->hash[i].b != b)
		i = (i + 1) & m;
	for (j = i;;) {
		j = (j + 1) & m;
		if (t->hash[j].b < 0)
			break;
		home = t->hash[j].h & m;
		if (((j - home) & m) >= ((j - i) & m)) {
			t->hash[i] = t->hash[j];
			i = j;
		}
	}
	t->hash[i].b = -1;
}

static int uid_index(struct pkv_tier *t, uint32_t uid)
{
	uint32_t i;

	for (i = 0; i < t->n_uids; i++)
		if (t->uids[i].uid == uid)
			return (int)i;
	if (t->n_uids == MAX_UIDS)
		return -ENOSPC;
	if (!t->uids) {
		t->uids = calloc(MAX_UIDS, sizeof(*t->uids));
		if (!t->uids)
			return -ENOMEM;
	}
	t->uids[i] = (struct tuid){ uid, -1, -1, 0, 0, 0, 0 };
	return (int)t->n_uids++;
}

static void lru_unlink(struct pkv_tier *t, int32_t b)
{
	struct tblk *k = &t->blk[b];
	struct tuid *u = &t->uids[k->uidx];

	if (k->prev >= 0)
		t->blk[k->prev].next = k->next;
	else
		u->head = k->next;
	if (k->next >= 0)
		t->blk[k->next].prev = k->prev;
	else
		u->tail = k->prev;
}

/* Appends at the newest end (stamps only grow, so each uid's list stays sorted). */
static void lru_append(struct pkv_tier *t, int32_t b)
{
	struct tblk *k = &t->blk[b];
	struct tuid *u = &t->uids[k->uidx];

	k->prev = u->tail;
	k->next = -1;
	if (u->tail >= 0)
		t->blk[u->tail].next = b;
	else
		u->head = b;
	u->tail = b;
}

/* Writes complete out of order: a block takes its place by the stamp its spill began with. */
static void lru_insert(struct pkv_tier *t, int32_t b)
{
	struct tblk *k = &t->blk[b];
	struct tuid *u = &t->uids[k->uidx];
	int32_t after = u->tail;

	while (after >= 0 && t->blk[after].stamp > k->stamp)
		after = t->blk[after].prev;
	if (after == u->tail) {
		lru_append(t, b);
		return;
	}
	k->prev = after;
	k->next = after >= 0 ? t->blk[after].next : u->head;
	t->blk[k->next].prev = b;
	if (after >= 0)
		t->blk[after].next = b;
	else
		u->head = b;
}

static void touch(struct pkv_tier *t, int32_t b)
{
	lru_unlink(t, b);
	t->blk[b].stamp = ++t->clock;
	lru_append(t, b);
}

/* Adds a stored block to the index; -EEXIST when its key is there already. */
static int idx_add(struct pkv_tier *t, int cls, uint64_t loc, const struct tier_entry *e)
{
	int32_t b;
	int u;

	if (idx_find(t, e->key) >= 0)
		return -EEXIST;
	u = uid_index(t, e->uid);
	if (u < 0)
		return u;
	if (2 * (t->n_live + 1) > (t->hash ? t->hash_mask + 1 : 0) && hash_grow(t))
		return -ENOMEM;
	if (t->free_head >= 0) {
		b = t->free_head;
		t->free_head = t->blk[b].next;
	} else {
		if (t->n_blk == t->cap_blk) {
			uint32_t cap = t->cap_blk ? 2 * t->cap_blk : 1024;
			struct tblk *nb = realloc(t->blk, (size_t)cap * sizeof(*nb));

			if (!nb)
				return -ENOMEM;
			t->blk = nb;
			t->cap_blk = cap;
		}
		b = (int32_t)t->n_blk++;
	}
	t->blk[b] = (struct tblk){ .key = e->key, .stamp = e->stamp, .loc = loc, .cls = (uint16_t)cls,
				   .uidx = (uint16_t)u };
	if (e->stamp > t->clock)
		t->clock = e->stamp;
	hash_put(t, b, hmix(t, e->key));
	if (!t->scanning)     /* a scan links nothing: sort_lru orders them all at once */
		lru_insert(t, b);
	t->n_live++;
	t->uids[u].bytes += t->cls[cls].l.rec_size;
	t->uids[u].blocks++;
	t->bytes += t->cls[cls].l.rec_size;
	return 0;
}

/* Removes b from the index; the caller deletes it from the backend. */
static void idx_del(struct pkv_tier *t, int32_t b)
{
	struct tblk *k = &t->blk[b];
	struct tuid *u = &t->uids[k->uidx];
	uint32_t rs = t->cls[k->cls].l.rec_size;

	hash_del(t, b);
	if (!t->scanning)
		lru_unlink(t, b);
	u->bytes -= rs;
	u->blocks--;
	t->bytes -= rs;
	t->n_live--;
	k->next = t->free_head;
	k->uidx = FREE_UIDX;
	t->free_head = b;
}

/* ------------------------------------------------------------ staging */

static int stage_alloc(struct pkv_tier *t, uint32_t pages)
{
	uint32_t i, run = 0;

	/* First fit over the bitmap; records are few and large, so the scan is short. */
	for (i = 0; i < t->n_pages; i++) {
		if (!(i & 63) && t->pagemap[i >> 6] == ~0ull) {
			run = 0;
			i += 63;
			continue;
		}
		if (t->pagemap[i >> 6] & (1ull << (i & 63))) {
			run = 0;
			continue;
		}
		if (++run == pages) {
			uint32_t s = i + 1 - pages, p;

			for (p = s; p <= i; p++)
				t->pagemap[p >> 6] |= 1ull << (p & 63);
			return (int)s;
		}
	}
	return -1;
}

static void stage_free(struct pkv_tier *t, void *buf, uint32_t pages)
{
	uint32_t s = (uint32_t)(((uint8_t *)buf - t->arena) / TIER_ALIGN), p;

	for (p = s; p < s + pages; p++)
		t->pagemap[p >> 6] &= ~(1ull << (p & 63));
}

/* ------------------------------------------------------------ classes */

static int cls_find(const struct pkv_tier *t, const struct pkv_tier_fp *fp)
{
	for (uint32_t i = 0; i < t->n_cls; i++)
		if (!memcmp(&t->cls[i].fp, fp, sizeof(*fp)))
			return (int)i;
	return -ENOENT;
}

static int cls_new(struct pkv_tier *t, const struct pkv_tier_fp *fp)
{
	struct tcls *c;

	if (t->n_cls == TIER_MAX_CLASSES)
		return -ENOSPC;
	c = &t->cls[t->n_cls];
	memset(c, 0, sizeof(*c));
	c->fp = *fp;
	if (pkv_tier_layout(fp, &c->l))
		return -EINVAL;
	/* A record must fit the staging arena with room to spare for others. */
	if ((uint64_t)c->l.rec_size * 4 > t->arena_len)
		return -EFBIG;
	return (int)t->n_cls++;
}

int pkv_tier_class(struct pkv_tier *t, const struct pkv_tier_fp *fp)
{
	int c, r;

	pthread_mutex_lock(&t->mu);
	c = cls_find(t, fp);
	if (c < 0)
		c = cls_new(t, fp);
	if (c >= 0 && !t->cls[c].stored) {
		/* Storage is made under the lock: the tier thread only uses classes that have it. */
		r = t->be->class_open(t->impl, c, fp, t->cls[c].l.rec_size);
		if (r) {
			if (c == (int)t->n_cls - 1)
				t->n_cls--;
			c = r;
		} else {
			t->cls[c].stored = 1;
		}
	}
	pthread_mutex_unlock(&t->mu);
	return c;
}

/* ------------------------------------------------------------ scan at open */

static int scan_cls(void *ud, const struct pkv_tier_fp *fp)
{
	struct pkv_tier *t = ud;
	int c = cls_find(t, fp);

	if (c < 0)
		c = cls_new(t, fp);
	if (c >= 0)
		t->cls[c].stored = 1;
	return c;
}

/* Sizes the index for n more blocks at once, so a scan never rehashes. */
static int scan_reserve(void *ud, uint64_t n)
{
	struct pkv_tier *t = ud;
	uint64_t want = t->n_blk + n;
	uint32_t cap;

	if (want > INT32_MAX / 4)
		return -EFBIG;
	if (want > t->cap_blk) {
		struct tblk *nb = realloc(t->blk, (size_t)want * sizeof(*nb));

		if (!nb)
			return -ENOMEM;
		t->blk = nb;
		t->cap_blk = (uint32_t)want;
	}
	for (cap = t->hash ? t->hash_mask + 1 : 1024; cap < 2 * (t->n_live + n) + 2; cap *= 2)
		;
	while (!t->hash || t->hash_mask + 1 < cap)
		if (hash_grow(t))
			return -ENOMEM;
	return 0;
}

static int scan_entry(void *ud, int cls, uint64_t loc, const struct tier_entry *e)
{
	struct pkv_tier *t = ud;
	int32_t old;
	int r = idx_add(t, cls, loc, e);

	if (r != -EEXIST)
		return r;
	/* Two entries for one key (a crash between a delete and a write): the newer one stays. */
	old = idx_find(t, e->key);
	if (t->blk[old].stamp >= e->stamp)
		return -EEXIST;
	t->be->del(t->impl, t->blk[old].cls, t->blk[old].loc);
	idx_del(t, old);
	return idx_add(t, cls, loc, e);
}

/* LSD radix sort of (stamp, index) pairs by stamp, 11 bits a pass, as many passes as stamps need. */
static void radix_sort(uint64_t (*v)[2], uint32_t n)
{
	uint64_t (*tmp)[2] = malloc((size_t)n * sizeof(*tmp)), (*a)[2] = v, (*b)[2] = tmp, (*sw)[2];
	uint64_t max = 0;
	uint32_t cnt[2048];

	if (!tmp) {
		/* Without scratch memory the LRU order is the file order: correct, only less exact. */
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		max = v[i][0] > max ? v[i][0] : max;
	for (unsigned sh = 0; sh < 64 && (max >> sh); sh += 11) {
		uint32_t sum = 0;

		memset(cnt, 0, sizeof(cnt));
		for (uint32_t i = 0; i < n; i++)
			cnt[(a[i][0] >> sh) & 2047]++;
		for (uint32_t d = 0; d < 2048; d++) {
			uint32_t c = cnt[d];

			cnt[d] = sum;
			sum += c;
		}
		for (uint32_t i = 0; i < n; i++) {
			uint32_t d = (uint32_t)(a[i][0] >> sh) & 2047;

			b[cnt[d]][0] = a[i][0];
			b[cnt[d]][1] = a[i][1];
			cnt[d]++;
		}
		sw = a;
		a = b;
		b = sw;
	}
	if (a != v)
		memcpy(v, a, (size_t)n * sizeof(*v));
	free(tmp);
}

/* Entries come in file order: rebuild every uid's LRU list in stamp order. */
static int sort_lru(struct pkv_tier *t)
{
	uint64_t (*v)[2];
	uint32_t n = 0, i;

	if (!t->n_live)
		return 0;
	v = malloc((size_t)t->n_live * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (i = 0; i < t->n_blk; i++)
		if (t->blk[i].uidx != FREE_UIDX) {
			v[n][0] = t->blk[i].stamp;
			v[n][1] = i;
			n++;
		}
	radix_sort(v, n);
	for (i = 0; i < t->n_uids; i++)
		t->uids[i].head = t->uids[i].tail = -1;
	for (i = 0; i < n; i++)
		lru_append(t, (int32_t)v[i][1]);
	free(v);
	return 0;
}

/* ------------------------------------------------------------ the tier thread */

static void stop_spilling(struct pkv_tier *t, int err, const char *what)
{
	if (t->stopped)
		return;
	t->stopped = err;
	snprintf(t->stop_reason, sizeof(t->stop_reason), "%s: %s", what, strerror(-err));
	pkv_warn("disk tier stops spilling (%s); RAM caching goes on", t->stop_reason);
}

/* Evicts the oldest block of uid u (u < 0: the oldest of all). Under mu; returns 0 or -ENOENT. */
static int evict_one(struct pkv_tier *t, int u)
{
	int32_t b = -1;

	if (u >= 0) {
		b = t->uids[u].head;
	} else {
		for (uint32_t i = 0; i < t->n_uids; i++) {
			int32_t h = t->uids[i].head;

			if (h >= 0 && (b < 0 || t->blk[h].stamp < t->blk[b].stamp))
				b = h;
		}
	}
	if (b < 0)
		return -ENOENT;
	t->be->del(t->impl, t->blk[b].cls, t->blk[b].loc);
	idx_del(t, b);
	t->evicted++;
	return 0;
}

/* Makes room for one more record of s's class within the budget and the uid's share. Under mu. */
static int make_room(struct pkv_tier *t, struct spill *s)
{
	uint64_t rs = t->cls[s->cls].l.rec_size;
	uint64_t share = (uint64_t)((unsigned __int128)t->cfg.budget * t->cfg.uid_share / 100);
	int u = uid_index(t, s->b.uid);

	if (u < 0)
		return u;
	if (rs > share)
		return -EFBIG;
	/* In-flight spills count: a burst (write-behind, a pool's teardown) must not pass the share. */
	while (t->uids[u].bytes + t->uids[u].pending + rs > share)
		if (evict_one(t, u))
			break;
	while (t->bytes + t->pending_bytes + rs > t->cfg.budget)
		if (evict_one(t, -1))
			return -ENOSPC;
	if (t->uids[u].bytes + t->uids[u].pending + rs > share)
		return -ENOSPC;
	t->pending_bytes += rs;
	t->uids[u].pending += rs;
	return 0;
}

static void wb_unlink(struct pkv_tier *t, struct spill *s)
{
	for (struct spill **pp = &t->wb_flight; *pp; pp = &(*pp)->wnext)
		if (*pp == s) {
			*pp = s->wnext;
			return;
		}
}

static void put_done(struct pkv_tier *t, struct spill *s)
{
	struct tier_io *io = &s->io;
	uint32_t rs = t->cls[s->cls].l.rec_size;
	int u = uid_index(t, s->b.uid);   /* found: make_room added it */

	t->pending_bytes -= rs;
	if (u >= 0)
		t->uids[u].pending -= rs;
	if (io->res) {
		t->skipped++;
		if (io->res == -ENOSPC || io->res == -EFBIG || io->res == -EDQUOT || io->res == -EIO)
			stop_spilling(t, io->res, "write");
	} else if (idx_add(t, s->cls, io->loc, &io->ent)) {
		/* The same key got there first (spilled twice in flight): keep one copy. */
		t->be->del(t->impl, s->cls, io->loc);
	} else {
		t->spilled++;
		t->spilled_behind += s->copy && s->copied_here;
		t->write_bytes += rs;
	}
	stage_free(t, io->buf, s->pages);
	if (s->copy) {
		t->n_later--;
		wb_unlink(t, s);
	}
	free(s);
}

/* Under mu. */
static void fetch_free(struct pkv_tier *t, struct pkv_tier_fetch *f)
{
	if (f->buf) {
		stage_free(t, f->buf, f->pages);
		if (f->uidx >= 0)
			t->uids[f->uidx].fetch_pages -= f->pages;
	}
	free(f->keys);
	free(f->tokens);
	free(f->res);
	free(f->got);
	free(f->ios);
	free(f);
}

/* Takes f off the waited-for list; 1 when it was on it. */
static int pend_unlink(struct pkv_tier *t, struct pkv_tier_fetch *f)
{
	for (struct pkv_tier_fetch **pp = &t->pend; *pp; pp = &(*pp)->pnext)
		if (*pp == f) {
			*pp = f->pnext;
			f->pnext = NULL;
			return 1;
		}
	return 0;
}

static void notify(struct pkv_tier *t)
{
	if (t->cfg.notify)
		t->cfg.notify(t->cfg.notify_ud);
}

/*
 * Expires the fetches whose deadline passed (their caller goes on with what
 * RAM has; the reads finish and are freed here later); returns the earliest
 * deadline still ahead, or UINT64_MAX.
 */
static uint64_t expire(struct pkv_tier *t, uint64_t now)
{
	uint64_t next = UINT64_MAX;
	int told = 0;

	for (struct pkv_tier_fetch **pp = &t->pend; *pp;) {
		struct pkv_tier_fetch *f = *pp;

		if (f->deadline <= now) {
			f->expired = 1;
			*pp = f->pnext;
			f->pnext = NULL;
			told = 1;
			continue;
		}
		if (f->deadline < next)
			next = f->deadline;
		pp = &f->pnext;
	}
	if (told) {
		pthread_cond_broadcast(&t->cv_done);
		notify(t);
	}
	return next;
}

/* Test hook (config read_gate): reads stay queued while the gate file is absent. */
static int gate_closed(const struct pkv_tier *t)
{
	return t->cfg.read_gate && !t->stop && access(t->cfg.read_gate, F_OK) != 0;
}

/* Frees the fetches at the head of the read queue whose caller gave them up before a read went out. */
static void drop_abandoned(struct pkv_tier *t)
{
	while (t->fq_head && t->fq_head->abandoned && !t->fq_head->next_io) {
		struct pkv_tier_fetch *f = t->fq_head;

		t->fq_head = f->next;
		if (!t->fq_head)
			t->fq_tail = NULL;
		fetch_free(t, f);
	}
}

static void fetch_finish(struct pkv_tier *t, struct pkv_tier_fetch *f)
{
	const struct tcls *c = &t->cls[f->cls];
	uint32_t i;

	/* Verify outside the lock: checksumming megabytes must not hold up the loop's probes. */
	pthread_mutex_unlock(&t->mu);
	for (i = 0; i < f->n && f->self; i++)
		if (!f->res[i])
			f->res[i] = pkv_tier_rec_check_self(f->buf + (size_t)i * c->l.rec_size, &c->l, &c->fp,
							    f->keys[i]);
	/* A chain's records were verified one by one as their reads completed (io_done). */
	pthread_mutex_lock(&t->mu);
	for (i = 0; i < f->n && !f->res[i]; i++)
		;
	f->ok = i;
	if (f->self)
		for (f->ok = 0, i = 0; i < f->n; i++)
			f->ok += !f->res[i];
	/* A chain is served up to its first bad block; a check looks at every block. */
	for (i = f->self ? 0 : i; i < f->n; i++) {
		int32_t b;

		if (!f->res[i] || f->res[i] == -ENOENT)
			continue;
		/* Never served, and never found again: a torn or foreign record leaves the index. */
		b = idx_find(t, f->keys[i]);
		if (b >= 0 && t->blk[b].loc == f->ios[i].loc && t->blk[b].cls == f->cls) {
			t->be->del(t->impl, f->cls, t->blk[b].loc);
			idx_del(t, b);
		}
		t->corrupt++;
	}
	if (!f->self)
		t->hits += f->ok;
	f->complete = 1;
	if (f->abandoned) {
		fetch_free(t, f);
		return;
	}
	pthread_cond_broadcast(&t->cv_done);
	if (pend_unlink(t, f))
		notify(t);
}

/* Called by the backend from reap, on the tier thread, without mu. */
static void io_done(void *ud, struct tier_io *io)
{
	struct pkv_tier *t = ud;

	/*
	 * A chain's record is verified as soon as it is read, outside the lock,
	 * overlapping the reads still in flight: the open waits for the last
	 * read, not for a checksum pass over the whole prefix after it.
	 */
	if (io->op == TIO_GET && !io->res && !((struct pkv_tier_fetch *)io->owner)->self) {
		const struct pkv_tier_fetch *f = io->owner;
		const struct tcls *c = &t->cls[f->cls];
		uint32_t i = io->idx;

		io->res = pkv_tier_rec_check(io->buf, &c->l, &c->fp, f->keys[i], i ? f->keys[i - 1] : f->parent,
					     f->ns, f->tokens + (size_t)i * c->fp.block_size);
		if (io->res)
			io->res = -EBADMSG;
	}
	pthread_mutex_lock(&t->mu);
	t->inflight--;
	t->completions++;
	/* GB/s are bytes over the time the device had this direction's requests in flight. */
	if (--t->infl_dir[io->op == TIO_PUT] == 0) {
		uint64_t busy = pkv_now_ns() - t->busy_since[io->op == TIO_PUT];

		if (io->op == TIO_PUT)
			t->write_ns += busy;
		else
			t->read_ns += busy;
	}
	if (io->op == TIO_PUT) {
		put_done(t, io->owner);
	} else {
		struct pkv_tier_fetch *f = io->owner;

		f->res[io->idx] = io->res;
		f->got[io->idx] = 1;
		/*
		 * The chain's verified head grows as reads complete (in any
		 * order): the caller may copy it into its pool while the rest
		 * is read. Told every FETCH_STEP records, not every one.
		 */
		while (!f->self && f->lead < f->n && f->got[f->lead] && !f->res[f->lead])
			f->lead++;   /* a check's records (self) are verified only at the end: no head */
		if (!f->self && !f->abandoned && !f->expired && f->lead - f->told >= FETCH_STEP &&
		    f->done_ios + 1 < f->n) {
			f->told = f->lead;
			notify(t);
		}
		if (!io->res || io->res == -EBADMSG)
			t->read_bytes += io->len;
		if (++f->done_ios == f->n)
			fetch_finish(t, f);
	}
	pthread_cond_broadcast(&t->cv_done);
	pthread_mutex_unlock(&t->mu);
}

static void submit_one(struct pkv_tier *t, struct tier_io *io)
{
	int r;

	io->t0 = pkv_now_ns();
	t->inflight++;
	if (t->infl_dir[io->op == TIO_PUT]++ == 0)
		t->busy_since[io->op == TIO_PUT] = io->t0;
	pthread_mutex_unlock(&t->mu);
	r = t->be->submit(t->impl, io);
	if (r) {
		io->res = r;
		io_done(t, io);
	}
	pthread_mutex_lock(&t->mu);
}

static void do_flush(struct pkv_tier *t)
{
	int64_t n = t->n_live;

	for (uint32_t u = 0; u < t->n_uids; u++)
		while (t->uids[u].head >= 0)
			idx_del(t, t->uids[u].head);
	/* The backend drops its records wholesale: no per-record delete needed. */
	t->be->wipe(t->impl);
	t->stopped = 0;
	t->stop_reason[0] = 0;
	t->flush_count = n;
	t->flush_done = t->flush_req;
	pthread_cond_broadcast(&t->cv_done);
}

static void *tier_thread(void *arg)
{
	struct pkv_tier *t = arg;
	unsigned qd = t->cfg.queue_depth;

	pthread_setname_np(pthread_self(), "pkv-tier");
	pthread_mutex_lock(&t->mu);
	for (;;) {
		uint64_t now = pkv_now_ns(), wake = expire(t, now);
		int took = 0, gated = gate_closed(t);

		drop_abandoned(t);
		if (gated && t->fq_head && wake > now + 10000000ull)
			wake = now + 10000000ull;   /* the test hook's gate is polled */
		/* Reads first: a client may be waiting on them; spills only fill the disk. */
		while (t->fq_head && t->inflight < qd && !gated) {
			struct pkv_tier_fetch *f = t->fq_head;
			uint32_t i = f->next_io++;

			/* Off the queue before its last read goes out: completion may free it. */
			if (f->next_io == f->n) {
				t->fq_head = f->next;
				if (!t->fq_head)
					t->fq_tail = NULL;
			}
			submit_one(t, &f->ios[i]);
			took++;
		}
		while (t->sq_head && t->inflight < qd) {
			struct spill *s = t->sq_head;
			int r;

			t->sq_head = s->next;
			if (!t->sq_head)
				t->sq_tail = NULL;
			r = t->stopped ? t->stopped : make_room(t, s);
			if (!r)
				t->n_taken++;   /* drain must not return while we copy and seal it unlocked */
			if (r) {
				t->skipped++;
				stage_free(t, s->io.buf, s->pages);
				if (s->copy)
					t->n_later--;
				free(s);
				continue;
			}
			/* Write-behind: the bytes are copied here, off the loop; spill_forget waits for it. */
			if (s->copy && !s->copied) {
				t->copying = s;
				pthread_mutex_unlock(&t->mu);
				s->copy(s->ud, s->tag, (uint8_t *)s->io.buf + t->cls[s->cls].l.kv_off);
				pthread_mutex_lock(&t->mu);
				s->copied = s->copied_here = 1;
				t->copying = NULL;
				pthread_cond_broadcast(&t->cv_done);
			}
			if (s->copy) {
				s->wnext = t->wb_flight;
				t->wb_flight = s;
			}
			/* Sealed here, not on the loop that handed the block over: one XXH3 pass over it. */
			pthread_mutex_unlock(&t->mu);
			pkv_tier_rec_seal(s->io.buf, &t->cls[s->cls].l, &t->cls[s->cls].fp, &s->b,
					  s->io.ent.stamp);
			s->io.ent.sum = ((struct tier_rec_hdr *)s->io.buf)->sum;
			pthread_mutex_lock(&t->mu);
			submit_one(t, &s->io);
			t->n_taken--;
			took++;
		}
		if (!t->inflight && !t->sq_head && (!t->fq_head || gated)) {
			struct timespec ts;

			if (t->flush_req != t->flush_done) {
				do_flush(t);
				continue;
			}
			pthread_cond_broadcast(&t->cv_done);
			if (t->stop && !t->fq_head)
				break;
			if (wake == UINT64_MAX) {
				pthread_cond_wait(&t->cv_work, &t->mu);
				continue;
			}
			ts.tv_sec = (time_t)(wake / 1000000000ull);
			ts.tv_nsec = (long)(wake % 1000000000ull);
			pthread_cond_timedwait(&t->cv_work, &t->mu, &ts);
			continue;
		}
		pthread_mutex_unlock(&t->mu);
		/* Waits for a completion, but never past a waiting caller's deadline. */
		t->be->reap(t->impl, took ? 0 : wake == UINT64_MAX ? -1 : wake > now ? (int64_t)(wake - now) : 0,
			    io_done, t);
		pthread_mutex_lock(&t->mu);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

/* ------------------------------------------------------------ public calls (loop thread) */

/* A spill of key k queued (write-behind or not), or write-behind being copied or written; under mu. */
static int sq_has_key(const struct pkv_tier *t, struct pkv_key k)
{
	for (const struct spill *s = t->sq_head; s; s = s->next)
		if (key_same(s->b.key, k))
			return 1;
	for (const struct spill *s = t->wb_flight; s; s = s->wnext)
		if (key_same(s->b.key, k))
			return 1;
	return t->copying && key_same(t->copying->b.key, k);
}

/* Takes a staging record for b and fills what the caller need not: returns s (under mu) or -errno. */
static int spill_new(struct pkv_tier *t, int cls, const struct pkv_tier_block *b, int later, struct spill **out)
{
	struct spill *s;
	struct tcls *c;
	int32_t have;
	int p, r = 0;

	*out = NULL;
	if (cls < 0 || (uint32_t)cls >= t->n_cls || !b)
		return -EINVAL;
	c = &t->cls[cls];
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_lock(&t->mu);
	have = idx_find(t, b->key);
	if (t->begun && !later)
		r = -EBUSY;
	else if (have >= 0 || (later && sq_has_key(t, b->key)))
		r = -EEXIST;
	else if (t->stopped)
		r = -ENOSPC;
	if (have >= 0 && !later)
		touch(t, have);   /* evicted from RAM: recently used; a write-behind probe is not a use */
	/* Write-behind never takes the staging an eviction may need. */
	if (!r && later && (uint64_t)(t->n_later + 1) * (c->l.rec_size / TIER_ALIGN) > t->n_pages / 2)
		r = -EAGAIN;
	if (r)
		goto err_unlock;
	p = stage_alloc(t, c->l.rec_size / TIER_ALIGN);
	if (p < 0) {
		r = -EAGAIN;
		goto err_unlock;
	}
	s->cls = cls;
	s->pages = c->l.rec_size / TIER_ALIGN;
	s->b = *b;
	s->io.op = TIO_PUT;
	s->io.cls = cls;
	s->io.buf = t->arena + (size_t)p * TIER_ALIGN;
	s->io.len = c->l.rec_size;
	s->io.owner = s;
	s->io.ent = (struct tier_entry){ .key = b->key, .parent = b->parent, .uid = b->uid,
					 .stamp = ++t->clock };
	memcpy((uint8_t *)s->io.buf + TIER_REC_HDR, b->tokens, (size_t)c->fp.block_size * sizeof(int32_t));
	s->b.tokens = (const int32_t *)((uint8_t *)s->io.buf + TIER_REC_HDR);
	*out = s;
	return 0;

err_unlock:
	if (r != -EBUSY && !later)
		t->skipped++;
	pthread_mutex_unlock(&t->mu);
	free(s);
	return r;
}

static void sq_push(struct pkv_tier *t, struct spill *s)
{
	s->next = NULL;
	if (t->sq_tail)
		t->sq_tail->next = s;
	else
		t->sq_head = s;
	t->sq_tail = s;
	pthread_cond_signal(&t->cv_work);
}

int pkv_tier_spill_begin(struct pkv_tier *t, int cls, const struct pkv_tier_block *b, void **kv)
{
	struct spill *s;
	int r;

	if (!kv)
		return -EINVAL;
	r = spill_new(t, cls, b, 0, &s);
	if (r)
		return r;
	t->begun = s;
	pthread_mutex_unlock(&t->mu);
	*kv = (uint8_t *)s->io.buf + t->cls[cls].l.kv_off;
	return 0;
}

int pkv_tier_spill_later(struct pkv_tier *t, int cls, const struct pkv_tier_block *b, pkv_tier_copy_fn copy,
			 void *ud, int32_t tag)
{
	struct spill *s;
	int r;

	if (!copy)
		return -EINVAL;
	r = spill_new(t, cls, b, 1, &s);
	if (r)
		return r;
	s->copy = copy;
	s->ud = ud;
	s->tag = tag;
	t->n_later++;
	sq_push(t, s);
	pthread_mutex_unlock(&t->mu);
	return 0;
}

int pkv_tier_spill_forget(struct pkv_tier *t, void *ud, int32_t tag, struct pkv_key key)
{
	int found = 0;

	pthread_mutex_lock(&t->mu);
	for (struct spill **pp = &t->sq_head, *prev = NULL; *pp;) {
		struct spill *s = *pp;

		if (!s->copy || s->ud != ud || (tag >= 0 && (s->tag != tag || !key_same(s->b.key, key)))) {
			prev = s;
			pp = &s->next;
			continue;
		}
		found = 1;
		if (tag >= 0 && !s->copied) {
			/*
			 * Not copied yet: copied now, before the caller changes its
			 * source (the old cost, once). Off the queue meanwhile, so the
			 * tier thread cannot take it, and without the lock, so the tier
			 * thread's completions and submissions are not held up by the
			 * copy. Back at the head once copied; keys are unique in the
			 * queue, so it was the only one.
			 */
			*pp = s->next;
			if (t->sq_tail == s)
				t->sq_tail = prev;
			t->n_taken++;   /* drain must not return while it is off the queue */
			pthread_mutex_unlock(&t->mu);
			s->copy(ud, tag, (uint8_t *)s->io.buf + t->cls[s->cls].l.kv_off);
			pthread_mutex_lock(&t->mu);
			s->copied = 1;
			t->n_taken--;
			s->next = t->sq_head;
			t->sq_head = s;
			if (!t->sq_tail)
				t->sq_tail = s;
			pthread_cond_signal(&t->cv_work);
			break;
		} else if (!s->copied) {
			/* Every block of ud: what is not copied yet is dropped. */
			*pp = s->next;
			if (t->sq_tail == s)
				t->sq_tail = prev;
			t->n_later--;
			stage_free(t, s->io.buf, s->pages);
			free(s);
			continue;
		}
		prev = s;
		pp = &s->next;
	}
	/* The tier thread is copying it now: wait for the copy, never for the write. */
	while (t->copying && t->copying->ud == ud &&
	       (tag < 0 || (t->copying->tag == tag && key_same(t->copying->b.key, key)))) {
		found = 1;
		pthread_cond_wait(&t->cv_done, &t->mu);
	}
	/* Copied and being written: nothing left to do either. */
	for (struct spill *s = t->wb_flight; s && !found && tag >= 0; s = s->wnext)
		found = s->ud == ud && s->tag == tag && key_same(s->b.key, key);
	pthread_mutex_unlock(&t->mu);
	return found;
}

void pkv_tier_spill_commit(struct pkv_tier *t, void *kv)
{
	struct spill *s = t->begun;

	if (!s || kv != (uint8_t *)s->io.buf + t->cls[s->cls].l.kv_off)
		return;
	pthread_mutex_lock(&t->mu);
	t->begun = NULL;
	sq_push(t, s);
	pthread_mutex_unlock(&t->mu);
}

void pkv_tier_spill_cancel(struct pkv_tier *t, void *kv)
{
	struct spill *s = t->begun;

	if (!s || kv != (uint8_t *)s->io.buf + t->cls[s->cls].l.kv_off)
		return;
	pthread_mutex_lock(&t->mu);
	t->begun = NULL;
	stage_free(t, s->io.buf, s->pages);
	pthread_mutex_unlock(&t->mu);
	free(s);
}

uint32_t pkv_tier_probe(struct pkv_tier *t, int cls, const struct pkv_key *keys, uint32_t n)
{
	uint32_t i;

	if (cls < 0 || (uint32_t)cls >= t->n_cls)
		return 0;
	pthread_mutex_lock(&t->mu);
	for (i = 0; i < n; i++) {
		int32_t b = idx_find(t, keys[i]);

		if (b < 0 || t->blk[b].cls != cls)
			break;
	}
	t->lookups += n;
	pthread_mutex_unlock(&t->mu);
	return i;
}

static int fetch_alloc(struct pkv_tier *t, const struct tcls *c, uint32_t n, struct pkv_tier_fetch **out)
{
	struct pkv_tier_fetch *f = calloc(1, sizeof(*f));

	*out = f;
	if (!f)
		return -ENOMEM;
	f->uidx = -1;
	f->n = n;
	f->keys = malloc(n * sizeof(*f->keys));
	f->tokens = malloc((size_t)n * c->fp.block_size * sizeof(*f->tokens));
	f->res = calloc(n, sizeof(*f->res));
	f->got = calloc(n, 1);
	f->ios = calloc(n, sizeof(*f->ios));
	if (!f->keys || !f->tokens || !f->res || !f->got || !f->ios)
		return -ENOMEM;
	return 0;
}

/* Queues the reads of the chain; returns how many blocks are being read (0: none, f is complete) or -errno. */
static int fetch_queue(struct pkv_tier *t, int cls, uint32_t uid, struct pkv_key ns, struct pkv_key parent,
		       const struct pkv_key *keys, const int32_t *tokens, uint32_t n, unsigned timeout_ms,
		       int wait, struct pkv_tier_fetch **out)
{
	struct pkv_tier_fetch *f;
	const struct tcls *c;
	uint32_t i, bs, rec_pages, room;
	int r, p, u;

	*out = NULL;
	if (cls < 0 || (uint32_t)cls >= t->n_cls || !n)
		return -EINVAL;
	c = &t->cls[cls];
	bs = c->fp.block_size;
	/* Never more than half the arena: spills keep moving while a prefix is read. */
	if ((uint64_t)n * c->l.rec_size > t->arena_len / 2)
		n = (uint32_t)(t->arena_len / 2 / c->l.rec_size);
	r = fetch_alloc(t, c, n, &f);
	*out = f;
	if (r)
		return r;
	f->cls = cls;
	f->rec_size = c->l.rec_size;
	f->kv_off = c->l.kv_off;
	f->ns = ns;
	f->parent = parent;
	memcpy(f->keys, keys, n * sizeof(*keys));
	memcpy(f->tokens, tokens, (size_t)n * bs * sizeof(*tokens));
	pthread_mutex_lock(&t->mu);
	/* The chain as it stands in the index now; the tail of it may be gone already. */
	for (i = 0; i < n; i++) {
		int32_t b = idx_find(t, keys[i]);

		if (b < 0 || t->blk[b].cls != cls)
			break;
		f->ios[i] = (struct tier_io){ .op = TIO_GET, .cls = cls, .loc = t->blk[b].loc,
					      .len = c->l.rec_size, .owner = f, .idx = i };
	}
	f->n = n = i;
	if (!n) {
		pthread_mutex_unlock(&t->mu);
		f->complete = 1;
		return 0;
	}
	/*
	 * One uid's fetches together hold at most half the staging, as one
	 * fetch may: a uid opening many prompts whose prefixes are on disk
	 * cannot take every staging page and leave the others' opens to
	 * recompute theirs (a class's record is at most a quarter of it).
	 */
	u = uid_index(t, uid);
	rec_pages = c->l.rec_size / TIER_ALIGN;
	room = u < 0 ? 0 : t->n_pages / 2 - t->uids[u].fetch_pages;
	if (n > room / rec_pages)
		f->n = n = room / rec_pages;
	f->pages = n * rec_pages;
	p = n ? stage_alloc(t, f->pages) : -1;
	if (p < 0) {
		pthread_mutex_unlock(&t->mu);
		f->complete = 1;
		return -EAGAIN;
	}
	f->uidx = u;
	t->uids[u].fetch_pages += f->pages;
	f->buf = t->arena + (size_t)p * TIER_ALIGN;
	for (i = 0; i < n; i++)
		f->ios[i].buf = f->buf + (size_t)i * c->l.rec_size;
	/* Tail first, so the chain's root ends up the most recent and leaves the disk last. */
	for (i = n; i-- > 0;)
		touch(t, idx_find(t, keys[i]));
	if (t->fq_tail)
		t->fq_tail->next = f;
	else
		t->fq_head = f;
	t->fq_tail = f;
	/* The tier thread keeps the deadline (and tells the caller) whether or not anyone blocks on it. */
	f->deadline = pkv_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	f->pnext = t->pend;
	t->pend = f;
	pthread_cond_signal(&t->cv_work);
	if (wait)
		while (!f->complete && !f->expired)
			pthread_cond_wait(&t->cv_done, &t->mu);
	pthread_mutex_unlock(&t->mu);
	return (int)n;
}

int pkv_tier_fetch_start(struct pkv_tier *t, int cls, uint32_t uid, struct pkv_key ns, struct pkv_key parent,
			 const struct pkv_key *keys, const int32_t *tokens, uint32_t n, unsigned timeout_ms,
			 struct pkv_tier_fetch **f)
{
	return fetch_queue(t, cls, uid, ns, parent, keys, tokens, n, timeout_ms, 0, f);
}

int pkv_tier_fetch_poll(struct pkv_tier *t, struct pkv_tier_fetch *f)
{
	int r;

	if (!f)
		return 0;
	pthread_mutex_lock(&t->mu);
	r = f->complete ? (int)f->ok : f->expired ? -ETIMEDOUT : -EINPROGRESS;
	f->avail = f->complete ? f->ok : f->lead;
	pthread_mutex_unlock(&t->mu);
	return r;
}

int pkv_tier_fetch(struct pkv_tier *t, int cls, uint32_t uid, struct pkv_key ns, struct pkv_key parent,
		   const struct pkv_key *keys, const int32_t *tokens, uint32_t n, unsigned timeout_ms,
		   struct pkv_tier_fetch **out)
{
	int r = fetch_queue(t, cls, uid, ns, parent, keys, tokens, n, timeout_ms, 1, out);

	return r <= 0 ? r : pkv_tier_fetch_poll(t, *out);
}

const void *pkv_tier_fetch_kv(const struct pkv_tier_fetch *f, uint32_t i)
{
	/* avail, not lead: the caller's own snapshot, taken under the lock by poll. */
	return i < f->avail ? f->buf + (size_t)i * f->rec_size + f->kv_off : NULL;
}

uint32_t pkv_tier_fetch_avail(const struct pkv_tier_fetch *f)
{
	return f ? f->avail : 0;
}

void pkv_tier_fetch_done(struct pkv_tier *t, struct pkv_tier_fetch *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&t->mu);
	pend_unlink(t, f);
	if (f->complete)
		fetch_free(t, f);
	else
		f->abandoned = 1;   /* the tier thread frees it when its reads come back */
	pthread_mutex_unlock(&t->mu);
}

int64_t pkv_tier_check_all(struct pkv_tier *t, uint64_t *dropped)
{
	int64_t checked = 0;

	*dropped = 0;
	for (uint32_t c = 0; c < t->n_cls; c++) {
		const struct tcls *k = &t->cls[c];
		uint32_t batch = (uint32_t)(t->arena_len / 2 / k->l.rec_size), n, b = 0;
		struct pkv_tier_fetch *f;
		int p;

		batch = batch > 64 ? 64 : batch;
		for (;;) {
			if (fetch_alloc(t, k, batch, &f)) {
				fetch_free(t, f);
				return -ENOMEM;
			}
			f->cls = (int)c;
			f->self = 1;
			f->rec_size = k->l.rec_size;
			f->kv_off = k->l.kv_off;
			pthread_mutex_lock(&t->mu);
			/* Blocks are visited by index; one dropped meanwhile just shifts the walk. */
			for (n = 0; b < t->n_blk && n < batch; b++) {
				const struct tblk *x = &t->blk[b];

				if (x->uidx == FREE_UIDX || x->cls != c)
					continue;
				f->keys[n] = x->key;
				f->ios[n] = (struct tier_io){ .op = TIO_GET, .cls = (int)c, .loc = x->loc,
							      .len = k->l.rec_size, .owner = f, .idx = n };
				n++;
			}
			f->n = n;
			f->pages = n * (k->l.rec_size / TIER_ALIGN);
			p = n ? stage_alloc(t, f->pages) : -1;
			if (p < 0) {
				pthread_mutex_unlock(&t->mu);
				f->n = 0;
				fetch_free(t, f);
				if (n)
					return -EAGAIN;
				break;
			}
			f->buf = t->arena + (size_t)p * TIER_ALIGN;
			for (uint32_t i = 0; i < n; i++)
				f->ios[i].buf = f->buf + (size_t)i * k->l.rec_size;
			if (t->fq_tail)
				t->fq_tail->next = f;
			else
				t->fq_head = f;
			t->fq_tail = f;
			pthread_cond_signal(&t->cv_work);
			while (!f->complete)
				pthread_cond_wait(&t->cv_done, &t->mu);
			checked += n;
			*dropped += n - f->ok;
			fetch_free(t, f);
			pthread_mutex_unlock(&t->mu);
		}
	}
	return checked;
}

void pkv_tier_wait_io(struct pkv_tier *t)
{
	uint64_t seen;

	pthread_mutex_lock(&t->mu);
	seen = t->completions;
	while ((t->sq_head || t->inflight) && t->completions == seen)
		pthread_cond_wait(&t->cv_done, &t->mu);
	pthread_mutex_unlock(&t->mu);
}

void pkv_tier_drain(struct pkv_tier *t)
{
	pthread_mutex_lock(&t->mu);
	while (t->sq_head || t->inflight || t->n_taken)
		pthread_cond_wait(&t->cv_done, &t->mu);
	pthread_mutex_unlock(&t->mu);
}

int64_t pkv_tier_flush(struct pkv_tier *t)
{
	uint64_t req;
	int64_t n;

	pthread_mutex_lock(&t->mu);
	req = ++t->flush_req;
	pthread_cond_signal(&t->cv_work);
	while (t->flush_done < req)
		pthread_cond_wait(&t->cv_done, &t->mu);
	n = t->flush_count;
	pthread_mutex_unlock(&t->mu);
	return n;
}

void pkv_tier_stats(struct pkv_tier *t, struct pkv_tier_stats *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&t->mu);
	st->blocks = t->n_live;
	st->bytes = t->bytes;
	st->budget = t->cfg.budget;
	st->lookups = t->lookups;
	st->hits = t->hits;
	st->spilled = t->spilled;
	st->spill_skipped = t->skipped;
	st->spilled_behind = t->spilled_behind;
	st->index_probe_max = t->probe_max;
	st->evicted = t->evicted;
	st->corrupt = t->corrupt;
	st->read_bytes = t->read_bytes;
	st->read_ns = t->read_ns;
	st->write_bytes = t->write_bytes;
	st->write_ns = t->write_ns;
	st->classes = t->n_cls;
	st->uids = t->n_uids;
	st->stopped = t->stopped;
	for (const struct pkv_tier_fetch *f = t->pend; f; f = f->pnext)
		st->fetching++;
	snprintf(st->stop_reason, sizeof(st->stop_reason), "%s", t->stop_reason);
	pthread_mutex_unlock(&t->mu);
	st->direct = t->be->direct(t->impl);
}

uint64_t pkv_tier_index_bytes(struct pkv_tier *t)
{
	return (uint64_t)t->cap_blk * sizeof(*t->blk) +
	       (t->hash ? (uint64_t)(t->hash_mask + 1) * sizeof(*t->hash) : 0) +
	       (t->uids ? MAX_UIDS * sizeof(*t->uids) : 0);
}

/* ------------------------------------------------------------ open / close */

int pkv_tier_open(const struct pkv_tier_config *cfg, struct pkv_tier **out, char *why, size_t why_len)
{
	struct tier_scan_cb cb;
	pthread_condattr_t ca;
	struct pkv_tier *t;
	int r;

	*out = NULL;
	if (!cfg || !cfg->dir || !cfg->budget || !cfg->uid_share || cfg->uid_share > 100) {
		snprintf(why, why_len, "disk tier: a directory, a budget and a uid share in 1..100 are needed");
		return -EINVAL;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->cfg = *cfg;
	if (!t->cfg.staging)
		t->cfg.staging = DEFAULT_STAGING;
	if (!t->cfg.queue_depth)
		t->cfg.queue_depth = DEFAULT_QD;
	t->free_head = -1;
	t->be = &pkv_tier_disk;
	pkv_hash_secret_init(&t->slot_secret);
	pthread_mutex_init(&t->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&t->cv_done, &ca);
	pthread_cond_init(&t->cv_work, &ca);
	pthread_condattr_destroy(&ca);

	t->n_pages = (uint32_t)((t->cfg.staging + TIER_ALIGN - 1) / TIER_ALIGN);
	t->arena_len = (size_t)t->n_pages * TIER_ALIGN;
	t->arena = mmap(NULL, t->arena_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	t->pagemap = calloc((t->n_pages + 63) / 64, sizeof(*t->pagemap));
	if (t->arena == MAP_FAILED || !t->pagemap) {
		if (t->arena == MAP_FAILED)
			t->arena = NULL;
		r = -ENOMEM;
		snprintf(why, why_len, "disk tier: no memory for %llu bytes of staging",
			 (unsigned long long)t->arena_len);
		goto err_free;
	}
	/* Pages past the arena's end are marked used so the first-fit scan never hands them out. */
	for (uint32_t p = t->n_pages; p < ((t->n_pages + 63) & ~63u); p++)
		t->pagemap[p >> 6] |= 1ull << (p & 63);
	r = t->be->open(&t->cfg, &t->impl, why, why_len);
	if (r)
		goto err_free;
	t->be->arena(t->impl, t->arena, t->arena_len);
	cb = (struct tier_scan_cb){ t, scan_cls, scan_entry, scan_reserve };
	t->scanning = 1;
	r = t->be->scan(t->impl, &cb);
	t->scanning = 0;
	if (!r)
		r = sort_lru(t);
	if (r) {
		snprintf(why, why_len, "disk tier: rebuilding the index of %s: %s", cfg->dir, strerror(-r));
		goto err_impl;
	}
	r = -pthread_create(&t->thread, NULL, tier_thread, t);
	if (r) {
		snprintf(why, why_len, "disk tier: cannot start its thread: %s", strerror(-r));
		goto err_impl;
	}
	t->started = 1;
	*out = t;
	return 0;

err_impl:
	t->be->close(t->impl);
err_free:
	if (t->arena)
		munmap(t->arena, t->arena_len);
	free(t->pagemap);
	free(t->blk);
	free(t->hash);
	free(t->uids);
	free(t);
	return r;
}

void pkv_tier_close(struct pkv_tier *t)
{
	struct pkv_tier_fetch *f;

	if (!t)
		return;
	if (t->begun)
		pkv_tier_spill_cancel(t, (uint8_t *)t->begun->io.buf + t->cls[t->begun->cls].l.kv_off);
	pthread_mutex_lock(&t->mu);
	t->stop = 1;
	pthread_cond_signal(&t->cv_work);
	pthread_mutex_unlock(&t->mu);
	pthread_join(t->thread, NULL);
	/* Fetches given up by their callers were freed on completion; none can be queued now. */
	while ((f = t->fq_head)) {
		t->fq_head = f->next;
		fetch_free(t, f);
	}
	t->be->close(t->impl);
	munmap(t->arena, t->arena_len);
	free(t->pagemap);
	free(t->blk);
	free(t->hash);
	free(t->uids);
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cv_done);
	pthread_cond_destroy(&t->cv_work);
	free(t);
}
