/* SPDX-License-Identifier: MIT */
/* The worker: consumes hot clients' rings itself, running their attends (merged per pool and layer) off the event loop. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <pagedkv/dtype.h>
#include "common/barrier.h"
#include "common/log.h"
#include "common/spin.h"
#include "daemon/daemon.h"
#include "daemon/sigbus.h"
#include "daemon/validate.h"

void job_free(struct job *j)
{
	if (j) {
		free(j->items);
		free(j->big_arrays);
		free(j->split_buf);
		free(j);
	}
}

double worker_attend_units(const struct pool *p, const struct pkv_step_meta *m)
{
	double u = 0;

	for (uint32_t s = 0; s < m->num_seqs; s++) {
		double sq = m->cu_seq_lens_q[s + 1] - m->cu_seq_lens_q[s];
		double sk = m->cu_seq_lens_k[s + 1] - m->cu_seq_lens_k[s];

		u += sq * (sk - sq) + sq * (sq + 1) / 2;
	}
	return u * p->geo.num_heads * p->geo.head_dim;
}

/* Bump allocator over the worker's scratch buffer, grown between batches only. */
static int scratch_reserve(struct worker *w, size_t need)
{
	uint8_t *n;

	if (need <= w->scratch_len)
		return 0;
	n = realloc(w->scratch, need);
	if (!n)
		return -ENOMEM;
	w->scratch = n;
	w->scratch_len = need;
	return 0;
}

static size_t al(size_t v)
{
	return (v + 63) & ~(size_t)63;
}

static void fill_common(struct pkv_attn_batch *b, const struct pool *p, uint32_t layer)
{
	const struct pkv_geometry *g = &p->geo;

	memset(b, 0, sizeof(*b));
	b->abi_version = PKV_BACKEND_ABI_VERSION;
	b->struct_size = sizeof(*b);
	b->layer = layer;
	b->act_dtype = p->act_dtype;
	b->q_stride_tok = b->o_stride_tok = (int64_t)g->num_heads * g->head_dim;
	b->q_stride_head = b->o_stride_head = g->head_dim;
	b->kv_stride_tok = (int64_t)g->num_kv_heads * g->head_dim;
	b->kv_stride_head = g->head_dim;
	b->scale = p->scale;
	b->softcap = p->softcap;
	b->window_left = p->window_left;
}

/* One batch for every item: zero-copy for a single item, gathered into scratch otherwise. */
static int run_attend(struct worker *w, struct job *j)
{
	const struct pool *p = j->pool;
	const struct pkv_geometry *g = &p->geo;
	size_t act = pkv_dtype_size(p->act_dtype);
	size_t qrow = (size_t)g->num_heads * g->head_dim * act, kvrow = (size_t)g->num_kv_heads * g->head_dim * act;
	struct pkv_attn_batch b;
	uint32_t n_seqs = 0, total_q = 0, maxb = 0, mq = 0, mk = 0;
	size_t need, o_cu_q, o_cu_k, o_csl, o_bt, o_slot, o_q, o_k, o_v, o_o;
	int32_t *cu_q, *cu_k, *csl, *bt;
	int64_t *slot;
	uint8_t *q, *k, *v, *o;
	int r;

	fill_common(&b, p, j->layer);
	if (j->n_items == 1) {
		const struct attend_item *it = &j->items[0];
		const struct pkv_step_meta *m = it->meta;

		b.num_seqs = m->num_seqs;
		b.total_q = m->total_q;
		b.q = it->q;
		b.k_new = it->k;
		b.v_new = it->v;
		b.o = it->o;
		b.cu_seq_lens_q = m->cu_seq_lens_q;
		b.cu_seq_lens_k = m->cu_seq_lens_k;
		b.max_length_q = m->max_length_q;
		b.max_length_k = m->max_length_k;
		b.block_tables = m->block_tables;
		b.max_blocks_per_seq = m->max_blocks_per_seq;
		b.cache_seqlens = m->cache_seqlens;
		b.slot_mapping = m->slot_mapping;
		return pkv_dispatch_attend(&j->pool->disp, &b);
	}
	for (uint32_t i = 0; i < j->n_items; i++) {
		const struct pkv_step_meta *m = j->items[i].meta;

		n_seqs += m->num_seqs;
		total_q += m->total_q;
		maxb = m->max_blocks_per_seq > maxb ? m->max_blocks_per_seq : maxb;
		mq = m->max_length_q > mq ? m->max_length_q : mq;
		mk = m->max_length_k > mk ? m->max_length_k : mk;
	}
	o_cu_q = 0;
	o_cu_k = o_cu_q + al((n_seqs + 1) * 4);
	o_csl = o_cu_k + al((n_seqs + 1) * 4);
	o_bt = o_csl + al(n_seqs * 4);
	o_slot = o_bt + al((size_t)n_seqs * maxb * 4);
	o_q = o_slot + al((size_t)total_q * 8);
	o_k = o_q + al(total_q * qrow);
	o_v = o_k + al(total_q * kvrow);
	o_o = o_v + al(total_q * kvrow);
	need = o_o + al(total_q * qrow);
	r = scratch_reserve(w, need);
	if (r)
		return r;
	cu_q = (int32_t *)(w->scratch + o_cu_q);
	cu_k = (int32_t *)(w->scratch + o_cu_k);
	csl = (int32_t *)(w->scratch + o_csl);
	bt = (int32_t *)(w->scratch + o_bt);
	slot = (int64_t *)(w->scratch + o_slot);
	q = w->scratch + o_q;
	k = w->scratch + o_k;
	v = w->scratch + o_v;
	o = w->scratch + o_o;
	cu_q[0] = cu_k[0] = 0;
	{
		uint32_t s0 = 0, t0 = 0;

		for (uint32_t i = 0; i < j->n_items; i++) {
			const struct attend_item *it = &j->items[i];
			const struct pkv_step_meta *m = it->meta;

			for (uint32_t s = 0; s < m->num_seqs; s++) {
				cu_q[s0 + s + 1] = (int32_t)t0 + m->cu_seq_lens_q[s + 1];
				cu_k[s0 + s + 1] = cu_k[s0] + m->cu_seq_lens_k[s + 1];
				csl[s0 + s] = m->cache_seqlens[s];
				for (uint32_t x = 0; x < maxb; x++)
					bt[(size_t)(s0 + s) * maxb + x] = x < m->max_blocks_per_seq
						? m->block_tables[(size_t)s * m->max_blocks_per_seq + x] : -1;
			}
			memcpy(slot + t0, m->slot_mapping, (size_t)m->total_q * 8);
			memcpy(q + t0 * qrow, it->q, m->total_q * qrow);
			memcpy(k + t0 * kvrow, it->k, m->total_q * kvrow);
			memcpy(v + t0 * kvrow, it->v, m->total_q * kvrow);
			s0 += m->num_seqs;
			t0 += m->total_q;
		}
	}
	b.num_seqs = n_seqs;
	b.total_q = total_q;
	b.q = q;
	b.k_new = k;
	b.v_new = v;
	b.o = o;
	b.cu_seq_lens_q = cu_q;
	b.cu_seq_lens_k = cu_k;
	b.max_length_q = mq;
	b.max_length_k = mk;
	b.block_tables = bt;
	b.max_blocks_per_seq = maxb;
	b.cache_seqlens = csl;
	b.slot_mapping = slot;
	r = pkv_dispatch_attend(&j->pool->disp, &b);
	if (!r) {
		uint32_t t0 = 0;

		for (uint32_t i = 0; i < j->n_items; i++) {
			const struct attend_item *it = &j->items[i];

			memcpy(it->o, o + t0 * qrow, it->meta->total_q * qrow);
			t0 += it->meta->total_q;
		}
	}
	return r;
}

/* Hands a finished job (a copy, or a ring given back) to the loop, waking it when it sleeps. */
static void finish(struct pkv_daemon *d, struct job *j)
{
	struct worker *w = &d->worker;
	uint64_t one = 1;

	pthread_mutex_lock(&w->mu);
	j->next = w->done;
	pkv_store_release(&w->done, j);
	/* Full fence pairs with the loop's between setting loop_sleeping and
	 * re-checking done: either it sees our job or we see its flag. */
	pkv_smp_mb();
	pthread_mutex_unlock(&w->mu);
	if (pkv_load_relaxed(&d->loop_sleeping))
		if (write(d->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			pkv_err("worker: cannot wake the loop: %s", strerror(errno));
}

/*
 * Puts s's doorbell in the worker's epoll set, edge-triggered: every write
 * of the client wakes us, and we never read the eventfd (the client shares
 * its file description and could make a read block). Its count is read
 * again by the loop once the ring is back. Without room in the set (the
 * user's epoll watch limit), the ring goes back to the loop when idle, as
 * it did before the worker could sleep on it.
 */
static int watch_bell(struct worker *w, struct job *o)
{
	const struct session *s = o->s;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.ptr = o };

	if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, s->sq_bell, &ev)) {
		pkv_dbg("worker: cannot watch the doorbell of client %u: %s", s->id, strerror(errno));
		return 0;
	}
	return 1;
}

/*
 * Before a ring goes back: out of the epoll set (the registration would
 * outlive our descriptor, since the client holds the file open) and its
 * flag cleared, since the loop sets its own when it sleeps.
 */
static void release_ring(struct worker *w, struct job *o)
{
	if (o->watched && epoll_ctl(w->epfd, EPOLL_CTL_DEL, o->s->sq_bell, NULL))
		pkv_err("worker: cannot unwatch the doorbell of client %u: %s", o->s->id, strerror(errno));
	o->watched = 0;
	pkv_ring_clear_wakeup(&o->s->sq);
}

