/* SPDX-License-Identifier: MIT */
/* The shared-memory rings and region layout: wrap-around of free-running indices, two threads, corruption checks. */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <sched.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "common/region.h"
#include "common/ring.h"
#include "../suite_main.h"

#define N_MSGS 50000u

struct pair {
	uint8_t *mem;
	struct pkv_shm_hdr h;
	struct pkv_ring prod, cons;
};

static void make_pair(struct pair *p, uint32_t start)
{
	ck_assert_int_eq(pkv_region_layout(4096, 8, 8, &p->h), 0);
	p->mem = aligned_alloc(4096, p->h.region_size);
	memset(p->mem, 0, p->h.region_size);
	pkv_ring_bind(&p->prod, p->mem + p->h.sq_ring_off, p->mem + p->h.sq_sqes_off, 8, sizeof(struct pkv_sqe), &p->h);
	pkv_ring_bind(&p->cons, p->mem + p->h.sq_ring_off, p->mem + p->h.sq_sqes_off, 8, sizeof(struct pkv_sqe), &p->h);
	/* Start just below the u32 wrap so every run crosses it. */
	p->prod.local = p->cons.local = start;
	*p->prod.sh_head = *p->prod.sh_tail = start;
}

static void *consumer(void *arg)
{
	struct pair *p = arg;
	uint64_t expect = 0;

	while (expect < N_MSGS) {
		int64_t n = pkv_ring_avail(&p->cons);
		struct pkv_sqe e;

		if (n < 0)
			return (void *)1;
		if (!n)
			sched_yield(); /* the producer may share this core */
		while (n-- > 0) {
			pkv_ring_peek_copy(&p->cons, &e);
			pkv_ring_consume(&p->cons);
			if (e.user_data != expect++)
				return (void *)2;
		}
	}
	return NULL;
}

START_TEST(test_spsc_two_threads_across_wrap)
{
	struct pair p;
	pthread_t t;
	void *res;

	make_pair(&p, UINT32_MAX - 1000);
	ck_assert_int_eq(pthread_create(&t, NULL, consumer, &p), 0);
	for (uint64_t i = 0; i < N_MSGS;) {
		int64_t space = pkv_ring_space(&p.prod);
		struct pkv_sqe e = { 0 };

		ck_assert_int_ge(space, 0);
		if (!space) {
			sched_yield();
			continue;
		}
		e.user_data = i++;
		memcpy(pkv_ring_prod_slot(&p.prod), &e, sizeof(e));
		pkv_ring_publish(&p.prod);
	}
	ck_assert_int_eq(pthread_join(t, &res), 0);
	ck_assert_ptr_null(res);
	free(p.mem);
}
END_TEST

START_TEST(test_impossible_indices_detected)
{
	struct pair p;

	make_pair(&p, 5);
	*p.prod.sh_tail = 5 + 9;                 /* 9 ready in an 8-entry ring */
	ck_assert_int_eq(pkv_ring_avail(&p.cons), -1);
	*p.prod.sh_tail = 5 + 8;
	ck_assert_int_eq(pkv_ring_avail(&p.cons), 8);
	*p.prod.sh_head = 5 + 1;                 /* consumer "ahead" of the producer */
	ck_assert_int_eq(pkv_ring_space(&p.prod), -1);
	free(p.mem);
}
END_TEST

START_TEST(test_sleep_handshake)
{
	struct pair p;

	make_pair(&p, 0);
	ck_assert_int_eq(pkv_ring_prepare_sleep(&p.cons), 0); /* empty: may sleep */
	pkv_ring_publish(&p.prod);
	ck_assert(pkv_ring_needs_wakeup(&p.prod));           /* producer must ring */
	pkv_ring_clear_wakeup(&p.cons);
	ck_assert(!pkv_ring_needs_wakeup(&p.prod));
	ck_assert_int_eq(pkv_ring_prepare_sleep(&p.cons), 1); /* work arrived: do not sleep */
	free(p.mem);
}
END_TEST

/* The spin hints: each in a word of its own after flags, seen by the other side; none where the layout has no room. */
START_TEST(test_hints_reach_the_peer)
{
	struct pair p;
	struct pkv_ring r;

	make_pair(&p, 0);
	ck_assert_uint_eq(pkv_ring_peer_threads(&p.prod), 0);
	pkv_ring_set_threads(&p.cons, 3);
	pkv_ring_set_cpu(&p.cons, 2);
	ck_assert_uint_eq(pkv_ring_peer_threads(&p.prod), 3);
	ck_assert_uint_eq(pkv_ring_peer_cpu(&p.prod), 2);
	ck_assert_uint_eq(*p.prod.sh_wake, 0); /* the wake word is not a hint's */
	/* A layout that puts the head where the threads hint would go: no hint, and no write there. */
	p.h.ring_head_off = p.h.ring_flags_off + 12;
	pkv_ring_bind(&r, p.mem + p.h.sq_ring_off, p.mem + p.h.sq_sqes_off, 8, sizeof(struct pkv_sqe), &p.h);
	ck_assert_ptr_null(r.sh_threads);
	pkv_ring_set_threads(&r, 9);
	ck_assert_uint_eq(pkv_ring_peer_threads(&r), 0);
	free(p.mem);
}
END_TEST

START_TEST(test_layout_passes_its_own_check)
{
	struct pkv_shm_hdr h;
	char why[256];

	for (uint64_t a = 1; a < (1ull << 30); a = a * 7 + 13) {
		ck_assert_int_eq(pkv_region_layout(a, 256, 256, &h), 0);
		ck_assert_int_eq(pkv_region_check(&h, h.region_size, why, sizeof(why)), 0);
		ck_assert_uint_ge(h.arena_size, a);
		ck_assert_int_ne(pkv_region_check(&h, h.region_size - 4096, why, sizeof(why)), 0);
	}
	ck_assert_int_lt(pkv_region_layout(4096, 3, 8, &h), 0);  /* not a power of two */
	ck_assert_int_eq(pkv_region_layout(4096, 8, 8, &h), 0);
	h.cq_cqes_off = h.sq_sqes_off;                          /* overlapping rings */
	ck_assert_int_ne(pkv_region_check(&h, h.region_size, why, sizeof(why)), 0);
	ck_assert_int_eq(pkv_region_layout(4096, 8, 8, &h), 0);
	h.version = PKV_PROTO_VERSION + 1;
	ck_assert_int_eq(pkv_region_check(&h, h.region_size, why, sizeof(why)), -EPROTO);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("rings");
	TCase *t = tcase_create("ring");

	tcase_set_timeout(t, 60);
	tcase_add_test(t, test_spsc_two_threads_across_wrap);
	tcase_add_test(t, test_impossible_indices_detected);
	tcase_add_test(t, test_sleep_handshake);
	tcase_add_test(t, test_hints_reach_the_peer);
	tcase_add_test(t, test_layout_passes_its_own_check);
	suite_add_tcase(s, t);
	return suite_main(s);
}
