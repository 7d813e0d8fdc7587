/* SPDX-License-Identifier: MIT */
/* A keyed hash of a 128-bit value (SipHash-1-3), for table slots that clients must not be able to aim. */
#ifndef PKV_KEYED_HASH_H
#define PKV_KEYED_HASH_H

#include <stdint.h>
#include <sys/random.h>

/*
 * Block keys are public: anyone can compute the key of the tokens they send.
 * A table indexed by the key's own bits lets a client pick tokens whose keys
 * share a slot and turn every lookup of every tenant into a long probe run.
 * Indexing by a hash under a per-process secret takes that aim away; SipHash
 * is a PRF, so without the secret the slots look random whatever the input.
 * One to three rounds (compression/finalization) is the fast variant; two 64-bit
 * words are all it ever hashes, so it stays a few nanoseconds per call.
 */
struct pkv_hash_secret {
	uint64_t k0, k1;
};

/* Fills s from the kernel's random source; falls back to addresses and time only if that fails. */
static inline void pkv_hash_secret_init(struct pkv_hash_secret *s)
{
	if (getrandom(s, sizeof(*s), GRND_NONBLOCK) != (ssize_t)sizeof(*s)) {
		/* Early boot before the pool is seeded: weaker, never fatal. */
		s->k0 = (uint64_t)(uintptr_t)s ^ 0x736f6d6570736575ull;
		s->k1 = (uint64_t)(uintptr_t)&s ^ 0x646f72616e646f6dull;
	}
}

static inline uint64_t pkv_hash_rotl(uint64_t x, int b)
{
	return (x << b) | (x >> (64 - b));
}

#define PKV_SIP_ROUND(v0, v1, v2, v3) do { \
	v0 += v1; v1 = pkv_hash_rotl(v1, 13); v1 ^= v0; v0 = pkv_hash_rotl(v0, 32); \
	v2 += v3; v3 = pkv_hash_rotl(v3, 16); v3 ^= v2; \
	v0 += v3; v3 = pkv_hash_rotl(v3, 21); v3 ^= v0; \
	v2 += v1; v1 = pkv_hash_rotl(v1, 17); v1 ^= v2; v2 = pkv_hash_rotl(v2, 32); \
} while (0)

/* SipHash-1-3 of the 16-byte message (a, b), little-endian words, under secret s. */
static inline uint64_t pkv_keyed_hash128(const struct pkv_hash_secret *s, uint64_t a, uint64_t b)
{
	uint64_t v0 = s->k0 ^ 0x736f6d6570736575ull, v1 = s->k1 ^ 0x646f72616e646f6dull;
	uint64_t v2 = s->k0 ^ 0x6c7967656e657261ull, v3 = s->k1 ^ 0x7465646279746573ull;
	const uint64_t last = (uint64_t)16 << 56;   /* message length in the top byte, no tail bytes */

	v3 ^= a; PKV_SIP_ROUND(v0, v1, v2, v3); v0 ^= a;
	v3 ^= b; PKV_SIP_ROUND(v0, v1, v2, v3); v0 ^= b;
	v3 ^= last; PKV_SIP_ROUND(v0, v1, v2, v3); v0 ^= last;
	v2 ^= 0xff;
	PKV_SIP_ROUND(v0, v1, v2, v3);
	PKV_SIP_ROUND(v0, v1, v2, v3);
	PKV_SIP_ROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

#endif
