/* SPDX-License-Identifier: MIT */
/* Randomized test of in-flight sharing: bursts of overlapping prompts, chunked and diverging producers,
 * aborts, truncates, forks and dying owners; audit after every operation, and every step reads only KV
 * that was written for exactly its own token prefix. */
#include <stdio.h>
#include <time.h>
#include "helpers.h"

#define NB 48       /* small pool: claims compete with steps for blocks */
#define SEQS 10
#define MAXLEN 64

struct tseq {
	int used;
	uint32_t owner, h, len;
	int32_t want[MAXLEN];   /* the tokens this sequence is to hold */
};

static struct pkv_cache *C;
static struct tseq S[SEQS];
static uint64_t kv[NB * BS];    /* fake KV: the hash of the token prefix that produced each slot */
static unsigned long rng;

static uint32_t rnd(uint32_t n)
{
	rng = rng * 6364136223846793005ul + 1442695040888963407ul;
	return (uint32_t)(rng >> 33) % n;
}

static uint64_t prefix_hash(const int32_t *t, uint32_t n)
{
	uint64_t h = 1469598103934665603ull;

	for (uint32_t i = 0; i < n; i++)
		h = (h ^ (uint64_t)(uint32_t)t[i]) * 1099511628211ull;
	return h;
}

/* Three families of prompts that share long prefixes within a family. */
static void make_prompt(int32_t *t)
{
	uint32_t fam = rnd(3), common = 8 + rnd(24);

	for (uint32_t i = 0; i < MAXLEN; i++)
		t[i] = i < common ? (int32_t)(fam * 100 + i) : (int32_t)(1000 + rnd(5));
}

static struct tseq *pick(int used)
{
	for (int tries = 0; tries < 4 * SEQS; tries++) {
		struct tseq *q = &S[rnd(SEQS)];

		if (q->used == used)
			return q;
	}
	return NULL;
}

static void op_open(void)
{
	struct tseq *q = pick(0);
	uint32_t nc, n;

	if (!q)
		return;
	make_prompt(q->want);
	n = 1 + rnd(MAXLEN - 16);
	q->owner = 1 + rnd(3);
	if (pkv_cache_seq_open(C, q->owner, test_ns(1), q->want, n, &q->h, &nc))
		return;
	q->used = 1;
	q->len = nc;
}

/* A step of one sequence: every slot it can read holds KV of its own prefix; then it writes its own. */
static void op_step(void)
{
	struct tseq *q = pick(1);
	struct pkv_step_meta m;
	struct pkv_step *st;
	struct pkv_step_req r;
	int32_t tok[8];
	uint32_t n, i;
	int err;

	if (!q || q->len >= MAXLEN - 1)
		return;
	n = 1 + rnd(q->len + 8 < MAXLEN ? 8 : MAXLEN - q->len);
	for (i = 0; i < n; i++)
		tok[i] = q->want[q->len + i];
	if (!rnd(8))   /* a producer that diverges from what it claimed */
		tok[rnd(n)] ^= 7;
	r = (struct pkv_step_req){ q->h, n, tok };
	err = pkv_cache_step_begin(C, q->owner, &r, 1, &st, &m);
	if (err == -ESTALE || err == -EAGAIN)
		ck_assert_uint_eq(pkv_cache_blocked_seq(C, NULL), q->h);
	if (err == -ESTALE) {
		q->len = (uint32_t)pkv_cache_seq_len(C, q->owner, q->h);
		return;
	}
	if (err)
		return;
	memcpy(q->want + q->len, tok, n * sizeof(*tok));
	for (i = 0; i < m.num_copies; i++)
		memcpy(&kv[(size_t)m.copies[i].dst * BS], &kv[(size_t)m.copies[i].src * BS], sizeof(kv[0]) * BS);
	for (uint32_t p = 0; p < (uint32_t)m.cache_seqlens[0]; p++) {
		int32_t b = m.block_tables[p / BS];

		ck_assert_msg(kv[(size_t)b * BS + p % BS] == prefix_hash(q->want, p + 1),
			      "seed %lu: position %u reads KV written for another prefix", rng, p);
	}
	for (i = 0; i < n; i++)
		kv[m.slot_mapping[i]] = prefix_hash(q->want, q->len + i + 1);
	if (rnd(5)) {
		ck_assert_int_eq(test_commit(C, st), 0);
		q->len += n;
	} else {
		pkv_cache_step_abort(C, st);
	}
}

