/* SPDX-License-Identifier: MIT */
/* Continuous batching: concurrent, chunked, memory-starved (-ENOSPC: wait / preempt) and multi-turn
 * runs produce exactly the tokens of each conversation run alone (random f32 model, greedy). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../examples/llama/engine.h"
#include "randmodel.h"
#include "daemon.h"

#define NC 4
#define GEN 24
static char path[256];
static const char *daemon_sock; /* set: attention through pagedkvd */
static unsigned pool_serial;

struct rig {
	struct llama m;
	struct tpool *tp;
	struct pkv_attn a;
	struct llama_ctx c;
	struct engine e;
	struct tokenizer tok;
};

static void rig_up(struct rig *r, uint64_t capacity, uint32_t budget, uint32_t max_running)
{
	struct pkv_geometry geo;
	char err[256];
	ck_assert_int_eq(llama_load(&r->m, path), 0);
	ck_assert_int_eq(tok_load(&r->tok, &r->m.g, err, sizeof err), 0);
	ck_assert_int_eq(tpool_create(2, &r->tp), 0);
	if (daemon_sock) {
		/* capacity in tokens becomes the pool's block count; a fresh pool per rig */
		char name[64];
		struct pkv_connect_opts co = { .socket_path = daemon_sock };
		struct pkv_pool_params pp = { .name = name, .act_dtype = PKV_DTYPE_F32, .model_id = r->m.model_id,
					      .window_left = -1 };
		llama_geometry(&r->m, 4, capacity ? (uint32_t)(capacity / 4) : 1024, &pp.geo);
		snprintf(name, sizeof name, "engine-%d-%u", (int)getpid(), pool_serial++);
		ck_assert_msg(pkv_attn_daemon_create(&co, &pp, &r->a, err, sizeof err) == 0, "%s", err);
	} else {
		llama_geometry(&r->m, 4, 1024, &geo);
		ck_assert_int_eq(pkv_attn_ref_create(&geo, capacity, r->tp, &r->a), 0);
	}
	ck_assert_int_eq(llama_ctx_init(&r->c, &r->m, &r->a, r->tp, 64), 0);
	ck_assert_int_eq(engine_init(&r->e, &r->c, &r->tok, budget, max_running), 0);
}

static void rig_down(struct rig *r)
{
	engine_free(&r->e);
	llama_ctx_free(&r->c);
	pkv_attn_destroy(&r->a);
	tpool_destroy(r->tp);
	tok_free(&r->tok);
	llama_free(&r->m);
}

static void prompt(int i, int32_t *t, uint32_t n)
{
	unsigned s = 1000u + (unsigned)i * 77u;
	for (uint32_t k = 0; k < n; k++) {
		s = s * 1103515245u + 12345u;
		t[k] = 3 + (int32_t)((s >> 8) % 290);
	}
}

/* Each conversation alone, unconstrained: the expected tokens. */
static void solo(int i, uint32_t n, int32_t *out, uint32_t *n_out)
{
	struct rig r;
	struct sampler smp;
	int32_t t[64];
	rig_up(&r, 0, 64, 1);
	sampler_init(&smp, 0, 0, 1, 1);
	prompt(i, t, n);
	struct conv *c = engine_conv_new(&r.e, &smp, NULL, NULL);
	ck_assert_int_eq(engine_submit(&r.e, c, t, n, GEN), 0);
	ck_assert_int_eq(engine_run(&r.e), 0);
	ck_assert_int_eq(c->state, CONV_DONE);
	*n_out = c->n_gen;
	memcpy(out, c->hist + c->turn_start, c->n_gen * sizeof *out);
	rig_down(&r);
}

static void run_all_and_compare(uint64_t capacity, uint32_t budget, int expect_preempt)
{
	static const uint32_t plen[NC] = { 20, 33, 7, 41 };
	struct rig r;
	struct sampler smp;
	struct conv *cv[NC];
	rig_up(&r, capacity, budget, NC);
	sampler_init(&smp, 0, 0, 1, 1);
	for (int i = 0; i < NC; i++) {
		int32_t t[64];
		prompt(i, t, plen[i]);
		cv[i] = engine_conv_new(&r.e, &smp, NULL, NULL);
		ck_assert_int_eq(engine_submit(&r.e, cv[i], t, plen[i], GEN), 0);
	}
	ck_assert_int_eq(engine_run(&r.e), 0);
	uint32_t pre = 0;
	for (int i = 0; i < NC; i++) {
		int32_t want[GEN];
		uint32_t nw;
		solo(i, plen[i], want, &nw);
		ck_assert_msg(cv[i]->state == CONV_DONE, "conversation %d: state %d err %d", i, cv[i]->state, cv[i]->err);
		ck_assert_uint_eq(cv[i]->n_gen, nw);
		for (uint32_t k = 0; k < nw; k++)
			ck_assert_msg(cv[i]->hist[cv[i]->turn_start + k] == want[k], "conv %d token %u", i, k);
		pre += cv[i]->preemptions;
	}
	if (expect_preempt)
		ck_assert_uint_gt(pre, 0);
	rig_down(&r);
}

