# SPDX-License-Identifier: MIT
# plugins/cuda: pkv_cuda.so, the CUDA backends "varlen" and "decode" (host code here, kernels in kernels/); needs nvcc.
PKV_CUDA_HOST_SOURCES = plugins/cuda/host.c plugins/cuda/backends.c plugins/cuda/splits.c
noinst_HEADERS += plugins/cuda/pkv_cuda.h
if HAVE_CUDA
pkglib_LTLIBRARIES += plugins/cuda/pkv_cuda.la
plugins_cuda_pkv_cuda_la_SOURCES = $(PKV_CUDA_HOST_SOURCES)
plugins_cuda_pkv_cuda_la_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/kernels -isystem $(CUDA_PREFIX)/include
plugins_cuda_pkv_cuda_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden
plugins_cuda_pkv_cuda_la_LDFLAGS = -module -avoid-version -shared \
	-export-symbols-regex '^pkv_backend_enum$$' $(PKV_CUDA_RPATH)
plugins_cuda_pkv_cuda_la_LIBADD = $(PKV_KERNEL_OBJS) $(PKV_CUDA_LINK)
EXTRA_plugins_cuda_pkv_cuda_la_DEPENDENCIES = $(PKV_KERNEL_OBJS)
else
EXTRA_DIST += $(PKV_CUDA_HOST_SOURCES)
endif
