/* SPDX-License-Identifier: MIT */
/* pagedkvd's internal state: pools, sessions (one per connection), the worker and the event loop. */
#ifndef PKV_DAEMON_H
#define PKV_DAEMON_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/types.h>
#include <liburing.h>
#include "cache/cache.h"
#include "common/clock.h"
#include "common/proto.h"
#include "common/ring.h"
#include "daemon/conf.h"
#include "daemon/rate.h"
#include "daemon/tenant.h"
#include "loader/loader.h"

struct pkv_daemon;
struct session;

/* ---------------------------------------------------------------- pools */

struct pool {
	struct pool *next;
	char name[PKV_NAME_MAX];
	struct pkv_geometry geo;
	uint32_t act_dtype, flags;
	uint64_t model_id;
	float scale, softcap;
	int32_t window_left;
	uint64_t bytes;               /* KV memory, counted against the budget */
	/*
	 * The cache manager is not thread-safe: cache_mu guards it, the step
	 * state of this pool's sessions (step, meta, step_* fields), their
	 * per-uid block charges (tenant.c: tp->blocks, charged_*) and the
	 * steps/step_errors counters. The loop holds it for one SQE (or one
	 * turn of an open's walk) at a time; the worker only ever tries it
	 * (a step boundary, worker.c) and hands the ring back when it is busy.
	 */
	pthread_mutex_t cache_mu;
	struct pkv_cache *cache;
	struct tier_pool *tier;       /* tier_glue.c: its disk tier hook, NULL without one */
	struct pkv_dispatch disp;     /* touched by the worker thread only (after creation) */
	/*
	 * A pool whose clients attend themselves (PKV_WIRE_POOL_CLIENT_ATTN):
	 * its KV memory is this memfd, mapped here at shared_map and passed to
	 * every client at attach; -1 otherwise. shared_watch: its SIGBUS slot.
	 */
	int shared_fd, shared_watch;
	void *shared_map;
	size_t shared_len;
	uint32_t n_clients;
	/*
	 * Scope and lifetime: a pool's name is private to owner_uid unless the
	 * pool is shared across users; a pool without clients is freed after
	 * pool_idle_grace_s, or at once when an attach needs its budget.
	 */
	uid_t owner_uid;
	uint32_t n_uids;              /* uids with a connection attached (tenant_attach) */
	uint64_t idle_since_ns;       /* when n_clients dropped to 0 */
	uint32_t last_batch_items;    /* worker only: size of the last merged attend batch */
	struct attend_rate rate;      /* worker only: measured backend speed (rate.h) */
	/* worker only: merging on or off, whichever served more attends per second lately (worker.c) */
	int merge_arm;
	uint32_t arm_epochs;
	uint64_t arm_t0, arm_items;
	double arm_rate[2];
	/* counters for status/metrics: steps and step_errors under cache_mu; attends, batches,
	 * batch_seqs, row_pieces and layer_copies by the worker (atomic adds, read by the loop for status) */
	uint64_t attends, batches, batch_seqs, steps, step_errors, row_pieces, layer_copies;
};

/* Creates or finds uid's pool (or the shared one) for an attach; -errno with the reason. */
int pool_attach(struct pkv_daemon *d, const struct pkv_msg_attach *m, uid_t uid, struct pool **out,
		char *why, size_t why_len);
/* A client left the pool (n_clients already decremented): starts its grace period. */
void pool_left(struct pkv_daemon *d, struct pool *p);
/* Frees the pools idle for longer than the grace period (loop timer). */
void pool_reap(struct pkv_daemon *d, uint64_t now_ns);
void pool_destroy(struct pkv_daemon *d, struct pool *p);
/* The loop's way to take backend_mu: ahead of the worker's next piece of copies. */
void backend_lock_loop(struct pkv_daemon *d);
/* Bytes of KV cache a geometry needs, or 0 on overflow. */
uint64_t pool_bytes(const struct pkv_geometry *g);
/* K and V of one block over every layer; 0 when that overflows. */
uint64_t block_kv_bytes(const struct pkv_geometry *g);
/* The cache lock (cache_mu); pool_lock_all takes every pool's, in list order (config reload). */
void pool_lock(struct pool *p);
void pool_unlock(struct pool *p);
void pool_lock_all(struct pkv_daemon *d);
void pool_unlock_all(struct pkv_daemon *d);
/* The pool's cache counters, under its lock (ctl). */
void pool_cache_stats(struct pool *p, struct pkv_cache_stats *cs);

