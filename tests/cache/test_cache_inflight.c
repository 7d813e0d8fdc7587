/* SPDX-License-Identifier: MIT */
/* Cache manager: in-flight prefix sharing (claims at open, waiting consumers, settling, withdrawal). */
#include <time.h>
#include "helpers.h"

#define PRODUCER 5
#define CONSUMER 6
#define N 40   /* two full blocks and a partial one */

static struct pkv_cache *lapsing_cache(uint32_t num_blocks, uint32_t lapse_ms)
{
	struct pkv_geometry g = test_geom(num_blocks);
	struct pkv_cache_limits lim = { .inflight_claims = 1, .inflight_lapse_ms = lapse_ms };
	struct pkv_cache *c = NULL;

	ck_assert_int_eq(pkv_cache_create(&g, &lim, &c), 0);
	return c;
}

/* Claims that outlast every test here (a minute without progress). */
static struct pkv_cache *claims_cache(uint32_t num_blocks)
{
	return lapsing_cache(num_blocks, 60000);
}

/* Longer than a 1 ms lapse, in a step too (10x): the clock only moves forward, so this cannot flake. */
static void outwait_lapse(void)
{
	nanosleep(&(struct timespec){ 0, 30 * 1000000 }, NULL);
}

static int begin(struct pkv_cache *c, uint32_t owner, uint32_t seq, const int32_t *t, uint32_t n,
		 struct pkv_step **st)
{
	struct pkv_step_req r = { seq, n, t };
	struct pkv_step_meta m;

	return pkv_cache_step_begin(c, owner, &r, 1, st, &m);
}

/* The producer computes [from, to) of its prompt in one committed step. */
static void produce(struct pkv_cache *c, uint32_t seq, const int32_t *t, uint32_t from, uint32_t to)
{
	struct pkv_step *st;

	ck_assert_int_eq(begin(c, PRODUCER, seq, t + from, to - from, &st), 0);
	ck_assert_int_eq(test_commit(c, st), 0);
}

/* A consumer opening the same prompt while the producer has not computed it. */
static void burst(struct pkv_cache *c, const int32_t *t, uint32_t *a, uint32_t *b, uint32_t *nb)
{
	uint32_t na;
	struct pkv_key ns = test_ns(1);

	ck_assert_int_eq(pkv_cache_seq_open(c, PRODUCER, ns, t, N, a, &na), 0);
	ck_assert_uint_eq(na, 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, CONSUMER, ns, t, N, b, nb), 0);
	test_audit_clean(c);
}

START_TEST(second_open_finds_blocks_in_flight)
{
	struct pkv_cache *c = claims_cache(64);
	struct pkv_cache_stats st;
	struct pkv_step *s;
	int32_t t[N];
	uint32_t a, b, nb, who;

	test_prompt(t, N, 1);
	burst(c, t, &a, &b, &nb);
	ck_assert_uint_eq(nb, 32);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.inflight_hit_tokens, 32);
	ck_assert_uint_eq(st.claimed_blocks, 2);
	/* Nothing computed yet: the consumer may not step, and is named. */
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), -EAGAIN);
	ck_assert_uint_eq(pkv_cache_blocked_seq(c, &who), b);
	ck_assert_uint_eq(who, PRODUCER);
	produce(c, a, t, 0, N);
	test_audit_clean(c);
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), 0);
	ck_assert_int_eq(test_commit(c, s), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(chunked_producer_releases_consumer_only_when_whole)
{
	struct pkv_cache *c = claims_cache(64);
	struct pkv_step *s;
	int32_t t[N];
	uint32_t a, b, nb;

	test_prompt(t, N, 2);
	burst(c, t, &a, &b, &nb);
	produce(c, a, t, 0, 20);   /* block 0 whole, block 1 a third written */
	test_audit_clean(c);
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), -EAGAIN);
	produce(c, a, t, 20, 33);
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), 0);
	pkv_cache_step_abort(c, s);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(producer_abort_keeps_its_claim)
{
	struct pkv_cache *c = claims_cache(64);
	struct pkv_step *s;
	int32_t t[N];
	uint32_t a, b, nb;

	test_prompt(t, N, 3);
	burst(c, t, &a, &b, &nb);
	ck_assert_int_eq(begin(c, PRODUCER, a, t, N, &s), 0);
	pkv_cache_step_abort(c, s);
	test_audit_clean(c);
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), -EAGAIN);
	produce(c, a, t, 0, N);
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), 0);
	pkv_cache_step_abort(c, s);
	pkv_cache_destroy(c);
}
END_TEST

