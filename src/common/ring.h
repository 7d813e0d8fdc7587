/* SPDX-License-Identifier: MIT */
/* Single-producer single-consumer rings in the shared region, and their sleep/wake handshake. */
#ifndef PKV_RING_H
#define PKV_RING_H

/*
 * A ring is a control block (head, tail, flags, each on its own cache line)
 * and a power-of-two array of fixed-size entries. head and tail run freely
 * and are masked on use. Each side keeps its own index in private memory
 * and only ever *reads* the other side's index from shared memory, so a
 * peer scribbling over the control block can make us see garbage counts
 * (checked: more than `entries` in flight is a protocol violation) but can
 * never make us index outside the entry array.
 */

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include "common/barrier.h"
#include "common/proto.h"

struct pkv_ring {
	uint32_t *sh_head;  /* shared: consumer's index */
	uint32_t *sh_tail;  /* shared: producer's index */
	uint32_t *sh_flags; /* shared: consumer's PKV_RING_NEED_WAKEUP */
	uint32_t *sh_cpu;   /* shared: consumer's CPU hint (CPU + 1, 0 unknown); NULL when it has no room */
	uint32_t *sh_wake;  /* shared: producer's wake word (futex), flags + 8 (checked by pkv_region_check) */
	uint32_t *sh_threads; /* shared: consumer's compute-threads hint, flags + 12; NULL when it has no room */
	uint8_t *sh_entries;
	uint32_t entries, mask, esize;
	uint32_t local;     /* our own index: tail when producing, head when consuming */
};

/* Binds a ring view onto a mapped control block and entry array. */
static inline void pkv_ring_bind(struct pkv_ring *r, void *ctl, void *entries, uint32_t n,
				 uint32_t esize, const struct pkv_shm_hdr *h)
{
	r->sh_head = (uint32_t *)((uint8_t *)ctl + h->ring_head_off);
	r->sh_tail = (uint32_t *)((uint8_t *)ctl + h->ring_tail_off);
	r->sh_flags = (uint32_t *)((uint8_t *)ctl + h->ring_flags_off);
	/* The word after flags, in the consumer's cache line, when the layout leaves it free. */
	r->sh_cpu = NULL;
	if (h->ring_flags_off + 8 <= PKV_RING_CTL_SIZE && h->ring_flags_off + 4 != h->ring_head_off &&
	    h->ring_flags_off + 4 != h->ring_tail_off)
		r->sh_cpu = (uint32_t *)((uint8_t *)ctl + h->ring_flags_off + 4);
	r->sh_wake = (uint32_t *)((uint8_t *)ctl + h->ring_flags_off + 8);
	r->sh_threads = NULL;
	if (h->ring_flags_off + 16 <= PKV_RING_CTL_SIZE && h->ring_flags_off + 12 != h->ring_head_off &&
	    h->ring_flags_off + 12 != h->ring_tail_off)
		r->sh_threads = (uint32_t *)((uint8_t *)ctl + h->ring_flags_off + 12);
	r->sh_entries = entries;
	r->entries = n;
	r->mask = n - 1;
	r->esize = esize;
	r->local = 0;
}

/* ---- producer side */

/* Free entries, or -1 when the consumer's head is impossible (corrupted ring). */
static inline int64_t pkv_ring_space(const struct pkv_ring *r)
{
	/* Acquire pairs with the consumer's release store of head in
	 * pkv_ring_consume(): the entries it freed are no longer being read. */
	uint32_t head = pkv_load_acquire(r->sh_head);
	uint32_t used = r->local - head;

	if (used > r->entries)
		return -1;
	return r->entries - used;
}

static inline void *pkv_ring_prod_slot(struct pkv_ring *r)
{
	return r->sh_entries + (size_t)(r->local & r->mask) * r->esize;
}

static inline void pkv_ring_publish(struct pkv_ring *r)
{
	r->local++;
	/* Release pairs with the consumer's acquire load of tail in
	 * pkv_ring_avail(): the entry written above is visible before the index. */
	pkv_store_release(r->sh_tail, r->local);
}

/* After publishing: does the consumer sleep, so that we must wake it? */
static inline int pkv_ring_needs_wakeup(const struct pkv_ring *r)
{
	/* Full fence pairs with the one in pkv_ring_prepare_sleep(): either the
	 * consumer sees our new tail on its re-check, or we see its flag. */
	pkv_smp_mb();
	return pkv_load_relaxed(r->sh_flags) & PKV_RING_NEED_WAKEUP;
}

/* ---- consumer side */

/* Entries ready, or -1 when the producer's tail is impossible (corrupted ring). */
static inline int64_t pkv_ring_avail(const struct pkv_ring *r)
{
	/* Acquire pairs with the producer's release store in pkv_ring_publish(). */
	uint32_t n = pkv_load_acquire(r->sh_tail) - r->local;

	if (n > r->entries)
		return -1;
	return n;
}

