/* SPDX-License-Identifier: MIT */
/* UTF-8 code points for the tokenizers: both directions, never failing on bad input. */
#ifndef PKV_EX_UTF8_H
#define PKV_EX_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* A byte that starts no valid sequence decodes as itself with this bit set: in no Unicode category. */
#define UTF8_RAW_BYTE 0x80000000u

static inline size_t utf8_put(uint32_t cp, char *o)
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

/* Decodes one code point from len > 0 bytes; invalid bytes decode one at a time (UTF8_RAW_BYTE) so
 * that nothing is dropped. */
static inline size_t utf8_get(const char *s, size_t len, uint32_t *cp)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t n = u[0] < 0x80 ? 1 : (u[0] >> 5) == 6 ? 2 : (u[0] >> 4) == 14 ? 3 : (u[0] >> 3) == 30 ? 4 : 0;

	if (n == 0 || n > len) {
		*cp = u[0] | UTF8_RAW_BYTE;
		return 1;
	}
	for (size_t i = 1; i < n; i++)
		if ((u[i] & 0xc0) != 0x80) {
			*cp = u[0] | UTF8_RAW_BYTE;
			return 1;
		}
	*cp = n == 1 ? u[0] : n == 2 ? (u[0] & 31u) << 6 | (u[1] & 63u)
		: n == 3 ? (u[0] & 15u) << 12 | (u[1] & 63u) << 6 | (u[2] & 63u)
		: (u[0] & 7u) << 18 | (u[1] & 63u) << 12 | (u[2] & 63u) << 6 | (u[3] & 63u);
	return n;
}

#endif
