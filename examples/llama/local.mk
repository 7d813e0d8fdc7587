# SPDX-License-Identifier: MIT
# The real model client: GGUF reader, kernels, llama forward, tokenizers, sampling, and the programs.
noinst_LTLIBRARIES += examples/llama/libpkvmodel.la
examples_llama_libpkvmodel_la_SOURCES = \
	examples/llama/gguf.c examples/llama/quant.c examples/llama/quant_k.c examples/llama/convert.c \
	examples/llama/quant_x86.c examples/llama/matmul.c \
	examples/llama/gemm_vnni.c \
	examples/llama/threadpool.c examples/llama/attn_ref.c examples/llama/llama.c examples/llama/tokenizer.c examples/llama/pretok.c \
	examples/llama/sampler.c examples/llama/attn_daemon.c examples/llama/engine.c examples/llama/session.c \
	examples/llama/opts.c
examples_llama_libpkvmodel_la_CPPFLAGS = $(AM_CPPFLAGS) -DPKV_HAVE_CLIENT
examples_llama_libpkvmodel_la_CFLAGS = $(AM_CFLAGS) $(XXHASH_CFLAGS)
examples_llama_libpkvmodel_la_LIBADD = src/client/libpagedkv.la $(XXHASH_LIBS) $(PTHREAD_LIBS) $(LIBM)
noinst_HEADERS += examples/llama/gguf.h examples/llama/quant.h examples/llama/matmul.h examples/llama/gemm_vnni.h \
	examples/llama/threadpool.h examples/llama/attn.h examples/llama/llama.h examples/llama/tokenizer.h \
	examples/llama/sampler.h examples/llama/engine.h examples/llama/session.h examples/llama/unicode_cats.h examples/llama/opts.h \
	examples/llama/pretok.h examples/llama/utf8.h
EXTRA_DIST += examples/llama/gen_unicode.py

bin_PROGRAMS += examples/llama/pkv-generate
examples_llama_pkv_generate_SOURCES = examples/llama/generate.c
examples_llama_pkv_generate_LDADD = examples/llama/libpkvmodel.la

bin_PROGRAMS += examples/llama/pkv-chat
examples_llama_pkv_chat_SOURCES = examples/llama/chat.c
examples_llama_pkv_chat_LDADD = examples/llama/libpkvmodel.la

bin_PROGRAMS += examples/llama/pkv-demo
examples_llama_pkv_demo_SOURCES = examples/llama/demo.c
examples_llama_pkv_demo_LDADD = examples/llama/libpkvmodel.la
