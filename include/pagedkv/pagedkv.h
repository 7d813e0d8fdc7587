/* SPDX-License-Identifier: MIT */
/* libpagedkv: the client API of the pagedkv daemon (connect, attach a pool, sequences, steps, attention). */
#ifndef PAGEDKV_H
#define PAGEDKV_H

/*
 * A client connects to pagedkvd, attaches to one pool (one model geometry),
 * allocates its Q/K/V/O tensors in a shared arena the daemon maps, and then
 * runs one step per forward pass:
 *
 *     pkv_step_begin(c, seqs, n_new, tokens, n)    reserve cache slots
 *     pkv_attend(c, layer, q, k, v, o)             once per layer
 *     pkv_step_end(c)                              commit; full blocks become shareable
 *
 * Every call returns 0 or a count on success and -errno on failure;
 * pkv_strerror() names the error and pkv_last_error() gives the daemon's
 * message for the last refused request. A connection is used by one thread
 * at a time. Every wait on the daemon has a timeout: a dead daemon gives
 * -ECONNRESET or -ETIMEDOUT, never a hang.
 *
 * The structs a caller fills (pkv_connect_opts, pkv_pool_params) or reads
 * (pkv_stats) start with struct_size so they can grow: fields are only
 * appended, the library reads or writes only the first struct_size bytes,
 * and a newer library gives fields an older caller lacks their defaults.
 * Start from the PKV_*_INIT macro; struct_size 0 (a designated initializer
 * that leaves it out) means the size in this first version (PKV_*_SIZE_V1).
 */

#include <stddef.h>
#include <stdint.h>
#include <pagedkv/types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct pkv_client;

struct pkv_connect_opts {
	uint32_t struct_size;    /* sizeof(struct pkv_connect_opts): use PKV_CONNECT_OPTS_INIT */
	uint32_t timeout_ms;     /* per wait on the daemon; 0: 10 s */
	const char *socket_path; /* NULL: $PAGEDKV_SOCKET, else $XDG_RUNTIME_DIR/pagedkv.sock, else /run/pagedkv.sock */
	size_t arena_bytes;      /* 0: 64 MiB */
	uint32_t spin_us;        /* busy-poll this long for a completion before sleeping; 0: 50 us
	                            (the environment's PAGEDKV_SPIN_US overrides) */
	/*
	 * How many threads the caller computes on between its attends (its
	 * thread pool's size); 0: unknown. A hint: the daemon spins for the
	 * next attend only on CPUs these leave idle, and otherwise sleeps at
	 * once, so that it never holds a core the caller's threads wait for.
	 * A count that covers every CPU also says these threads yield their
	 * cores while an attend runs: the call may then be split over them
	 * (by the daemon for a lone client, or by this process's backend in a
	 * pool with PKV_POOL_CLIENT_ATTENTION while no other thread waits for
	 * a core).
	 */
	uint32_t compute_threads;
	/*
	 * Optional: when pkv_connect fails, why, as one line: the daemon's own
	 * reason when it refused us (version, quota, ...), else what went wrong
	 * locally, naming the socket path and whether a daemon is listening
	 * there. The handle is freed either way; this is how a caller learns
	 * the reason (the role sqlite3_open's failed handle plays).
	 */
	char *error_buf;
	size_t error_buf_len;
};

#define PKV_CONNECT_OPTS_INIT { .struct_size = sizeof(struct pkv_connect_opts) }
#define PKV_CONNECT_OPTS_SIZE_V1 (offsetof(struct pkv_connect_opts, error_buf_len) + sizeof(size_t))

/* 0, or -errno with the reason in opts->error_buf (see above). */
int pkv_connect(const struct pkv_connect_opts *opts, struct pkv_client **out);
void pkv_disconnect(struct pkv_client *c);

const char *pkv_strerror(int err);
/* The daemon's explanation of the last refused request on this connection ("" if none). */
const char *pkv_last_error(const struct pkv_client *c);

#define PKV_POOL_SHARE_ACROSS_USERS (1u << 0) /* creator's choice; prefix sharing ignores uid */
/*
 * The creator's choice for a private pool (not with SHARE_ACROSS_USERS): the
 * daemon keeps the cache (blocks, prefix sharing among the uid's processes,
 * quotas, the disk tier) and maps the pool's KV memory into its clients,
 * which run each attend in their own process with the daemon's backend
 * (loaded from $PAGEDKV_PLUGIN_DIR, else the installed plugin directory):
 * a decode step then costs two round trips to the daemon, not one per
 * layer. Every process of the uid can read and write the whole pool. When
 * the backend cannot be loaded here the daemon attends as usual and
 * pkv_last_error() says why; pkv_stats' attention_in_client tells which.
 */
#define PKV_POOL_CLIENT_ATTENTION (1u << 1)

struct pkv_pool_params {
	uint32_t struct_size;        /* sizeof(struct pkv_pool_params): use PKV_POOL_PARAMS_INIT */
	uint32_t flags;              /* PKV_POOL_* */
	const char *name;            /* pools are found by name (printable ASCII) */
	struct pkv_geometry geo;     /* must equal an existing pool's exactly */
	uint32_t act_dtype;          /* dtype of Q/K/V/O in the arena */
	uint64_t model_id;           /* fingerprint of the weights */
	const void *cache_salt;      /* optional: narrows sharing further */
	size_t cache_salt_len;
	float scale;                 /* 0: 1/sqrt(head_dim) */
	float softcap;               /* 0: off */
	int32_t window_left;         /* < 0: no sliding window */
};

