/* SPDX-License-Identifier: MIT */
/* SentencePiece-style and byte-level BPE tokenizers, driven entirely by the GGUF vocabulary. */
#include "tokenizer.h"
#include "pretok.h"
#include "utf8.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- hash map: key is a byte string or a 64-bit pair, value two int32 ---- */

struct tm_ent {
	const char *s;
	uint32_t len;
	uint64_t pair;
	int32_t a, b;
	int used;
};

struct tok_map {
	struct tm_ent *e;
	size_t mask;
};

static struct tok_map *tm_new(size_t n)
{
	struct tok_map *m = calloc(1, sizeof *m);
	size_t cap = 16;
	while (cap < n * 2)
		cap *= 2;
	if (!m)
		return NULL;
	m->e = calloc(cap, sizeof *m->e);
	if (!m->e) {
		free(m);
		return NULL;
	}
	m->mask = cap - 1;
	return m;
}

static void tm_free(struct tok_map *m)
{
	if (m)
		free(m->e);
	free(m);
}

static struct tm_ent *tm_slot_s(const struct tok_map *m, const char *s, size_t len)
{
	size_t i = XXH3_64bits(s, len) & m->mask;
	while (m->e[i].used && !(m->e[i].len == len && !memcmp(m->e[i].s, s, len)))
		i = (i + 1) & m->mask;
	return &m->e[i];
}

static struct tm_ent *tm_slot_p(const struct tok_map *m, uint64_t pair)
{
	size_t i = XXH3_64bits(&pair, 8) & m->mask;
	while (m->e[i].used && m->e[i].pair != pair)
		i = (i + 1) & m->mask;
	return &m->e[i];
}

static int32_t vocab_get(const struct tokenizer *t, const char *s, size_t len)
{
	struct tm_ent *e = tm_slot_s(t->vocab, s, len);
	return e->used ? e->a : -1;
}

/* ---- GPT-2 byte <-> unicode mapping (printable bytes stand for themselves) ----
 * The 68 other bytes (0-32, 127-160, 173) map in order to U+0100.. A pure function, not a table
 * filled at load time: two models loading in two threads share nothing. */

static uint32_t byte_cp(uint8_t b)
{
	if (b <= 32)
		return 256u + b;
	if (b >= 127 && b <= 160)
		return 256u + 33 + (b - 127u);
	if (b == 173)
		return 256u + 67;
	return b;
}

static int cp_to_byte(uint32_t cp)
{
	if (cp < 256)
		return byte_cp((uint8_t)cp) == cp ? (int)cp : -1;
	if (cp < 256 + 33)
		return (int)(cp - 256);
	if (cp < 256 + 67)
		return (int)(cp - 256 - 33 + 127);
	return cp == 256 + 67 ? 173 : -1;
}

/* ---- loading ---- */

struct special_key {
	uint64_t len;
	int32_t id;
};