/* How the producer fails: 0 close, 1 release (its process died), 2 truncate. */
static void producer_fails(struct pkv_cache *c, uint32_t a, int how)
{
	if (how == 0)
		ck_assert_int_eq(pkv_cache_seq_close(c, PRODUCER, a), 0);
	else if (how == 1)
		ck_assert_int_eq(pkv_cache_release_owner(c, PRODUCER), 1);
	else
		ck_assert_int_eq(pkv_cache_seq_truncate(c, PRODUCER, a, 0), 0);
}

START_TEST(failed_producer_cuts_consumer_back)
{
	struct pkv_cache *c = claims_cache(64);
	struct pkv_cache_stats st;
	struct pkv_step *s;
	int32_t t[N];
	uint32_t a, b, nb;

	test_prompt(t, N, 4);
	burst(c, t, &a, &b, &nb);
	producer_fails(c, a, _i);
	test_audit_clean(c);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.withdrawn_blocks, 2);
	ck_assert_uint_eq(st.in_use_blocks, 0);   /* the claimed blocks went back to the pool */
	ck_assert_int_eq(pkv_cache_seq_len(c, CONSUMER, b), 0);
	/* Told once, then the consumer computes everything itself. */
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), -ESTALE);
	ck_assert_uint_eq(pkv_cache_blocked_seq(c, NULL), b);
	ck_assert_int_eq(begin(c, CONSUMER, b, t, N, &s), 0);
	ck_assert_int_eq(test_commit(c, s), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(producer_stepping_other_tokens_withdraws_from_there)
{
	struct pkv_cache *c = claims_cache(64);
	struct pkv_step *s;
	int32_t t[N], other[N];
	uint32_t a, b, nb;

	test_prompt(t, N, 5);
	memcpy(other, t, sizeof(t));
	other[20] ^= 1;   /* block 1 differs from the claim */
	burst(c, t, &a, &b, &nb);
	produce(c, a, other, 0, N);
	test_audit_clean(c);
	/* Block 0 was delivered, block 1 was not: the consumer keeps 16 tokens. */
	ck_assert_int_eq(pkv_cache_seq_len(c, CONSUMER, b), 16);
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), -ESTALE);
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 16, 24, &s), 0);
	ck_assert_int_eq(test_commit(c, s), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(fork_of_a_waiting_sequence_waits_too)
{
	struct pkv_cache *c = claims_cache(64);
	struct pkv_step *s;
	int32_t t[N];
	uint32_t a, b, nb, f;

	test_prompt(t, N, 6);
	burst(c, t, &a, &b, &nb);
	ck_assert_int_eq(pkv_cache_seq_fork(c, CONSUMER, b, &f), 0);
	ck_assert_int_eq(begin(c, CONSUMER, f, t + 32, 8, &s), -EAGAIN);
	producer_fails(c, a, 0);
	ck_assert_int_eq(pkv_cache_seq_len(c, CONSUMER, f), 0);
	ck_assert_int_eq(begin(c, CONSUMER, f, t + 32, 8, &s), -ESTALE);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(pending_blocks_cannot_be_pinned)
{
	struct pkv_cache *c = claims_cache(64);
	int32_t t[N];
	uint32_t a, b, nb;

	test_prompt(t, N, 7);
	burst(c, t, &a, &b, &nb);
	ck_assert_int_eq(pkv_prefix_pin(c, CONSUMER, test_ns(1), t, N), 0);
	produce(c, a, t, 0, N);
	ck_assert_int_eq(pkv_prefix_pin(c, CONSUMER, test_ns(1), t, N), 32);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(claims_stay_in_their_namespace)
{
	struct pkv_cache *c = claims_cache(64);
	int32_t t[N];
	uint32_t a, b, na, nb;

	test_prompt(t, N, 8);
	ck_assert_int_eq(pkv_cache_seq_open(c, PRODUCER, test_ns(1), t, N, &a, &na), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, CONSUMER, test_ns(2), t, N, &b, &nb), 0);
	ck_assert_uint_eq(nb, 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(claims_respect_block_limits)
{
	struct pkv_cache *c = claims_cache(64);
	struct pkv_owner_usage u;
	int32_t t[N];
	uint32_t a, na;

	test_prompt(t, N, 9);
	ck_assert_int_eq(pkv_cache_set_owner_limits(c, PRODUCER, 0, 1), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, PRODUCER, test_ns(1), t, N, &a, &na), 0);
	pkv_cache_owner_usage(c, PRODUCER, &u);
	ck_assert_uint_eq(u.blocks, 1);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(settled_open_neither_sees_nor_makes_claims)
{
	struct pkv_cache *c = claims_cache(64);
	struct pkv_cache_stats st;
	int32_t t[N];
	uint32_t a, b, na, nb;

	test_prompt(t, N, 11);
	ck_assert_int_eq(pkv_cache_seq_open(c, PRODUCER, test_ns(1), t, N, &a, &na), 0);
	ck_assert_int_eq(pkv_cache_seq_open_partial(c, CONSUMER, test_ns(1), t, N, PKV_OPEN_SETTLED, 0, &b, &nb),
			 0);
	ck_assert_uint_eq(nb, 0);
	produce(c, a, t, 0, 20);   /* block 0 committed, block 1 still pending */
	ck_assert_int_eq(pkv_cache_seq_close(c, CONSUMER, b), 0);
	ck_assert_int_eq(pkv_cache_seq_open_partial(c, CONSUMER, test_ns(1), t, N, PKV_OPEN_SETTLED, 0, &b, &nb),
			 0);
	ck_assert_uint_eq(nb, 16);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.claimed_blocks, 2);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/*
 * A producer that claims a prompt and never computes it (a hostile client in
 * a shared pool) cannot keep the next client waiting: its claim lapses, the
 * waiting consumer is told -ESTALE once, computes the prompt itself and
 * publishes it for everyone after. The producer is not harmed: it computes
 * its own copy whenever it steps.
 */
START_TEST(stalled_claim_lapses)
{
	struct pkv_cache *c = lapsing_cache(64, 1);
	struct pkv_cache_stats st;
	struct pkv_step *s;
	int32_t t[N];
	uint32_t a, b, d, nb, nd;

	test_prompt(t, N, 11);
	burst(c, t, &a, &b, &nb);
	ck_assert_uint_eq(nb, 32);
	outwait_lapse();
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), -ESTALE);
	test_audit_clean(c);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.lapsed_claims, 1);
	ck_assert_uint_eq(st.withdrawn_blocks, 2);
	ck_assert_int_eq(pkv_cache_seq_len(c, CONSUMER, b), 0);
	ck_assert_int_eq(begin(c, CONSUMER, b, t, N, &s), 0);
	ck_assert_int_eq(test_commit(c, s), 0);
	/* The consumer's blocks are the prompt's now: a third client finds them computed. */
	ck_assert_int_eq(pkv_cache_seq_open(c, 7, test_ns(1), t, N, &d, &nd), 0);
	ck_assert_uint_eq(nd, 32);
	ck_assert_int_eq(begin(c, 7, d, t + 32, 8, &s), 0);
	pkv_cache_step_abort(c, s);
	produce(c, a, t, 0, N);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/*
 * A producer that begins the step writing its claims and then stalls: after
 * 10x the lapse the consumer goes its own way; the producer's step still
 * commits (the blocks are its own, unshared) or aborts, with a clean audit.
 */
START_TEST(claim_lapses_inside_a_stalled_step)
{
	struct pkv_cache *c = lapsing_cache(64, 1);
	struct pkv_step *s, *ps;
	int32_t t[N];
	uint32_t a, b, nb;

	test_prompt(t, N, 12 + _i);
	burst(c, t, &a, &b, &nb);
	ck_assert_int_eq(begin(c, PRODUCER, a, t, 16, &ps), 0);   /* writes the first claim only */
	outwait_lapse();
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), -ESTALE);
	test_audit_clean(c);
	if (_i)
		pkv_cache_step_abort(c, ps);
	else
		ck_assert_int_eq(test_commit(c, ps), 0);
	test_audit_clean(c);
	ck_assert_int_eq(pkv_cache_seq_len(c, PRODUCER, a), _i ? 0 : 16);
	ck_assert_int_eq(begin(c, CONSUMER, b, t, N, &s), 0);
	ck_assert_int_eq(test_commit(c, s), 0);
	produce(c, a, t, _i ? 0 : 16, N);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

static void sleep_ms(long ms)
{
	nanosleep(&(struct timespec){ ms / 1000, (ms % 1000) * 1000000 }, NULL);
}

/*
 * Steps that settle no claimed block are not progress: a producer that steps its claimed prompt a
 * token at a time (a hostile client once held another uid 47 s this way, every one-token step
 * counting) lapses as one that does nothing, however recent its last step.
 */
START_TEST(dripping_producer_lapses)
{
	struct pkv_cache *c = lapsing_cache(64, 20);
	struct pkv_cache_stats st;
	struct pkv_step *s;
	int32_t t[N];
	uint32_t a, b, nb;

	test_prompt(t, N, 14);
	burst(c, t, &a, &b, &nb);
	ck_assert_int_eq(begin(c, PRODUCER, a, t, 1, &s), 0);
	ck_assert_int_eq(test_commit(c, s), 0);
	sleep_ms(25);
	ck_assert_int_eq(begin(c, PRODUCER, a, t + 1, 1, &s), 0);   /* 0 ms ago, but nothing settled */
	ck_assert_int_eq(test_commit(c, s), 0);
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), -ESTALE);
	pkv_cache_stats(c, &st);
	ck_assert_uint_eq(st.lapsed_claims, 1);
	test_audit_clean(c);
	produce(c, a, t, 2, N);
	ck_assert_int_eq(begin(c, CONSUMER, b, t, N, &s), 0);
	ck_assert_int_eq(test_commit(c, s), 0);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/*
 * A producer that does settle its claims, a block now and then, holds a consumer ten lapses at most
 * from when it began to wait: then the consumer computes the rest itself, though the producer's
 * last settle is fresh.
 */
