/* SPDX-License-Identifier: MIT */
/* Tokenizers built from GGUF metadata: SentencePiece-style ("llama") and byte-level BPE ("gpt2"). */
#ifndef PKV_EX_TOKENIZER_H
#define PKV_EX_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

enum tok_kind { TOK_SPM = 1, TOK_BPE = 2 };

struct tok_map; /* string -> id / pair -> merge, open addressing */

struct tokenizer {
	int kind;
	uint32_t n_vocab;
	struct gguf_str *text;   /* token strings (into the mapping) */
	float *score;            /* SPM merge priority */
	int32_t *type;           /* 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte */
	struct tok_map *vocab;   /* text -> id */
	struct tok_map *merges;  /* (left id, right id) -> rank and result (BPE) */
	int32_t byte_tok[256];   /* SPM byte fallback <0xXX>, -1 when absent */
	int32_t bos, eos, unk, eot; /* eot: a chat turn's end (<|im_end|>, <|eot_id|>), else eos */
	int add_bos, add_space_prefix;
	int pre;                 /* BPE: enum pretok, how text is split before the merges */
	struct gguf_str chat_template; /* tokenizer.chat_template (Jinja source, into the mapping), or empty */
	int32_t *special;        /* control / user-defined ids, longest text first */
	uint32_t n_special;
};

/* Builds from the model's tokenizer.ggml.* metadata; err receives the reason on failure. */
int tok_load(struct tokenizer *t, const struct gguf *g, char *err, size_t errlen);
void tok_free(struct tokenizer *t);

/*
 * Encodes len bytes of UTF-8 text. add_bos prepends BOS (when the model has one); parse_special
 * turns the literal text of control tokens ("<|im_start|>") into those tokens — only for text the
 * program itself writes (templates), never for user input. *out is malloc'd. Returns count or -errno.
 */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
	       int32_t **out);
/*
 * Encodes a chat template filled with the conversation's text in one piece, as the model's own
 * template code would, with control tokens read only where markup[i] is nonzero (the template's
 * own bytes): a "<|im_end|>" in the system or user text stays text.
 */
int tok_encode_markup(const struct tokenizer *t, const char *text, size_t len, const uint8_t *markup,
		      int32_t **out);

/* Bytes of one token as text (control tokens give "" unless show_special). Returns length. */
size_t tok_piece(const struct tokenizer *t, int32_t id, int show_special, char *buf, size_t cap);
int tok_is_eog(const struct tokenizer *t, int32_t id);

#endif