static int own(struct worker *w, struct job *j)
{
	if (w->n_owned == w->cap_owned) {
		uint32_t c = w->cap_owned ? w->cap_owned * 2 : 8;
		struct job **n = realloc(w->owned, c * sizeof(*n));

		if (!n)
			return -ENOMEM;
		w->owned = n;
		w->cap_owned = c;
	}
	j->last_ns = pkv_now_ns();
	j->in_batch = j->give_back = 0;
	j->watched = watch_bell(w, j);
	w->owned[w->n_owned++] = j;
	return 0;
}

/*
 * Copy-on-write copies run in pieces of about COPY_PIECE_BYTES (a few
 * hundred microseconds of memcpy), the backend lock let go between them. A
 * step's copies are one block (every layer's K and V) per forked sequence
 * whose last block it shares: a client's to choose, up to what its pool
 * holds, and repeatable at every step. The pieces are served in turn with
 * the slices (pick_big), a step begun here (copy_on) or on the loop
 * (JOB_COPY) alike, so other uids' attends run between them, and the
 * session's own ring waits until they are done. The loop, which takes the
 * lock to create or free a pool, waits one piece and gets the lock before
 * the next one (a mutex let go and taken again at once would keep it).
 */
#define COPY_PIECE_BYTES (4u << 20)

static uint32_t copy_piece_blocks(const struct pool *p)
{
	uint64_t blk = block_kv_bytes(&p->geo);

	return blk && blk < COPY_PIECE_BYTES ? (uint32_t)(COPY_PIECE_BYTES / blk) : 1;
}

/*
 * A block larger than a piece (many layers of long blocks: 900 layers of
 * 4,096 tokens made one 225 MiB copy, ~41 ms) is copied a range of its
 * layers at a time, through a view of the pool's memory; one layer of one
 * block is at most PKV_MAX_BLOCK_LAYER_BYTES.
 */
static uint32_t copy_piece_layers(const struct pool *p)
{
	uint64_t per = block_kv_bytes(&p->geo) / p->geo.num_layers;

	return per && per < COPY_PIECE_BYTES ? (uint32_t)(COPY_PIECE_BYTES / per) : 1;
}

static void drop_hints_if_shared(struct worker *w);

/*
 * The worker's way to take backend_mu, before each backend call: after the
 * loop, when it waits for it (backend_lock_loop); and with a hinting
 * client's settings undone if another uid connected meanwhile.
 */
static void backend_lock_worker(struct pkv_daemon *d)
{
	drop_hints_if_shared(&d->worker);
	while (__atomic_load_n(&d->backend_wanted, __ATOMIC_ACQUIRE))
		sched_yield();
	pthread_mutex_lock(&d->backend_mu);
}

/* Copies c[0..n), layers [l0, l0 + nl) of them. */
static int copy_piece(struct pkv_daemon *d, struct pool *p, const struct pkv_block_copy *c, uint32_t n,
		      uint32_t l0, uint32_t nl)
{
	int r;

	backend_lock_worker(d);
	r = pkv_dispatch_copy_layers(&p->disp, c, n, l0, nl); /* every layer: copy_blocks on the pool itself */
	pthread_mutex_unlock(&d->backend_mu);
	return r;
}

/*
 * The next piece of o's copies c[0..n) (from block copy_next, layer
 * copy_layer): whole blocks, or a range of one block's layers. 1 when none
 * is left or one failed (*res then < 0).
 */
static int copy_step(struct pkv_daemon *d, struct job *o, const struct pkv_block_copy *c, uint32_t n, int *res)
{
	struct pool *p = o->s->pool;
	uint32_t k = copy_piece_blocks(p), L = p->geo.num_layers, nl = L;

	if (k > n - o->copy_next)
		k = n - o->copy_next;
	if (block_kv_bytes(&p->geo) > COPY_PIECE_BYTES && pkv_dispatch_can_copy_layers(&p->disp)) {
		nl = copy_piece_layers(p);
		nl = nl < L - o->copy_layer ? nl : L - o->copy_layer;
	}
	*res = pkv_load_relaxed(&o->s->closing) ? -ECANCELED : copy_piece(d, p, c + o->copy_next, k, o->copy_layer, nl);
	if (*res >= 0 && nl < L)
		__atomic_fetch_add(&p->layer_copies, 1, __ATOMIC_RELAXED);
	o->copy_layer += nl;
	if (o->copy_layer >= L) {
		o->copy_layer = 0;
		o->copy_next += k;
	}
	o->big_served_ns = pkv_now_ns();
	d->worker.last_big_uid = o->s->uid;
	return *res < 0 || o->copy_next >= n;
}

/* A failed copy-on-write poisons the step: its end aborts it, its attends fail meanwhile (take). */
static void copy_failed(struct session *s, int res)
{
	if (res != -ECANCELED) /* its client hung up meanwhile */
		pkv_warn("client %u: copy-on-write failed: %s", s->id, strerror(-res));
	s->step_poisoned = 1;
}

/*
 * One piece of a JOB_COPY (a step the loop began); after the last one the
 * job goes back to the loop, which then lets the step end. Returns whether
 * it did. The poison is set before the loop learns of it: the step's end
 * may run on this thread once the ring is handed over.
 */
static int run_copy_job(struct pkv_daemon *d, struct job *j)
{
	struct worker *w = &d->worker;
	int r;

	if (!copy_step(d, j, j->copies, j->n_copies, &r))
		return 0;
	if (r < 0)
		copy_failed(j->s, r);
	j->res = r < 0 ? r : 0;
	j->s->worker_copies--;
	for (uint32_t i = 0; i < w->n_copying; i++)
		if (w->copying[i] == j) {
			w->copying[i] = w->copying[--w->n_copying];
			break;
		}
	finish(d, j);
	return 1;
}

/* Queues a JOB_COPY to run in pieces (out of memory: all of it now). */
static void queue_copy_job(struct pkv_daemon *d, struct job *j)
{
	struct worker *w = &d->worker;

	j->copy_next = j->copy_layer = 0;
	j->big_served_ns = 0;
	j->s->worker_copies++;
	if (w->n_copying == w->cap_copying) {
		uint32_t c = w->cap_copying ? w->cap_copying * 2 : 8;
		struct job **n = realloc(w->copying, c * sizeof(*n));

		if (!n) {
			while (!run_copy_job(d, j))
				;
			return;
		}
		w->copying = n;
		w->cap_copying = c;
	}
	w->copying[w->n_copying++] = j;
}

/*
 * Takes every queued job in order: a copy joins those run in pieces, and
 * its session's ring, handed over after it, waits for it (worker_copies); a
 * ring joins the polled set.
 */
static void absorb(struct pkv_daemon *d)
{
	struct worker *w = &d->worker;
	struct job *j;

	if (!pkv_load_acquire(&w->head))
		return;
	pthread_mutex_lock(&w->mu);
	j = w->head;
	w->head = w->tail = NULL;
	pthread_mutex_unlock(&w->mu);
	while (j) {
		struct job *next = j->next;

		j->next = NULL;
		if (j->kind == JOB_COPY) {
			queue_copy_job(d, j);
		} else if (own(w, j)) {
			j->res = -ENOMEM;
			finish(d, j);
		}
		j = next;
	}
}

enum head { HEAD_EMPTY, HEAD_FULL, HEAD_ATTEND, HEAD_STEP, HEAD_OTHER, HEAD_BAD };

/* Looks at the next SQE of an owned ring (copied out of shared memory into e). */
static enum head head_of(struct session *s, struct pkv_sqe *e)
{
	int64_t avail, space;

	if (pkv_load_relaxed(&s->closing))
		return HEAD_OTHER;
	avail = pkv_ring_avail(&s->sq);
	if (avail == 0)
		return HEAD_EMPTY;
	space = session_cq_space(s);
	if (avail < 0 || space < 0)
		return HEAD_BAD;
	if (space == 0)
		return HEAD_FULL; /* no room for the completion: only a client that broke the protocol */
	pkv_ring_peek_copy(&s->sq, e);
	if (e->opcode == PKV_OP_ATTEND)
		return HEAD_ATTEND;
	/* A step boundary runs here (run_step); anything else goes back to the loop. */
	return session_step_on_worker(s, e) ? HEAD_STEP : HEAD_OTHER;
}

static int batch_add(struct worker *w, struct job *b, const struct attend_item *it)
{
	if (b->n_items == w->cap_batch) {
		uint32_t c = w->cap_batch ? w->cap_batch * 2 : 8;
		struct attend_item *n = realloc(w->batch, c * sizeof(*n));

		if (!n)
			return -ENOMEM;
		w->batch = n;
		w->cap_batch = c;
	}
	b->items = w->batch;
	b->items[b->n_items++] = *it;
	return 0;
}

/* Completes one SQE of an owned ring; a ring we cannot post to goes back for a disconnect. */
static void post_p(struct job *o, uint64_t ud, int32_t res, uint64_t p0, uint64_t p1)
{
	if (res < 0)
		o->errors++;
	if (session_post(o->s, ud, res, p0, p1) || o->s->cq_broken) {
		o->res = -EPROTO;
		o->give_back = 1;
	}
}

static void post(struct job *o, uint64_t ud, int32_t res)
{
	post_p(o, ud, res, 0, 0);
}

/*
 * Runs the step boundary at the head of o's ring (copied in e) here, so a
 * decode step costs no hand-off to the loop and back: one lock of the
 * pool's cache, taken only if free. When the loop holds it (an open's walk,
 * another client's step), or the step is too long for this thread, the ring
 * goes back to the loop, which runs it as before: no client can make this
 * thread wait. A fault in the client's memory while we read it (the step's
 * arrays) gives the ring back for the loop to disconnect the client.
 */
