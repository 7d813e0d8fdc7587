/* SPDX-License-Identifier: MIT */
/* The only memory-ordering primitives the rings use: acquire loads, release stores and a full fence. */
#ifndef PKV_BARRIER_H
#define PKV_BARRIER_H

#include <stdint.h>

/*
 * Every shared ring index is written by exactly one side. The producer fills
 * an entry, then publishes it with a release store of tail; the consumer
 * reads tail with an acquire load before reading the entry, and frees the
 * entry with a release store of head that the producer reads with acquire.
 * Call sites name the store or load they pair with.
 *
 * The sleep/wake handshake (need_wakeup) is a store-then-load pattern on two
 * different words on each side (Dekker), which acquire/release does not
 * order: both sides put pkv_smp_mb() between their store and their load.
 */
#define pkv_load_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define pkv_store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define pkv_load_relaxed(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define pkv_store_relaxed(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define pkv_smp_mb() __atomic_thread_fence(__ATOMIC_SEQ_CST)

static inline void pkv_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

#endif
