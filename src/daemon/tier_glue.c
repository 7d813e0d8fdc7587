/* SPDX-License-Identifier: MIT */
/* Glue between pagedkvd and its disk tier: lifetime, spill on eviction, fetch before an open, status. */
#include "config.h"
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/log.h"
#include "daemon/daemon.h"
#include "daemon/tier_glue.h"
#include "tier/tier.h"

#define DEFAULT_BUDGET (10ull << 30)
#define DEFAULT_WAIT_MS 200u
#define MAX_FETCH_BLOCKS 4096u
#define BEHIND 64u                /* oldest LRU blocks kept queued for write-behind */

struct tier_pool {
	struct pkv_daemon *d;
	struct pool *p;
	int cls;                      /* the tier's class for this pool, < 0: not spilled */
	int may_wait;                 /* flush or pool teardown: a full staging area is waited out */
	uint8_t *behind;              /* per block: a write-behind spill was queued (or the tier had it) */
	int32_t blks[BEHIND];
	struct pkv_evict_info info[BEHIND];
};

/* The daemon holds one tier; pools reach it through their glue. */
static struct pkv_tier *g_tier;

/*
 * The budget owner of a pool's blocks. Every namespace of a private pool is its owner's (only the
 * owner can attach it) and every namespace of a shared pool is the shared scope, so the owner follows
 * from the pool alone, never from a bounded table a client can flush with salts.
 */
static uint32_t pool_uid(const struct tier_pool *tp)
{
	return (tp->p->flags & PKV_WIRE_POOL_SHARED) ? PKV_NS_SHARED : (uint32_t)tp->p->owner_uid;
}

/* Record layout of KV: layer 0 K, layer 0 V, layer 1 K, ... one block's rows each. */
static void copy_block(const struct pkv_cache_mem *m, int32_t blk, void *rec, const void *from)
{
	size_t bs = m->block_stride;

	for (uint32_t l = 0; l < m->geo.num_layers; l++) {
		uint8_t *k = (uint8_t *)m->k_base + l * m->layer_stride + (size_t)blk * bs;
		uint8_t *v = (uint8_t *)m->v_base + l * m->layer_stride + (size_t)blk * bs;
		size_t o = (size_t)2 * l * bs;

		if (from) {
			memcpy(k, (const uint8_t *)from + o, bs);
			memcpy(v, (const uint8_t *)from + o + bs, bs);
		} else {
			memcpy((uint8_t *)rec + o, k, bs);
			memcpy((uint8_t *)rec + o + bs, v, bs);
		}
	}
}

/* Tier thread (write-behind): the block is still in the LRU, unchanged until on_evict waits for this. */
static void copy_behind(void *ud, int32_t blk, void *kv)
{
	struct tier_pool *tp = ud;

	copy_block(&tp->p->disp.mem, blk, kv, NULL);
}

/*
 * Write-behind: the blocks eviction takes next are queued now, and the tier
 * thread copies them while they sit in the LRU, so that their eviction (in
 * a step's allocation, on the loop) finds them on their way to disk and
 * copies nothing. Bounded to BEHIND blocks and half the staging.
 */
static void behind(struct tier_pool *tp, int32_t evicting)
{
	uint32_t n = pkv_cache_lru_oldest(tp->p->cache, BEHIND, tp->blks, tp->info);

	for (uint32_t i = 0; i < n; i++) {
		const struct pkv_evict_info *e = &tp->info[i];
		int32_t b = tp->blks[i];
		struct pkv_tier_block tb = { e->key, e->parent, e->ns, pool_uid(tp), e->tokens };
		int r;

		if (b == evicting || tp->behind[b])
			continue;
		r = pkv_tier_spill_later(g_tier, tp->cls, &tb, copy_behind, tp, b);
		if (r == -EAGAIN || r == -ENOSPC || r == -ENOMEM)
			break;   /* staging's write-behind half is full, or spilling stopped */
		tp->behind[b] = 1;
	}
}

/* The cache's eviction hook (loop thread): the block's bytes go to the tier before its slots are reused. */
static void on_evict(void *ud, int32_t blk, const struct pkv_evict_info *e)
{
	struct tier_pool *tp = ud;
	struct pkv_tier_block b = { e->key, e->parent, e->ns, pool_uid(tp), e->tokens };
	void *kv;
	int r;

	/* Queued for write-behind: its copy is done (or finished now); nothing else to copy. */
	if (tp->behind[blk]) {
		tp->behind[blk] = 0;
		if (pkv_tier_spill_forget(g_tier, tp, blk, e->key))
			goto out;
	}
	while ((r = pkv_tier_spill_begin(g_tier, tp->cls, &b, &kv)) == -EAGAIN && tp->may_wait)
		pkv_tier_wait_io(g_tier);
	if (r)
		goto out;   /* already there, staging full, or spilling stopped: RAM goes on regardless */
	copy_block(&tp->p->disp.mem, blk, kv, NULL);
	pkv_tier_spill_commit(g_tier, kv);
out:
	if (!tp->may_wait)
		behind(tp, blk);
}

