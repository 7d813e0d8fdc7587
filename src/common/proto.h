/* SPDX-License-Identifier: MIT */
/* The client <-> daemon protocol: control messages, the shared region's header, SQEs and CQEs. */
#ifndef PKV_PROTO_H
#define PKV_PROTO_H

/*
 * Everything here crosses a process boundary, so every struct has a fixed
 * size and explicit padding (static_asserts below) and every field is read
 * by the daemon as hostile input. Bump PKV_PROTO_VERSION on any change.
 */

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <pagedkv/types.h>

#define PKV_PROTO_VERSION 3u /* 3: client attention (pool memory at attach, step tables); 2: futex wake-ups */
#define PKV_SHM_MAGIC 0x564b4450u /* "PDKV" little-endian */

/* ---------------------------------------------------------------- control socket */

enum pkv_msg_type {
	PKV_MSG_HELLO = 1,  /* C->D first message; a client passes 2 fds: memfd, SQ doorbell (eventfd) */
	PKV_MSG_ATTACH = 2, /* C->D attach to (or create) a pool */
	PKV_MSG_CTL = 3,    /* C->D an administrative command (pagedkvctl) */
	PKV_MSG_REPLY = 4,  /* D->C answer to any of the above */
};

enum pkv_role {
	PKV_ROLE_CLIENT = 1, /* a libpagedkv connection with a shared region */
	PKV_ROLE_CTL = 2,    /* pagedkvctl: control messages only, no fds */
};

struct pkv_msg_hdr {
	uint32_t type;
	uint32_t size; /* of the whole message, header included */
};

struct pkv_msg_hello {
	struct pkv_msg_hdr hdr;
	uint32_t version;     /* PKV_PROTO_VERSION */
	uint32_t role;        /* enum pkv_role */
	uint64_t region_size; /* bytes of the memfd; the daemon checks it with fstat */
};

/* Pool flags on the wire; equal to pagedkv.h's PKV_POOL_* (checked in the client). */
#define PKV_WIRE_POOL_SHARED (1u << 0)
/*
 * The pool's KV memory is a memfd the daemon maps into its owner's clients,
 * which run the attention of their steps themselves (DESIGN §8, "Attention
 * in the client"). Private pools of a host-memory backend only.
 */
#define PKV_WIRE_POOL_CLIENT_ATTN (1u << 1)

#define PKV_NAME_MAX 64
#define PKV_SALT_MAX 64

struct pkv_msg_attach {
	struct pkv_msg_hdr hdr;
	uint64_t model_id;
	struct pkv_geometry geo;
	uint32_t act_dtype;
	uint32_t flags;         /* PKV_POOL_* of pagedkv.h */
	float scale, softcap;
	int32_t window_left;
	uint32_t salt_len;
	char name[PKV_NAME_MAX];  /* NUL-terminated */
	uint8_t salt[PKV_SALT_MAX];
	uint32_t reserved0;
};

enum pkv_ctl_cmd { PKV_CTL_STATUS = 1, PKV_CTL_AUDIT, PKV_CTL_FLUSH, PKV_CTL_METRICS, PKV_CTL_FLUSH_DISK };
enum pkv_ctl_format { PKV_FMT_TEXT = 0, PKV_FMT_JSON = 1, PKV_FMT_PROM = 2 };

struct pkv_msg_ctl {
	struct pkv_msg_hdr hdr;
	uint32_t cmd;    /* enum pkv_ctl_cmd */
	uint32_t format; /* enum pkv_ctl_format */
};

#define PKV_REPLY_MORE 1u /* another reply message follows (older daemons' long ctl output) */
/*
 * The output is in a sealed memfd passed with this reply (SCM_RIGHTS), value
 * bytes long; the text is empty. Used when it does not fit one message, so
 * any size arrives whole, in one message the daemon can always send.
 */
#define PKV_REPLY_FD 2u
#define PKV_REPLY_TEXT_MAX 4000
/*
 * Attach reply of a PKV_WIRE_POOL_CLIENT_ATTN pool: the pool's KV memory is
 * passed with it (SCM_RIGHTS; a memfd sealed against resizing and further
 * seals), value = its bytes, laid out as pkv_shared_cache_layout() says
 * (loader.h); the text holds a struct pkv_wire_pool_mem.
 */
#define PKV_REPLY_POOL_MEM 4u

/* Which backends serve the pool: the client loads the same files from its own plugin directory. */
struct pkv_wire_pool_mem {
	char varlen_file[PKV_NAME_MAX];    /* file name, no '/': "pkv_cpu.so" */
	char varlen_backend[PKV_NAME_MAX]; /* backend name within it: "cpu" */
	char decode_file[PKV_NAME_MAX];
	char decode_backend[PKV_NAME_MAX];
};

