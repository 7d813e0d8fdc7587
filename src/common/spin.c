/* SPDX-License-Identifier: MIT */
/* Whether a waiter may spin: the machine's runnable count against the CPUs we may use. */
#include "config.h"
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/clock.h"
#include "common/spin.h"

enum { POLICY_UNSET, POLICY_ADAPT, POLICY_ALWAYS, POLICY_NEVER };

static int loadavg_fd = -1;
static int policy = POLICY_UNSET;

static __thread uint64_t next_ns;
static __thread int last_ok = 1, last_spare = 1, ncpu;

/* Once per process; racing first calls agree on the value, and only one fd is kept. */
static int get_policy(void)
{
	int p = __atomic_load_n(&policy, __ATOMIC_ACQUIRE);

	if (p == POLICY_UNSET) {
		const char *e = getenv("PAGEDKV_SPIN_POLICY");
		int fd = -1, none = -1;

		p = !e || !*e ? POLICY_ADAPT : !strcmp(e, "always") ? POLICY_ALWAYS
			: !strcmp(e, "never") ? POLICY_NEVER : POLICY_ADAPT;
		if (p == POLICY_ADAPT) {
			fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
			if (fd < 0)
				p = POLICY_ALWAYS; /* cannot tell: behave as before */
			else if (!__atomic_compare_exchange_n(&loadavg_fd, &none, fd, 0, __ATOMIC_ACQ_REL,
							      __ATOMIC_ACQUIRE))
				close(fd);
		}
		__atomic_store_n(&policy, p, __ATOMIC_RELEASE);
	}
	return p;
}

/* The running field of "0.50 0.40 0.30 3/345 12345", or -1. */
static long running_now(void)
{
	char buf[128], *p = buf;
	ssize_t n = pread(__atomic_load_n(&loadavg_fd, __ATOMIC_ACQUIRE), buf, sizeof(buf) - 1, 0);

	if (n <= 0)
		return -1;
	buf[n] = 0;
	for (int f = 0; f < 3; f++) {
		p = strchr(p, ' ');
		if (!p)
			return -1;
		p++;
	}
	return strtol(p, NULL, 10);
}

int pkv_spin_worthwhile(void)
{
	int p = get_policy();
	uint64_t t;
	long run;

	if (p != POLICY_ADAPT)
		return p == POLICY_ALWAYS;
	t = pkv_now_ns();
	if (t < next_ns)
		return last_ok;
	next_ns = t + PKV_SPIN_SAMPLE_NS;
	if (!ncpu) {
		cpu_set_t m;

		ncpu = sched_getaffinity(0, sizeof(m), &m) ? (int)sysconf(_SC_NPROCESSORS_ONLN) : CPU_COUNT(&m);
		if (ncpu < 1)
			ncpu = 1;
	}
	run = running_now();
	last_ok = run < 0 || run <= ncpu;
	last_spare = run < 0 || run < ncpu;
	return last_ok;
}

int pkv_spin_spare_cpu(void)
{
	int p = get_policy();

	if (p != POLICY_ADAPT)
		return p == POLICY_ALWAYS;
	(void)pkv_spin_worthwhile(); /* samples when due */
	return last_spare;
}
