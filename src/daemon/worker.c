/* SPDX-License-Identifier: MIT */
/* The worker: runs backend calls off the event loop, merging attends of one pool and layer into one batch. */
#include "config.h"
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/barrier.h"
#include "common/log.h"
#include "daemon/daemon.h"

void job_free(struct job *j)
{
	if (j) {
		free(j->items);
		free(j);
	}
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

/*
 * Takes the head job; with coalescing on, also takes every attend job queued
 * right behind it for the same pool and layer (never jumping a copy job,
 * which must run before the attends queued after it).
 */
static struct job *pop_merged(struct worker *w)
{
	struct job *j = w->head, *n;

	w->head = j->next;
	j->next = NULL;
	while (w->coalesce && j->kind == JOB_ATTEND && (n = w->head) && n->kind == JOB_ATTEND &&
	       n->pool == j->pool && n->layer == j->layer) {
		if (j->n_items + n->n_items > j->cap_items) {
			uint32_t c = j->n_items + n->n_items;
			struct attend_item *it = realloc(j->items, c * sizeof(*it));

			if (!it)
				break;
			j->items = it;
			j->cap_items = c;
		}
		memcpy(j->items + j->n_items, n->items, n->n_items * sizeof(*n->items));
		j->n_items += n->n_items;
		w->head = n->next;
		job_free(n);
	}
	if (!w->head)
		w->tail = NULL;
	return j;
}

/*
 * Clients in lockstep (decode) submit their next layer a few microseconds
 * apart. When the last batch of this pool held more items than the one just
 * taken, wait a little for the others so they share the call; the window
 * closes as soon as the batch is as large as the last one. A client that
 * leaves costs one window, after which the expected size follows.
 */
static void gather(struct worker *w, struct job *j)
{
	uint64_t end;

	if (!w->coalesce || j->kind != JOB_ATTEND || j->pool->last_batch_items <= j->n_items)
		return;
	end = pkv_now_ns() + (uint64_t)w->gather_us * 1000;
	while (j->n_items < j->pool->last_batch_items && pkv_now_ns() < end) {
		struct job *n;

		pthread_mutex_lock(&w->mu);
		n = w->head;
		if (n && n->kind == JOB_ATTEND && n->pool == j->pool && n->layer == j->layer) {
			struct attend_item *it = realloc(j->items, (j->n_items + n->n_items) * sizeof(*it));

			if (it) {
				j->items = it;
				j->cap_items = j->n_items + n->n_items;
				memcpy(j->items + j->n_items, n->items, n->n_items * sizeof(*n->items));
				j->n_items += n->n_items;
				w->head = n->next;
				if (!w->head)
					w->tail = NULL;
				job_free(n);
			}
			pthread_mutex_unlock(&w->mu);
			continue;
		}
		pthread_mutex_unlock(&w->mu);
		/* Anything else at the head (another layer, a copy) ends the wait. */
		if (n)
			break;
		for (int i = 0; i < 16; i++)
			pkv_cpu_relax();
	}
}

static void *worker_main(void *arg)
{
	struct pkv_daemon *d = arg;
	struct worker *w = &d->worker;

	pthread_mutex_lock(&w->mu);
	while (!w->stop) {
		struct job *j;
		uint64_t one = 1;

		if (!w->head) {
			uint64_t end = pkv_now_ns() + (uint64_t)w->spin_us * 1000;

			/* Spin briefly: the next layer's attends usually arrive within microseconds. */
			pthread_mutex_unlock(&w->mu);
			for (unsigned it = 0; !pkv_load_acquire(&w->head) && !pkv_load_relaxed(&w->stop) &&
					      pkv_now_ns() < end; it++) {
				pkv_cpu_relax();
				/* Give the core away now and then, not at every check. */
				if ((it & 255) == 255)
					sched_yield();
			}
			pthread_mutex_lock(&w->mu);
			if (!w->head && !w->stop) {
				w->sleeping = 1;
				pthread_cond_wait(&w->cv, &w->mu);
				w->sleeping = 0;
			}
			continue;
		}
		j = pop_merged(w);
		pthread_mutex_unlock(&w->mu);
		gather(w, j);
		if (j->kind == JOB_ATTEND)
			j->pool->last_batch_items = j->n_items;
		pthread_mutex_lock(&d->backend_mu);
		if (j->kind == JOB_ATTEND)
			j->res = run_attend(w, j);
		else
			j->res = pkv_dispatch_copy_blocks(&j->pool->disp, j->copies, j->n_copies);
		pthread_mutex_unlock(&d->backend_mu);
		if (j->kind == JOB_ATTEND) {
			w->batches++;
			w->merged_items += j->n_items;
			/* Straight to the clients; the loop only does the bookkeeping. */
			for (uint32_t i = 0; i < j->n_items; i++)
				j->items[i].posted = !session_post(j->items[i].s, j->items[i].user_data, j->res, 0, 0);
		}
		pthread_mutex_lock(&w->mu);
		j->next = w->done;
		pkv_store_release(&w->done, j);
		/* Full fence pairs with the loop's between setting loop_sleeping and
		 * re-checking done: either it sees our job or we see its flag. */
		pkv_smp_mb();
		if (pkv_load_relaxed(&d->loop_sleeping))
			if (write(d->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
				pkv_err("worker: cannot wake the loop: %s", strerror(errno));
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

int worker_start(struct pkv_daemon *d)
{
	struct worker *w = &d->worker;
	int r;

	w->d = d;
	w->spin_us = d->cfg.spin_us;
	w->coalesce = d->cfg.coalesce;
	w->gather_us = d->cfg.gather_us;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	r = pthread_create(&w->thread, NULL, worker_main, d);
	return -r;
}

void worker_stop(struct pkv_daemon *d)
{
	struct worker *w = &d->worker;

	pthread_mutex_lock(&w->mu);
	w->stop = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
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
	free(w->scratch);
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->cv);
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
	if (w->sleeping)
		pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
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
	/* Oldest first, so completions reach a client in submission order. */
	while (j) {
		struct job *n = j->next;

		j->next = rev;
		rev = j;
		j = n;
	}
	return rev;
}
