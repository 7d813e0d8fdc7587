/* SPDX-License-Identifier: MIT */
/* A SIGBUS handler that turns a fault in a client's shared mapping into zero pages and a flag. */
#include "config.h"
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "daemon/sigbus.h"

/*
 * Why a handler at all: the daemon refuses memory it cannot read safely
 * (hugetlbfs, unsealed files), but a shmem page can still fail to come in
 * (a memory cgroup or the kernel refusing), and the CPU plugin reads Q/K/V
 * straight from the arena on worker threads. Whatever thread touches
 * client memory, a fault there must end that client, not the daemon.
 *
 * The table is read inside the handler, so it is a list of fixed chunks
 * that only ever grows: a new chunk is fully built before it is published,
 * and a slot's range is cleared before its mapping goes away. Every field
 * the handler reads is accessed atomically.
 */
#define SLOTS_PER_CHUNK 64

struct slot {
	uintptr_t start;      /* 0: free (atomic) */
	size_t len;           /* atomic */
	int faulted;          /* atomic: set by the handler */
	int used;             /* loop thread only */
};

struct chunk {
	struct slot slot[SLOTS_PER_CHUNK];
	struct chunk *next;   /* atomic: appended once, never removed */
};

static struct chunk first;
static int wake_fd = -1;
static struct sigaction old_action;
static int installed;

static struct slot *slot_at(int i)
{
	struct chunk *c = &first;

	for (; i >= SLOTS_PER_CHUNK && c; i -= SLOTS_PER_CHUNK)
		c = __atomic_load_n(&c->next, __ATOMIC_ACQUIRE);
	return c ? &c->slot[i] : NULL;
}

/* Hands the fault back to whoever handled SIGBUS before us (the default: death). */
static void pass_on(int sig, siginfo_t *info, void *ctx)
{
	sigaction(SIGBUS, &old_action, NULL);
	if ((old_action.sa_flags & SA_SIGINFO) && old_action.sa_sigaction) {
		old_action.sa_sigaction(sig, info, ctx);
		return;
	}
	/* A fault re-executes the access and faults again under the old action; a sent signal does not. */
	if (info->si_code <= 0)
		raise(sig);
}

static void on_sigbus(int sig, siginfo_t *info, void *ctx)
{
	uintptr_t a = (uintptr_t)info->si_addr;
	int saved = errno;

	/* Only a fault the kernel raised counts: a queued signal can carry any address. */
	if (info->si_code <= 0)
		goto fatal;
	for (struct chunk *c = &first; c; c = __atomic_load_n(&c->next, __ATOMIC_ACQUIRE)) {
		for (int i = 0; i < SLOTS_PER_CHUNK; i++) {
			struct slot *s = &c->slot[i];
			uintptr_t start = __atomic_load_n(&s->start, __ATOMIC_ACQUIRE);
			size_t len = __atomic_load_n(&s->len, __ATOMIC_RELAXED);
			uint64_t one = 1;

			if (!start || a < start || a - start >= len)
				continue;
			/*
			 * Replace the client's whole mapping, not one page: it may
			 * have punched every page, and one signal per page would let
			 * it keep the daemon busy. mmap is a plain system call here
			 * (async-signal-safe in practice; POSIX lists none of mm).
			 */
			if (mmap((void *)start, len, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
				goto fatal;
			__atomic_store_n(&s->faulted, 1, __ATOMIC_RELEASE);
			if (wake_fd >= 0 && write(wake_fd, &one, sizeof(one)) < 0) {
				/* The loop still sees the flag at its next tick. */
			}
			errno = saved;
			return;
		}
	}
fatal:
	errno = saved;
	pass_on(sig, info, ctx);
}

int pkv_sigbus_install(int fd)
{
	struct sigaction sa;

	wake_fd = fd;
	if (installed)
		return 0;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &old_action) < 0)
		return -errno;
	installed = 1;
	return 0;
}

int pkv_sigbus_watch(void *addr, size_t len)
{
	struct chunk *c = &first, *last = NULL;
	int base = 0;

	for (; c; c = c->next, base += SLOTS_PER_CHUNK) {
		last = c;
		for (int i = 0; i < SLOTS_PER_CHUNK; i++) {
			struct slot *s = &c->slot[i];

			if (s->used)
				continue;
			s->used = 1;
			__atomic_store_n(&s->faulted, 0, __ATOMIC_RELAXED);
			__atomic_store_n(&s->len, len, __ATOMIC_RELAXED);
			/* Publishes len with it: the handler loads start with acquire. */
			__atomic_store_n(&s->start, (uintptr_t)addr, __ATOMIC_RELEASE);
			return base + i;
		}
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	/* Chunks live until exit: the handler may be walking the list at any time. */
	__atomic_store_n(&last->next, c, __ATOMIC_RELEASE);
	return pkv_sigbus_watch(addr, len);
}

void pkv_sigbus_unwatch(int i)
{
	struct slot *s = i >= 0 ? slot_at(i) : NULL;

	if (!s)
		return;
	__atomic_store_n(&s->start, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&s->len, 0, __ATOMIC_RELAXED);
	s->used = 0;
}

int pkv_sigbus_faulted(int i)
{
	struct slot *s = i >= 0 ? slot_at(i) : NULL;

	return s ? __atomic_load_n(&s->faulted, __ATOMIC_ACQUIRE) : 0;
}