static void run_step(struct pkv_daemon *d, struct job *o, const struct pkv_sqe *e)
{
	struct session *s = o->s;
	struct pool *p = s->pool;
	uint64_t p0 = 0, p1 = 0;
	int r;

	if (pthread_mutex_trylock(&p->cache_mu)) {
		o->give_back = 1;
		return;
	}
	r = session_exec(d, s, e, WORKER_STEP_TOKENS, &p0, &p1);
	pthread_mutex_unlock(&p->cache_mu);
	if (r == SESSION_NOT_HERE) {
		o->give_back = 1;
		return;
	}
	pkv_ring_consume(&s->sq);
	o->ops++;
	o->last_ns = pkv_now_ns();
	if (pkv_sigbus_faulted(s->bus_slot)) {
		o->res = -EFAULT;
		o->give_back = 1;
		return;
	}
	/*
	 * Its copy-on-write before any attend of the step: in pieces, in turn
	 * with the slices (run_copy_piece), its ring held meanwhile; the begin
	 * completes after the last one.
	 */
	if (!r && e->opcode == PKV_OP_STEP_BEGIN && s->meta.num_copies) {
		o->copy_on = 1;
		o->copy_next = o->copy_layer = 0;
		o->copy_ud = e->user_data;
		o->copy_p0 = p0;
		o->copy_p1 = p1;
		o->in_batch = 1;
		return;
	}
	post_p(o, e->user_data, r, p0, p1);
}

/* One piece of the copies of o's step begin; the begin completes after the last one. */
static void run_copy_piece(struct pkv_daemon *d, struct job *o)
{
	struct session *s = o->s;
	int r;

	if (!copy_step(d, o, s->meta.copies, s->meta.num_copies, &r))
		return;
	o->copy_on = 0;
	o->in_batch = 0;
	if (r < 0)
		copy_failed(s, r);
	post_p(o, o->copy_ud, 0, o->copy_p0, o->copy_p1);
}

/* Consumes the attend at the head of o's ring (copied in e); 0 with the item, or completed with its error. */
static int take(struct job *o, const struct pkv_sqe *e, struct attend_item *it)
{
	struct session *s = o->s;
	struct sqe_limits lim;
	char why[PKV_ERR_LEN];
	int r;

	pkv_ring_consume(&s->sq);
	o->ops++;
	o->last_ns = pkv_now_ns();
	memset(&lim, 0, sizeof(lim));
	lim.arena_size = s->arena_size;
	lim.geo = &s->pool->geo;
	lim.act_size = pkv_dtype_size(s->pool->act_dtype);
	lim.step_total_q = s->meta.total_q; /* 0 with no step open (step_clear): refused */
	why[0] = 0;
	r = pkv_sqe_check(e, &lim, why, sizeof(why));
	if (r) {
		session_set_err(s, "%s", why);
		post(o, e->user_data, r);
		return r;
	}
	/*
	 * Its copy-on-write failed: the copies' target blocks hold whatever
	 * they held before (maybe another uid's KV), and an attend would read
	 * them. The step's end aborts it.
	 */
	if (s->step_poisoned) {
		session_set_err(s, "copy-on-write failed in the backend; the step's attends fail until it ends");
		post(o, e->user_data, -EIO);
		return -EIO;
	}
	*it = (struct attend_item){
		.s = s, .owner = o, .user_data = e->user_data, .meta = &s->meta,
		.q = s->arena + e->off[0], .k = s->arena + e->off[1],
		.v = s->arena + e->off[2], .o = s->arena + e->off[3],
	};
	return 0;
}

/* Starts a long attend: it runs in slices (run_slice), one between any two batches. */
static void start_big(struct job *o, const struct attend_item *it, uint32_t layer)
{
	uint32_t n = it->meta->num_seqs + 1;

	free(o->big_arrays);
	o->big_arrays = malloc((size_t)n * 3 * sizeof(int32_t));
	if (!o->big_arrays) {
		post(o, it->user_data, -ENOMEM);
		return;
	}
	o->big = *it;
	o->big_row = 0;
	o->big_on = 1;
	/*
	 * big_served_ns stays as the connection's last slice left it: reset,
	 * every new attend of a connection went before one still being sliced,
	 * and a uid's 16-row prefill starved behind its own 15 connections'
	 * one-slice decode attends (their client timed out after 10 s).
	 */
	o->layer = layer;
	o->in_batch = 1;
}

/*
 * Whether merging a step into batch b would pad the merged block table (all
 * sequences x the longest table) past PKV_MAX_STEP_TABLE, or carry more
 * query rows or keys than one step may: each step is held to those alone,
 * and merging must not multiply them (one long sequence beside many short
 * ones from another client; keys past INT32_MAX would wrap the merged
 * cu_seq_lens_k, and the backend check would then fail every member).
 */
static int merge_too_big(const struct job *b, const struct pkv_step_meta *m)
{
	uint64_t seqs = m->num_seqs, maxb = m->max_blocks_per_seq, q = m->total_q;
	uint64_t keys = (uint64_t)m->cu_seq_lens_k[m->num_seqs]; /* a step is open: collect refused any other */

	for (uint32_t i = 0; i < b->n_items; i++) {
		const struct pkv_step_meta *o = b->items[i].meta;

		seqs += o->num_seqs;
		q += o->total_q;
		keys += (uint64_t)o->cu_seq_lens_k[o->num_seqs];
		if (o->max_blocks_per_seq > maxb)
			maxb = o->max_blocks_per_seq;
	}
	return seqs * maxb > PKV_MAX_STEP_TABLE || q > PKV_MAX_STEP_TOKENS || keys > INT32_MAX;
}

/*
 * How long an owned ring may sit idle before it goes back to the loop.
 * While its doorbell is watched the worker sleeps holding it, so keeping
 * it costs nothing and saves the loop's wake-up and hand-off at the next
 * attend: through an open step (a layer's matmuls between attends), and
 * for a grace period after it (sampling, the next step's begin). A ring
 * that stays quiet longer (a client that stopped, or went on to other
 * work) goes back. An unwatched ring keeps the old rule: spin_us.
 */
#define KEEP_STEP_NS 1000000000ull
#define KEEP_GRACE_NS 50000000ull

static uint64_t keep_ns(const struct worker *w, const struct job *o)
{
	uint64_t spin = (uint64_t)w->spin_us * 1000, k;

	if (!o->watched)
		return spin;
	k = o->s->step ? KEEP_STEP_NS : KEEP_GRACE_NS;
	return k > spin ? k : spin;
}

/*
 * Round robin per uid, then per connection within a uid: whether a (of uid
 * ua, last served at ta) takes its turn before b. The next turn is the
 * smallest uid after the last one served, wrapping around, so a uid's many
 * connections get one uid's turn; within a uid, the one served longest ago.
 */
static int turn_before(uid_t last, uid_t ua, uint64_t ta, uid_t ub, uint64_t tb)
{
	int a_after = ua > last, b_after = ub > last;

	if (a_after != b_after)
		return a_after;
	return ua != ub ? ua < ub : ta < tb;
}

/* Busy (in a batch, a slice, its copies), going back, or its step's copies begun on the loop not done. */
static int ring_waits(const struct job *o)
{
	return o->in_batch || o->give_back || o->s->worker_copies;
}

/*
 * The ring a sweep starts at: the first in turn (turn_before) of those with
 * an SQE waiting. Starting at a rotating index gave every connection a turn:
 * a uid with 64 connections' attends queued led 64 batches for each one of
 * another uid's single connection.
 */
static uint32_t sweep_start(const struct worker *w)
{
	const struct job *best = NULL;
	uint32_t at = 0;

	for (uint32_t i = 0; i < w->n_owned; i++) {
		const struct job *o = w->owned[i];

		if (ring_waits(o) || pkv_ring_avail(&o->s->sq) <= 0)
			continue;
		if (!best || turn_before(w->last_lead_uid, o->s->uid, o->led_ns, best->s->uid, best->led_ns)) {
			best = o;
			at = i;
		}
	}
	return at;
}

/*
 * One sweep over the owned rings, starting at the ring whose turn it is
 * (sweep_start; its SQE leads the sweep): takes the
 * head attend of every ring whose head matches the first one's pool and
 * layer (coalescing; only the first with coalescing off), while the batch's
 * estimated time stays within the slice and its padded table within
 * PKV_MAX_STEP_TABLE. An attend longer than a slice by itself starts a
 * sliced run instead. Returns how many SQEs it took.
 */
