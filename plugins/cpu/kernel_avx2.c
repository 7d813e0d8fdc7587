/* SPDX-License-Identifier: MIT */
/* The attention kernel compiled for AVX2+FMA+F16C (flags in plugins/cpu/local.mk; chosen at run time). */
#define KERNEL_ISA avx2
#define KERNEL_NAME "AVX2+FMA+F16C"
#include "kernel_impl.h"