static int longest_first(const void *a, const void *b)
{
	const struct special_key *x = a, *y = b;

	if (x->len != y->len)
		return x->len > y->len ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/*
 * Longest text first, so "<|im_start|>" wins over any shorter special it
 * contains; equal lengths by id. A sort in n log n: the count comes from the
 * file (an insertion sort took 18 s on 150,000 specials in a 3 MB file).
 */
static int sort_special(struct tokenizer *t)
{
	struct special_key *k = malloc((t->n_special ? t->n_special : 1) * sizeof(*k));

	if (!k)
		return -ENOMEM;
	for (uint32_t i = 0; i < t->n_special; i++)
		k[i] = (struct special_key){ t->text[t->special[i]].len, t->special[i] };
	qsort(k, t->n_special, sizeof(*k), longest_first);
	for (uint32_t i = 0; i < t->n_special; i++)
		t->special[i] = k[i].id;
	free(k);
	return 0;
}

int tok_load(struct tokenizer *t, const struct gguf *g, char *err, size_t errlen)
{
	struct gguf_str model;
	const struct gguf_kv *kt, *ks, *kty, *km;
	int r = -EINVAL;

	memset(t, 0, sizeof *t);
	if (gguf_get_str(g, "tokenizer.ggml.model", &model)) {
		snprintf(err, errlen, "no tokenizer.ggml.model in the model file");
		return -EINVAL;
	}
	if (gguf_str_eq(model, "llama"))
		t->kind = TOK_SPM;
	else if (gguf_str_eq(model, "gpt2"))
		t->kind = TOK_BPE;
	else {
		snprintf(err, errlen, "tokenizer '%.*s' is not supported (llama, gpt2)", (int)(model.len > 32 ? 32 : model.len),
			 model.s);
		return -ENOTSUP;
	}
	kt = gguf_find(g, "tokenizer.ggml.tokens");
	if (!kt || kt->type != GGUF_ARRAY || kt->arr_type != GGUF_STRING || kt->arr_n == 0 || kt->arr_n > (1u << 24)) {
		snprintf(err, errlen, "tokenizer.ggml.tokens missing or not a string array");
		return -EINVAL;
	}
	t->n_vocab = (uint32_t)kt->arr_n;
	t->text = calloc(t->n_vocab, sizeof *t->text);
	t->score = calloc(t->n_vocab, sizeof *t->score);
	t->type = calloc(t->n_vocab, sizeof *t->type);
	t->vocab = tm_new(t->n_vocab);
	if (!t->text || !t->score || !t->type || !t->vocab) {
		r = -ENOMEM;
		goto err;
	}
	gguf_arr_strs(kt, t->text);
	ks = gguf_find(g, "tokenizer.ggml.scores");
	kty = gguf_find(g, "tokenizer.ggml.token_type");
	for (uint32_t i = 0; i < t->n_vocab; i++) {
		int64_t ty = 1;
		if (t->text[i].len > 4096) {
			snprintf(err, errlen, "token %u is implausibly long", i);
			goto err;
		}
		if (ks)
			gguf_arr_f32(ks, i, &t->score[i]);
		if (kty)
			gguf_arr_i64(kty, i, &ty);
		t->type[i] = (int32_t)ty;
		struct tm_ent *e = tm_slot_s(t->vocab, t->text[i].s, t->text[i].len);
		if (!e->used) { /* first wins on duplicates */
			e->used = 1;
			e->s = t->text[i].s;
			e->len = (uint32_t)t->text[i].len;
			e->a = (int32_t)i;
		}
	}
	for (int b = 0; b < 256; b++) {
		char nm[8];
		snprintf(nm, sizeof nm, "<0x%02X>", b);
		t->byte_tok[b] = vocab_get(t, nm, 6);
	}
	{
		uint32_t v;
		t->bos = gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &v) == 0 && v < t->n_vocab ? (int32_t)v : -1;
		t->eos = gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &v) == 0 && v < t->n_vocab ? (int32_t)v : -1;
		t->unk = gguf_get_u32(g, "tokenizer.ggml.unknown_token_id", &v) == 0 && v < t->n_vocab ? (int32_t)v : -1;
		/* the end of a chat turn: the file's word, else ChatML's or Llama 3's marker, else EOS */
		if (gguf_get_u32(g, "tokenizer.ggml.eot_token_id", &v) == 0 && v < t->n_vocab)
			t->eot = (int32_t)v;
		else if ((t->eot = vocab_get(t, "<|im_end|>", 10)) < 0 &&
			 (t->eot = vocab_get(t, "<|eot_id|>", 10)) < 0)
			t->eot = t->eos;
	}
	if (gguf_get_str(g, "tokenizer.chat_template", &t->chat_template))
		t->chat_template = (struct gguf_str){ 0 };
	/* llama.cpp's defaults: SentencePiece adds BOS and a space prefix, GPT-2 BPE neither. */
	int bos_unsaid = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos);

	if (bos_unsaid)
		t->add_bos = t->kind == TOK_SPM;
	if (gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix))
		t->add_space_prefix = t->kind == TOK_SPM;
	t->special = calloc(t->n_vocab, sizeof *t->special);
	if (!t->special) {
		r = -ENOMEM;
		goto err;
	}
	for (uint32_t i = 0; i < t->n_vocab; i++)
		if ((t->type[i] == 3 || t->type[i] == 4) && t->text[i].len > 0)
			t->special[t->n_special++] = (int32_t)i;
	if (sort_special(t)) {
		r = -ENOMEM;
		goto err;
	}
	if (t->kind == TOK_BPE) {
		struct gguf_str pre;

		/* Another family's pre-tokenizer would tokenize differently with no error (pretok.h):
		 * an unknown one is refused. A file that names none gets SmolLM's, as it always did. */
		t->pre = PRETOK_SMOLLM;
		if (!gguf_get_str(g, "tokenizer.ggml.pre", &pre) && (t->pre = pretok_by_name(pre.s, pre.len)) < 0) {
			snprintf(err, errlen,
				 "gpt2 pre-tokenizer '%.*s' is not supported (smollm, gpt-2, llama-bpe, qwen2)",
				 (int)(pre.len > 32 ? 32 : pre.len), pre.s);
			r = -ENOTSUP;
			goto err;
		}
		if (bos_unsaid && t->pre == PRETOK_LLAMA3)
			t->add_bos = 1; /* Llama 3 begins every text with <|begin_of_text|> */
		km = gguf_find(g, "tokenizer.ggml.merges");
		if (!km || km->type != GGUF_ARRAY || km->arr_type != GGUF_STRING) {
			snprintf(err, errlen, "gpt2 tokenizer without tokenizer.ggml.merges");
			goto err;
		}
		struct gguf_str *ms = calloc(km->arr_n ? km->arr_n : 1, sizeof *ms);
		t->merges = tm_new(km->arr_n);
		if (!ms || !t->merges) {
			free(ms);
			r = -ENOMEM;
			goto err;
		}
		gguf_arr_strs(km, ms);
		char buf[8192];
		for (uint64_t i = 0; i < km->arr_n; i++) {
			const char *sp = memchr(ms[i].s, ' ', ms[i].len);
			if (!sp || ms[i].len >= sizeof buf)
				continue; /* a malformed merge is skipped, not fatal */
			size_t la = (size_t)(sp - ms[i].s), lb = ms[i].len - la - 1;
			int32_t a = vocab_get(t, ms[i].s, la), b = vocab_get(t, sp + 1, lb), c;
			memcpy(buf, ms[i].s, la);
			memcpy(buf + la, sp + 1, lb);
			c = vocab_get(t, buf, la + lb);
			if (a < 0 || b < 0 || c < 0)
				continue;
			uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
			struct tm_ent *e = tm_slot_p(t->merges, key);
			if (!e->used) {
				e->used = 1;
				e->pair = key;
				e->a = (int32_t)i; /* rank */
				e->b = c;         /* result */
			}
		}
		free(ms);
	}
	return 0;
