/* SPDX-License-Identifier: MIT */
/* Attention in the client: the pool's backends run in this process over the daemon's shared KV memory. */
#ifndef PKV_CLIENT_LOCAL_ATTN_H
#define PKV_CLIENT_LOCAL_ATTN_H

#include <stddef.h>
#include <stdint.h>
#include <pagedkv/types.h>
#include "common/proto.h"

struct local_attn;

/* What the attend batches of this pool carry besides the step's tables (the attach's parameters). */
struct local_attn_params {
	struct pkv_geometry geo;
	uint32_t act_dtype;
	float scale, softcap;
	int32_t window_left;
	uint32_t threads;   /* for the backends' parallel_for, the caller's included; 0: 1 */
	/*
	 * The caller's compute threads cover every CPU and yield theirs while an
	 * attend runs: a call may split over them while no other thread waits
	 * for a core.
	 */
	int cpus_ours;
};

/*
 * Maps the pool's memory (fd, bytes as the daemon said) and loads the
 * backends w names from this process's plugin directory ($PAGEDKV_PLUGIN_DIR,
 * else the installed one). Takes fd (closed on failure too). -errno and the
 * reason in err.
 */
int local_attn_open(int fd, uint64_t bytes, const struct pkv_wire_pool_mem *w, const struct local_attn_params *p,
		    struct local_attn **out, char *err, size_t err_len);
void local_attn_close(struct local_attn *la);

/* Takes a step's tables as the daemon wrote them (len bytes at tables: shared memory, copied). */
int local_attn_step(struct local_attn *la, const void *tables, uint64_t len, char *err, size_t err_len);
/* Attends one layer of the current step: Q, K, V, O packed as pkv_attend says. */
int local_attn_run(struct local_attn *la, uint32_t layer, const void *q, const void *k, const void *v, void *o,
		   char *err, size_t err_len);
/* The step ended (committed or aborted): attends fail until the next local_attn_step. */
void local_attn_step_done(struct local_attn *la);

#endif