static int collect(struct pkv_daemon *d, struct job *b)
{
	struct worker *w = &d->worker;
	uint64_t now = pkv_now_ns();
	int n = 0, lead = !b->n_items; /* the first SQE this sweep takes was the turn of its uid */
	/* Whose turn it is matters for a sweep that starts a batch, not one that fills it (gather). */
	uint32_t first = lead ? sweep_start(w) : 0;
	/* Sliced from here (the reason is below, at its use). */
	double big_ns = (pkv_load_relaxed(&d->uids_connected) > 1 ? 0.25 : 1.0) * (double)w->slice_ns;

	for (uint32_t k = 0; k < w->n_owned; k++) {
		struct job *o = w->owned[(first + k) % w->n_owned];
		struct attend_item it;
		struct pkv_sqe e;
		enum head h;
		double est;

		if (ring_waits(o))
			continue;
		/* Its memory faulted (the loop learns why from the handler's slot). */
		if (pkv_sigbus_faulted(o->s->bus_slot)) {
			o->res = -EFAULT;
			o->give_back = 1;
			continue;
		}
		pkv_ring_set_cpu(&o->s->sq, w->cpu1);
		h = head_of(o->s, &e);
		if (h == HEAD_EMPTY) {
			if (now - o->last_ns > keep_ns(w, o))
				o->give_back = 1; /* idle for long: the loop sleeps on its doorbell */
			continue;
		}
		if (h == HEAD_FULL) {
			o->give_back = 1; /* the loop waits for it to reap, as it always did */
			continue;
		}
		if (lead && (h == HEAD_STEP || h == HEAD_ATTEND)) {
			lead = 0;
			w->last_lead_uid = o->s->uid;
			o->led_ns = now;
		}
		if (h == HEAD_STEP) {
			run_step(d, o, &e);
			n++;
			continue;
		}
		if (h != HEAD_ATTEND) {
			o->res = h == HEAD_BAD ? -EPROTO : 0;
			o->give_back = 1;
			continue;
		}
		/*
		 * An attend with no step open: its step arrays are empty (no
		 * cu_seq_lens to size a merge by). take() refuses it at once, before
		 * anything below reads the step.
		 */
		if (!o->s->step) {
			(void)take(o, &e, &it);
			n++;
			continue;
		}
		est = w->slice_ns ? o->s->step_units * rate_ns_per_unit(&o->s->pool->rate) : 0;
		/*
		 * Longer than a slice: run in slices of whole query rows, between
		 * other clients' batches. A decode step too (whole sequences per
		 * slice, a single one as one slice): unsliced, a uid decoding at a
		 * long context from many connections held every other uid's short
		 * attend for a whole attend of its own at every layer (pkv-bench
		 * isolation many_rings); as slices, follow_short serves the short
		 * ones' next layers between them, and they wait about one slice
		 * per step. With another uid connected, from a quarter of a slice:
		 * such attends (~0.45 ms at 8 K context on one host) merged into
		 * batches of a slice, each of another uid's decode layers waited
		 * one (its step 17 ms against 1.2 ms alone, many_rings), where
		 * follow_short between them serves its whole step.
		 */
		if (est > big_ns) {
			if (!take(o, &e, &it))
				start_big(o, &it, e.layer);
			n++;
			continue;
		}
		if (b->n_items && (!w->coalesce || !b->pool->merge_arm || o->s->pool != b->pool || e.layer != b->layer ||
				   (w->slice_ns && b->est_ns + est > (double)w->slice_ns) ||
				   merge_too_big(b, &o->s->meta)))
			continue;
		n++;
		if (take(o, &e, &it))
			continue;
		it.seen_ns = now;
		if (batch_add(w, b, &it)) {
			post(o, it.user_data, -ENOMEM);
			continue;
		}
		if (b->n_items == 1) {
			b->pool = o->s->pool;
			b->layer = e.layer;
			/* Its uid had the turn too (the sweep's first SQE may have gone to a slice). */
			w->last_lead_uid = o->s->uid;
			o->led_ns = now;
		}
		b->est_ns += est;
		o->in_batch = 1;
	}
	return n;
}

/*
 * Clients in lockstep (decode) submit their next layer a few microseconds
 * apart. When the last batch of this pool held more items than this one,
 * wait a little for the others so they share the call, but never longer
 * than the merge saves: the measured fixed cost of the calls the missing
 * items would otherwise make (at most gather_us). The window closes as soon
 * as the batch is as large as the last one. A straggler must run to submit:
 * when no core is idle, the wait yields this one rather than spins.
 */
static void gather(struct pkv_daemon *d, struct job *b)
{
	struct worker *w = &d->worker;
	uint64_t end, win;
	double saves;
	int spin;

	if (!w->coalesce || !b->pool->merge_arm || b->pool->last_batch_items <= b->n_items)
		return;
	saves = (double)(b->pool->last_batch_items - b->n_items) * rate_call_ns(&b->pool->rate);
	win = (uint64_t)w->gather_us * 1000;
	if (saves < (double)win)
		win = (uint64_t)saves;
	spin = pkv_spin_worthwhile();
	end = pkv_now_ns() + win;
	while (b->n_items < b->pool->last_batch_items && pkv_now_ns() < end) {
		absorb(d); /* a ring handed over meanwhile may hold one */
		if (!collect(d, b)) {
			for (int i = 0; i < 16; i++)
				pkv_cpu_relax();
			if (!spin)
				sched_yield();
		}
	}
}

/*
 * Coalescing that pays. Merging lockstep clients saves the fixed cost of
 * calls but puts them in lockstep, which loses the overlap of one client's
 * submit with another's attend: which one wins depends on the client count,
 * the machine and its load. So the worker measures both: it serves the pool
 * in epochs of ARM_EPOCH_NS (short: a lockstep burst may last a fraction
 * of a second), merging or not, keeps the attends per second
 * of each (an average over epochs), runs the better one and tries the other
 * one epoch in ARM_PROBE. A pool starts merging.
 */
#define ARM_EPOCH_NS 5000000ull
#define ARM_PROBE 8

static void arm_account(struct pool *p, uint32_t items, uint64_t now)
{
	double rate;
	int best;

	if (!p->arm_t0) {
		p->arm_t0 = now;
		p->merge_arm = 1;
		return;
	}
	p->arm_items += items;
	if (now - p->arm_t0 < ARM_EPOCH_NS)
		return;
	if (now - p->arm_t0 > 8 * ARM_EPOCH_NS) {
		/* The pool sat idle meanwhile: that says nothing about merging. */
		p->arm_t0 = now;
		p->arm_items = 0;
		return;
	}
	rate = (double)p->arm_items * 1e9 / (double)(now - p->arm_t0);
	p->arm_rate[p->merge_arm] = p->arm_rate[p->merge_arm] > 0 ? 0.5 * p->arm_rate[p->merge_arm] + 0.5 * rate
								   : rate;
	best = p->arm_rate[1] >= p->arm_rate[0] ? 1 : 0;
	if (++p->arm_epochs % ARM_PROBE == 0 || !p->arm_rate[!p->merge_arm])
		p->merge_arm = !best; /* probe the other one (or measure it a first time) */
	else
		p->merge_arm = best;
	p->arm_t0 = now;
	p->arm_items = 0;
}

/*
 * Whether every connected client is one uid's. The spin hints (a client's
 * CPU, its compute_threads) are the client's word: they may decide how the
 * worker serves that uid's clients (SCHED_BATCH, following a sleeper), never
 * how it serves another uid's, who would pay for a false hint with a
 * scheduler slice of waiting at every attend (a client claiming every CPU
 * while its threads spin keeps a SCHED_BATCH worker from running).
 */
static int one_uid(const struct worker *w)
{
	return pkv_load_relaxed(&w->d->uids_connected) <= 1;
}

/*
 * Whether the backend may split this merged batch over its threads whatever
 * the runnable count says: the batch's clients all wait for it, and each
 * claims at least one CPU it does not compute on meanwhile (the one-client
 * case is follow_sleeper's). Those that spin for it count as running, yet
 * yield their core to a thread with work, and the count (sampled once per
 * ms) rarely read a spare core while lockstep clients spun. Only for a
 * batch long enough that a helper's wake-up is small beside half of it
 * (a lone SmolLM2 decode attend split over 2 CPUs lost: docs/performance.md),
 * and only while one uid is connected (its clients' waits decide for nobody
 * else). 8 clients decoding behind a 512-token shared prompt, merging on /
 * off: 1.02-1.06x -> 1.26-1.31x (pkv-bench ipc, the cascade call split).
 */
#define LEND_MIN_NS 50000.0

static int batch_lends(const struct worker *w, const struct job *b)
{
	return b->n_items >= 2 && b->est_ns >= LEND_MIN_NS && !w->follow_cpu1 && one_uid(w);
}

static void run_batch(struct pkv_daemon *d, struct job *b)
{
	struct worker *w = &d->worker;
	uint64_t seqs = 0, t0, ns, end;
	double units = 0;
	int32_t res;
	int lend;

	for (uint32_t i = 0; i < b->n_items; i++)
		units += b->items[i].s->step_units;
	b->pool->last_batch_items = b->n_items;
	w->last_short_ns = pkv_now_ns();
	lend = batch_lends(w, b);
	backend_lock_worker(d);
	if (lend)
		pkv_host_set_cpus_lent(d->host, 1);
	t0 = pkv_now_ns();
	res = run_attend(w, b);
	ns = pkv_now_ns() - t0;
	if (lend)
		pkv_host_set_cpus_lent(d->host, 0);
	rate_measured(&b->pool->rate, units, ns);
	pthread_mutex_unlock(&d->backend_mu);
	w->batches++;
	w->merged_items += b->n_items;
	end = pkv_now_ns();
	/* Straight into the clients' rings: one hand-off each way per attend. */
	for (uint32_t i = 0; i < b->n_items; i++) {
		/* Only now are the step's new slots written in this layer (step_end checks every layer). */
		if (!res)
			pkv_cache_step_layer_done(b->items[i].s->step, b->layer);
		b->items[i].owner->in_batch = 0;
		seqs += b->items[i].meta->num_seqs;
		/* Each its share of the call's time (by work): the client tells hand-off from backend time. */
		post_p(b->items[i].owner, b->items[i].user_data, res,
		       units > 0 ? (uint64_t)((double)ns * b->items[i].s->step_units / units) : ns / b->n_items,
		       end - b->items[i].seen_ns);
	}
	__atomic_fetch_add(&b->pool->attends, b->n_items, __ATOMIC_RELAXED);
	__atomic_fetch_add(&b->pool->batches, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&b->pool->batch_seqs, seqs, __ATOMIC_RELAXED);
	if (w->coalesce)
		arm_account(b->pool, b->n_items, pkv_now_ns());
}

/*
 * A long attend alone on the worker (no short batch for ALONE_NS) runs
 * ALONE_SLICES slices per call: a client that shows up waits that long
 * once, then the slices shrink back.
 */
