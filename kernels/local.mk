# SPDX-License-Identifier: MIT
# kernels: the CUDA kernels and the host code both CUDA plugins share; built only when configure finds nvcc.

KERNELS_CU = kernels/attn_f16.cu kernels/attn_bf16.cu kernels/util.cu
KERNELS_CU_DEPS = kernels/attn_kernel.cuh kernels/attn_precise.cuh kernels/pkv_cuda_kernels.h include/pagedkv/types.h
# Sources and scripts are distributed whether or not this build compiles them.
EXTRA_DIST += $(KERNELS_CU) kernels/attn_kernel.cuh kernels/nvcc-lt kernels/gpu-check.sh \
	kernels/cuda_bench.c kernels/NOTES.md kernels/conformance-cuda.sh \
	kernels/conformance-cuda-varlen kernels/conformance-cuda-decode
noinst_HEADERS += kernels/pkv_cuda_kernels.h kernels/cuda_backend.h

# The kernel on a CPU emulation of its warp primitives: runs in every build, GPU or not, nvcc or not.
EXTRA_DIST += kernels/cuda_emu.h kernels/emu_launch.h kernels/emulate.cpp kernels/emulate-check \
	kernels/emu_plugin.cpp kernels/emulate-selftest kernels/cuda_selftest.c kernels/fake_cudart.cpp \
	kernels/attn_precise.cuh kernels/emulate-plugins kernels/emulate-hostile kernels/hostile_batches.c
TESTS += kernels/emulate-check kernels/emulate-selftest kernels/emulate-plugins kernels/emulate-hostile
CLEANFILES += kernels/emulate kernels/pkv_cuda_emu.so kernels/cuda-selftest-emu
# kernels/emulate-plugins builds into kernels/fake-*
clean-local: clean-local-kernels-fake
clean-local-kernels-fake:
	-rm -rf kernels/fake-selftest kernels/fake-hostile
.PHONY: clean-local-kernels-fake

if HAVE_CUDA
NVCC_LT = $(SHELL) $(srcdir)/kernels/nvcc-lt "$(NVCC)"
NVCC_LT_FLAGS = -I$(top_srcdir)/include -I$(top_srcdir)/kernels $(NVCCFLAGS)

# Kernels + shared host code as one libtool convenience library, linked whole into each plugin.
noinst_LTLIBRARIES += kernels/libpkvcuda.la
kernels_libpkvcuda_la_SOURCES = kernels/cuda_backend.c
kernels_libpkvcuda_la_CPPFLAGS = $(AM_CPPFLAGS) -isystem $(CUDA_PREFIX)/include
kernels_libpkvcuda_la_LIBADD = kernels/attn_f16.lo kernels/attn_bf16.lo kernels/util.lo
EXTRA_kernels_libpkvcuda_la_DEPENDENCIES = kernels/attn_f16.lo kernels/attn_bf16.lo kernels/util.lo
# Whatever links the kernels needs the CUDA runtime and the C++ runtime of nvcc's host code.
PKV_CUDA_LINK = $(CUDA_LIBS) -lstdc++
PKV_CUDA_RPATH = -R $(CUDA_PREFIX)/lib64

kernels/attn_f16.lo: kernels/attn_f16.cu $(KERNELS_CU_DEPS)
	$(AM_V_GEN)$(NVCC_LT) $@ $(srcdir)/kernels/attn_f16.cu $(NVCC_LT_FLAGS)
kernels/attn_bf16.lo: kernels/attn_bf16.cu $(KERNELS_CU_DEPS)
	$(AM_V_GEN)$(NVCC_LT) $@ $(srcdir)/kernels/attn_bf16.cu $(NVCC_LT_FLAGS)
kernels/util.lo: kernels/util.cu $(KERNELS_CU_DEPS)
	$(AM_V_GEN)$(NVCC_LT) $@ $(srcdir)/kernels/util.cu $(NVCC_LT_FLAGS)

# Loads both plugins through the ABI and checks they refuse cleanly without a GPU (or start with one).
check_PROGRAMS += kernels/test-cuda-plugins
TESTS += kernels/test-cuda-plugins
kernels_test_cuda_plugins_SOURCES = kernels/test_cuda_plugins.c
kernels_test_cuda_plugins_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
kernels_test_cuda_plugins_LDADD = src/loader/libpkvloader.la $(CHECK_LIBS)

# The GPU self-test: random paged batches against an f64 reference. Exits 77 (SKIP) without a GPU.
check_PROGRAMS += kernels/cuda-selftest
TESTS += kernels/cuda-selftest
kernels_cuda_selftest_SOURCES = kernels/cuda_selftest.c
kernels_cuda_selftest_LDADD = $(LIBM)

# The backends issue's conformance suite on both CUDA plugins (SKIP without a GPU).
TESTS += kernels/conformance-cuda-varlen kernels/conformance-cuda-decode
endif
