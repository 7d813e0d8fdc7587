/* SPDX-License-Identifier: MIT */
/* The attention kernel compiled for AVX-512 (flags in plugins/cpu/local.mk; chosen at run time). */
#define KERNEL_ISA avx512
#define KERNEL_NAME "AVX-512"
#include "kernel_impl.h"