err:
	tok_free(t);
	if (r == -ENOMEM)
		snprintf(err, errlen, "out of memory loading the tokenizer");
	return r;
}

void tok_free(struct tokenizer *t)
{
	free(t->text);
	free(t->score);
	free(t->type);
	free(t->special);
	tm_free(t->vocab);
	tm_free(t->merges);
	memset(t, 0, sizeof *t);
}

/* ---- output buffer ---- */

struct obuf {
	int32_t *v;
	size_t n, cap;
	int oom;
};

static void push(struct obuf *o, int32_t id)
{
	if (o->n == o->cap) {
		size_t nc = o->cap ? o->cap * 2 : 64;
		int32_t *n = realloc(o->v, nc * sizeof *n);
		if (!n) {
			o->oom = 1;
			return;
		}
		o->v = n;
		o->cap = nc;
	}
	o->v[o->n++] = id;
}

/* ---- SentencePiece-style: best-scoring adjacent merge first, ties to the left ---- */

struct sym {
	const char *s;
	size_t len;
	int prev, next;
};

static void spm_word(const struct tokenizer *t, const char *text, size_t len, struct obuf *o)
{
	size_t n = 0;
	struct sym *sy = malloc((len + 1) * sizeof *sy);
	if (!sy) {
		o->oom = 1;
		return;
	}
	for (size_t i = 0; i < len;) {
		uint32_t cp;
		size_t l = utf8_get(text + i, len - i, &cp);
		sy[n] = (struct sym){ text + i, l, (int)n - 1, (int)n + 1 };
		n++;
		i += l;
	}
	if (n)
		sy[n - 1].next = -1;
	for (;;) {
		int best = -1;
		float bs = 0;
		for (int i = n ? 0 : -1; i >= 0; i = sy[i].next) {
			int j = sy[i].next;
			if (j < 0)
				break;
			/* symbols are adjacent in the text, so their concatenation is one span */
			int32_t id = vocab_get(t, sy[i].s, sy[i].len + sy[j].len);
			if (id >= 0 && (best < 0 || t->score[id] > bs)) {
				best = i;
				bs = t->score[id];
			}
		}
		if (best < 0)
			break;
		int j = sy[best].next;
		sy[best].len += sy[j].len;
		sy[best].next = sy[j].next;
		if (sy[j].next >= 0)
			sy[sy[j].next].prev = best;
	}
	for (int i = n ? 0 : -1; i >= 0; i = sy[i].next) {
		int32_t id = vocab_get(t, sy[i].s, sy[i].len);
		if (id >= 0) {
			push(o, id);
			continue;
		}
		for (size_t k = 0; k < sy[i].len; k++) {
			int32_t b = t->byte_tok[(uint8_t)sy[i].s[k]];
			push(o, b >= 0 ? b : t->unk >= 0 ? t->unk : 0);
		}
	}
	free(sy);
}