#define ALONE_NS 50000000ull
#define ALONE_SLICES 8

/* Ends a sliced attend with its result. */
static void end_big(struct job *o, int32_t res)
{
	struct pool *p = o->s->pool;

	o->big_on = 0;
	o->in_batch = 0;
	free(o->big_arrays);
	o->big_arrays = NULL;
	free(o->split_buf);
	o->split_buf = NULL;
	o->split_end = 0;
	/* Every slice wrote its rows' K/V in this layer: the step may now count it (step_end checks). */
	if (!res)
		pkv_cache_step_layer_done(o->s->step, o->layer);
	post_p(o, o->big.user_data, res, o->big_backend_ns, 0);
	o->big_backend_ns = 0;
	__atomic_fetch_add(&p->attends, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&p->batches, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&p->batch_seqs, o->big.meta->num_seqs, __ATOMIC_RELAXED);
}

/* Element i of a row of dtype dt, as f32. */
static float act_get(const void *row, uint32_t dt, size_t i)
{
	if (dt == PKV_DTYPE_BF16)
		return pkv_bf16_to_f32(((const uint16_t *)row)[i]);
	if (dt == PKV_DTYPE_F16)
		return pkv_f16_to_f32(((const uint16_t *)row)[i]);
	return ((const float *)row)[i];
}

static void act_put(void *row, uint32_t dt, size_t i, float v)
{
	if (dt == PKV_DTYPE_BF16)
		((uint16_t *)row)[i] = pkv_f32_to_bf16(v);
	else if (dt == PKV_DTYPE_F16)
		((uint16_t *)row)[i] = pkv_f32_to_f16(v);
	else
		((float *)row)[i] = v;
}

/*
 * Whether o's next row (big_row) alone costs more than budget and is split
 * over keys instead; sets the split up. One query row reads all its keys
 * for every head: a client's geometry and context decide its length (4,096
 * heads x hd 256 over 512 keys took ~30 ms), and everyone else waited for
 * it. In pieces of about a slice of its keys, each a call of its own with
 * the row's log-sum-exp (flash-decoding's split), it takes its turns like
 * any slice. Needs backends that report the log-sum-exp; without, the row
 * runs whole.
 */
static int row_split_start(struct job *o, double budget)
{
	const struct pkv_step_meta *m = o->big.meta;
	struct pool *p = o->s->pool;
	const struct pkv_geometry *g = &p->geo;
	uint32_t r = o->big_row, s, align;
	double width = (double)g->num_heads * g->head_dim, keys;
	int64_t hi, lo;
	size_t H = g->num_heads, hd = g->head_dim;

	for (s = 0; s < m->num_seqs && (uint32_t)m->cu_seq_lens_q[s + 1] <= r; s++)
		;
	if (s >= m->num_seqs || !pkv_dispatch_has_lse(&p->disp))
		return 0;
	/*
	 * A piece may start inside a block (the window then cuts it there, so a
	 * 4,096-token block is not the least a piece reads) where the backends
	 * take a window; else on a block.
	 */
	align = pkv_dispatch_features(&p->disp) & PKV_FEAT_WINDOW ? 1 : g->block_size;
	/* Its keys: [lo, hi], bottom-right causal, then the window. */
	hi = (int64_t)(m->cu_seq_lens_k[s + 1] - m->cu_seq_lens_k[s]) -
	     (m->cu_seq_lens_q[s + 1] - m->cu_seq_lens_q[s]) + (r - (uint32_t)m->cu_seq_lens_q[s]);
	lo = p->window_left >= 0 && hi - p->window_left > 0 ? hi - p->window_left : 0;
	keys = rate_piece_keys(width, budget, align);
	if (hi < lo || (double)(hi - lo + 1) <= keys)
		return 0;
	o->split_buf = malloc(H * (2 * hd + 2) * sizeof(float));
	if (!o->split_buf)
		return 0; /* it runs whole */
	memset(o->split_buf, 0, H * hd * sizeof(float));
	for (size_t h = 0; h < H; h++)
		o->split_buf[H * hd + h] = -INFINITY;
	o->split_align = align;
	o->split_seq = s;
	o->split_lo = (uint32_t)lo;
	o->split_key = (uint32_t)lo / align * align;
	o->split_end = (uint32_t)hi + 1;
	return 1;
}

/* Folds the piece's (lse, O) of every head into the row's running (lse, acc): the log-sum-exp combine. */
static void row_merge(struct job *o, const void *piece_o, uint32_t dt)
{
	const struct pkv_geometry *g = &o->s->pool->geo;
	size_t H = g->num_heads, hd = g->head_dim;
	float *acc = o->split_buf, *run = acc + H * hd, *plse = run + H;

	for (size_t h = 0; h < H; h++) {
		float l = plse[h], L = run[h], wa = 0.0f, wb = 1.0f;

		if (l == -INFINITY)
			continue; /* saw none of these keys (a window's edge) */
		if (L != -INFINITY) {
			float mx = L > l ? L : l, nl = mx + logf(expf(L - mx) + expf(l - mx));

			wa = expf(L - nl);
			wb = expf(l - nl);
			l = nl;
		}
		run[h] = l;
		for (size_t d = 0; d < hd; d++)
			acc[h * hd + d] = wa * acc[h * hd + d] + wb * act_get(piece_o, dt, h * hd + d);
	}
}

/*
 * Runs the next key piece of o's split row, keys [split_key, kb): a
 * one-query sequence over the keys from that piece's first block to kb,
 * those before the piece hidden by the window, writing the row's K/V only
 * in the last piece (the one that reads it). After the last, the merged
 * row goes to the client's O.
 */
static int row_piece(struct job *o, double budget, double *units)
{
	static const int64_t no_slot = -1;
	const struct attend_item *it = &o->big;
	const struct pkv_step_meta *m = it->meta;
	struct pool *p = o->s->pool;
	const struct pkv_geometry *g = &p->geo;
	size_t H = g->num_heads, hd = g->head_dim, act = pkv_dtype_size(p->act_dtype);
	size_t qrow = H * hd * act, kvrow = (size_t)g->num_kv_heads * hd * act;
	/* Sized by the budget of now (alone or not, the pool's latest rate), like every slice. */
	double keys = rate_piece_keys((double)H * hd, budget, o->split_align);
	uint32_t r = o->big_row, bs = g->block_size, ka = o->split_key;
	uint32_t kb = (double)(o->split_end - ka) > keys ? ka + (uint32_t)keys : o->split_end;
	/* The call sees keys from the piece's first block on; the window hides those before the piece (or its window). */
	uint32_t k0 = ka / bs * bs, from = ka > o->split_lo ? ka : o->split_lo;
	int32_t cq[2] = { 0, 1 }, ck[2] = { 0, (int32_t)(kb - k0) }, cs[1] = { (int32_t)(kb - k0 - 1) };
	float *acc = o->split_buf, *plse = acc + H * hd + H;
	void *piece_o = plse + H;
	struct pkv_attn_batch b;
	int32_t res;

	fill_common(&b, p, o->layer);
	b.num_seqs = 1;
	b.total_q = 1;
	b.q = (const uint8_t *)it->q + (size_t)r * qrow;
	b.k_new = (const uint8_t *)it->k + (size_t)r * kvrow;
	b.v_new = (const uint8_t *)it->v + (size_t)r * kvrow;
	b.o = piece_o;
	b.cu_seq_lens_q = cq;
	b.cu_seq_lens_k = ck;
	b.max_length_q = 1;
	b.max_length_k = kb - k0;
	b.block_tables = m->block_tables + (size_t)o->split_seq * m->max_blocks_per_seq + k0 / bs;
	b.max_blocks_per_seq = m->max_blocks_per_seq - k0 / bs;
	b.cache_seqlens = cs;
	b.slot_mapping = kb == o->split_end ? m->slot_mapping + r : &no_slot;
	b.window_left = from > k0 ? (int32_t)(kb - 1 - from) : -1;
	b.softmax_lse = plse;
	*units = (double)(kb - from) * (double)H * hd;
	res = pkv_dispatch_attend(&p->disp, &b);
	if (res < 0)
		return res;
	row_merge(o, piece_o, p->act_dtype);
	__atomic_fetch_add(&p->row_pieces, 1, __ATOMIC_RELAXED);
	o->split_key = kb;
	if (kb < o->split_end)
		return 0;
	for (size_t i = 0; i < H * hd; i++)
		act_put((uint8_t *)it->o + (size_t)r * qrow, p->act_dtype, i, acc[i]);
	free(o->split_buf);
	o->split_buf = NULL;
	o->split_end = 0;
	o->big_row = r + 1;
	return 0;
}

