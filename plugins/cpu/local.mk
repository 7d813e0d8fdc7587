# SPDX-License-Identifier: MIT
# plugins/cpu: the CPU attention backend, pkv_cpu.so, exporting only pkv_backend_enum.
#
# The kernel is one source (kernel_impl.h) compiled five times, each in its
# own convenience library with its own -m flags, so only the variant the CPU
# supports ever runs and the module still loads on a CPU without AVX.
#
# No -O level here: automake puts the user's CFLAGS (autoconf's default
# "-g -O2" included) after a target's CFLAGS, so an -O3 here never took
# effect. The kernels are built, measured and tuned at the build's level;
# the hot decode loops keep their accumulators in registers at -O2 through
# #pragma GCC unroll (docs/performance.md, "Why the loop reads at that
# speed": without them GCC 12 kept them in stack arrays, 69-74 % of STREAM
# against 79-88 %).
pkglib_LTLIBRARIES += plugins/cpu/pkv_cpu.la
plugins_cpu_pkv_cpu_la_SOURCES = plugins/cpu/cpu.c plugins/cpu/convert.c plugins/cpu/kernel_generic.c
plugins_cpu_pkv_cpu_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden -Wno-psabi
plugins_cpu_pkv_cpu_la_LDFLAGS = -module -avoid-version -shared -export-symbols-regex '^pkv_backend_enum$$'
plugins_cpu_pkv_cpu_la_LIBADD = $(LIBM)
noinst_HEADERS += plugins/cpu/cpu.h plugins/cpu/kernel_impl.h

if PKV_X86_64
noinst_LTLIBRARIES += plugins/cpu/libkern_avx2.la plugins/cpu/libkern_avx512.la plugins/cpu/libkern_avx512bf16.la \
	plugins/cpu/libkern_amx.la
plugins_cpu_libkern_avx2_la_SOURCES = plugins/cpu/kernel_avx2.c
plugins_cpu_libkern_avx2_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden -Wno-psabi -mavx2 -mfma -mf16c
plugins_cpu_libkern_avx512_la_SOURCES = plugins/cpu/kernel_avx512.c
plugins_cpu_libkern_avx512_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden -Wno-psabi -mavx2 -mfma -mf16c \
	-mavx512f -mavx512bw -mavx512vl -mavx512dq -mprefer-vector-width=512
plugins_cpu_libkern_avx512bf16_la_SOURCES = plugins/cpu/kernel_avx512bf16.c
plugins_cpu_libkern_avx512bf16_la_CFLAGS = $(plugins_cpu_libkern_avx512_la_CFLAGS) -mavx512bf16
plugins_cpu_libkern_amx_la_SOURCES = plugins/cpu/kernel_amx.c
plugins_cpu_libkern_amx_la_CFLAGS = $(plugins_cpu_libkern_avx512bf16_la_CFLAGS) -mamx-tile -mamx-bf16
plugins_cpu_pkv_cpu_la_LIBADD += plugins/cpu/libkern_avx2.la plugins/cpu/libkern_avx512.la \
	plugins/cpu/libkern_avx512bf16.la plugins/cpu/libkern_amx.la
endif
