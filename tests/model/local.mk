# SPDX-License-Identifier: MIT
# tests/model: GGUF reader (unit + fuzz), kernels, tokenizers, reference model outputs, equality with pagedkv.
noinst_HEADERS += tests/model/modeldir.h

MODEL_TEST_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
MODEL_TEST_LIBS = examples/libpkvmodel.la $(CHECK_LIBS)

check_PROGRAMS += tests/model/test_stories
TESTS += tests/model/test_stories
tests_model_test_stories_SOURCES = tests/model/test_stories.c
tests_model_test_stories_CFLAGS = $(MODEL_TEST_CFLAGS)
tests_model_test_stories_LDADD = $(MODEL_TEST_LIBS)
