# SPDX-License-Identifier: MIT
# tests/cuda: the CUDA kernels and the plugin's host code, tested without a GPU (CPU emulation of the warp
# primitives, a fake CUDA runtime) in every build that has a C++20 compiler, and on a GPU when there is one.
EMU_CXXFLAGS = -std=c++20 -O2 -Wall -Wno-unknown-pragmas -Wno-unused-parameter -Wno-missing-field-initializers
EMU_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/kernels -I$(top_srcdir)/tests/cuda
EXTRA_DIST += tests/cuda/cuda_emu.h tests/cuda/emu_launch.h tests/cuda/emulate.cpp tests/cuda/emu_plugin.cpp \
	tests/cuda/fake_cudart.cpp tests/cuda/hostile_batches.c tests/cuda/test_cuda_plugins.c \
	tests/cuda/cuda_bench.c tests/cuda/gpu-check.sh
dist_check_SCRIPTS += tests/cuda/conformance-pair tests/cuda/conformance-emu tests/cuda/conformance-cuda

if HAVE_CUDA_EMU
# The attention kernel itself on the emulation, against an f64 reference (TAP).
check_PROGRAMS += tests/cuda/emulate
TESTS += tests/cuda/emulate
tests_cuda_emulate_SOURCES = tests/cuda/emulate.cpp
tests_cuda_emulate_CPPFLAGS = $(EMU_CPPFLAGS)
tests_cuda_emulate_CXXFLAGS = $(EMU_CXXFLAGS)
tests_cuda_emulate_LDADD = src/conformance/libpkvref.la $(PTHREAD_LIBS)

# The kernel as a host-domain backend (emu_plugin.cpp), checked by pkv-conformance like any plugin.
check_LTLIBRARIES += tests/cuda/pkv_cuda_emu.la
tests_cuda_pkv_cuda_emu_la_SOURCES = tests/cuda/emu_plugin.cpp
tests_cuda_pkv_cuda_emu_la_CPPFLAGS = $(EMU_CPPFLAGS)
tests_cuda_pkv_cuda_emu_la_CXXFLAGS = $(EMU_CXXFLAGS)
tests_cuda_pkv_cuda_emu_la_LDFLAGS = -module -avoid-version -shared -rpath /nowhere
TESTS += tests/cuda/conformance-emu

if HAVE_CUDA_HEADERS
# The shipped host code (plugins/cuda, split heuristic included) on a fake CUDA runtime whose launchers run
# the real kernel template on the emulation: needs the CUDA headers, not a GPU or libcudart.
check_LTLIBRARIES += tests/cuda/pkv_cuda_fake.la
tests_cuda_pkv_cuda_fake_la_SOURCES = $(PKV_CUDA_HOST_SOURCES) tests/cuda/fake_cudart.cpp
tests_cuda_pkv_cuda_fake_la_CPPFLAGS = $(EMU_CPPFLAGS) $(CUDA_HEADERS_CFLAGS)
tests_cuda_pkv_cuda_fake_la_CFLAGS = $(AM_CFLAGS)
tests_cuda_pkv_cuda_fake_la_CXXFLAGS = $(EMU_CXXFLAGS)
tests_cuda_pkv_cuda_fake_la_LDFLAGS = -module -avoid-version -shared -rpath /nowhere
tests_cuda_pkv_cuda_fake_la_LIBADD = $(LIBM)
# Malformed batches and requests are refused and leave the backends usable.
check_PROGRAMS += tests/cuda/hostile_batches
TESTS += tests/cuda/hostile_batches
tests_cuda_hostile_batches_SOURCES = tests/cuda/hostile_batches.c
endif
endif

if HAVE_CUDA
# The real pkv_cuda.so: its one exported symbol, and a clean refusal without a GPU.
check_PROGRAMS += tests/cuda/test_cuda_plugins
TESTS += tests/cuda/test_cuda_plugins
tests_cuda_test_cuda_plugins_SOURCES = tests/cuda/test_cuda_plugins.c
tests_cuda_test_cuda_plugins_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_cuda_test_cuda_plugins_LDADD = src/loader/libpkvloader.la $(CHECK_LIBS)
# pkv-conformance on both backends (SKIP without a GPU).
TESTS += tests/cuda/conformance-cuda
endif
