# SPDX-License-Identifier: MIT
# plugins/decode: the CUDA decode backend (one query per sequence, split-KV), pkv_cuda_decode.so; needs nvcc.
if HAVE_CUDA
pkglib_LTLIBRARIES += plugins/decode/pkv_cuda_decode.la
plugins_decode_pkv_cuda_decode_la_SOURCES = plugins/decode/decode.c
plugins_decode_pkv_cuda_decode_la_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/kernels
plugins_decode_pkv_cuda_decode_la_LDFLAGS = -module -avoid-version -shared \
	-export-symbols-regex '^pkv_backend_enum$$' $(PKV_CUDA_RPATH)
plugins_decode_pkv_cuda_decode_la_LIBADD = kernels/libpkvcuda.la $(PKV_CUDA_LINK)
endif
