/* SPDX-License-Identifier: MIT */
/* The attention kernel compiled for AVX-512+BF16 (flags in plugins/cpu/local.mk; chosen at run time). */
#define KERNEL_ISA avx512bf16
#define KERNEL_NAME "AVX-512+BF16"
#define KERNEL_DPBF16 1
#include "kernel_impl.h"