/* Fills b with the whole query rows from big_row on that fit budget (one at least); returns the row after them. */
static uint32_t slice_rows(struct job *o, double budget, struct pkv_attn_batch *b, double *units)
{
	const struct attend_item *it = &o->big;
	const struct pkv_step_meta *m = it->meta;
	struct pool *p = o->s->pool;
	const struct pkv_geometry *g = &p->geo;
	size_t act = pkv_dtype_size(p->act_dtype);
	size_t qrow = (size_t)g->num_heads * g->head_dim * act, kvrow = (size_t)g->num_kv_heads * g->head_dim * act;
	double width = (double)g->num_heads * g->head_dim;
	int32_t *cq = o->big_arrays, *ck = cq + m->num_seqs + 1, *cs = ck + m->num_seqs + 1;
	uint32_t r0 = o->big_row, r1 = r0, n = 0, s, first = 0, mq = 0, mk = 0;

	*units = 0;
	for (s = 0; s < m->num_seqs && (uint32_t)m->cu_seq_lens_q[s + 1] <= r0; s++)
		;
	cq[0] = ck[0] = 0;
	for (; s < m->num_seqs && r1 < m->total_q; s++) {
		uint32_t qa = (uint32_t)m->cu_seq_lens_q[s], qb = (uint32_t)m->cu_seq_lens_q[s + 1];
		uint32_t base = (uint32_t)(m->cu_seq_lens_k[s + 1] - m->cu_seq_lens_k[s]) - (qb - qa);
		uint32_t lo = r1 - qa, hi = lo;

		while (qa + hi < qb) {
			double row = (double)(base + hi + 1) * width;

			if (*units > 0 && *units + row > budget)
				break;
			*units += row;
			hi++;
		}
		if (hi == lo)
			break;
		if (!n)
			first = s;
		cq[n + 1] = cq[n] + (int32_t)(hi - lo);
		ck[n + 1] = ck[n] + (int32_t)(base + hi);
		cs[n] = (int32_t)(base + lo);
		mq = hi - lo > mq ? hi - lo : mq;
		mk = base + hi > mk ? base + hi : mk;
		n++;
		r1 = qa + hi;
		if (qa + hi < qb)
			break; /* the slice is full inside this sequence */
	}
	fill_common(b, p, o->layer);
	b->num_seqs = n;
	b->total_q = r1 - r0;
	b->q = (const uint8_t *)it->q + (size_t)r0 * qrow;
	b->k_new = (const uint8_t *)it->k + (size_t)r0 * kvrow;
	b->v_new = (const uint8_t *)it->v + (size_t)r0 * kvrow;
	b->o = (uint8_t *)it->o + (size_t)r0 * qrow;
	b->cu_seq_lens_q = cq;
	b->cu_seq_lens_k = ck;
	b->max_length_q = mq;
	b->max_length_k = mk;
	b->block_tables = m->block_tables + (size_t)first * m->max_blocks_per_seq;
	b->max_blocks_per_seq = m->max_blocks_per_seq;
	b->cache_seqlens = cs;
	b->slot_mapping = m->slot_mapping + r0;
	return r1;
}

/*
 * Runs the next slice of o's long attend: the query rows from big_row on,
 * as many as fit the slice by the pool's measured rate (one at least), or
 * the next key piece of a row longer than a slice by itself. A slice of
 * rows is a correct varlen batch of its own: a sequence's rows [a, b) are
 * its queries a..b-1 with the keys up to (cached + b) visible and
 * cache_seqlens = cached + a, so bottom-right causal alignment gives each
 * row exactly the keys it has in the whole batch; the slice writes the K/V
 * of its rows before reading them, and the keys of rows before a were
 * written by the earlier slices (they run in order, within one layer).
 */
static void run_slice(struct pkv_daemon *d, struct job *o)
{
	struct worker *w = &d->worker;
	struct pool *p = o->s->pool;
	/* Nobody else ran an attend lately: longer slices, less per-call cost for a lone prefill. */
	double budget = (double)w->slice_ns * (pkv_now_ns() - w->last_short_ns > ALONE_NS ? ALONE_SLICES : 1) /
			rate_ns_per_unit(&p->rate), units;
	struct pkv_attn_batch b;
	uint32_t r1 = 0;
	uint64_t t0;
	int32_t res;
	int split;

	if (pkv_load_relaxed(&o->s->closing)) {
		end_big(o, -ECANCELED);
		return;
	}
	split = o->split_end || row_split_start(o, budget);

	if (!split)
		r1 = slice_rows(o, budget, &b, &units);
	backend_lock_worker(d);
	t0 = pkv_now_ns();
	res = split ? row_piece(o, budget, &units) : pkv_dispatch_attend(&p->disp, &b);
	o->big_served_ns = pkv_now_ns();
	o->big_backend_ns += o->big_served_ns - t0;
	rate_measured(&p->rate, units, o->big_served_ns - t0);
	pthread_mutex_unlock(&d->backend_mu);
	w->slices++;
	w->last_big_uid = o->s->uid;
	if (!split)
		o->big_row = r1;
	if (res < 0 || o->big_row >= o->big.meta->total_q)
		end_big(o, res);
}

/* The sliced attend or piece of copies to run next: round robin per uid, then per connection (turn_before). */
static struct job *pick_big(struct worker *w)
{
	struct job *best = NULL;

	for (uint32_t i = 0; i < w->n_owned; i++) {
		struct job *o = w->owned[i];

		if (!o->big_on && !o->copy_on)
			continue;
		if (!best || turn_before(w->last_big_uid, o->s->uid, o->big_served_ns, best->s->uid, best->big_served_ns))
			best = o;
	}
	for (uint32_t i = 0; i < w->n_copying; i++) {
		struct job *j = w->copying[i];

		if (!best || turn_before(w->last_big_uid, j->s->uid, j->big_served_ns, best->s->uid, best->big_served_ns))
			best = j;
	}
	return best;
}

/*
 * While long attends wait for their next slice: a client whose attend just
 * completed submits its next layer within microseconds, so keep serving the
 * short attends that arrive within the gather window (up to one slice of
 * them) before the next slice. A decode step then waits for one slice in
 * all, not one per layer.
 */
#define FOLLOW_US 250

static void follow_short(struct pkv_daemon *d)
{
	struct worker *w = &d->worker;
	uint64_t start = pkv_now_ns(), window = FOLLOW_US * 1000;

	for (;;) {
		uint64_t end = pkv_now_ns() + window;
		unsigned spins = 0;
		struct job b;

		memset(&b, 0, sizeof(b));
		b.kind = JOB_ATTEND;
		while (!b.n_items && pkv_now_ns() < end) {
			absorb(d);
			if (collect(d, &b))
				continue;
			for (int i = 0; i < 16; i++)
				pkv_cpu_relax();
			/* The client must run to submit: on a busy machine it may be waiting for our CPU. */
			if ((++spins & 7) == 7)
				sched_yield();
		}
		if (!b.n_items)
			return;
		run_batch(d, &b);
		if (pkv_now_ns() - start > w->slice_ns)
			return;
	}
}

/* Hands back the rings marked for the loop. */
static void give_back(struct pkv_daemon *d)
{
	struct worker *w = &d->worker;
	uint32_t k = 0;

	for (uint32_t i = 0; i < w->n_owned; i++) {
		struct job *o = w->owned[i];

		if (o->give_back) {
			release_ring(w, o);
			finish(d, o);
		} else {
			w->owned[k++] = o;
		}
	}
	w->n_owned = k;
}

/* One round over the owned rings; returns how many SQEs it took. */
static int poll_rings(struct pkv_daemon *d)
{
	struct job b;
	int n;

	memset(&b, 0, sizeof(b));
	b.kind = JOB_ATTEND;
	d->worker.cpu1 = (uint32_t)(sched_getcpu() + 1);
	n = collect(d, &b);
	if (b.n_items) {
		gather(d, &b);
		run_batch(d, &b);
	}
	/* One slice of a long attend between any two batches: others wait one slice at most. */
	{
		struct job *o = pick_big(&d->worker);

		if (o) {
			if (b.n_items)
				follow_short(d);
			if (o->kind == JOB_COPY)
				run_copy_job(d, o);
			else if (o->copy_on)
				run_copy_piece(d, o);
			else
				run_slice(d, o);
			n++;
		}
	}
	give_back(d);
	return n;
}


/* Whether a held ring's client says its threads compute on every CPU we may use (then it never spins). */
static int claims_all(const struct worker *w, const struct job *o)
{
	return pkv_ring_peer_threads(&o->s->cq) >= w->ncpu;
}

/*
 * What the worker changed of its own scheduling (HINT_MOVED: its CPU mask;
 * HINT_BATCH: SCHED_BATCH), for worker_uids_shared, which undoes only that
 * (an admin's policy or pin of the whole daemon stays). Release: w->home
 * was set before any bit.
 */
static void publish_hints(struct worker *w)
{
	__atomic_store_n(&w->hints_set, (w->moved ? HINT_MOVED : 0u) | (w->batch_policy > 0 ? HINT_BATCH : 0u),
			 __ATOMIC_RELEASE);
}

/*
 * A client spinning on our CPU costs two context switches per attend (about
 * 6 us against 13 us of attention on 2 vCPUs): when every client we poll
 * says it runs on this CPU and another one is allowed, leave it until we go
 * idle. Only once per hot period, so a scheduler that moves the client after
 * us cannot make us chase it.
 */
static void maybe_move(struct worker *w)
{
	cpu_set_t m;

	if (w->moved || !w->cpu1 || !w->n_owned || !CPU_ISSET(w->cpu1 - 1, &w->home) || !one_uid(w))
		return;
	for (uint32_t i = 0; i < w->n_owned; i++)
		if (pkv_ring_peer_cpu(&w->owned[i]->s->cq) != w->cpu1 || claims_all(w, w->owned[i]))
			return; /* a client on every CPU sleeps while we serve it: see follow_sleeper */
	m = w->home;
	CPU_CLR(w->cpu1 - 1, &m);
	if (!CPU_COUNT(&m))
		return;
	w->moved = 1;
	publish_hints(w);
	if (sched_setaffinity(0, sizeof(m), &m))
		pkv_dbg("worker: cannot leave CPU %u: %s", w->cpu1 - 1, strerror(errno));
}

static void go_home(struct worker *w)
{
	if (w->moved && sched_setaffinity(0, sizeof(w->home), &w->home))
		pkv_dbg("worker: cannot restore its CPU mask: %s", strerror(errno));
	w->moved = 0;
	publish_hints(w);
	w->follow_cpu1 = 0;
	pkv_host_set_cpus_lent(w->d->host, 0);
}

