# SPDX-License-Identifier: MIT
# kernels: CUDA device code only (.cu, .cuh and their one header), compiled by nvcc when configure finds it.
KERNELS_CU = kernels/attn_f16.cu kernels/attn_bf16.cu kernels/util.cu
KERNELS_CU_DEPS = kernels/attn_kernel.cuh kernels/attn_precise.cuh kernels/pkv_cuda_kernels.h include/pagedkv/types.h
# Sources are distributed whether or not this build compiles them.
EXTRA_DIST += $(KERNELS_CU) kernels/attn_kernel.cuh kernels/attn_precise.cuh build-aux/nvcc-lt
noinst_HEADERS += kernels/pkv_cuda_kernels.h

if HAVE_CUDA
NVCC_LT = $(SHELL) $(srcdir)/build-aux/nvcc-lt "$(NVCC)"
NVCC_LT_FLAGS = -I$(top_srcdir)/include -I$(top_srcdir)/kernels $(NVCCFLAGS)
# The kernel objects the CUDA plugin links, and what linking them needs (CUDA runtime, nvcc's C++ runtime).
PKV_KERNEL_OBJS = kernels/attn_f16.lo kernels/attn_bf16.lo kernels/util.lo
PKV_CUDA_LINK = $(CUDA_LIBS) -lstdc++
PKV_CUDA_RPATH = -R $(CUDA_PREFIX)/lib64

kernels/attn_f16.lo: kernels/attn_f16.cu $(KERNELS_CU_DEPS)
	$(AM_V_GEN)$(NVCC_LT) $@ $(srcdir)/kernels/attn_f16.cu $(NVCC_LT_FLAGS)
kernels/attn_bf16.lo: kernels/attn_bf16.cu $(KERNELS_CU_DEPS)
	$(AM_V_GEN)$(NVCC_LT) $@ $(srcdir)/kernels/attn_bf16.cu $(NVCC_LT_FLAGS)
kernels/util.lo: kernels/util.cu $(KERNELS_CU_DEPS)
	$(AM_V_GEN)$(NVCC_LT) $@ $(srcdir)/kernels/util.cu $(NVCC_LT_FLAGS)
endif
