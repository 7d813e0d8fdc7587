# SPDX-License-Identifier: MIT
# plugins/varlen: the CUDA varlen backend (batches with prefill), pkv_cuda_varlen.so; needs nvcc.
if HAVE_CUDA
pkglib_LTLIBRARIES += plugins/varlen/pkv_cuda_varlen.la
plugins_varlen_pkv_cuda_varlen_la_SOURCES = plugins/varlen/varlen.c
plugins_varlen_pkv_cuda_varlen_la_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/kernels
plugins_varlen_pkv_cuda_varlen_la_LDFLAGS = -module -avoid-version -shared \
	-export-symbols-regex '^pkv_backend_enum$$' $(PKV_CUDA_RPATH)
plugins_varlen_pkv_cuda_varlen_la_LIBADD = kernels/libpkvcuda.la $(PKV_CUDA_LINK)
endif