START_TEST(consumer_waits_ten_lapses_at_most)
{
	struct pkv_cache *c = lapsing_cache(64, 20);
	struct pkv_step *s;
	int32_t t[N];
	uint32_t a, b, nb;

	test_prompt(t, N, 15);
	burst(c, t, &a, &b, &nb);
	sleep_ms(210);
	produce(c, a, t, 0, 16);   /* settles the first claim: progress, 0 ms ago */
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 32, 8, &s), -ESTALE);
	ck_assert_int_eq(pkv_cache_seq_len(c, CONSUMER, b), 16);
	test_audit_clean(c);
	ck_assert_int_eq(begin(c, CONSUMER, b, t + 16, N - 16, &s), 0);
	ck_assert_int_eq(test_commit(c, s), 0);
	produce(c, a, t, 16, N);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

/*
 * Blocks read back from the disk tier are never adopted under a claimed, still pending parent: a
 * withdrawal would leave them published under a freed block (pagedkvctl audit once found one).
 */
START_TEST(adopt_refuses_a_pending_parent)
{
	struct pkv_cache *c = claims_cache(64);
	struct pkv_key last;
	int32_t t[N], more[16];
	int32_t blk;
	uint32_t a, b, nb;

	test_prompt(t, N, 16);
	test_prompt(more, 16, 17);
	burst(c, t, &a, &b, &nb);
	ck_assert_uint_eq(pkv_cache_lookup(c, test_ns(1), t, N, &last), 2);   /* both claims, pending */
	ck_assert_int_eq(pkv_cache_adopt(c, test_ns(1), last, more, &blk), -ENOENT);
	produce(c, a, t, 0, N);
	ck_assert_int_eq(pkv_cache_adopt(c, test_ns(1), last, more, &blk), 0);
	pkv_cache_adopt_end(c, blk);
	test_audit_clean(c);
	pkv_cache_destroy(c);
}
END_TEST