/* ---------------------------------------------------------------- sessions */

enum watch_kind { W_SIGNAL = 1, W_WAKE, W_TIMER, W_CTL, W_BELL, W_CANCEL };

/* What an io_uring request's user_data points to. */
struct watch {
	enum watch_kind kind;
	struct session *s;
};

/* A sequence this connection holds, with its committed length (for block quotas). */
struct seq_ent {
	uint32_t seq, len;
};

struct session {
	struct session *next, *prev;
	uint32_t id;                  /* the cache's owner id */
	int sock, memfd, sq_bell;
	uid_t uid;
	pid_t pid;
	int role;                     /* 0 until hello */
	int unauth_counted;           /* the acceptor counts it before its hello (acceptor_hello_done once) */
	int admin;                    /* control connection of an admin (ctl_peer_is_admin) */
	uint64_t created_ns;
	struct watch w_ctl, w_bell, w_cancel;
	int armed;                    /* io_uring requests (cancels included) still pointing at this session */
	uint64_t bell_buf;            /* target of the doorbell read */
	int bell_armed;               /* the loop's doorbell read is in flight (not re-armed while the worker owns the ring) */
	uint32_t empty_bells;         /* doorbell reads this tick that found no SQE (loop.c, on_bell) */
	int bell_parked;              /* too many: the doorbell is re-armed at the next tick */
	int closing;                  /* hung up: stop reading, release when idle */
	int released;
	/* shared region (clients) */
	uint8_t *region;
	size_t region_size;
	int bus_slot;                 /* pkv_sigbus_watch slot of region, or -1 */
	struct pkv_shm_hdr hdr;       /* validated private copy; never re-read */
	struct pkv_ring sq, cq;
	uint8_t *arena;
	uint64_t arena_size;
	/* pool */
	struct pool *pool;
	struct pkv_key ns;
	struct pkv_step *step;
	int step_poisoned;            /* its copy-on-write failed: commit must not publish */
	struct pkv_step_meta meta;    /* the step's layout; read by attends on the ring's owner */
	double step_units;            /* worker_attend_units() of meta, once per step (the worker's slicing and rate) */
	struct pkv_step_req *step_reqs; /* private copies for length updates at commit */
	uint32_t n_step_reqs;
	int32_t *step_tokens;
	uint32_t exec_max_step;       /* session_exec's max_step while it runs (op_step_begin reads it) */
	uint32_t inflight;            /* jobs on the worker (copies, ring ownership); release waits for 0 */
	/*
	 * Loop's view: the worker consumes this session's SQ ring (handed over
	 * at an attend, handed back at any other opcode, on hang-up or when
	 * idle for long). Exactly one thread consumes a ring at a time; the
	 * hand-offs go through the worker's mutex, which orders everything
	 * either side wrote before. The ring's consumer alone sets and clears
	 * its need-wakeup flag, and sleeps on its doorbell (worker.c).
	 */
	int worker_owned;
	uint64_t end_handed;          /* loop only: user_data of the last client-attention STEP_END it handed over */
	uint32_t worker_copies;       /* worker only: its JOB_COPYs not done yet (its ring waits for them) */
	pthread_spinlock_t cq_lock;   /* the loop and the worker both post completions */
	int cq_broken;                /* set by a poster that found the ring corrupted */
	struct seq_ent *seqs;
	uint32_t n_seqs, cap_seqs;
	/* An open whose prefix walk goes on over several turns; its SQE completes at the end. */
	int32_t *open_tokens;         /* non-NULL while one is pending */
	uint32_t open_n, open_seq;
	uint64_t open_ud;
	/* Parked before its walk while the disk tier reads its prefix (tier_glue.c); flags/lookup of its SQE. */
	struct tier_open *open_fetch;
	uint32_t open_flags, open_lookup;
	uint64_t ops, errors;
	/* per-uid accounting (tenant.c): what this connection adds to its uid's counters */
	struct tenant *tenant;        /* set at hello */
	struct tenant_pool *tp;       /* set at attach */
	uint32_t charged_seqs, charged_blocks, pins;
	uint64_t charged_region;
	uint64_t lookup_tokens, hit_tokens; /* this connection's prefix lookups (STATS) */
};