START_TEST(concurrent_chunked_equals_solo)
{
	run_all_and_compare(0, 16, 0); /* 16-token budget: prompts are split over several steps */
}
END_TEST

/* Room for about two conversations: the others wait or are preempted and redone. */
START_TEST(enospc_waits_or_preempts_and_still_equals_solo)
{
	run_all_and_compare(120, 64, 1);
}
END_TEST

START_TEST(second_turn_reuses_history)
{
	struct rig r;
	struct sampler smp;
	int32_t t1[40], t2[10];
	rig_up(&r, 0, 64, 1);
	sampler_init(&smp, 0, 0, 1, 1);
	prompt(7, t1, 40);
	prompt(8, t2, 10);
	struct conv *c = engine_conv_new(&r.e, &smp, NULL, NULL);
	ck_assert_int_eq(engine_submit(&r.e, c, t1, 40, 8), 0);
	ck_assert_int_eq(engine_run(&r.e), 0);
	uint32_t hist1 = c->n_hist;
	uint64_t before = r.e.tokens_computed;
	ck_assert_int_eq(engine_submit(&r.e, c, t2, 10, 8), 0);
	ck_assert_int_eq(engine_run(&r.e), 0);
	ck_assert_int_eq(c->state, CONV_DONE);
	/* only the tail of the history (less than a block) plus the new turn and its decodes */
	uint64_t computed = r.e.tokens_computed - before;
	ck_assert_uint_le(computed, 4 + 10 + 8);
	/* and the reply equals a fresh run over the same whole history */
	int32_t *h = malloc((hist1 + 10) * sizeof *h);
	memcpy(h, c->hist, (hist1 + 10) * sizeof *h);
	int32_t got[8];
	uint32_t ng = c->n_gen;
	memcpy(got, c->hist + c->turn_start, ng * sizeof *got);
	rig_down(&r);
	rig_up(&r, 0, 64, 1);
	struct conv *f = engine_conv_new(&r.e, &smp, NULL, NULL);
	ck_assert_int_eq(engine_submit(&r.e, f, h, hist1 + 10, 8), 0);
	ck_assert_int_eq(engine_run(&r.e), 0);
	ck_assert_uint_eq(f->n_gen, ng);
	for (uint32_t k = 0; k < ng; k++)
		ck_assert_int_eq(f->hist[f->turn_start + k], got[k]);
	free(h);
	rig_down(&r);
}
END_TEST

static struct dmn dmn;

static void daemon_up(void)
{
	if (test_daemon_start(&dmn)) {
		daemon_sock = "/nonexistent/pagedkvd-did-not-start";
		return;
	}
	daemon_sock = dmn.sock;
}

static void daemon_down(void)
{
	if (dmn.pid)
		test_daemon_stop(&dmn);
	daemon_sock = NULL;
}

int main(void)
{
	char dir[] = "/tmp/pkv-engine-XXXXXX";
	if (!mkdtemp(dir))
		return 99;
	struct randmodel_params p = { .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn = 96,
				      .n_vocab = 300, .wtype = GGML_F32, .seed = 9 };
	snprintf(path, sizeof path, "%s/rand.gguf", dir);
	if (randmodel_write(path, &p))
		return 99;
	Suite *s = suite_create("engine");
	TCase *tc = tcase_create("batching");
	tcase_add_test(tc, concurrent_chunked_equals_solo);
	tcase_add_test(tc, enospc_waits_or_preempts_and_still_equals_solo);
	tcase_add_test(tc, second_turn_reuses_history);
	suite_add_tcase(s, tc);
	/* The same through pagedkvd: a pool of 30 4-token blocks makes step_begin return -ENOSPC. */
	TCase *td = tcase_create("pagedkvd");
	tcase_add_unchecked_fixture(td, daemon_up, daemon_down);
	tcase_set_timeout(td, 120);
	tcase_add_test(td, concurrent_chunked_equals_solo);
	tcase_add_test(td, enospc_waits_or_preempts_and_still_equals_solo);
	tcase_add_test(td, second_turn_reuses_history);
	suite_add_tcase(s, td);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	unlink(path);
	rmdir(dir);
	return nf ? 1 : 0;
}
