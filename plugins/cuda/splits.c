/* SPDX-License-Identifier: MIT */
/* How many KV splits a CUDA attention launch uses: host arithmetic, shared by the plugin, the fake-runtime tests and the bench. */
#include <stdint.h>
#include "pkv_cuda.h"
#include "pkv_cuda_kernels.h"

int pkv_cuda_choose_splits(int num_sms, int shape, int forced, int32_t num_seqs, int32_t num_kv_heads,
			   int32_t group, int32_t max_q, int32_t max_k, int32_t total_q, int32_t num_heads,
			   int32_t head_dim)
{
	const uint64_t max_split_bytes = (uint64_t)256 << 20, max_splits = 128;
	const uint64_t rows = (uint64_t)pkv_cuda_rows_per_cta(shape, head_dim);
	const uint64_t kpt = (uint64_t)pkv_cuda_keys_per_tile(shape);
	const uint64_t mt = ((uint64_t)max_q * group + rows - 1) / rows;
	const uint64_t ctas = (uint64_t)num_seqs * num_kv_heads * (mt ? mt : 1);
	const uint64_t tiles = ((uint64_t)max_k + kpt - 1) / kpt;
	const uint64_t per_split = (uint64_t)total_q * num_heads * (head_dim + 1) * sizeof(float);
	/* Decode CTAs are one warp: several fit on a multiprocessor, so aim higher. */
	const uint64_t target = (uint64_t)num_sms * (shape == PKV_CUDA_SHAPE_DECODE ? 8 : 2);
	uint64_t n = ctas >= target ? 1 : (target + ctas - 1) / ctas;

	if (forced > 0)
		n = (uint64_t)forced;
	if (n > max_splits)
		n = max_splits;
	if (n > tiles / 2)
		n = tiles / 2; /* at least two tiles per split, or splitting costs more than it saves */
	while (n > 1 && per_split * n > max_split_bytes)
		n /= 2;
	return n < 1 ? 1 : (int)n;
}
