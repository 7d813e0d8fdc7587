/* SPDX-License-Identifier: MIT */
/* Hard limits on every size and count a client controls (DESIGN §2, "Limits"): one home for all of them. */
#ifndef PKV_BOUNDS_H
#define PKV_BOUNDS_H

/*
 * Each limit bounds memory or loop-thread time that one request can cost the
 * daemon. Sizes derived from them are computed in 64 bits or with
 * __builtin_*_overflow, so none can wrap before it is compared with its limit.
 */

/* Geometry: past these a pool is taken as a mistake rather than a model. */
#define PKV_MAX_LAYERS     4096u
#define PKV_MAX_HEADS      4096u
#define PKV_MAX_HEAD_DIM   4096u
#define PKV_MAX_BLOCK_SIZE 4096u
#define PKV_MAX_NUM_BLOCKS (1u << 26)
#define PKV_MAX_POOL_BYTES (1ull << 48)   /* 256 TiB of K+V */
/*
 * num_heads x head_dim: one query row's width (512 heads of 128, 256 of 256).
 * The daemon keeps a row's partial results while it splits that row over
 * keys (worker.c, row_split_start): 512 KiB per connection at most.
 */
#define PKV_MAX_ROW_WIDTH  (1u << 16)
/*
 * K and V of one block in one layer (block_size x num_kv_heads x head_dim x
 * dtype size x 2): the smallest piece of a copy-on-write the worker runs
 * (worker.c, copy_step), ~2 ms of memcpy. 256-token blocks of 16 KV heads of
 * 256 in f32 take half of it.
 */
#define PKV_MAX_BLOCK_LAYER_BYTES (16u << 20)
/* Ceilings of struct pkv_cache_limits (the daemon's configuration stays below them). */
#define PKV_MAX_SEQS_LIMIT (1u << 24)
#define PKV_MAX_TOKENS_LIMIT (1u << 30)

/* Tokens in one sequence (and the largest count an open, pin or truncate may name). */
#define PKV_MAX_SEQ_TOKENS (1u << 20)
/* Sequences in one step. */
#define PKV_MAX_STEP_SEQS 4096u
/* New tokens in one step, summed over its sequences. */
#define PKV_MAX_STEP_TOKENS (1u << 20)
/*
 * Block-table entries of one step: num_seqs x max_blocks_per_seq (the table
 * the backends take is dense, so one long sequence pads every short one). 4 Mi
 * entries (16 MiB) fit 256 sequences of 256 Ki tokens at block_size 16.
 */
#define PKV_MAX_STEP_TABLE (1u << 22)
/*
 * Block references (table entries) plus pinned blocks one owner may hold, per
 * block of the pool, whatever limit the daemon set (struct
 * pkv_cache_limits.max_refs_per_owner defaults to this x num_blocks): forks
 * share blocks but each has its own table, so without it 1,024 forks of a
 * long sequence held ~1 MiB of table each, charged to no one. 8 forks of a
 * whole-pool sequence still fit; the tables cost at most 32 bytes per pool
 * block per connection.
 */
#define PKV_OWNER_REFS_PER_BLOCK 8u
/*
 * Leading tokens one open or pin looks up in the prefix table: the chain walk
 * runs on the daemon's event loop, so it is bounded per request (4096 blocks
 * of 16, about 0.3 ms). Tokens past it are never matched: a longer prompt still
 * opens, its tail is computed by the first step.
 */
#define PKV_MAX_OPEN_WALK_TOKENS (1u << 16)
/*
 * Loop-thread work one client gets per turn of the daemon's event loop, in
 * tokens read or hashed (opens, pins, step tokens). Its remaining requests
 * wait for its next turn, and an open's prefix walk goes on over several
 * turns (256 blocks of 16, about 20 us, each), so a flood of long opens
 * holds the loop for no more than that per client per turn. A single other
 * request (a step, a pin) still runs whole: at least one per turn.
 */
#define PKV_SWEEP_WORK_TOKENS 4096u
/*
 * A step's buffers are kept for the next step (no allocation per step when
 * warm) only up to this many bytes each; a larger one is freed at commit/abort
 * so one huge step does not leave its memory behind.
 */
#define PKV_STEP_KEEP_BYTES (1u << 20)

#endif
