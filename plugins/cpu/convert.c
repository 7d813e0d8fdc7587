/* SPDX-License-Identifier: MIT */
/* Row conversions between dtypes for the CPU backend, built on <pagedkv/dtype.h>. */
#include <string.h>

#include "cpu.h"

void pkv_cpu_convert(void *dst, uint32_t dst_dtype, const void *src, uint32_t src_dtype, size_t n)
{
	size_t i;

	if (dst_dtype == src_dtype) {
		memcpy(dst, src, n * pkv_dtype_size(src_dtype));
		return;
	}
	for (i = 0; i < n; i++) {
		float v = pkv_cpu_load(src, src_dtype, i);

		if (dst_dtype == PKV_DTYPE_F32)
			((float *)dst)[i] = v;
		else if (dst_dtype == PKV_DTYPE_F16)
			((uint16_t *)dst)[i] = pkv_f32_to_f16(v);
		else
			((uint16_t *)dst)[i] = pkv_f32_to_bf16(v);
	}
}

void pkv_cpu_store_row(void *dst, uint32_t dtype, const float *src, size_t n)
{
	pkv_cpu_convert(dst, dtype, src, PKV_DTYPE_F32, n);
}