/* Tier thread: a fetch an open waits for completed or timed out; the loop's next sweep takes it. */
static void wake_loop(void *ud)
{
	struct pkv_daemon *d = ud;
	uint64_t one = 1;

	if (write(d->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		pkv_err("disk tier: cannot wake the loop: %s", strerror(errno));
}

int tier_glue_start(struct pkv_daemon *d)
{
	struct pkv_tier_config tc = {
		.dir = d->cfg.disk_cache,
		.budget = d->cfg.disk_budget ? d->cfg.disk_budget : DEFAULT_BUDGET,
		.uid_share = d->cfg.disk_uid_share ? d->cfg.disk_uid_share : 100,
		.notify = wake_loop,
		.notify_ud = d,
		/* Test hook only: the tests' slow disk on demand. */
		.read_gate = getenv("PAGEDKV_TIER_TEST_READ_GATE"),
	};
	struct pkv_tier_stats st;
	char why[512] = "";
	int r;

	if (!d->cfg.disk_cache[0])
		return 0;
	/* A file-size limit must fail a write (EFBIG, the tier stops spilling), not kill the daemon. */
	signal(SIGXFSZ, SIG_IGN);
	r = pkv_tier_open(&tc, &g_tier, why, sizeof(why));
	if (r) {
		pkv_err("%s", why);
		return r;
	}
	pkv_tier_stats(g_tier, &st);
	pkv_info("disk tier %s: %llu blocks (%llu MiB) of a %llu MiB budget, uid share %u%%",
		 tc.dir, (unsigned long long)st.blocks, (unsigned long long)(st.bytes >> 20),
		 (unsigned long long)(tc.budget >> 20), tc.uid_share);
	return 0;
}

void tier_glue_stop(struct pkv_daemon *d)
{
	(void)d;
	pkv_tier_close(g_tier);
	g_tier = NULL;
}

void tier_glue_pool_created(struct pkv_daemon *d, struct pool *p)
{
	struct pkv_tier_fp fp;
	struct tier_pool *tp;

	if (!g_tier)
		return;
	/* The tier copies with memcpy: only a host-domain cache is spilled. */
	if (p->disp.mem.domain != PKV_DOMAIN_HOST) {
		pkv_info("pool '%s': cache is not in host memory; no disk tier for it", p->name);
		return;
	}
	tp = calloc(1, sizeof(*tp));
	if (tp)
		tp->behind = calloc(p->geo.num_blocks, 1);
	if (!tp || !tp->behind) {
		free(tp);
		pkv_warn("pool '%s': no memory for its disk tier glue", p->name);
		return;
	}
	pkv_tier_fp_of(&p->geo, p->model_id, &fp);
	tp->d = d;
	tp->p = p;
	tp->cls = pkv_tier_class(g_tier, &fp);
	if (tp->cls < 0) {
		pkv_warn("pool '%s': disk tier refuses its blocks: %s", p->name, strerror(-tp->cls));
		free(tp->behind);
		free(tp);
		return;
	}
	p->tier = tp;
	pkv_cache_set_evict_hook(p->cache, on_evict, tp);
}

void tier_glue_pool_destroy(struct pkv_daemon *d, struct pool *p)
{
	struct tier_pool *tp = p->tier;

	(void)d;
	if (!tp)
		return;
	/* Freeing a pool is a spill of everything it still caches. */
	tp->may_wait = 1;
	pkv_cache_flush(p->cache);
	pkv_cache_set_evict_hook(p->cache, NULL, NULL);
	/* Every evicted block settled its write-behind; whatever else is queued must not read freed memory. */
	static const struct pkv_key e_none;

	pkv_tier_spill_forget(g_tier, tp, -1, e_none);
	free(tp->behind);
	free(tp);
	p->tier = NULL;
}

int tier_glue_cache_flush(struct pkv_daemon *d, struct pool *p)
{
	int n;

	(void)d;
	/* An administrator's flush may wait for the disk: every flushed block is spilled. */
	if (p->tier)
		p->tier->may_wait = 1;
	n = pkv_cache_flush(p->cache);
	if (p->tier) {
		p->tier->may_wait = 0;
		pkv_tier_drain(g_tier);   /* the flush returns once its blocks are findable on disk */
	}
	return n;
}

/*
 * An open parked while the tier reads the part of its prefix that left RAM,
 * or (a follower) while another open of its pool and namespace reads the
 * same chain: a burst of clients opening one spilled system prompt reads it
 * once, not once per client.
 */
struct tier_open {
	struct pkv_tier_fetch *f;     /* NULL for a follower */
	struct tier_open *lead;       /* a follower's: the open whose reads it waits for (a reference) */
	uint32_t refs;                /* the session's, plus one per follower */
	int released;                 /* its session let go of it: its reads are in, given up or abandoned */
	uint64_t t0;                  /* when the reads were queued (a follower: when it began to wait) */
	struct pkv_key parent;        /* the key of the last block RAM had, or the namespace */
	struct pkv_key *keys;
	uint32_t ram, n;              /* blocks RAM had, blocks being read after them */
	uint32_t next;                /* records taken into the pool so far (the chain's head) */
	uint32_t early;               /* of them, taken while the rest was still being read */
	uint32_t copied;              /* of them, copied (the others were in RAM already) */
	int broken;                   /* the chain ended in RAM: nothing more is taken */
	uint64_t copy_ns;             /* time spent adopting and copying (debug log) */
};

/* Followers parked now: opens waiting for reads, as the tier's own count is of the reads. */
static uint32_t g_following;

static void open_put(struct tier_open *o)
{
	if (--o->refs)
		return;
	free(o->keys);
	free(o);
}

/* The session lets go of o; its followers see it released at their next turn. */
static void open_free(struct tier_open *o)
{
	if (!o)
		return;
	pkv_tier_fetch_done(g_tier, o->f);   /* still in flight: the tier thread frees it */
	o->f = NULL;
	o->released = 1;
	if (o->lead) {
		g_following--;
		open_put(o->lead);
	}
	open_put(o);
}

static uint32_t wait_ms(const struct pkv_daemon *d)
{
	return d->cfg.disk_wait_ms ? d->cfg.disk_wait_ms : DEFAULT_WAIT_MS;
}

static int key_same(struct pkv_key a, struct pkv_key b)
{
	return a.lo == b.lo && a.hi == b.hi;
}

/*
 * Another session's open of this pool and namespace whose reads are in flight
 * and include the block keyed first: same pool, namespace and key mean the
 * same tokens at the same place, so its reads are this open's too.
 */
static struct tier_open *reading(struct pkv_daemon *d, const struct session *s, struct pkv_key first)
{
	for (struct session *o = d->sessions; o; o = o->next) {
		struct tier_open *t = o->open_fetch;

		if (o == s || !t || !t->f || o->pool != s->pool || !key_same(o->ns, s->ns))
			continue;
		for (uint32_t i = 0; i < t->n; i++)
			if (key_same(t->keys[i], first))
				return t;
	}
	return NULL;
}

/*
 * The parked open for tokens' blocks that RAM lacks and the disk holds, with
 * at most wait ms for the reads; NULL when there is nothing to read. With
 * may_follow, one whose chain another open is reading already follows it.
 */
static struct tier_open *fetch_open(struct pkv_daemon *d, struct session *s, const int32_t *tokens, uint32_t n,
				    int may_follow, uint32_t wait)
{
	struct tier_pool *tp = s->pool ? s->pool->tier : NULL;
	struct pkv_cache *c = s->pool ? s->pool->cache : NULL;
	uint32_t bs, max_blk, ram, want, i, hits;
	struct tier_open *o, *lead;
	int r;

	if (!tp || !n || !wait)
		return NULL;
	bs = s->pool->geo.block_size;
	max_blk = (n - 1) / bs;
	o = calloc(1, sizeof(*o));
	if (!o)
		return NULL;
	o->refs = 1;
	ram = pkv_cache_lookup(c, s->ns, tokens, n, &o->parent);
	if (ram >= max_blk)
		goto err_free;
	want = max_blk - ram;
	if (want > MAX_FETCH_BLOCKS)
		want = MAX_FETCH_BLOCKS;
	o->keys = malloc(want * sizeof(*o->keys));
	if (!o->keys)
		goto err_free;
	/* The chain continues from the last block RAM has, exactly as the cache would key it. */
	for (i = 0; i < want; i++) {
		o->keys[i] = pkv_cache_block_key(i ? o->keys[i - 1] : o->parent, s->ns,
						 tokens + (size_t)(ram + i) * bs, bs);
	}
	o->ram = ram;
	o->t0 = pkv_now_ns();
	lead = may_follow ? reading(d, s, o->keys[0]) : NULL;
	if (lead) {
		o->lead = lead;
		lead->refs++;
		g_following++;
		return o;
	}
	hits = pkv_tier_probe(g_tier, tp->cls, o->keys, want);
	if (!hits)
		goto err_free;
	/*
	 * Only blocks the index holds are read, so nothing is waited for that
	 * cannot be used. The open is parked, not the loop: the tier thread
	 * wakes the loop when the reads are verified or the wait passed.
	 */
	r = pkv_tier_fetch_start(g_tier, tp->cls, (uint32_t)s->uid, s->ns, o->parent, o->keys,
				 tokens + (size_t)ram * bs, hits, wait, &o->f);
	if (r <= 0)
		goto err_free;
	o->n = (uint32_t)r;
	return o;

err_free:
	open_free(o);
	return NULL;
}

int tier_glue_fetch_start(struct pkv_daemon *d, struct session *s, const int32_t *tokens, uint32_t n)
{
	if (s->open_fetch)
		return 0;
	s->open_fetch = fetch_open(d, s, tokens, n, 1, wait_ms(d));
	return s->open_fetch != NULL;
}

/*
 * Adopts records [o->next, avail) into the pool, copying their bytes, and
 * hands them to the LRU (tail first within the batch); under the pool lock.
 * Each block is published and filled within this one call, so nothing
 * else ever sees it half-filled.
 */
static void take_records(struct session *s, struct tier_open *o, const int32_t *tokens, uint32_t avail)
{
	struct pkv_cache *c = s->pool->cache;
	uint32_t bs = s->pool->geo.block_size;
	int32_t held[16];
	uint64_t t0 = pkv_now_ns();

	while (!o->broken && o->next < avail) {
		uint32_t n_held = 0;

		for (; o->next < avail && n_held < 16; o->next++) {
			uint32_t i = o->next;
			int32_t blk;
			int r = pkv_cache_adopt(c, s->ns, i ? o->keys[i - 1] : o->parent,
						tokens + (size_t)(o->ram + i) * bs, &blk);

			/*
			 * RAM may have changed while the disk read: a block someone
			 * computed meanwhile is kept (and the chain goes on past it),
			 * a parent evicted meanwhile ends the chain (adopt refuses an
			 * orphan).
			 */
			if (r == -EEXIST)
				continue;
			if (r) {
				o->broken = 1;
				break;
			}
			copy_block(&s->pool->disp.mem, blk, NULL, pkv_tier_fetch_kv(o->f, i));
			held[n_held++] = blk;
			o->copied++;
		}
		/* Tail first into the LRU, as a closed sequence would leave them. */
		while (n_held > 0)
			pkv_cache_adopt_end(c, held[--n_held]);
	}
	o->copy_ns += pkv_now_ns() - t0;
}

int tier_glue_fetch_ready(struct pkv_daemon *d, struct session *s, const int32_t *tokens)
{
	struct tier_open *o = s->open_fetch;
	uint64_t t1;
	int got;

	if (o->lead) {
		struct tier_open *own;
		uint64_t waited_ms = (pkv_now_ns() - o->t0) / 1000000;

		if (!o->lead->released)
			return 0;
		/*
		 * What the other open took is in RAM now. The rest of this chain
		 * (a longer prompt) is read as this open's own, within what is left
		 * of its wait: all told an open waits disk_wait_ms at most.
		 */
		own = waited_ms < wait_ms(d) ? fetch_open(d, s, tokens, s->open_n, 0, wait_ms(d) - (uint32_t)waited_ms)
					     : NULL;
		if (!own)
			return 1;
		open_free(o);
		s->open_fetch = own;
		return 0;
	}
	got = pkv_tier_fetch_poll(g_tier, o->f);
	t1 = pkv_now_ns();
	/*
	 * The verified head of the chain is copied into the pool as it grows,
	 * while the rest is still being read: the open then waits for the last
	 * read and one last copy, not for the read of all plus the copy of all.
	 */
	take_records(s, o, tokens, pkv_tier_fetch_avail(o->f));
	if (got == -EINPROGRESS) {
		o->early = o->next;
		return 0;
	}
	/* Past the deadline the open goes on with what RAM has (and what was taken); the reads finish unseen. */
	if (got > 0)
		pkv_dbg("client %u: %d blocks read and verified in %.2f ms; %u copied into the pool in %.2f ms, "
			"all but the last %u while the rest was read (%.2f ms after the last read)",
			s->id, got, (double)(t1 - o->t0) / 1e6, o->copied, (double)o->copy_ns / 1e6,
			o->next - o->early, (double)(pkv_now_ns() - t1) / 1e6);
	return 1;
}

void tier_glue_fetch_release(struct pkv_daemon *d, struct session *s)
{
	struct tier_open *o = s->open_fetch;
	uint64_t one = 1;

	if (!o)
		return;
	s->open_fetch = NULL;
	/* Its followers go on at the loop's next sweep: wake it, it may be about to sleep (a hang-up). */
	if (o->refs > 1 && write(d->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		pkv_warn("disk tier: waking the loop for waiting opens: %s", strerror(errno));
	open_free(o);
}

static double gbps(uint64_t bytes, uint64_t ns)
{
	return ns ? (double)bytes / (double)ns : 0.0;
}

void tier_glue_status(struct pkv_daemon *d, FILE *f, int json)
{
	struct pkv_tier_stats st;

	if (!g_tier)
		return;
	pkv_tier_stats(g_tier, &st);
	if (json) {
		fprintf(f, "\"disk_tier\":{\"blocks\":%llu,\"bytes\":%llu,\"budget\":%llu,\"lookups\":%llu,"
			   "\"hits\":%llu,\"hit_rate\":%.4f,\"spilled\":%llu,\"spill_skipped\":%llu,"
			   "\"evicted\":%llu,\"corrupt\":%llu,\"read_bytes\":%llu,\"write_bytes\":%llu,"
			   "\"read_gbps\":%.3f,\"write_gbps\":%.3f,\"o_direct\":%s,\"spilling\":%s,"
			   "\"opens_waiting\":%u,\"spilled_behind\":%llu},",
			(unsigned long long)st.blocks, (unsigned long long)st.bytes,
			(unsigned long long)st.budget, (unsigned long long)st.lookups,
			(unsigned long long)st.hits, st.lookups ? (double)st.hits / (double)st.lookups : 0.0,
			(unsigned long long)st.spilled, (unsigned long long)st.spill_skipped,
			(unsigned long long)st.evicted, (unsigned long long)st.corrupt,
			(unsigned long long)st.read_bytes, (unsigned long long)st.write_bytes,
			gbps(st.read_bytes, st.read_ns), gbps(st.write_bytes, st.write_ns),
			st.direct ? "true" : "false", st.stopped ? "false" : "true", st.fetching + g_following,
			(unsigned long long)st.spilled_behind);
		return;
	}
	fprintf(f, "disk tier %s: %llu blocks, %llu of %llu MiB; hits %llu of %llu blocks looked up (%.1f%%)\n",
		d->cfg.disk_cache, (unsigned long long)st.blocks, (unsigned long long)(st.bytes >> 20),
		(unsigned long long)(st.budget >> 20), (unsigned long long)st.hits,
		(unsigned long long)st.lookups, st.lookups ? 100.0 * (double)st.hits / (double)st.lookups : 0.0);
	fprintf(f, "  read %.2f GB/s, write %.2f GB/s (%s); %llu spilled (%llu copied behind), %llu not spilled, %llu evicted, %llu corrupt dropped\n",
		gbps(st.read_bytes, st.read_ns), gbps(st.write_bytes, st.write_ns),
		st.direct ? "O_DIRECT" : "buffered", (unsigned long long)st.spilled,
		(unsigned long long)st.spilled_behind,
		(unsigned long long)st.spill_skipped, (unsigned long long)st.evicted,
		(unsigned long long)st.corrupt);
	if (st.fetching + g_following)
		fprintf(f, "  %u opens waiting for reads (%u of them for another open's)\n", st.fetching + g_following,
			g_following);
	if (st.stopped)
		fprintf(f, "  spilling stopped: %s (pagedkvctl flush --disk resumes it)\n", st.stop_reason);
}

void tier_glue_flush(struct pkv_daemon *d, FILE *f, int json)
{
	int64_t n = -1;

	(void)d;
	if (g_tier)
		n = pkv_tier_flush(g_tier);
	if (json)
		fprintf(f, "{\"disk_flushed_blocks\":%lld}\n", (long long)n);
	else if (n < 0)
		fprintf(f, "no disk tier (pagedkvd --disk-cache DIR)\n");
	else
		fprintf(f, "disk tier: %lld blocks dropped\n", (long long)n);
}