/*
 * A lone client whose compute threads cover every CPU never spins for its
 * attend: it sleeps, on a CPU that stays free while we serve it (its other
 * threads keep theirs). Pinned to that CPU we wake where it went to sleep,
 * it wakes there after us, and its pool threads keep the other CPUs: both
 * hand-offs stay on one CPU. Unpinned, the scheduler often put us beside
 * its yielding pool thread: a 2-thread SmolLM2 client on 2 vCPUs read a
 * median hand-off of 33 us per attend (13-93) against 18 us (10-34) when
 * following it, 24 alternated runs. Its cores are lent to us meanwhile
 * (its pool threads only yield them until our completion), so the backend's
 * calls split over its threads (pkv_host_set_cpus_lent: a decode attend
 * ~100 -> ~70 us). Not for several clients, nor one that spins: anything
 * else and we go back to every CPU and to the runnable-count rule.
 */
static void follow_sleeper(struct worker *w)
{
	uint32_t cpu1 = 0, n = 0;
	cpu_set_t m;

	for (uint32_t i = 0; i < w->n_owned && n < 2; i++)
		if (w->owned[i]->s->step) {
			n++;
			cpu1 = claims_all(w, w->owned[i]) ? pkv_ring_peer_cpu(&w->owned[i]->s->cq) : 0;
		}
	if (n != 1 || !cpu1 || cpu1 > CPU_SETSIZE || !CPU_ISSET(cpu1 - 1, &w->home) || w->ncpu < 2 || !one_uid(w)) {
		if (w->follow_cpu1)
			go_home(w);
		return;
	}
	if (w->follow_cpu1 == cpu1)
		return;
	CPU_ZERO(&m);
	CPU_SET(cpu1 - 1, &m);
	if (sched_setaffinity(0, sizeof(m), &m)) {
		pkv_dbg("worker: cannot follow its client to CPU %u: %s", cpu1 - 1, strerror(errno));
		if (w->follow_cpu1)
			go_home(w); /* not left pinned where the client no longer sleeps, nor lent its cores */
		return;
	}
	w->moved = 1;
	publish_hints(w);
	w->follow_cpu1 = cpu1;
	pkv_host_set_cpus_lent(w->d->host, 1);
}

/* Does a client whose ring we poll share our CPU, or not say where it runs (or are hints not heeded)? */
static int client_here(const struct worker *w)
{
	if (!one_uid(w))
		return 1;
	for (uint32_t i = 0; i < w->n_owned; i++) {
		uint32_t c = pkv_ring_peer_cpu(&w->owned[i]->s->cq);

		if (!c || !w->cpu1 || c == w->cpu1)
			return 1;
	}
	return 0;
}

/* Empties our own eventfd after a wake-up (it is ours alone and non-blocking). */
static void drain_efd(struct worker *w)
{
	uint64_t v;

	if (read(w->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		pkv_err("worker: cannot read its eventfd: %s", strerror(errno));
}

/*
 * A doorbell that wakes us with no SQE behind it, again and again, is rung
 * for nothing: each write would cost us a wake-up and a sweep, more than it
 * costs the client. Past the loop's allowance (EMPTY_BELLS_PER_TICK a
 * second) the ring goes back to the loop, which reads that doorbell at most
 * so often.
 */
static void count_empty_bell(struct job *o, uint64_t now)
{
	if (now - o->bells_from_ns > 1000000000ull) {
		o->bells_from_ns = now;
		o->empty_bells = 0;
	}
	if (pkv_ring_avail(&o->s->sq) == 0 && ++o->empty_bells >= EMPTY_BELLS_PER_TICK)
		o->give_back = 1;
}

/*
 * Sleeps until a job, a hang-up or a doorbell of an owned ring, or until the
 * first owned ring's keep time runs out (the next poll hands it back). The
 * flags announce the sleep to the clients, which then ring; the re-check of
 * each ring after its flag, and of the queue after `sleeping`, closes the
 * race with a submit or a push in between (full fences both sides).
 */
static void sleep_on_rings(struct pkv_daemon *d)
{
	struct worker *w = &d->worker;
	struct epoll_event ev[8];
	uint64_t now = pkv_now_ns(), until = UINT64_MAX;
	int work = 0, timeout = -1, n;

	for (uint32_t i = 0; i < w->n_owned; i++) {
		struct job *o = w->owned[i];
		uint64_t t;

		/* A ring that cannot wake us (or is being sliced, or broken) is polled, not slept on. */
		if (!o->watched || o->big_on || o->copy_on || o->give_back) {
			work = 1;
			break;
		}
		t = o->last_ns + keep_ns(w, o);
		until = t < until ? t : until;
		if (pkv_ring_prepare_sleep(&o->s->sq) != 0)
			work = 1;
	}
	pkv_store_relaxed(&w->sleeping, 1);
	/* Pairs with the fence in worker_push/worker_kick: we see their job or they see the flag. */
	pkv_smp_mb();
	if (pkv_load_acquire(&w->head) || pkv_load_relaxed(&w->stop) || w->n_copying)
		work = 1;
	if (!work && w->n_owned) {
		if (until <= now)
			work = 1;
		else if (until != UINT64_MAX)
			timeout = (int)((until - now + 999999) / 1000000);
	}
	if (!work) {
		n = epoll_wait(w->epfd, ev, 8, timeout);
		for (int i = 0; i < n; i++) {
			if (ev[i].data.u64 == 0)
				drain_efd(w);
			else
				count_empty_bell(ev[i].data.ptr, now);
		}
	}
	pkv_store_relaxed(&w->sleeping, 0);
	for (uint32_t i = 0; i < w->n_owned; i++)
		pkv_ring_clear_wakeup(&w->owned[i]->s->sq);
}

/*
 * How long to spin for the next SQE before sleeping. spin_us, or while a
 * held ring has a step open, about the gap its client has been leaving
 * between attends (a layer's matmuls, learned in w->gap_ns), at most
 * HOLD_SPIN_MAX_NS: when a core would otherwise idle, spinning through the
 * gap saves the wake-up of a sleeping vCPU at every attend, which on a VM
 * costs more than the wake-up itself.
 */
#define HOLD_SPIN_MAX_NS 2000000ull

static uint64_t idle_spin_ns(const struct worker *w, uint64_t spin_ns, int stepping)
{
	uint64_t want = w->gap_ns + w->gap_ns / 4 + 20000;

	if (!w->gap_ns || want <= spin_ns || !stepping)
		return spin_ns;
	return want < HOLD_SPIN_MAX_NS ? want : HOLD_SPIN_MAX_NS;
}

/*
 * The CPUs the clients of the held rings with a step open compute on
 * between their attends: each one's hint (pkv_connect_opts.compute_threads),
 * 1 when it gave none. When they cover every CPU we may run on, a spin of
 * ours takes a core from a client thread that wakes as soon as its attend
 * completes (a multi-threaded client's pool starts the next matmul at once):
 * on 2 CPUs, a 2-thread client's second thread waited ~0.1 ms per layer for
 * the worker's spin to end. 0: no held ring has a step open.
 */
static uint32_t clients_threads(const struct worker *w)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < w->n_owned && n < w->ncpu; i++)
		if (w->owned[i]->s->step) {
			uint32_t t = pkv_ring_peer_threads(&w->owned[i]->s->cq);

			n += !t ? 1 : t < w->ncpu ? t : w->ncpu;
		}
	return n;
}

/*
 * While the clients claim every CPU: no spin, unless their SQEs have been
 * coming back within about what our own sleep and wake-up cost (lockstep
 * clients with little to compute between attends): a spin that short takes
 * less from them than the sleep would.
 */
#define CLAIMED_SPIN_NS 20000ull

static uint64_t claimed_spin_ns(const struct worker *w, uint64_t spin_ns)
{
	uint64_t cap = spin_ns < CLAIMED_SPIN_NS ? spin_ns : CLAIMED_SPIN_NS;

	return w->gap_ns && w->gap_ns < cap ? cap : 0;
}

/*
 * While the clients claim every CPU the worker runs as SCHED_BATCH: woken by
 * a doorbell it then waits for a core to come free (a client blocking on its
 * own attend, a yielding pool thread, the tick) instead of preempting a
 * client in the middle of a matmul (perf: reschedule IPIs landing in the 8
 * one-thread clients' matmul kernels, 2 % of all CPU time with the switches
 * they forced). While a core idles it is SCHED_OTHER again: it lands on the
 * free core anyway, and a client sharing the machine with other programs
 * keeps its attends' latency. A daemon started under any other policy
 * (chrt, a unit's CPUSchedulingPolicy) is left as it is.
 */
static void worker_policy(struct worker *w, int claimed)
{
	struct sched_param sp = { 0 };

	if (w->batch_policy < 0 || w->batch_policy == claimed)
		return;
	if (pthread_setschedparam(pthread_self(), claimed ? SCHED_BATCH : SCHED_OTHER, &sp))
		w->batch_policy = -1; /* not allowed here (a seccomp filter): keep what we have */
	else
		w->batch_policy = claimed;
	publish_hints(w);
}

/*
 * Another uid connected: what the first one's hints set (a move, following,
 * lent cores, SCHED_BATCH, claimed CPUs) is undone before that uid's work
 * runs. At the top of every turn, and before every backend call, since a
 * ring handed over mid-turn (gather, follow_short) brings its attends in
 * before the next turn.
 */
static void drop_hints_if_shared(struct worker *w)
{
	/* The loop undid them on our thread (worker_uids_shared): our record follows, even if that uid left since. */
	uint32_t undone = __atomic_exchange_n(&w->hints_undone, 0, __ATOMIC_ACQ_REL);

	if (!(w->moved || w->batch_policy > 0 || w->claimed) || (one_uid(w) && !undone))
		return;
	go_home(w);
	worker_policy(w, 0);
	pkv_host_set_cpus_claimed(w->d->host, 0);
	w->claimed = 0;
	w->idle_from_ns = 0; /* the spin chosen for this quiet spell counted the hints */
}