/* Copies the next entry out of shared memory (never read it in place: the peer may rewrite it). */
static inline void pkv_ring_peek_copy(const struct pkv_ring *r, void *dst)
{
	memcpy(dst, r->sh_entries + (size_t)(r->local & r->mask) * r->esize, r->esize);
}

static inline void pkv_ring_consume(struct pkv_ring *r)
{
	r->local++;
	/* Release pairs with the producer's acquire load of head in pkv_ring_space():
	 * our copy of the entry is complete before the slot is handed back. */
	pkv_store_release(r->sh_head, r->local);
}

/*
 * Announces that we are about to sleep and re-checks the ring. Returns the
 * entries that arrived meanwhile (then do not sleep: call
 * pkv_ring_clear_wakeup), 0 when it is safe to sleep, -1 on corruption.
 */
static inline int64_t pkv_ring_prepare_sleep(struct pkv_ring *r)
{
	pkv_store_relaxed(r->sh_flags, PKV_RING_NEED_WAKEUP);
	/* Full fence pairs with the producer's in pkv_ring_needs_wakeup(). */
	pkv_smp_mb();
	return pkv_ring_avail(r);
}

static inline void pkv_ring_clear_wakeup(struct pkv_ring *r)
{
	pkv_store_relaxed(r->sh_flags, 0);
}

/*
 * ---- futex wake-ups (the CQ: daemon produces, client sleeps)
 *
 * Non-private futexes: the word lives in a MAP_SHARED memfd mapped by two
 * processes. FUTEX_WAKE never sleeps, so a client cannot stall the daemon
 * through its wake-up, unlike a write(2) to an eventfd whose (shared) file
 * description the client may make blocking and fill.
 */

/* Consumer: pkv_ring_prepare_sleep(), and *seq is the wake word to pass to pkv_ring_wait(). */
static inline int64_t pkv_ring_prepare_wait(struct pkv_ring *r, uint32_t *seq)
{
	pkv_store_relaxed(r->sh_flags, PKV_RING_NEED_WAKEUP);
	/* Full fence pairs with the producer's in pkv_ring_needs_wakeup(). The
	 * wake word is read after it: a bump we miss here comes after the flag
	 * was seen, so FUTEX_WAIT finds the word changed or gets the wake. */
	pkv_smp_mb();
	*seq = pkv_load_acquire(r->sh_wake);
	return pkv_ring_avail(r);
}

/* Consumer: sleeps while the wake word is still seq, at most ts; 0, or -errno (-EAGAIN: it changed). */
static inline int pkv_ring_wait(struct pkv_ring *r, uint32_t seq, const struct timespec *ts)
{
	if (syscall(SYS_futex, r->sh_wake, FUTEX_WAIT, seq, ts, NULL, 0) < 0)
		return -errno;
	return 0;
}

/* Producer, after pkv_ring_needs_wakeup() said so: bumps the wake word and wakes the sleeper. Never blocks. */
static inline void pkv_ring_wake(struct pkv_ring *r)
{
	/* Seq-cst RMW: ordered after the tail published before it. */
	__atomic_fetch_add(r->sh_wake, 1, __ATOMIC_SEQ_CST);
	syscall(SYS_futex, r->sh_wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/*
 * ---- CPU hints, for spinning on 2 vCPUs
 *
 * A waiting side must give its core away (sched_yield) when the thread it
 * waits for runs on the same CPU, and should not when it runs elsewhere: a
 * yield can hand the core to an unrelated process for a whole time slice.
 * The consumer of a ring says where it polls from; the producer reads it.
 * Only a hint: a wrong value costs the waiter some latency, nothing else.
 */

/* Consumer: records the CPU it polls from (cpu1 = CPU + 1), writing only on change. */
static inline void pkv_ring_set_cpu(struct pkv_ring *r, uint32_t cpu1)
{
	if (r->sh_cpu && pkv_load_relaxed(r->sh_cpu) != cpu1)
		pkv_store_relaxed(r->sh_cpu, cpu1);
}

/* Producer: the consumer's CPU + 1, or 0 when unknown. */
static inline uint32_t pkv_ring_peer_cpu(const struct pkv_ring *r)
{
	return r->sh_cpu ? pkv_load_relaxed(r->sh_cpu) : 0;
}

/*
 * The consumer's compute threads: how many CPUs it keeps busy between its
 * polls. A producer that would spin for the consumer's next request leaves
 * those CPUs to it. Only a hint, as the CPU above.
 */
static inline void pkv_ring_set_threads(struct pkv_ring *r, uint32_t n)
{
	if (r->sh_threads)
		pkv_store_relaxed(r->sh_threads, n);
}

/* Producer: the consumer's compute threads, 0 when unknown (any value: the peer writes it). */
static inline uint32_t pkv_ring_peer_threads(const struct pkv_ring *r)
{
	return r->sh_threads ? pkv_load_relaxed(r->sh_threads) : 0;
}

#endif
