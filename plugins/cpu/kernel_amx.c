/* SPDX-License-Identifier: MIT */
/* The attention kernel compiled for AVX-512+BF16 with AMX tiles for 16-row blocks (chosen at run time). */
#define KERNEL_ISA amx
#define KERNEL_NAME "AVX-512+BF16+AMX"
#define KERNEL_DPBF16 1
#define KERNEL_AMX 1
#include "kernel_impl.h"
