/* SPDX-License-Identifier: MIT */
/* The attention kernel compiled for generic (flags in plugins/cpu/local.mk; chosen at run time). */
#define KERNEL_ISA generic
#define KERNEL_NAME "generic"
#include "kernel_impl.h"
