/* SPDX-License-Identifier: MIT */
/* SentencePiece-style and byte-level BPE tokenizers, driven entirely by the GGUF vocabulary. */
#include "tokenizer.h"
#include "unicode_cats.h"

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

static size_t utf8_put(uint32_t cp, char *o)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 63));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | ((cp >> 6) & 63));
		o[2] = (char)(0x80 | (cp & 63));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | ((cp >> 12) & 63));
	o[2] = (char)(0x80 | ((cp >> 6) & 63));
	o[3] = (char)(0x80 | (cp & 63));
	return 4;
}

/* Decodes one code point; invalid bytes decode as themselves (length 1) so nothing is dropped. */
static size_t utf8_get(const char *s, size_t len, uint32_t *cp)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t n = u[0] < 0x80 ? 1 : (u[0] >> 5) == 6 ? 2 : (u[0] >> 4) == 14 ? 3 : (u[0] >> 3) == 30 ? 4 : 0;
	if (n == 0 || n > len) {
		*cp = u[0] | 0x80000000u; /* marks a raw byte */
		return 1;
	}
	for (size_t i = 1; i < n; i++)
		if ((u[i] & 0xc0) != 0x80) {
			*cp = u[0] | 0x80000000u;
			return 1;
		}
	*cp = n == 1 ? u[0] : n == 2 ? (u[0] & 31u) << 6 | (u[1] & 63u)
		: n == 3 ? (u[0] & 15u) << 12 | (u[1] & 63u) << 6 | (u[2] & 63u)
		: (u[0] & 7u) << 18 | (u[1] & 63u) << 12 | (u[2] & 63u) << 6 | (u[3] & 63u);
	return n;
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
		t->eot = vocab_get(t, "<|im_end|>", 10);
		if (t->eot < 0)
			t->eot = t->eos;
	}
	/* llama.cpp's defaults: SentencePiece adds BOS and a space prefix, GPT-2 BPE neither. */
	if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos))
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

		/*
		 * The pre-tokenizer splits text before the merges, and each model family has its own
		 * (digits, contractions, line breaks): another one's text would tokenize differently
		 * with no error. Only SmolLM's is implemented; a file that names none gets it too.
		 */
		if (!gguf_get_str(g, "tokenizer.ggml.pre", &pre) && !gguf_str_eq(pre, "smollm")) {
			snprintf(err, errlen, "gpt2 pre-tokenizer '%.*s' is not supported (smollm)",
				 (int)(pre.len > 32 ? 32 : pre.len), pre.s);
			r = -ENOTSUP;
			goto err;
		}
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

/* ---- byte-level BPE with the SmolLM pre-tokenizer ----
 * llama.cpp's "smollm" pre-tokenizer (and HF's Digits(individual_digits) + ByteLevel): first every
 * \p{N} code point becomes its own chunk, then each chunk is split by the GPT-2 pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * so no lookahead crosses a digit: "\n\n1" is "\n\n" + "1". \p{L} and \p{N} come from
 * unicode_cats.h (generated, Unicode version there); \s is the White_Space property. */

static int is_space(uint32_t c)
{
	return c == ' ' || (c >= 9 && c <= 13) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
	       c == 0x3000;
}

static int in_ranges(const struct ucat_range *r, size_t n, uint32_t c)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (c < r[mid].lo)
			hi = mid;
		else if (c > r[mid].hi)
			lo = mid + 1;
		else
			return 1;
	}
	return 0;
}

/* \p{N}; a raw (invalid UTF-8) byte carries bit 31 and is in no category */
static int is_number(uint32_t c)
{
	if (c < 0x80)
		return c >= '0' && c <= '9';
	return in_ranges(ucat_number, sizeof(ucat_number) / sizeof(ucat_number[0]), c);
}

/* \p{L} */
static int is_letter(uint32_t c)
{
	if (c < 0x80)
		return (c | 32) >= 'a' && (c | 32) <= 'z';
	return in_ranges(ucat_letter, sizeof(ucat_letter) / sizeof(ucat_letter[0]), c);
}

static void bpe_word(const struct tokenizer *t, const char *w, size_t len, struct obuf *o)
{
	/* map bytes to their GPT-2 code points; each starts as one symbol (a single-char token) */
	size_t n = 0;
	int32_t *ids = malloc(len * sizeof *ids);
	if (!ids) {
		o->oom = 1;
		return;
	}
	for (size_t i = 0; i < len; i++) {
		char u[4];
		size_t l = utf8_put(byte_cp((uint8_t)w[i]), u);
		int32_t id = vocab_get(t, u, l);
		ids[n++] = id >= 0 ? id : (t->unk >= 0 ? t->unk : 0);
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

/* One chunk without \p{N} in it (bpe_text splits those off): the GPT-2 pattern, chunk end = text end. */
static void bpe_chunk(const struct tokenizer *t, const char *s, size_t len, struct obuf *o)
{
	size_t i = 0;
	while (i < len) {
		uint32_t c, c2 = 0;
		size_t l = utf8_get(s + i, len - i, &c), l2 = 0, j;
		if (i + l < len)
			l2 = utf8_get(s + i + l, len - i - l, &c2);
		if (c == '\'' && i + 1 < len) {
			static const char *const sfx[] = { "re", "ve", "ll", "s", "t", "m", "d" };
			size_t k;
			for (k = 0; k < 7; k++) {
				size_t sl = strlen(sfx[k]);
				if (i + 1 + sl <= len && !memcmp(s + i + 1, sfx[k], sl))
					break;
			}
			if (k < 7) {
				bpe_word(t, s + i, 1 + strlen(sfx[k]), o);
				i += 1 + strlen(sfx[k]);
				continue;
			}
		}
		/* " ?X+" for X = letters or other symbols */
		j = i;
		uint32_t head = c;
		if (c == ' ' && l2 && !is_space(c2)) {
			j += l;
			head = c2;
		}
		if (!is_space(head)) {
			int letters = is_letter(head);
			while (j < len) {
				uint32_t d;
				size_t dl = utf8_get(s + j, len - j, &d);
				if (letters ? !is_letter(d) : (is_letter(d) || is_space(d)))
					break;
				j += dl;
			}
			bpe_word(t, s + i, j - i, o);
			i = j;
			continue;
		}
		/* whitespace run: \s+(?!\S) leaves the last space to prefix the next word; else \s+ */
		size_t last = i;
		j = i;
		while (j < len) {
			uint32_t d;
			size_t dl = utf8_get(s + j, len - j, &d);
			if (!is_space(d))
				break;
			last = j;
			j += dl;
		}
		if (j < len && last > i)
			j = last;
		bpe_word(t, s + i, j - i, o);
		i = j;
	}
}

static void bpe_text(const struct tokenizer *t, const char *s, size_t len, struct obuf *o)
{
	size_t start = 0, i = 0;

	while (i < len) {
		uint32_t c;
		size_t l = utf8_get(s + i, len - i, &c);

		if (is_number(c)) {
			bpe_chunk(t, s + start, i - start, o);
			bpe_word(t, s + i, l, o);
			start = i + l;
		}
		i += l;
	}
	bpe_chunk(t, s + start, len - start, o);
}

static void encode_plain(const struct tokenizer *t, const char *s, size_t len, int first, struct obuf *o)
{
	if (!len)
		return;
	if (t->kind == TOK_SPM)
		spm_text(t, s, len, first, o);
	else
		bpe_text(t, s, len, o);
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
	       int32_t **out)
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
			if (st->len <= len - i && !memcmp(text + i, st->s, st->len))
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