struct pkv_msg_reply {
	struct pkv_msg_hdr hdr;
	int32_t status;   /* 0 or -errno */
	uint32_t flags;   /* PKV_REPLY_* */
	uint64_t value;   /* request-specific (hello: connection id) */
	char text[PKV_REPLY_TEXT_MAX]; /* message or output; size says how much is used */
};

#define PKV_REPLY_HDR_SIZE offsetof(struct pkv_msg_reply, text)
#define PKV_MSG_MAX sizeof(struct pkv_msg_reply)

/* ---------------------------------------------------------------- shared region */

/*
 * The client lays the region out and writes this header at offset 0; the
 * daemon copies it once at hello, validates it, and afterwards uses only
 * its copy. Offsets are from the start of the region; readers never assume
 * a layout from sizeof.
 */
struct pkv_shm_hdr {
	uint32_t magic;           /* PKV_SHM_MAGIC */
	uint32_t version;         /* PKV_PROTO_VERSION */
	uint32_t hdr_size;        /* sizeof(struct pkv_shm_hdr) of the writer */
	uint32_t features;        /* PKV_FEATURE_*: none defined yet, must be 0 */
	uint64_t region_size;
	uint32_t sq_entries, cq_entries;   /* powers of two */
	uint32_t sqe_size, cqe_size;
	uint32_t ring_head_off, ring_tail_off, ring_flags_off; /* inside a ring control block */
	uint32_t err_len;                  /* bytes at err_off */
	uint64_t sq_ring_off, sq_sqes_off; /* SQ control block, SQ entries */
	uint64_t cq_ring_off, cq_cqes_off;
	uint64_t err_off;          /* daemon writes the reason of the last error CQE here */
	uint64_t arena_off, arena_size;
	uint64_t reserved[8];      /* zero */
};

/* Layout of a ring control block: each index on its own cache line. */
#define PKV_RING_HEAD_OFF 0u   /* consumer-owned */
#define PKV_RING_TAIL_OFF 64u  /* producer-owned */
#define PKV_RING_FLAGS_OFF 128u /* consumer-owned: PKV_RING_NEED_WAKEUP */
/* consumer-owned, the word after flags: the CPU it polls from + 1 (a spin hint, see ring.h) */
#define PKV_RING_CPU_OFF (PKV_RING_FLAGS_OFF + 4u)
/*
 * producer-owned, two words after flags: the consumer's wake word, a futex.
 * The producer bumps it and FUTEX_WAKEs after publishing when the consumer
 * set PKV_RING_NEED_WAKEUP; the consumer FUTEX_WAITs on it. Used on the CQ:
 * a futex wake can never block the daemon, whatever the client does to its
 * side (an eventfd's file description is shared and can be made blocking).
 */
#define PKV_RING_WAKE_OFF (PKV_RING_FLAGS_OFF + 8u)
/*
 * consumer-owned, three words after flags: how many threads the consumer
 * computes on between its polls (a spin hint, see ring.h). On the CQ: the
 * client's pkv_connect_opts.compute_threads.
 */
#define PKV_RING_THREADS_OFF (PKV_RING_FLAGS_OFF + 12u)
#define PKV_RING_CTL_SIZE 192u

/* The consumer is (about to be) asleep: wake it after publishing (SQ eventfd, CQ futex). */
#define PKV_RING_NEED_WAKEUP 1u

#define PKV_RING_MAX_ENTRIES 4096u
#define PKV_ERR_LEN 256u

/* ---------------------------------------------------------------- ring entries */

enum pkv_op {
	PKV_OP_NOP = 0,
	PKV_OP_SEQ_OPEN = 1,     /* off[0]: int32 tokens[n] -> payload {seq, n_cached} */
	PKV_OP_SEQ_FORK = 2,     /* seq -> payload {child} */
	PKV_OP_SEQ_TRUNCATE = 3, /* seq, n = new length */
	PKV_OP_SEQ_CLOSE = 4,    /* seq */
	PKV_OP_STEP_BEGIN = 5,   /* n = n_seqs; off[0]: u32 seqs[n], off[1]: u32 n_new[n], off[2]: int32 tokens[] */
	PKV_OP_ATTEND = 6,       /* layer; off[0..3]: Q, K, V, O */
	PKV_OP_STEP_END = 7,
	PKV_OP_STEP_ABORT = 8,
	PKV_OP_PIN = 9,          /* off[0]: int32 tokens[n] -> res = tokens pinned */
	PKV_OP_UNPIN = 10,
	PKV_OP_STATS = 11,       /* off[0]: struct pkv_wire_stats written by the daemon */
	PKV_OP_COUNT
};