static void spm_text(const struct tokenizer *t, const char *text, size_t len, int first, struct obuf *o)
{
	/* spaces become U+2581; a leading one is added like SentencePiece's add_dummy_prefix */
	size_t cap = len * 3 + 4, n = 0;
	char *b = malloc(cap);
	if (!b) {
		o->oom = 1;
		return;
	}
	if (first && t->add_space_prefix) {
		memcpy(b, "\xe2\x96\x81", 3);
		n = 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (text[i] == ' ') {
			memcpy(b + n, "\xe2\x96\x81", 3);
			n += 3;
		} else {
			b[n++] = text[i];
		}
	}
	spm_word(t, b, n, o);
	free(b);
}

/* ---- byte-level BPE: the pieces of pretok.c, each merged on its own ---- */

/* The piece as one token when the pre-tokenizer takes whole vocabulary words without merges
 * (pretok_ignores_merges): merging can end elsewhere than at a word the vocabulary has. */
static int32_t bpe_whole_word(const struct tokenizer *t, const char *w, size_t len)
{
	char *m = malloc(2 * len); /* a byte's GPT-2 code point is below 0x800: two UTF-8 bytes */
	size_t n = 0;
	int32_t id;

	if (!m)
		return -1; /* then merged, as without the rule */
	for (size_t i = 0; i < len; i++)
		n += utf8_put(byte_cp((uint8_t)w[i]), m + n);
	id = vocab_get(t, m, n);
	free(m);
	return id;
}

static void bpe_word(const struct tokenizer *t, const char *w, size_t len, struct obuf *o)
{
	/* map bytes to their GPT-2 code points; each starts as one symbol (a single-char token) */
	size_t n = 0;
	int32_t *ids, whole;

	if (pretok_ignores_merges((enum pretok)t->pre) && (whole = bpe_whole_word(t, w, len)) >= 0) {
		push(o, whole);
		return;
	}
	ids = malloc(3 * len * sizeof *ids);
	if (!ids) {
		o->oom = 1;
		return;
	}
	for (size_t i = 0; i < len; i++) {
		char u[4];
		int32_t id = vocab_get(t, u, utf8_put(byte_cp((uint8_t)w[i]), u));

		if (id >= 0) {
			ids[n++] = id;
			continue;
		}
		/*
		 * A byte the vocabulary lacks (0xC0, 0xF5..0xFF: never in valid UTF-8) becomes U+FFFD's
		 * three bytes, as llama.cpp reads invalid text; never the unknown id, which in GPT-2
		 * vocabularies is a control token (SmolLM2's 0 is <|endoftext|>): user text cannot end a
		 * document. Without those bytes either, the byte is dropped.
		 */
		for (const char *r = "\xef\xbf\xbd"; *r; r++)
			if ((id = vocab_get(t, u, utf8_put(byte_cp((uint8_t)*r), u))) >= 0)
				ids[n++] = id;
	}
	for (;;) {
		int32_t best_rank = INT32_MAX, res = -1;
		size_t bi = 0;
		for (size_t i = 0; i + 1 < n; i++) {
			uint64_t key = (uint64_t)(uint32_t)ids[i] << 32 | (uint32_t)ids[i + 1];
			struct tm_ent *e = tm_slot_p(t->merges, key);
			if (e->used && e->a < best_rank) {
				best_rank = e->a;
				res = e->b;
				bi = i;
			}
		}
		if (res < 0)
			break;
		ids[bi] = res;
		memmove(ids + bi + 1, ids + bi + 2, (n - bi - 2) * sizeof *ids);
		n--;
	}
	for (size_t i = 0; i < n; i++)
		push(o, ids[i]);
	free(ids);
}

