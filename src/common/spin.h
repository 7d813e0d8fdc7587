/* SPDX-License-Identifier: MIT */
/* Whether a waiter may spin: only while a core would otherwise idle (runnable threads vs usable CPUs). */
#ifndef PKV_SPIN_H
#define PKV_SPIN_H

/*
 * 1 when the runnable threads of the whole machine (the running field of
 * /proc/loadavg, the caller included) fit the CPUs this thread may use, so
 * that a spin steals from nobody; 0 when some thread waits for a core, where
 * every microsecond spent spinning is taken from a process that has work.
 * Sampled at most once per PKV_SPIN_SAMPLE_NS per thread: cheap enough to
 * ask inside a wait loop. PAGEDKV_SPIN_POLICY=always restores unconditional
 * spinning (the old behaviour, for A/B runs), =never forbids it.
 */
int pkv_spin_worthwhile(void);

/*
 * Whether a core is idle beyond the caller's own: the runnable threads, the
 * caller included, leave at least one CPU free (sampled with the above).
 * What fanning work out to another thread needs: a woken helper thread
 * takes a core from somebody otherwise, and the caller then waits for it.
 */
int pkv_spin_spare_cpu(void);

#define PKV_SPIN_SAMPLE_NS 1000000ull

#endif