START_TEST(claims_off_by_default)
{
	struct pkv_cache *c = test_cache(64);
	int32_t t[N];
	uint32_t a, b, na, nb;

	test_prompt(t, N, 10);
	ck_assert_int_eq(pkv_cache_seq_open(c, PRODUCER, test_ns(1), t, N, &a, &na), 0);
	ck_assert_int_eq(pkv_cache_seq_open(c, CONSUMER, test_ns(1), t, N, &b, &nb), 0);
	ck_assert_uint_eq(nb, 0);
	pkv_cache_destroy(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cache-inflight");
	TCase *tc = tcase_create("inflight");

	tcase_add_test(tc, second_open_finds_blocks_in_flight);
	tcase_add_test(tc, chunked_producer_releases_consumer_only_when_whole);
	tcase_add_test(tc, producer_abort_keeps_its_claim);
	tcase_add_loop_test(tc, failed_producer_cuts_consumer_back, 0, 3);
	tcase_add_test(tc, producer_stepping_other_tokens_withdraws_from_there);
	tcase_add_test(tc, fork_of_a_waiting_sequence_waits_too);
	tcase_add_test(tc, pending_blocks_cannot_be_pinned);
	tcase_add_test(tc, claims_stay_in_their_namespace);
	tcase_add_test(tc, claims_respect_block_limits);
	tcase_add_test(tc, settled_open_neither_sees_nor_makes_claims);
	tcase_add_test(tc, claims_off_by_default);
	tcase_add_test(tc, stalled_claim_lapses);
	tcase_add_loop_test(tc, claim_lapses_inside_a_stalled_step, 0, 2);
	tcase_add_test(tc, dripping_producer_lapses);
	tcase_add_test(tc, consumer_waits_ten_lapses_at_most);
	tcase_add_test(tc, adopt_refuses_a_pending_parent);
	suite_add_tcase(s, tc);
	return test_run(s);
}
