/* SPDX-License-Identifier: MIT */
/* Internal interface of the CPU backend: one call's parameters, work items, scratch, and the ISA kernels. */
#ifndef PKV_CPU_H
#define PKV_CPU_H

#include <stddef.h>
#include <stdint.h>
#include <pagedkv/backend.h>
#include <pagedkv/dtype.h>

/* Keys per tile: scores for a tile are exponentiated together, 2 vectors of 16 per row. */
#define CPU_TK 32
#define CPU_MAX_HD 256

/* What stays constant over one attend call. */
struct cpu_call {
	const struct pkv_attn_batch *b;
	const char *kbase, *vbase;      /* this layer's K and V */
	size_t block_stride, token_stride;
	uint32_t hd, hdp;               /* head dim, padded to a multiple of 16 (scratch rows) */
	uint32_t G;                     /* query heads per KV head */
	uint32_t bs;                    /* block size */
	uint32_t cdt, adt;              /* cache and activation dtypes */
	uint32_t qb;                    /* query rows per work item */
	float scale, softcap;
	int32_t window;                 /* < 0: unbounded */
	float *part;                    /* split partials, part_stride floats each */
	size_t part_stride;
	const uint32_t *seqs;           /* shared-prefix items: the sequences their rows belong to */
	/*
	 * The batch's softmax_lse ([total_q][nh]) when asked for, else NULL:
	 * written only where a row's O is (store_rows, the merges), once per
	 * row and head, never in the tile loops.
	 */
	float *lse;
	uint32_t nh;                    /* query heads: lse's row stride */
};

/*
 * One unit of work: query rows [q0, q0+nq) of sequence seq, all G query heads
 * of KV heads [kvh, kvh+nkvh), against keys [k0, k1). Decode items take every
 * KV head, so a thread streams whole token rows (contiguous) of the cache. part < 0: the item covers every key
 * the rows can see and writes O; else it writes its (m, l, acc) partial into
 * part slot `part` for a later log-sum-exp merge (flash-decoding).
 *
 * CPU_ITEM_SHARED (cascade attention): the item's rows are the decode queries
 * of the sequences seqs[q0, q0+nq) of the call, which all hold the same
 * blocks for keys [k0, k1); seq is the first of them (whose block table is
 * read). Always a partial. CPU_ITEM_SUFFIX: a decode item of such a sequence
 * over its own keys, a partial too; both are merged per sequence
 * (merge_cascade), never by the split merge.
 */
#define CPU_ITEM_SHARED 1u
#define CPU_ITEM_SUFFIX 2u

struct cpu_item {
	uint32_t seq, kvh, nkvh, q0, nq, k0, k1;
	int32_t part;
	uint32_t flags;
};

/* Row qi's query: its token index in Q/O, the sequence it belongs to, and its position among that sequence's queries. */
static inline void cpu_row_query(const struct cpu_call *c, const struct cpu_item *it, uint32_t qi, uint32_t *seq,
				 uint32_t *pos)
{
	if (it->flags & CPU_ITEM_SHARED) {
		*seq = c->seqs[it->q0 + qi];
		*pos = 0;
	} else {
		*seq = it->seq;
		*pos = it->q0 + qi;
	}
}

/*
 * Row r of an item (nq queries x nkvh KV heads x G query heads) is query
 * q0 + qi, query head h; rows of one KV head are contiguous so the tile code
 * can work on them as one group: r = (hh * nq + qi) * G + g.
 */
static inline void cpu_row_map(const struct cpu_call *c, const struct cpu_item *it, uint32_t r,
			       uint32_t *qi, uint32_t *h)
{
	uint32_t g = r % c->G, rest = r / c->G;

	*qi = rest % it->nq;
	*h = (it->kvh + rest / it->nq) * c->G + g;
}

/* Per-thread scratch, sized for rmax = qb * G query vectors of hdp floats. */
struct cpu_scratch {
	uint32_t rmax;
	float *qf;       /* [rmax][hdp] queries in f32 */
	uint16_t *qh;    /* [rmax][CPU_MAX_HD] queries in bf16 (dpbf16 kernel), zero-padded */
	float *kf;       /* [TK][hdp] converted K tile */
	float *vf;       /* [TK][hdp] converted V tile */
	float *kt;       /* [hd][TK] transposed K tile (f32 decode loop, shared-prefix items) */
	float *s;        /* [rmax][TK] scores, then probabilities */
	float *acc;      /* [rmax][hdp] output accumulators */
	float *m, *l;    /* [rmax] running max and sum */
	int32_t *lo, *hi;/* [rmax] visible key range of each row (inclusive) */
	uint32_t pf_carry; /* keys from the start of the item being started that the previous one prefetched */
};

/*
 * Computes one item. next: the item the same thread computes right after it
 * (the next of its run), or NULL; the decode loop prefetches into it while
 * finishing this one, and says how far in sc->pf_carry. A run starts with
 * sc->pf_carry = 0.
 */
typedef void (*cpu_attend_fn)(const struct cpu_call *c, const struct cpu_item *it, const struct cpu_item *next,
			      struct cpu_scratch *sc);

struct cpu_isa {
	const char *name;
	cpu_attend_fn attend;
	uint32_t rows_multiple;  /* rows per KV head in an item should be a multiple of this */
	/* Most rows per KV head the decode loop takes (bf16 cache and queries, head dim % 32 == 0); 0: none. */
	uint32_t dec_rows;
	/*
	 * Most rows in all (every KV head) the f32-query decode loop takes in a
	 * shared-prefix item (f32 queries, any cache, head dim % 32 == 0); 0: none.
	 */
	uint32_t dec_rows_f32;
};

/* The same kernel source compiled for each instruction set (kernel_*.c). */
extern const struct cpu_isa pkv_cpu_isa_generic;
extern const struct cpu_isa pkv_cpu_isa_avx2;
extern const struct cpu_isa pkv_cpu_isa_avx512;
extern const struct cpu_isa pkv_cpu_isa_avx512bf16;
extern const struct cpu_isa pkv_cpu_isa_amx;

/* Exact scalar conversions (round-to-nearest-even, subnormals kept): convert.c. */
/* Converts n elements from one dtype to another (same dtype: copy). */
void pkv_cpu_convert(void *dst, uint32_t dst_dtype, const void *src, uint32_t src_dtype, size_t n);
/* Loads one element as f32. */
static inline float pkv_cpu_load(const void *p, uint32_t dtype, size_t i)
{
	if (dtype == PKV_DTYPE_F32)
		return ((const float *)p)[i];
	if (dtype == PKV_DTYPE_F16)
		return pkv_f16_to_f32(((const uint16_t *)p)[i]);
	return pkv_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* Writes an f32 row of n elements as dtype. */
void pkv_cpu_store_row(void *dst, uint32_t dtype, const float *src, size_t n);

#endif
