# SPDX-License-Identifier: MIT
# tests/model: GGUF reader (unit + fuzz), kernels, tokenizers, reference model outputs, equality with pagedkv.
noinst_HEADERS += tests/model/modeldir.h

# Test fixtures: a GGUF writer and a random-weight model built with it.
check_LTLIBRARIES += tests/model/libmodelfixtures.la
tests_model_libmodelfixtures_la_SOURCES = tests/model/gguf_write.c tests/model/randmodel.c tests/model/model_logits.c
noinst_HEADERS += tests/model/gguf_write.h tests/model/randmodel.h tests/model/model_logits.h

MODEL_TEST_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
MODEL_TEST_LIBS = tests/model/libmodelfixtures.la examples/llama/libpkvmodel.la tests/daemon/libpkvtestlaunch.la \
	$(CHECK_LIBS)

check_PROGRAMS += tests/model/test_stories
TESTS += tests/model/test_stories
tests_model_test_stories_SOURCES = tests/model/test_stories.c
tests_model_test_stories_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_stories_LDADD = $(MODEL_TEST_LIBS)

check_PROGRAMS += tests/model/test_session_attn
TESTS += tests/model/test_session_attn
tests_model_test_session_attn_SOURCES = tests/model/test_session_attn.c
tests_model_test_session_attn_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_session_attn_LDADD = $(MODEL_TEST_LIBS)

noinst_HEADERS += tests/model/fixtures.h tests/model/daemon.h tests/model/refdata.h

check_PROGRAMS += tests/model/test_gguf
TESTS += tests/model/test_gguf
tests_model_test_gguf_SOURCES = tests/model/test_gguf.c
tests_model_test_gguf_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_gguf_LDADD = $(MODEL_TEST_LIBS)
check_PROGRAMS += tests/model/test_tok_hostile
TESTS += tests/model/test_tok_hostile
tests_model_test_tok_hostile_SOURCES = tests/model/test_tok_hostile.c
tests_model_test_tok_hostile_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_tok_hostile_LDADD = $(MODEL_TEST_LIBS)

# Fuzz target + standalone driver; `clang -fsanitize=fuzzer tests/model/fuzz_gguf.c examples/llama/*.c` also works.
check_PROGRAMS += tests/model/fuzz_gguf
TESTS += tests/model/fuzz_gguf
tests_model_fuzz_gguf_SOURCES = tests/model/fuzz_gguf.c tests/model/fuzz_gguf_seeds.c tests/fuzz_driver.c \
	tests/fuzz_driver.h
tests_model_fuzz_gguf_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/tests
tests_model_fuzz_gguf_LDADD = tests/model/libmodelfixtures.la examples/llama/libpkvmodel.la

check_PROGRAMS += tests/model/test_quant
TESTS += tests/model/test_quant
tests_model_test_quant_SOURCES = tests/model/test_quant.c
tests_model_test_quant_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_quant_LDADD = $(MODEL_TEST_LIBS) $(LIBM)

# The 5-bit and K-quant formats against independent references (ref_quant_k.h), and their conversion.
check_PROGRAMS += tests/model/test_quant_k
TESTS += tests/model/test_quant_k
tests_model_test_quant_k_SOURCES = tests/model/test_quant_k.c
tests_model_test_quant_k_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_quant_k_LDADD = $(MODEL_TEST_LIBS) $(LIBM)
noinst_HEADERS += tests/model/ref_quant_k.h

# Random-weight models in those formats: converted at load, logits against the converted and f32 models.
check_PROGRAMS += tests/model/test_rope_scaling
TESTS += tests/model/test_rope_scaling
tests_model_test_rope_scaling_SOURCES = tests/model/test_rope_scaling.c
tests_model_test_rope_scaling_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_rope_scaling_LDADD = $(MODEL_TEST_LIBS) $(LIBM)
check_PROGRAMS += tests/model/test_kquant_model
TESTS += tests/model/test_kquant_model
tests_model_test_kquant_model_SOURCES = tests/model/test_kquant_model.c
tests_model_test_kquant_model_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_kquant_model_LDADD = $(MODEL_TEST_LIBS) $(LIBM)

check_PROGRAMS += tests/model/test_q8act
TESTS += tests/model/test_q8act
tests_model_test_q8act_SOURCES = tests/model/test_q8act.c
tests_model_test_q8act_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_q8act_LDADD = $(MODEL_TEST_LIBS) $(LIBM)