/*
 * The loop, when a second uid connects: undoes at once on the worker thread
 * what the lone uid's hints set there (a pin to one CPU, SCHED_BATCH) and
 * in the backend (lent, claimed CPUs). The worker undoes its own state at
 * its next turn (drop_hints_if_shared), but while it sleeps pinned and
 * SCHED_BATCH on the CPU where the first uid's client runs, the new uid's
 * first attend would wait for that CPU, up to a scheduler slice, before
 * that turn came. Only what the worker set itself (publish_hints).
 */
void worker_uids_shared(struct pkv_daemon *d)
{
	struct worker *w = &d->worker;
	struct sched_param sp = { 0 };
	uint32_t set;

	if (w->efd < 0)
		return; /* not started */
	set = __atomic_load_n(&w->hints_set, __ATOMIC_ACQUIRE);
	if ((set & HINT_MOVED) && CPU_COUNT(&w->home) && pthread_setaffinity_np(w->thread, sizeof(w->home), &w->home))
		pkv_dbg("worker: cannot give it its CPU mask back");
	if ((set & HINT_BATCH) && pthread_setschedparam(w->thread, SCHED_OTHER, &sp))
		pkv_dbg("worker: cannot give it SCHED_OTHER back");
	pkv_host_set_cpus_lent(d->host, 0);
	pkv_host_set_cpus_claimed(d->host, 0);
	__atomic_store_n(&w->hints_undone, 1, __ATOMIC_RELEASE);
}

/*
 * Learns the gap between an idle start and the next SQE (exponential
 * average; long gaps are pauses), only over gaps inside a step, the only
 * ones idle_spin_ns spins through: a layer's matmuls, or a client attending
 * itself between its begin and end. The short gaps between one step's end
 * and the next begin, averaged in, made the spin end before each end came.
 */
static void learn_gap(struct worker *w, uint64_t now)
{
	uint64_t g = now - w->idle_from_ns;

	if (w->idle_from_ns && w->idle_stepping && g < 2 * HOLD_SPIN_MAX_NS)
		w->gap_ns = w->gap_ns ? (7 * w->gap_ns + g) / 8 : g;
	w->idle_from_ns = 0;
}

static void *worker_main(void *arg)
{
	struct pkv_daemon *d = arg;
	struct worker *w = &d->worker;
	uint64_t spin_ns = (uint64_t)w->spin_us * 1000;
	unsigned quiet = 0;

	pthread_setname_np(pthread_self(), "pkv-worker");
	if (sched_getaffinity(0, sizeof(w->home), &w->home))
		CPU_ZERO(&w->home); /* never move then */
	w->ncpu = CPU_COUNT(&w->home) ? (uint32_t)CPU_COUNT(&w->home) : 1;
	{
		int policy;
		struct sched_param sp;

		w->batch_policy = !pthread_getschedparam(pthread_self(), &policy, &sp) && policy == SCHED_OTHER ? 0 : -1;
	}

	while (!pkv_load_relaxed(&w->stop)) {
		absorb(d);
		drop_hints_if_shared(w);
		if (w->n_owned || w->n_copying) {
			/* Hot: poll the rings ourselves (and run queued copies); the loop may sleep meanwhile. */
			if (poll_rings(d)) {
				quiet = 0;
				w->last_take_ns = pkv_now_ns();
				learn_gap(w, w->last_take_ns);
				/* Following a client: re-checked while hot too, so a second client stepping frees us at once. */
				if (w->follow_cpu1)
					follow_sleeper(w);
				else
					maybe_move(w);
				continue;
			}
			if (!w->n_owned)
				continue;
			/* Gone quiet: how long to spin is decided once, not per turn of the spin. */
			if (!w->idle_from_ns) {
				uint32_t busy = clients_threads(w);
				int claimed = busy >= w->ncpu && one_uid(w);

				w->idle_from_ns = pkv_now_ns();
				w->idle_stepping = busy > 0;
				w->idle_spin_ns = claimed ? claimed_spin_ns(w, spin_ns) : idle_spin_ns(w, spin_ns, busy > 0);
				pkv_host_set_cpus_claimed(d->host, claimed);
				w->claimed = claimed;
				worker_policy(w, claimed);
				follow_sleeper(w);
			}
			/*
			 * Spin spin_us after the last SQE while a core idles: a
			 * lockstep client's next attend often comes within it. Then
			 * (at once on a busy machine) sleep holding the rings: the
			 * next attend costs one wake-up, client to worker, and the
			 * loop stays out of it.
			 */
			if (pkv_now_ns() - w->last_take_ns < w->idle_spin_ns && pkv_spin_worthwhile()) {
				pkv_cpu_relax();
				/*
				 * Give the core away often when a client we poll for runs on
				 * this CPU (or says nothing): it must run to submit its next
				 * attend. Otherwise only now and then (a backend thread, the
				 * loop), since a yield may hand the core to another process.
				 */
				++quiet;
				if ((quiet & 15) == 15 && (client_here(w) || (!w->moved && (quiet & 255) == 255)))
					sched_yield();
				continue;
			}
			sleep_on_rings(d);
			continue;
		}
		go_home(w);
		{
			uint64_t end = pkv_now_ns() + spin_ns;

			/* Spin briefly (while a core idles): the next ring or copy usually arrives within microseconds. */
			if (!pkv_spin_worthwhile())
				end = 0;
			for (unsigned it = 0; !pkv_load_acquire(&w->head) && !pkv_load_relaxed(&w->stop) &&
					      pkv_now_ns() < end; it++) {
				pkv_cpu_relax();
				if ((it & 255) == 255)
					sched_yield();
			}
		}
		sleep_on_rings(d);
	}
	go_home(w); /* a stopped worker follows no one and lends the backend nothing */
	/* Stopping: the loop has released every session; hand back whatever is left. */
	for (uint32_t i = 0; i < w->n_owned; i++) {
		release_ring(w, w->owned[i]);
		finish(d, w->owned[i]);
	}
	w->n_owned = 0;
	while (w->n_copying) {
		struct job *j = w->copying[--w->n_copying];

		j->res = -ECANCELED;
		j->s->worker_copies--;
		finish(d, j);
	}
	return NULL;
}

int worker_start(struct pkv_daemon *d)
{
	struct worker *w = &d->worker;
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 0 };
	int r;

	w->d = d;
	w->spin_us = d->cfg.spin_us;
	w->coalesce = d->cfg.coalesce;
	w->gather_us = d->cfg.gather_us;
	w->slice_ns = (uint64_t)d->cfg.attend_slice_us * 1000;
	/* The backend's threads serve every client's attends: they must not spin or fan out on a busy machine. */
	pkv_host_set_shared_cpus(d->host, 1);
	/* The gate opens /proc/loadavg on first use: do it now, not in the middle of serving (nor when fds run short). */
	(void)pkv_spin_worthwhile();
	w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	w->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (w->efd < 0 || w->epfd < 0 || epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->efd, &ev)) {
		r = -errno;
		goto err_fds;
	}
	pthread_mutex_init(&w->mu, NULL);
	r = -pthread_create(&w->thread, NULL, worker_main, d);
	if (r) {
		pthread_mutex_destroy(&w->mu);
		goto err_fds;
	}
	return 0;
err_fds:
	if (w->efd >= 0)
		close(w->efd);
	if (w->epfd >= 0)
		close(w->epfd);
	w->efd = w->epfd = -1;
	return r;
}

/*
 * Unconditional: what the kick is for (a hang-up, a doorbell count the
 * loop's read took before the worker's epoll saw it) is not re-checked by
 * the worker after it announces its sleep, so the eventfd must stay
 * readable until the worker drains it.
 */
void worker_kick(struct pkv_daemon *d)
{
	uint64_t one = 1;

	if (write(d->worker.efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		pkv_err("worker: cannot be woken: %s", strerror(errno));
}

void worker_stop(struct pkv_daemon *d)
{
	struct worker *w = &d->worker;

	pkv_store_relaxed(&w->stop, 1);
	worker_kick(d);
	pthread_join(w->thread, NULL);
	while (w->head) {
		struct job *j = w->head;

		w->head = j->next;
		job_free(j);
	}
	while (w->done) {
		struct job *j = w->done;

		w->done = j->next;
		job_free(j);
	}
	free(w->owned);
	free(w->copying);
	free(w->batch);
	free(w->scratch);
	pthread_mutex_destroy(&w->mu);
	close(w->efd);
	close(w->epfd);
	w->efd = w->epfd = -1;
}

void worker_push(struct pkv_daemon *d, struct job *j)
{
	struct worker *w = &d->worker;

	j->next = NULL;
	pthread_mutex_lock(&w->mu);
	if (w->tail)
		w->tail->next = j;
	else
		pkv_store_release(&w->head, j);
	w->tail = j;
	pthread_mutex_unlock(&w->mu);
	/* Pairs with the fence in sleep_on_rings: it sees our job on its re-check, or we see it sleep. */
	pkv_smp_mb();
	if (pkv_load_relaxed(&w->sleeping))
		worker_kick(d);
}

struct job *worker_take_done(struct pkv_daemon *d)
{
	struct worker *w = &d->worker;
	struct job *j, *rev = NULL;

	if (!pkv_load_acquire(&w->done))
		return NULL;
	pthread_mutex_lock(&w->mu);
	j = w->done;
	w->done = NULL;
	pthread_mutex_unlock(&w->mu);
	/* Oldest first. */
	while (j) {
		struct job *n = j->next;

		j->next = rev;
		rev = j;
		j = n;
	}
	return rev;
}