static void op_other(void)
{
	struct tseq *q = pick(1), *f;
	uint32_t k = rnd(4);

	if (!q)
		return;
	if (k == 0) {
		ck_assert_int_eq(pkv_cache_seq_close(C, q->owner, q->h), 0);
		q->used = 0;
	} else if (k == 1) {
		uint32_t n = rnd(q->len + 1);
		int64_t now = pkv_cache_seq_len(C, q->owner, q->h);
		int err = pkv_cache_seq_truncate(C, q->owner, q->h, n);

		/* A withdrawal may have cut it back already (its next step would say -ESTALE). */
		ck_assert_int_eq(err, n <= now ? 0 : -EINVAL);
		q->len = n <= now ? n : (uint32_t)now;
	} else if (k == 2) {
		uint32_t child;

		f = pick(0);
		if (f && !pkv_cache_seq_fork(C, q->owner, q->h, &child)) {
			*f = *q;
			f->h = child;
			f->len = (uint32_t)pkv_cache_seq_len(C, f->owner, child);
		}
	} else if (k == 3 && !rnd(4)) {
		uint32_t o = q->owner;

		pkv_cache_release_owner(C, o);
		for (int i = 0; i < SEQS; i++)
			if (S[i].used && S[i].owner == o)
				S[i].used = 0;
	}
}

START_TEST(random_bursts_never_read_foreign_kv)
{
	struct pkv_geometry g = test_geom(NB);
	/* Runs 2 and 3: claims lapse after 1 ms without progress, so lapses land anywhere in the run. */
	struct pkv_cache_limits lim = { .inflight_claims = 1, .inflight_lapse_ms = _i >= 2 ? 1 : 0 };
	struct pkv_cache_stats st;
	unsigned long ops = getenv("PKV_RANDOM_OPS") ? strtoul(getenv("PKV_RANDOM_OPS"), NULL, 10) : 20000;

	rng = getenv("PKV_RANDOM_SEED") ? strtoul(getenv("PKV_RANDOM_SEED"), NULL, 10) : 12345u + (unsigned)_i;
	fprintf(stderr, "inflight random: seed %lu\n", rng);
	memset(S, 0, sizeof(S));
	for (size_t i = 0; i < NB * BS; i++)
		kv[i] = 0xdeadbeefull * (i + 1);   /* a previous owner's data */
	ck_assert_int_eq(pkv_cache_create(&g, &lim, &C), 0);
	for (unsigned long i = 0; i < ops; i++) {
		uint32_t k = rnd(10);

		/* Lapse runs: now and then time passes, so the stalled producers' claims lapse. */
		if (lim.inflight_lapse_ms && rnd(10) == 0)
			nanosleep(&(struct timespec){ 0, 1500000 }, NULL);
		if (k < 3)
			op_open();
		else if (k < 8)
			op_step();
		else
			op_other();
		test_audit_clean(C);
	}
	/* The run went through the paths it is about. */
	pkv_cache_stats(C, &st);
	ck_assert_uint_gt(st.inflight_hit_tokens, 0);
	ck_assert_uint_gt(st.withdrawn_blocks, 0);
	if (_i >= 2)
		ck_assert_uint_gt(st.lapsed_claims, 0);
	fprintf(stderr, "inflight random: %llu claims lapsed\n", (unsigned long long)st.lapsed_claims);
	pkv_cache_destroy(C);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cache-inflight-random");
	TCase *tc = tcase_create("random");

	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, random_bursts_never_read_foreign_kv, 0, 4);
	suite_add_tcase(s, tc);
	return test_run(s);
}