check_PROGRAMS += tests/model/test_q8agree
TESTS += tests/model/test_q8agree
tests_model_test_q8agree_SOURCES = tests/model/test_q8agree.c
tests_model_test_q8agree_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_q8agree_LDADD = $(MODEL_TEST_LIBS)

check_PROGRAMS += tests/model/test_attn_ref
TESTS += tests/model/test_attn_ref
tests_model_test_attn_ref_SOURCES = tests/model/test_attn_ref.c
tests_model_test_attn_ref_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_attn_ref_LDADD = $(MODEL_TEST_LIBS) $(LIBM)

check_PROGRAMS += tests/model/test_peer_json
TESTS += tests/model/test_peer_json
tests_model_test_peer_json_SOURCES = tests/model/test_peer_json.c src/tools/bench_peer.c
tests_model_test_peer_json_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_peer_json_LDADD = $(CHECK_LIBS)

check_PROGRAMS += tests/model/test_equality
TESTS += tests/model/test_equality
tests_model_test_equality_SOURCES = tests/model/test_equality.c
tests_model_test_equality_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_equality_LDADD = $(MODEL_TEST_LIBS) $(LIBM)

# SmolLM2 end to end: runs when scripts/fetch-model has cached the model (or PKV_SMOLLM2_MODEL names it).
check_PROGRAMS += tests/model/test_smollm
TESTS += tests/model/test_smollm
tests_model_test_smollm_SOURCES = tests/model/test_smollm.c
tests_model_test_smollm_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_smollm_LDADD = $(MODEL_TEST_LIBS)

check_PROGRAMS += tests/model/test_engine
TESTS += tests/model/test_engine
tests_model_test_engine_SOURCES = tests/model/test_engine.c
tests_model_test_engine_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_engine_LDADD = $(MODEL_TEST_LIBS)

check_PROGRAMS += tests/model/test_sampler
TESTS += tests/model/test_sampler
tests_model_test_sampler_SOURCES = tests/model/test_sampler.c
tests_model_test_sampler_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_sampler_LDADD = $(MODEL_TEST_LIBS) $(LIBM)

# SmolLM2's tokenizer against ids from Hugging Face `tokenizers` (tests/model/gen_tok_ref.py wrote them).
check_PROGRAMS += tests/model/test_tok_ref
TESTS += tests/model/test_tok_ref
tests_model_test_tok_ref_SOURCES = tests/model/test_tok_ref.c
tests_model_test_tok_ref_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_tok_ref_LDADD = $(MODEL_TEST_LIBS) $(PTHREAD_LIBS)
EXTRA_DIST += tests/model/gen_tok_ref.py tests/data/smollm2_tok_ref.txt

check_PROGRAMS += tests/model/test_penalty
TESTS += tests/model/test_penalty
tests_model_test_penalty_SOURCES = tests/model/test_penalty.c
tests_model_test_penalty_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_penalty_LDADD = $(MODEL_TEST_LIBS)
EXTRA_DIST += tests/data/stories260K.gguf tests/data/README.md

# Byte-level BPE pre-tokenizers against an independent regex engine (tests/model/gen_pretok_ref.py).
check_PROGRAMS += tests/model/test_pretok
TESTS += tests/model/test_pretok
tests_model_test_pretok_SOURCES = tests/model/test_pretok.c
tests_model_test_pretok_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_pretok_LDADD = $(MODEL_TEST_LIBS)
EXTRA_DIST += tests/model/gen_pretok_ref.py tests/data/pretok_ref.txt

# Tokenizers against llama.cpp's tokenizer references (scripts/fetch-vocab caches them; skipped without).
check_PROGRAMS += tests/model/test_vocab_ref
TESTS += tests/model/test_vocab_ref
tests_model_test_vocab_ref_SOURCES = tests/model/test_vocab_ref.c
tests_model_test_vocab_ref_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_vocab_ref_LDADD = $(MODEL_TEST_LIBS)

# Each architecture's forward against llama.cpp's logits on random-weight models (gen_arch_ref.cpp).
check_PROGRAMS += tests/model/test_arch_ref
TESTS += tests/model/test_arch_ref
tests_model_test_arch_ref_SOURCES = tests/model/test_arch_ref.c
tests_model_test_arch_ref_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_arch_ref_LDADD = $(MODEL_TEST_LIBS)
EXTRA_DIST += tests/model/gen_arch_ref.cpp tests/data/arch_logits_ref.txt