/* ---------------------------------------------------------------- worker */

struct job;

/* One attend of one session, taken from its ring by the worker. */
struct attend_item {
	struct session *s;
	struct job *owner;            /* the session's JOB_POLL */
	uint64_t user_data;
	const struct pkv_step_meta *meta;
	const void *q, *k, *v;
	void *o;
	uint64_t seen_ns;             /* when the worker took it off the ring */
};

/*
 * JOB_COPY: a step's copy-on-write, run before any later attend of the
 * session (the queue is FIFO). JOB_POLL: the session's SQ ring, handed to
 * the worker; it comes back through `done` with what the loop must account.
 */
enum job_kind { JOB_ATTEND = 1, JOB_COPY, JOB_POLL };

struct job {
	struct job *next;
	enum job_kind kind;
	struct pool *pool;
	uint32_t layer;
	/* JOB_ATTEND */
	struct attend_item *items;
	uint32_t n_items, cap_items;
	/* JOB_COPY, JOB_POLL */
	struct session *s;
	const struct pkv_block_copy *copies;
	uint32_t n_copies;
	/*
	 * JOB_COPY of a step its client attends itself: the begin's completion,
	 * posted by the loop once the copies are done (the client writes the
	 * step's slots as soon as it has it, and a copy still to come would
	 * overwrite them).
	 */
	int post_begin;
	uint64_t begin_ud, begin_p0, begin_p1;
	int32_t res;                  /* JOB_POLL: < 0 when the loop must disconnect the session */
	double est_ns;                /* JOB_ATTEND: estimated backend time of the batch */
	/* JOB_POLL, worker only until handed back */
	uint64_t last_ns;             /* last SQE taken */
	uint64_t ops, errors;
	int in_batch, give_back;
	int watched;                  /* its doorbell is in the worker's epoll set (the worker may sleep holding it) */
	uint32_t empty_bells;         /* its doorbell woke the worker with no SQE, since bells_from_ns (worker.c) */
	uint64_t bells_from_ns;
	/*
	 * A long attend run in slices (worker only): its rows [big_row, total_q)
	 * are still to do; each slice is a varlen sub-batch of whole query rows,
	 * run between other clients' batches.
	 */
	int big_on;
	struct attend_item big;
	uint32_t big_row;
	uint64_t big_served_ns;       /* when it last ran a slice (round robin) */
	uint64_t led_ns;              /* when its SQE last led a sweep (round robin) */
	uint64_t big_backend_ns;      /* its slices' time in the backend so far */
	int32_t *big_arrays;          /* cu_q, cu_k, cache_seqlens of the current slice */
	/*
	 * Its row big_row when that row alone is longer than a slice (a backend
	 * with PKV_FEAT_LSE): run over key pieces from split_key to split_end
	 * (each starting on a multiple of split_align), each merged by its
	 * log-sum-exp into split_buf (row_piece). split_end == 0: no row split.
	 */
	uint32_t split_seq, split_lo, split_key, split_end, split_align;
	float *split_buf;             /* acc [H][hd] and lse [H] f32, the piece's lse [H] and O [H][hd] */
	/* Copy-on-write run in pieces (worker only): a step begin's (copy_on) or a JOB_COPY's, from block copy_next, layer copy_layer on. */
	int copy_on;
	uint32_t copy_next, copy_layer;
	uint64_t copy_ud, copy_p0, copy_p1; /* the begin's completion, posted after the last piece */
};

