/* SPDX-License-Identifier: MIT */
/* Types shared by the client API, the backend ABI and the daemon: dtypes and pool geometry. */
#ifndef PAGEDKV_TYPES_H
#define PAGEDKV_TYPES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of the KV cache and of activations (Q/K/V/O). Values are ABI. */
enum pkv_dtype {
	PKV_DTYPE_F32 = 0,
	PKV_DTYPE_F16 = 1,
	PKV_DTYPE_BF16 = 2,
	PKV_DTYPE_COUNT
};

/* Bit for a dtype in a caps mask. */
#define PKV_DTYPE_BIT(t) (1u << (t))

static inline uint32_t pkv_dtype_size(uint32_t t)
{
	return t == PKV_DTYPE_F32 ? 4 : (t < PKV_DTYPE_COUNT ? 2 : 0);
}

/*
 * One KV cache for one model geometry (DESIGN §2). A block holds block_size
 * tokens of K and V for every layer; block id b names the same slot range in
 * each layer. Slot s = b * block_size + offset.
 */
struct pkv_geometry {
	uint32_t num_layers;
	uint32_t num_heads;    /* query heads */
	uint32_t num_kv_heads; /* divides num_heads (GQA) */
	uint32_t head_dim;
	uint32_t cache_dtype;  /* enum pkv_dtype */
	uint32_t block_size;   /* tokens per block */
	uint32_t num_blocks;
};

#ifdef __cplusplus
}
#endif
#endif