/* SEQ_OPEN: find only committed prefixes and claim nothing (in-flight sharing off for this open). */
#define PKV_SQE_OPEN_SETTLED (1u << 0)
/*
 * STEP_BEGIN in a PKV_WIRE_POOL_CLIENT_ATTN pool: the client attends this
 * step itself. The daemon writes the step's tables (struct pkv_wire_step and
 * the arrays after it) at off[3], at most aux bytes, and counts every layer
 * as attended. When they do not fit, the begin fails with -ENOBUFS, nothing
 * reserved, payload[0] = the bytes they need.
 */
#define PKV_SQE_STEP_TABLES (1u << 0)

struct pkv_sqe {
	uint8_t opcode;   /* enum pkv_op */
	uint8_t flags;    /* PKV_SQE_* of its opcode; others must be 0 */
	uint16_t reserved0;
	uint32_t layer;
	uint64_t user_data; /* echoed in the CQE */
	uint32_t seq;
	uint32_t n;
	uint64_t off[4];  /* arena offsets */
	uint64_t aux;     /* STEP_BEGIN with PKV_SQE_STEP_TABLES: bytes at off[3]; else 0 */
};

struct pkv_cqe {
	uint64_t user_data;
	int32_t res;      /* 0/count or -errno */
	uint32_t flags;
	uint64_t payload[2];
};

/* What PKV_OP_STATS writes into the arena. */
struct pkv_wire_stats {
	uint32_t num_blocks, free_blocks, cached_blocks, in_use_blocks;
	uint32_t open_seqs, reserved0;
	uint64_t prefix_lookup_tokens, prefix_hit_tokens;
};

/*
 * The tables of a step a client attends itself, at STEP_BEGIN's off[3]: this
 * header, then int32 cu_seq_lens_q[num_seqs + 1], cu_seq_lens_k[num_seqs + 1],
 * cache_seqlens[num_seqs], block_tables[num_seqs * max_blocks_per_seq], and
 * at the next 8-byte boundary int64 slot_mapping[total_q]: backend.h's
 * pkv_attn_batch fields, at the offsets pkv_wire_step_layout gives.
 */
struct pkv_wire_step {
	uint32_t num_seqs, total_q;
	uint32_t max_length_q, max_length_k;
	uint32_t max_blocks_per_seq, reserved0;
};

struct pkv_wire_step_offs {
	uint64_t cu_q, cu_k, seqlens, tables, slots, total;
};

/* Byte offsets of a step's arrays from the header's start; 0 when they would pass 2^40 bytes. */
static inline uint64_t pkv_wire_step_layout(uint64_t num_seqs, uint64_t max_blocks, uint64_t total_q,
					    struct pkv_wire_step_offs *o)
{
	if (num_seqs > (1u << 24) || max_blocks > (1u << 24) || total_q > (1u << 30))
		return 0;
	o->cu_q = sizeof(struct pkv_wire_step);
	o->cu_k = o->cu_q + 4 * (num_seqs + 1);
	o->seqlens = o->cu_k + 4 * (num_seqs + 1);
	o->tables = o->seqlens + 4 * num_seqs;
	o->slots = (o->tables + 4 * num_seqs * max_blocks + 7) & ~7ull;
	o->total = o->slots + 8 * total_q;
	return o->total;
}

static_assert(sizeof(struct pkv_sqe) == 64, "SQE is ABI");
static_assert(sizeof(struct pkv_cqe) == 32, "CQE is ABI");
static_assert(sizeof(struct pkv_shm_hdr) == 176, "region header is ABI");
static_assert(sizeof(struct pkv_msg_hello) == 24, "hello is ABI");
static_assert(sizeof(struct pkv_msg_attach) == 200, "attach is ABI");
static_assert(sizeof(struct pkv_wire_stats) == 40, "stats are ABI");
static_assert(sizeof(struct pkv_wire_step) == 24, "step tables are ABI");
static_assert(sizeof(struct pkv_wire_pool_mem) == 4 * PKV_NAME_MAX, "pool memory reply is ABI");

/* Default socket path: $PAGEDKV_SOCKET, else $XDG_RUNTIME_DIR/pagedkv.sock, else /run/pagedkv.sock. */
int pkv_default_socket_path(char *buf, size_t len);

#endif