#define PKV_POOL_PARAMS_INIT { .struct_size = sizeof(struct pkv_pool_params), .window_left = -1 }
#define PKV_POOL_PARAMS_SIZE_V1 (offsetof(struct pkv_pool_params, window_left) + sizeof(int32_t))

int pkv_pool_attach(struct pkv_client *c, const struct pkv_pool_params *p);

/* Tensor memory the daemon can see (64-byte aligned). NULL when the arena is full. */
void *pkv_alloc(struct pkv_client *c, size_t bytes);
void pkv_free(struct pkv_client *c, void *ptr);

/* Sequences: open returns how many leading tokens are already cached (n_cached). */
int pkv_seq_open(struct pkv_client *c, const int32_t *tokens, uint32_t n_tokens,
		 uint32_t *seq, uint32_t *n_cached);
int pkv_seq_fork(struct pkv_client *c, uint32_t seq, uint32_t *child);
int pkv_seq_truncate(struct pkv_client *c, uint32_t seq, uint32_t n_tokens);
int pkv_seq_close(struct pkv_client *c, uint32_t seq);

/*
 * Steps. tokens holds n_new[0] ids of seqs[0], then n_new[1] of seqs[1], ...
 * Q/K/V/O given to pkv_attend are packed in the same order:
 * Q, O [total_q][num_heads][head_dim], K, V [total_q][num_kv_heads][head_dim].
 */
int pkv_step_begin(struct pkv_client *c, const uint32_t *seqs, const uint32_t *n_new,
		   const int32_t *tokens, uint32_t n_seqs);
/*
 * In-flight prefix sharing: an open may count blocks that another sequence
 * (of any process sharing the namespace) is still computing. A step of that
 * sequence cannot begin until they are written: when it is the step's only
 * sequence and another connection computes them, pkv_step_begin waits for
 * that (at most 30 s); otherwise it fails with -EAGAIN: step the other
 * sequences (the producer among them) without it and retry it later. If the
 * producer gives up, the sequence is cut back and its next pkv_step_begin
 * fails once with -ESTALE: close and re-open it and compute the rest. In
 * both cases nothing was reserved and pkv_blocked_seq() names the sequence.
 */
uint32_t pkv_blocked_seq(const struct pkv_client *c);
int pkv_attend(struct pkv_client *c, uint32_t layer, const void *q, const void *k,
	       const void *v, void *o);
/* Submits without waiting; pkv_wait(ticket) returns the attend's result. */
int pkv_attend_async(struct pkv_client *c, uint32_t layer, const void *q, const void *k,
		     const void *v, void *o, uint64_t *ticket);
int pkv_wait(struct pkv_client *c, uint64_t ticket);
/*
 * Commits the step. Every layer must have been attended (successfully): the
 * reserved slots hold nothing of this client's until then, so otherwise
 * step_end returns -EINVAL naming the missing layers, aborts the step and
 * commits nothing.
 */
int pkv_step_end(struct pkv_client *c);
int pkv_step_abort(struct pkv_client *c);

/* Keep a prefix's blocks cached while this connection lasts (within its pin budget, a quarter of
 * the pool, and the pool's cap on pinned blocks, half of it). Returns tokens pinned. */
int pkv_pin(struct pkv_client *c, const int32_t *tokens, uint32_t n_tokens);
int pkv_unpin(struct pkv_client *c, const int32_t *tokens, uint32_t n_tokens);

struct pkv_stats {
	uint32_t struct_size;        /* set by the caller (PKV_STATS_INIT); the library fills no more */
	uint32_t num_blocks, free_blocks, cached_blocks, in_use_blocks;
	uint32_t open_seqs;          /* this client's */
	/* this connection's opens: pool-wide counts would tell one user about another's prompts */
	uint64_t prefix_lookup_tokens, prefix_hit_tokens;
	/* Appended after version 1 (read only when struct_size covers them): this connection's own counts. */
	uint32_t client_sleeps;        /* waits that slept on the completion futex */
	uint32_t client_lost_wakeups;  /* sleeps that timed out with a completion posted and the wake word
	                                  never bumped: the daemon forgot a wake-up (0 when correct) */
	/*
	 * Appended after version 2: where this connection's pkv_attend calls
	 * spent their time. wait: submit to completion, as this client saw it;
	 * daemon: from the daemon's worker taking the request off the ring to
	 * posting its completion (its wait for other clients' work in a merged
	 * call included); backend: inside the backend's call (its share of a
	 * merged call). wait - daemon is the passage between the processes both
	 * ways, wake-ups included.
	 */
	uint64_t attends, attend_wait_ns, attend_backend_ns, attend_daemon_ns;
	/* Appended after version 3: 1 when this connection runs its attends itself (PKV_POOL_CLIENT_ATTENTION). */
	uint32_t attention_in_client;
};

#define PKV_STATS_INIT { .struct_size = sizeof(struct pkv_stats) }
#define PKV_STATS_SIZE_V1 (offsetof(struct pkv_stats, prefix_hit_tokens) + sizeof(uint64_t))
int pkv_stats(struct pkv_client *c, struct pkv_stats *st);

/* A no-op round trip through the rings (liveness check, latency measurement). */
int pkv_nop(struct pkv_client *c);
/* Submits a no-op without waiting; pkv_wait(ticket) completes it (batching measurements). */
int pkv_nop_async(struct pkv_client *c, uint64_t *ticket);

#ifdef __cplusplus
}
#endif
#endif
