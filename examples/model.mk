# SPDX-License-Identifier: MIT
# The real model client: GGUF reader, kernels, llama forward, tokenizers, sampling, and the programs.
noinst_LTLIBRARIES += examples/libpkvmodel.la
examples_libpkvmodel_la_SOURCES = \
	examples/gguf.c examples/quant.c examples/quant_x86.c examples/matmul.c \
	examples/threadpool.c examples/attn_ref.c examples/llama.c examples/tokenizer.c \
	examples/sampler.c examples/attn_daemon.c
examples_libpkvmodel_la_CPPFLAGS = $(AM_CPPFLAGS) -DPKV_HAVE_CLIENT
examples_libpkvmodel_la_CFLAGS = $(AM_CFLAGS) $(XXHASH_CFLAGS)
examples_libpkvmodel_la_LIBADD = src/client/libpagedkv.la $(XXHASH_LIBS) $(PTHREAD_LIBS) $(LIBM)
noinst_HEADERS += examples/gguf.h examples/quant.h examples/matmul.h examples/threadpool.h \
	examples/attn.h examples/llama.h examples/tokenizer.h examples/sampler.h
examples_libpkvmodel_la_SOURCES += examples/engine.c examples/session.c examples/gguf_write.c examples/randmodel.c
noinst_HEADERS += examples/engine.h examples/session.h examples/gguf_write.h examples/randmodel.h

bin_PROGRAMS += examples/pkv-generate
examples_pkv_generate_SOURCES = examples/generate.c
examples_pkv_generate_LDADD = examples/libpkvmodel.la

bin_PROGRAMS += examples/pkv-chat
examples_pkv_chat_SOURCES = examples/chat.c
examples_pkv_chat_LDADD = examples/libpkvmodel.la

bin_PROGRAMS += examples/pkv-demo
examples_pkv_demo_SOURCES = examples/demo.c
examples_pkv_demo_LDADD = examples/libpkvmodel.la