/* Distinct uids the acceptor counts connections before their hello for; past that, new uids wait. */
#define PKV_ACCEPT_MAX_UIDS 1024u

/* The acceptor thread (accept.c): takes connections, refuses a uid's excess, queues the rest for the loop. */
struct acceptor {
	pthread_t thread;
	int started, stop;
	int stop_fd;                  /* eventfd: acceptor_stop wakes the thread's poll */
	pthread_mutex_t mu;           /* the queue and the counts */
	struct accepted { int fd; uid_t uid; uint64_t due_ns; int counted; } *queue, *held; /* for the loop; paced */
	uint32_t n_queue, cap_queue, n_held, cap_held;
	/*
	 * Per uid: connections held here, queued or held by the loop before their
	 * hello (acceptor_hello_done), and the tokens of its pace.
	 */
	struct uid_gate { uid_t uid; uint32_t n; int used; double tokens; uint64_t at_ns; } gates[PKV_ACCEPT_MAX_UIDS];
	uint32_t n_gates;             /* slots used so far */
	uid_t *done_later;            /* loop only: hellos to count down at its next acceptor_take */
	uint32_t n_later, cap_later;
	int reserve_fd;               /* given back to accept-and-refuse when out of descriptors */
	uint64_t fd_pressure_ns;      /* atomic: last time accept hit EMFILE/ENFILE */
	uint64_t refused_logged_ns, refused_unlogged;
};

int acceptor_start(struct pkv_daemon *d);
/* Stops taking connections; closes those the loop has not taken. Idempotent. */
void acceptor_stop(struct pkv_daemon *d);
/* Up to max accepted connections for the loop; returns how many, or ACCEPTOR_BUSY (never waits). */
#define ACCEPTOR_BUSY (-1)
int acceptor_take(struct pkv_daemon *d, struct accepted *out, uint32_t max);
/* A connection the acceptor queued said its hello or went away before it: uid holds one fewer. */
void acceptor_hello_done(struct pkv_daemon *d, uid_t uid);

enum { HINT_MOVED = 1u, HINT_BATCH = 2u };

struct worker {
	pthread_t thread;
	pthread_mutex_t mu;           /* the job queues */
	/*
	 * The worker sleeps in epoll_wait on efd (its own eventfd: jobs, hang-ups,
	 * stop) and on the doorbells of the rings it owns (edge-triggered, never
	 * read: the client shares their file descriptions and could make a read
	 * block). worker_push writes efd when `sleeping` is set; worker_kick
	 * always does.
	 */
	int efd, epfd;
	struct job *head, *tail;      /* queued */
	struct job *done;             /* finished, for the loop */
	struct job **owned;           /* worker only: JOB_POLLs of the rings it consumes */
	uint32_t n_owned, cap_owned;
	struct job **copying;         /* worker only: JOB_COPYs being run in pieces */
	uint32_t n_copying, cap_copying;
	struct attend_item *batch;    /* worker only: the attends of one backend call */
	uint32_t cap_batch;
	uint32_t cpu1;                /* worker only: CPU + 1 of the current poll */
	cpu_set_t home;               /* worker only: its CPU mask at start */
	uint32_t ncpu;                /* worker only: CPUs in home (at least 1) */
	int moved;                    /* worker only: it left a client's CPU (maybe_move) or follows one */
	uint32_t follow_cpu1;         /* worker only: CPU + 1 it is pinned to (follow_sleeper), or 0 */
	uint32_t hints_set;           /* atomic: HINT_* the worker applied to itself (worker_uids_shared) */
	uint32_t hints_undone;        /* atomic: the loop undid them; the worker resets its record */
	int batch_policy;             /* worker only: -1 never switch; else 1 while it runs SCHED_BATCH (worker.c) */
	int stop, sleeping;
	uint64_t last_take_ns;        /* worker only: when it last took an SQE from any ring */
	uint64_t idle_from_ns;        /* worker only: when its rings went quiet (0: not quiet) */
	uint64_t gap_ns;              /* worker only: learned quiet gap before the next SQE (worker.c) */
	int idle_stepping;            /* worker only: a held ring had a step open when they went quiet */
	uint64_t idle_spin_ns;        /* worker only: how long it spins from idle_from_ns on */
	unsigned spin_us;
	unsigned gather_us;           /* longest wait for a lockstep batch to fill */
	int coalesce;
	struct pkv_daemon *d;
	/* scratch for merged batches (worker thread only) */
	uint8_t *scratch;
	size_t scratch_len;
	uint64_t batches, merged_items, slices;
	uint64_t slice_ns;            /* attend_slice_us */
	uid_t last_lead_uid;          /* uid whose SQE led the last sweep (round robin per uid) */
	int claimed;                  /* the held rings' clients claim every CPU (their hints; one uid only) */
	uid_t last_big_uid;           /* uid of the last slice run (round robin per uid) */
	uint64_t last_short_ns;       /* when the last batch of short attends ran */
};

