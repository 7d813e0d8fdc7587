/* SPDX-License-Identifier: MIT */
/* Test harness: a private pagedkvd per test, a control client, raw protocol access, synthetic Q/K/V. */
#ifndef PKV_TEST_HARNESS_H
#define PKV_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/wait.h>
#include "common/proto.h"
#include "common/ring.h"

#include "launch.h"

/* A waited-for child's exit code, or 128 + its signal: a crashed child never reads as exit 0. */
static inline int child_status(int st)
{
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Runs one pagedkvctl command over the socket; returns the reply status, output in out. */
int ctl_cmd(const char *sock, uint32_t cmd, uint32_t fmt, char *out, size_t len);
/* A counter of the admin status (JSON), summed over the pools: "row_pieces", "layer_copies", ... */
uint64_t pool_counter_sum(const char *sock, const char *key);
/* Audits until clean (releases are immediate but the hang-up is asynchronous); returns problems. */
int audit_until_clean(const char *sock, int timeout_ms, char *out, size_t len);

/* The tests' geometry: 2 layers, 4 query heads, 2 KV heads, head_dim 16, f32, blocks of 16. */
#define T_LAYERS 2u
#define T_HEADS 4u
#define T_KV_HEADS 2u
#define T_DIM 16u
#define T_BS 16u
#define T_BLOCKS 64u

struct pkv_client;
struct pkv_pool_params;
void test_pool_params(struct pkv_pool_params *p, const char *name);
/* Connects to sock and attaches pool `pool` with test_pool_params(); NULL on any failure. */
struct pkv_client *test_client(const char *sock, const char *pool, size_t arena_bytes, uint32_t timeout_ms);

/* Synthetic activations: a function of (token, position, layer, head, x) only. */
float act_q(int32_t tok, uint32_t pos, uint32_t layer, uint32_t h, uint32_t x);
float act_k(int32_t tok, uint32_t pos, uint32_t layer, uint32_t h, uint32_t x);
float act_v(int32_t tok, uint32_t pos, uint32_t layer, uint32_t h, uint32_t x);
/* One token's row of each: q [T_HEADS][T_DIM], k and v [T_KV_HEADS][T_DIM]. */
void act_row(int32_t tok, uint32_t pos, uint32_t layer, float *q, float *k, float *v);

/*
 * Reference attention for one sequence whose full token list is toks[0..n):
 * output rows for positions p0..n-1 of `layer` into out[(p - p0)][H][D].
 */
void ref_attend(const int32_t *toks, uint32_t n, uint32_t p0, uint32_t layer, float *out);
/* The same in a pool with window_left = window (< 0: none). */
void ref_attend_window(const int32_t *toks, uint32_t n, uint32_t p0, uint32_t layer, int32_t window, float *out);

/*
 * Runs one step for one sequence through the daemon: positions p0..p0+k-1
 * of toks, every layer; writes O into out[layer][k][H][D] (may be NULL).
 */
/* n deterministic token ids of a test prompt; different seeds give different prompts. */
void make_prompt(int32_t *t, uint32_t n, int32_t seed);
int run_step(struct pkv_client *c, uint32_t seq, const int32_t *toks, uint32_t p0, uint32_t k, float *out);
/*
 * One layer's attend of positions p0..p0+k-1 of toks in the open step; O into out[k][H][D] (may be NULL).
 * It sleeps run_step_pause_us first (a client computing the layer; 0 unless a test sets it).
 */
int attend_layer(struct pkv_client *c, const int32_t *toks, uint32_t p0, uint32_t k, uint32_t layer, float *out);
extern unsigned run_step_pause_us;
/* The arena dtype attend_layer writes Q/K/V in and reads O from (f32 rows either side); PKV_DTYPE_F32 unless set. */
extern uint32_t run_step_act_dtype;
/*
 * Runs positions n_cached..n-1 of toks as one step (run_step) and returns the
 * largest difference of any layer's output from ref_attend (INFINITY when the
 * step failed); the outputs go to got_out[layer][k][H][D] when non-NULL.
 */
float step_and_check(struct pkv_client *c, uint32_t seq, const int32_t *toks, uint32_t n, uint32_t n_cached,
		     float *got_out);
/* Largest |a-b| over n floats. */
float max_diff(const float *a, const float *b, size_t n);

/* ---- raw protocol access, for hostile-input tests */
struct raw {
	int sock, memfd, sq_bell;
	uint8_t *region;
	size_t size;
	struct pkv_shm_hdr hdr;
	struct pkv_ring sq, cq;
	uint8_t *arena;
	uint64_t ud;
};

/* Builds a region and the submission eventfd (sealed unless seals == 0), connects, does not send hello. */
int raw_open(struct raw *r, const char *sock, uint64_t arena, int seals);
/* Sends a hello with the given version and region size (fds: memfd, submission bell when pass_fds). Returns reply status. */
int raw_hello(struct raw *r, uint32_t version, uint64_t region_size, int pass_fds, char *why, size_t len);
int raw_attach(struct raw *r, const struct pkv_msg_attach *m, char *why, size_t len);
void raw_attach_msg(struct pkv_msg_attach *m, const char *name);
/* Submits one SQE (and rings the bell if the daemon sleeps) without waiting. */
int raw_submit(struct raw *r, struct pkv_sqe *sqe);
/* Submits one SQE and waits (2 s) for its CQE; returns 0 or -ETIMEDOUT/-ECONNRESET. */
int raw_call(struct raw *r, struct pkv_sqe *sqe, struct pkv_cqe *cqe);
void raw_close(struct raw *r);

#endif