struct bpe_out {
	const struct tokenizer *t;
	struct obuf *o;
};

static void bpe_piece(void *ctx, const char *piece, size_t len)
{
	struct bpe_out *b = ctx;

	bpe_word(b->t, piece, len, b->o);
}

static void encode_plain(const struct tokenizer *t, const char *s, size_t len, int first, struct obuf *o)
{
	struct bpe_out b = { t, o };

	if (!len)
		return;
	if (t->kind == TOK_SPM)
		spm_text(t, s, len, first, o);
	else
		pretok_split((enum pretok)t->pre, s, len, bpe_piece, &b);
}

/* Whether bytes [i, i + n) may be read as a control token: all of them, or all marked as markup. */
static int special_allowed(const uint8_t *markup, size_t i, size_t n)
{
	if (!markup)
		return 1;
	for (size_t j = i; j < i + n; j++)
		if (!markup[j])
			return 0;
	return 1;
}

/* tok_encode, with control tokens read only where markup allows (NULL: everywhere) when parse_special. */
static int encode(const struct tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
		  const uint8_t *markup, int32_t **out)
{
	struct obuf o = { 0 };
	size_t start = 0, i = 0;
	int first = 1;
	if (add_bos && t->bos >= 0)
		push(&o, t->bos);
	while (parse_special && i < len) {
		uint32_t k;
		for (k = 0; k < t->n_special; k++) {
			const struct gguf_str *st = &t->text[t->special[k]];
			if (st->len <= len - i && !memcmp(text + i, st->s, st->len) &&
			    special_allowed(markup, i, st->len))
				break;
		}
		if (k == t->n_special) {
			i++;
			continue;
		}
		encode_plain(t, text + start, i - start, first, &o);
		first = 0;
		push(&o, t->special[k]);
		i += t->text[t->special[k]].len;
		start = i;
	}
	encode_plain(t, text + start, len - start, first, &o);
	if (o.oom) {
		free(o.v);
		return -ENOMEM;
	}
	if (!o.v)
		o.v = malloc(sizeof(int32_t));
	*out = o.v;
	return (int)o.n;
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
	       int32_t **out)
{
	return encode(t, text, len, add_bos, parse_special, NULL, out);
}

int tok_encode_markup(const struct tokenizer *t, const char *text, size_t len, const uint8_t *markup,
		      int32_t **out)
{
	return encode(t, text, len, 0, 1, markup, out);
}

static int hex_digit(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The byte of a "<0xXX>" token, or -1. Token text lies in the file, not NUL-terminated: no strtol. */
static int byte_token_value(const struct gguf_str *s)
{
	int hi, lo;

	if (s->len != 6 || memcmp(s->s, "<0x", 3) || s->s[5] != '>')
		return -1;
	hi = hex_digit(s->s[3]);
	lo = hex_digit(s->s[4]);
	return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

size_t tok_piece(const struct tokenizer *t, int32_t id, int show_special, char *buf, size_t cap)
{
	size_t n = 0;
	if (id < 0 || (uint32_t)id >= t->n_vocab || cap == 0)
		return 0;
	const struct gguf_str *s = &t->text[id];
	if (t->type[id] == 3 || t->type[id] == 2) {
		if (!show_special)
			return 0;
		n = s->len < cap ? s->len : cap;
		memcpy(buf, s->s, n);
		return n;
	}
	if (t->kind == TOK_SPM) {
		int byte = byte_token_value(s);

		if (t->type[id] == 6 && byte >= 0) {
			buf[0] = (char)byte;
			return 1;
		}
		for (size_t i = 0; i < s->len && n < cap; i++) {
			if (i + 3 <= s->len && !memcmp(s->s + i, "\xe2\x96\x81", 3)) {
				buf[n++] = ' ';
				i += 2;
			} else {
				buf[n++] = s->s[i];
			}
		}
		return n;
	}
	for (size_t i = 0; i < s->len && n < cap;) {
		uint32_t cp;
		i += utf8_get(s->s + i, s->len - i, &cp);
		int b = cp_to_byte(cp);
		buf[n++] = (char)(b >= 0 ? b : '?');
	}
	return n;
}

int tok_is_eog(const struct tokenizer *t, int32_t id)
{
	return id == t->eos || id == t->eot;
}