/*
 * Doorbell reads in one tick that may find no SQE before the doorbell waits
 * for the next tick. A client rings once per SQE it submits while we sleep,
 * and a read finds nothing only after a race with the sweep or once after
 * the worker hands the ring back (the count it left unread): a few a
 * second. A doorbell read that completes for nothing again and again is
 * one rung for nothing, e.g. an EFD_SEMAPHORE eventfd written once with a
 * huge count, whose every 8-byte read takes 1 and completes at once: 5.5 M
 * reads in 4 s, a core held for as long as that client stayed connected.
 */
#define EMPTY_BELLS_PER_TICK 64u

int worker_start(struct pkv_daemon *d);
void worker_stop(struct pkv_daemon *d);
void worker_push(struct pkv_daemon *d, struct job *j);
/* Wakes the worker, now or at its next sleep (a ring it owns hung up, or rang the loop's doorbell read). Never blocks. */
void worker_kick(struct pkv_daemon *d);
/* Query-key pairs times the head width of a step's attend: what its time grows with (set once per step). */
double worker_attend_units(const struct pool *p, const struct pkv_step_meta *m);
/* The loop, when a second uid connects: undoes a lone uid's hints on the worker thread now. */
void worker_uids_shared(struct pkv_daemon *d);
/* Takes the finished jobs (loop thread). */
struct job *worker_take_done(struct pkv_daemon *d);
void job_free(struct job *j);

/* ---------------------------------------------------------------- daemon */

struct pkv_daemon {
	struct pkv_config cfg;
	struct io_uring ring;
	int listen_fd, signal_fd, wake_fd, lock_fd;
	int activated;                /* the listening socket came from systemd (LISTEN_FDS) */
	char lock_path[sizeof(((struct pkv_config *)0)->socket_path) + 8];
	struct watch w_signal, w_wake, w_timer;
	uint64_t wake_buf;
	struct __kernel_timespec tick;
	int loop_sleeping;            /* shared with the worker: ring wake_fd when set */
	uint32_t cpu1;                /* loop: CPU + 1 of the current sweep (ring CPU hint) */
	int stopping;
	struct session *sessions;
	uint32_t next_id;
	uint32_t n_sessions;
	struct pool *pools;
	uint64_t budget_used;
	struct tenant *tenants;       /* per-uid records (loop thread only) */
	/*
	 * Uids with a client connection past its hello (written by the loop,
	 * read by the worker): while more than one is, no client's spin hints
	 * decide how the worker is scheduled (worker.c, one_uid). Control
	 * connections (pagedkvctl) run no attend and do not count.
	 */
	uint32_t uids_connected;
	struct pkv_host *host;
	struct pkv_plugin plug_varlen, plug_decode;
	int same_plugin;
	struct worker worker;
	/*
	 * Held around every backend call: the ABI promises a plugin context is
	 * never entered twice at once, and pool creation (cache_alloc, in the
	 * loop) may coincide with an attend on the worker. The loop takes it
	 * only when a pool is created or freed (backend_lock_loop), and the
	 * worker holds it at most a slice or one piece of copies at a time.
	 */
	pthread_mutex_t backend_mu;
	uint32_t backend_wanted;      /* the loop waits for backend_mu: the worker lets it in before its next call */
	struct acceptor acceptor;
	gid_t admin_gid;              /* admin_group, resolved at start */
	int have_admin_gid;
};

