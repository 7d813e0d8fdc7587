/* SPDX-License-Identifier: MIT */
/*
 * The pre-tokenizers of pretok.h as hand-written matchers, one piece at a time. Each follows its
 * pattern's alternatives in order, as a backtracking regex engine would take them (the first that
 * matches at a position wins, each as long as it can be). \p{L} and \p{N} come from unicode_cats.h
 * (generated, Unicode version there); \s is the White_Space property.
 */
#include "pretok.h"

#include <string.h>

#include "unicode_cats.h"
#include "utf8.h"

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

/* \p{N}; a raw byte (UTF8_RAW_BYTE) is in no category */
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

enum cls { C_SPACE, C_LETTER, C_NUMBER, C_OTHER };

static enum cls cls_of(uint32_t c)
{
	return is_space(c) ? C_SPACE : is_letter(c) ? C_LETTER : is_number(c) ? C_NUMBER : C_OTHER;
}

/* The code point at s[i] (i < len) and its length. */
static size_t at(const char *s, size_t len, size_t i, uint32_t *c)
{
	return utf8_get(s + i, len - i, c);
}

/* End of the run of class k starting at i (at most max code points). */
static size_t run_of(const char *s, size_t len, size_t i, enum cls k, size_t max)
{
	for (size_t n = 0; i < len && n < max; n++) {
		uint32_t d;
		size_t l = at(s, len, i, &d);

		if (cls_of(d) != k)
			break;
		i += l;
	}
	return i;
}

/* 's 't 're 've 'm 'll 'd after the apostrophe at i (any case when fold); the end, or 0. */
static size_t contraction(const char *s, size_t len, size_t i, int fold)
{
	static const char *const sfx[] = { "re", "ve", "ll", "s", "t", "m", "d" };

	for (size_t k = 0; k < sizeof(sfx) / sizeof(sfx[0]); k++) {
		size_t n = strlen(sfx[k]), m;

		if (i + 1 + n > len)
			continue;
		for (m = 0; m < n; m++) {
			char c = s[i + 1 + m];

			if (c != sfx[k][m] && !(fold && (c | 32) == sfx[k][m]))
				break;
		}
		if (m == n)
			return i + 1 + n;
	}
	return 0;
}

/* \s+(?!\S)|\s+ at the whitespace run [i, end): the whole run at the end of the text; else all but
 * its last code point, which then leads the next piece; a lone one before \S is a piece itself. */
static size_t space_run(const char *s, size_t len, size_t i)
{
	size_t j = i, last = i;

	while (j < len) {
		uint32_t d;
		size_t l = at(s, len, j, &d);

		if (!is_space(d))
			break;
		last = j;
		j += l;
	}
	return j < len && last > i ? last : j;
}

/* One piece of 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t gpt2_piece(const char *s, size_t len, size_t i)
{
	uint32_t c, c2;
	size_t l = at(s, len, i, &c), j = i, e;
	enum cls head = cls_of(c);

	if (c == '\'' && (e = contraction(s, len, i, 0)))
		return e;
	if (c == ' ' && i + l < len) {
		at(s, len, i + l, &c2);
		if (!is_space(c2)) {
			j += l;
			head = cls_of(c2);
		}
	}
	if (head != C_SPACE)
		return run_of(s, len, j, head, (size_t)-1);
	return space_run(s, len, i);
}

/*
 * One piece of Llama 3's pattern (Qwen2's with max_digits 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 */
static size_t llama3_piece(const char *s, size_t len, size_t i, size_t max_digits)
{
	uint32_t c, c2 = 0;
	size_t l = at(s, len, i, &c), e;
	enum cls k = cls_of(c), k2 = C_SPACE;

	if (i + l < len)
		k2 = cls_of((at(s, len, i + l, &c2), c2));
	if (c == '\'' && (e = contraction(s, len, i, 1)))
		return e;
	if (k == C_LETTER)
		return run_of(s, len, i, C_LETTER, (size_t)-1);
	if (k2 == C_LETTER && k != C_NUMBER && c != '\r' && c != '\n')
		return run_of(s, len, i + l, C_LETTER, (size_t)-1);
	if (k == C_NUMBER)
		return run_of(s, len, i, C_NUMBER, max_digits);
	if (k == C_OTHER || (c == ' ' && k2 == C_OTHER)) {
		e = run_of(s, len, k == C_OTHER ? i : i + l, C_OTHER, (size_t)-1);
		while (e < len && (s[e] == '\r' || s[e] == '\n'))
			e++;
		return e;
	}
	/* whitespace: \s*[\r\n]+ ends after the run's last line break, when it has one */
	size_t j = i, nl = 0;

	while (j < len) {
		uint32_t d;
		size_t dl = at(s, len, j, &d);

		if (!is_space(d))
			break;
		j += dl;
		if (d == '\r' || d == '\n')
			nl = j;
	}
	return nl ? nl : space_run(s, len, i);
}

static size_t piece_end(enum pretok kind, const char *s, size_t len, size_t i)
{
	switch (kind) {
	case PRETOK_LLAMA3:
		return llama3_piece(s, len, i, 3);
	case PRETOK_QWEN2:
		return llama3_piece(s, len, i, 1);
	default:
		return gpt2_piece(s, len, i);
	}
}

static void split_span(enum pretok kind, const char *s, size_t len, pretok_emit *emit, void *ctx)
{
	for (size_t i = 0; i < len;) {
		size_t e = piece_end(kind, s, len, i);

		emit(ctx, s + i, e - i);
		i = e;
	}
}

void pretok_split(enum pretok kind, const char *s, size_t len, pretok_emit *emit, void *ctx)
{
	size_t start = 0;

	if (kind != PRETOK_SMOLLM) {
		split_span(kind, s, len, emit, ctx);
		return;
	}
	/* SmolLM isolates every \p{N} first, so no other piece (and no lookahead) crosses a digit:
	 * "\n\n1" is "\n\n" + "1". */
	for (size_t i = 0; i < len;) {
		uint32_t c;
		size_t l = at(s, len, i, &c);

		if (is_number(c)) {
			split_span(kind, s + start, i - start, emit, ctx);
			emit(ctx, s + i, l);
			start = i + l;
		}
		i += l;
	}
	split_span(kind, s + start, len - start, emit, ctx);
}

int pretok_by_name(const char *name, size_t len)
{
	static const struct {
		const char *name;
		enum pretok kind;
	} names[] = {
		{ "smollm", PRETOK_SMOLLM },  { "gpt-2", PRETOK_GPT2 },	      { "phi-2", PRETOK_GPT2 },
		{ "llama-bpe", PRETOK_LLAMA3 }, { "llama3", PRETOK_LLAMA3 }, { "llama-v3", PRETOK_LLAMA3 },
		{ "falcon3", PRETOK_LLAMA3 }, { "qwen2", PRETOK_QWEN2 },     { "deepseek-r1-qwen", PRETOK_QWEN2 },
	};

	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++)
		if (strlen(names[k].name) == len && !memcmp(names[k].name, name, len))
			return (int)names[k].kind;
	return -1;
}

int pretok_ignores_merges(enum pretok kind)
{
	return kind == PRETOK_LLAMA3;
}