/* Session lifecycle (loop thread). */
struct session *session_new(struct pkv_daemon *d, int sock);
void session_hangup(struct pkv_daemon *d, struct session *s);
/* Frees what can be freed; returns 1 when the session is gone. */
int session_maybe_free(struct pkv_daemon *d, struct session *s);
/* Handles one control message. */
void session_ctl_message(struct pkv_daemon *d, struct session *s);
/* Hangs s up, with the reason logged, when its shared memory faulted (sigbus.c); returns 1 then. */
int session_faulted(struct pkv_daemon *d, struct session *s);
/* Consumes SQEs; returns how many were handled. */
int session_process(struct pkv_daemon *d, struct session *s);
/*
 * Checks, limits and executes one SQE of s, as its ring's owner, with
 * s->pool->cache_mu held when s is attached: the loop's path for every
 * opcode and the worker's for the step opcodes. max_step (0: any) is the
 * most new tokens a step may carry on the caller's thread: a larger
 * STEP_BEGIN/END/ABORT returns SESSION_NOT_HERE having changed nothing.
 * Otherwise the completion's result (0, a count, or -errno with the
 * session's error text set) and its payload, or SESSION_LATER when it
 * completes later. A STEP_BEGIN that succeeded may leave copies
 * (s->meta.num_copies) for the caller to run before any attend of the step.
 * Neither value is a result any opcode completes with (a count of 1 or 2
 * blocks is: a PIN of one block once hung its client).
 */
#define SESSION_LATER INT32_MAX
#define SESSION_NOT_HERE (INT32_MAX - 1)
int session_exec(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e, uint32_t max_step,
		 uint64_t *p0, uint64_t *p1);
/*
 * The most new tokens a step boundary may carry to run on the worker: a
 * decode step or a short chunk. Its cost grows with them (the token copy,
 * the slot mapping, the commit's block keys), and every client's attends
 * wait while it runs; a longer one goes to the loop, whose turn budget
 * bounds it there.
 */
#define WORKER_STEP_TOKENS 256

/* Whether e is a step boundary (STEP_BEGIN, STEP_END, STEP_ABORT) the worker may run for s. */
int session_step_on_worker(const struct session *s, const struct pkv_sqe *e);
/* Bytes of shared regions the uid's connections have mapped (for per-uid quotas). */
int session_post(struct session *s, uint64_t ud, int32_t res, uint64_t p0, uint64_t p1);
/* Free CQ entries (< 0: corrupted indices), read under cq_lock: the worker may be posting. Any thread. */
int64_t session_cq_space(struct session *s);
void session_set_err(struct session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void session_release(struct pkv_daemon *d, struct session *s);

/* Administrative commands (pagedkvctl) as asked by `who`: output in a malloc'd buffer; returns status. */
int ctl_run(struct pkv_daemon *d, const struct session *who, uint32_t cmd, uint32_t format, char **out,
	    size_t *len);
/* Resolves admin_group (startup). */
int ctl_init(struct pkv_daemon *d);
/* Root, the daemon's uid, or a member of admin_group (by the kernel's credentials of the socket). */
int ctl_peer_is_admin(const struct pkv_daemon *d, int sock, uid_t uid);
/* Daemon-wide audit: returns problems found, text appended to buf. */

int loop_run(struct pkv_daemon *d);
/* Waits (bounded) for the worker to hand back the rings of hung-up connections, and releases them (ctl). */
void loop_settle_releases(struct pkv_daemon *d);
/* main.c: SIGHUP's re-read of the config file and flags (called on the loop thread). */
int daemon_reload(struct pkv_daemon *d);
/* Raises the descriptor limit and takes the reserve descriptor (before listening). */
void loop_setup_fds(struct pkv_daemon *d);
void loop_arm_session(struct pkv_daemon *d, struct session *s);
int loop_over_uid_limit(const struct pkv_daemon *d, const struct session *s, char *why, size_t why_len);


#endif
