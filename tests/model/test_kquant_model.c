/* SPDX-License-Identifier: MIT */
/*
 * Random-weight llama models with Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 matrices: they load, their matrices
 * are converted to exactly the bytes of the reference conversion (ref_quant_k.h), their logits equal
 * those of the same model stored already converted, and stay close to those of the model stored as
 * f32 (the dequantized weights). Broken files (truncated K-quant data, row lengths that are not whole
 * super-blocks, shapes whose sizes overflow) fail with a message.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../examples/llama/llama.h"
#include "gguf_write.h"
#include "model_logits.h"
#include "randmodel.h"
#include "ref_quant_k.h"
#include "../suite_main.h"

/* The larger difference, a NaN being the largest and staying (fmaxf would drop it). */
static float worse(float worst, float d)
{
	return isnan(worst) || d <= worst ? worst : d;
}

static const uint32_t types[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_Q5_0, GGML_Q5_1 };
#define N_TYPES 5
enum { AS_FILE, AS_CONVERTED, AS_F32, N_FORMS };
static char dir[] = "/tmp/pkv-kq-XXXXXX";
static char path[N_TYPES][N_FORMS][300];

static int restore_converted(uint32_t wtype, const void *row, uint32_t store, void *out, size_t n)
{
	float *scratch = malloc(n * sizeof *scratch);
	if (!scratch)
		return -ENOMEM;
	if (store != (wtype == GGML_Q4_K ? GGML_Q4_1 : GGML_Q8_0)) {
		free(scratch);
		return -EINVAL;
	}
	ref_convert(wtype, row, out, n, scratch);
	free(scratch);
	return 0;
}

static int restore_f32(uint32_t wtype, const void *row, uint32_t store, void *out, size_t n)
{
	if (store != GGML_F32)
		return -EINVAL;
	ref_dequant(wtype, row, out, n);
	return 0;
}

/* Geometry: rows of whole super-blocks (dim and ffn multiples of 256), 16-row multiples so the
 * converted matrices take the VNNI path where the CPU has it; Q6_K's model has tied embeddings. */
static int write_models(void)
{
	for (int i = 0; i < N_TYPES; i++)
		for (int f = 0; f < N_FORMS; f++) {
			struct randmodel_params p = { .dim = 256, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn = 512,
						      .n_vocab = 304, .wtype = types[i], .tied = types[i] == GGML_Q6_K,
						      .seed = 11 + (uint64_t)i };
			if (f == AS_CONVERTED) {
				p.restore = restore_converted;
				p.store_type = types[i] == GGML_Q4_K ? GGML_Q4_1 : GGML_Q8_0;
			} else if (f == AS_F32) {
				p.restore = restore_f32;
				p.store_type = GGML_F32;
			}
			snprintf(path[i][f], sizeof path[i][f], "%s/%s-%d.gguf", dir, ggml_type_name(types[i]), f);
			if (randmodel_write(path[i][f], &p))
				return -1;
		}
	return 0;
}

static void all_mats(struct llama *m, struct wmat **ws, int *n)
{
	*n = 0;
	ws[(*n)++] = &m->tok_embd;
	ws[(*n)++] = &m->output;
	for (uint32_t l = 0; l < m->hp.n_layers; l++) {
		struct llama_layer *L = &m->layers[l];
		struct wmat *lw[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down };
		for (int k = 0; k < 7; k++)
			ws[(*n)++] = lw[k];
	}
}

START_TEST(matrices_convert_to_the_reference_bytes)
{
	struct llama a, b;
	struct wmat *wa[32], *wb[32];
	int na, nb;
	uint32_t to = pkv_convert_target(types[_i]);
	ck_assert_msg(llama_load(&a, path[_i][AS_FILE]) == 0, "%s", a.err);
	ck_assert_msg(llama_load(&b, path[_i][AS_CONVERTED]) == 0, "%s", b.err);
	all_mats(&a, wa, &na);
	all_mats(&b, wb, &nb);
	ck_assert_int_eq(na, nb);
	for (int k = 0; k < na; k++) {
		ck_assert_uint_eq(wa[k]->type, to);
		ck_assert_uint_eq(wb[k]->type, to);
		ck_assert_uint_eq(wa[k]->row_bytes, wb[k]->row_bytes);
		ck_assert_msg(!memcmp(wa[k]->data, wb[k]->data, (size_t)wa[k]->rows * wa[k]->row_bytes),
			      "%s: matrix %d converted differently from the reference", ggml_type_name(types[_i]), k);
		ck_assert_msg(wa[k]->packed || !wb[k]->packed, "matrix %d: converted copy not packed", k);
	}
	/* tied embeddings: the output shares tok_embd's converted copy, which only tok_embd frees */
	if (types[_i] == GGML_Q6_K) {
		ck_assert_ptr_eq(a.output.data, a.tok_embd.data);
		ck_assert_ptr_null(a.output.converted);
	}
	ck_assert_ptr_nonnull(a.tok_embd.converted);
	llama_free(&a);
	llama_free(&b);
}
END_TEST

static float *run(const char *p, uint32_t n, unsigned seed, uint32_t *vocab)
{
	float *out = model_logits(p, n, seed, vocab, NULL);

	ck_assert_msg(out != NULL, "%s: no logits", p);
	return out;
}

/*
 * Against the model stored already converted: the same bytes run through the same kernels, and each
 * output element is computed by one thread in a fixed order, so the logits must be identical (no
 * tolerance). Against the model stored as the dequantized f32 weights: converting to Q8_0 moves each
 * weight by up to half a Q8_0 step, as quantizing f32 weights to Q8_0 does, and this small random
 * model is sensitive to that: quantizing its f32 weights straight to Q8_0 moves the logits by 2.5 %
 * of their largest magnitude (measured over 4 seeds); the conversions moved them by 0.3 % (Q4_K, only
 * f16 rounding) to 3.6 % (Q5_0). 5e-2 bounds that; converting to Q8_0 blocks of only 15 levels instead
 * of 255 moves them by 22 to 40 % (measured).
 */
START_TEST(logits_equal_the_converted_model)
{
	uint32_t V, n = 24;
	float *got = run(path[_i][AS_FILE], n, 5, &V), *want = run(path[_i][AS_CONVERTED], n, 5, &V);
	float *f32 = run(path[_i][AS_F32], n, 5, &V), scale = 0, worst = 0;
	ck_assert_msg(!memcmp(got, want, (size_t)n * V * sizeof *got), "%s: logits differ from the converted model",
		      ggml_type_name(types[_i]));
	for (size_t i = 0; i < (size_t)n * V; i++) {
		scale = fmaxf(scale, fabsf(f32[i]));
		worst = worse(worst, fabsf(got[i] - f32[i]));
	}
	fprintf(stderr, "%s: max |logit - f32 model's| = %.3g of scale %.3g\n", ggml_type_name(types[_i]),
		(double)(worst / scale), (double)scale);
	ck_assert_msg(scale > 0.1f, "degenerate logits");
	ck_assert_msg(worst <= 5e-2f * scale, "%s: max |diff| %g over scale %g", ggml_type_name(types[_i]), worst, scale);
	free(got);
	free(want);
	free(f32);
}
END_TEST

static uint8_t *slurp(const char *p, size_t *len)
{
	FILE *f = fopen(p, "rb");
	uint8_t *buf;
	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	*len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc(*len);
	ck_assert_uint_eq(fread(buf, 1, *len, f), *len);
	fclose(f);
	return buf;
}

/* Cut inside the K-quant data (the last tensor, a middle one, one byte short): an error, not a crash. */
START_TEST(truncated_kquant_data_fails_to_load)
{
	size_t len;
	uint8_t *img = slurp(path[_i][AS_FILE], &len);
	size_t cuts[] = { len - 1, len - 100, len - ref_block_bytes(types[_i]), len / 2, len * 3 / 4 };
	char cut[320];
	snprintf(cut, sizeof cut, "%s/cut.gguf", dir);
	for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
		struct llama m;
		FILE *f = fopen(cut, "wb");
		ck_assert_ptr_nonnull(f);
		ck_assert_uint_eq(fwrite(img, 1, cuts[k], f), cuts[k]);
		fclose(f);
		ck_assert_msg(llama_load(&m, cut) != 0, "%s cut at %zu loaded", ggml_type_name(types[_i]), cuts[k]);
		ck_assert_msg(strstr(m.err, "truncated"), "cut at %zu: %s", cuts[k], m.err);
	}
	unlink(cut);
	free(img);
}
END_TEST

/* One tensor of the given shape with data_bytes of data, parsed from the image less its last short_by bytes. */
static int parse_one_tensor(uint32_t type, const uint64_t ne[2], size_t data_bytes, size_t short_by, char *why,
			    size_t whylen)
{
	struct gguf_builder b;
	struct gguf g;
	uint8_t *img, *data = calloc(1, data_bytes ? data_bytes : 1);
	size_t len;
	int r;
	gb_init(&b, 32);
	gb_kv_str(&b, "general.architecture", "llama");
	gb_tensor(&b, "w", type, ne, 2, data, data_bytes);
	free(data);
	ck_assert_int_eq(gb_finish(&b, &img, &len), 0);
	ck_assert_uint_lt(short_by, len);
	r = gguf_parse(&g, img, len - short_by);
	snprintf(why, whylen, "%s", g.err);
	if (!r) {
		ck_assert_uint_eq(g.tensors[0].nbytes, ne[0] / ref_block_elems(type) * ref_block_bytes(type) * ne[1]);
		gguf_close(&g);
	}
	free(img);
	return r;
}

START_TEST(bad_kquant_geometry_is_rejected)
{
	uint32_t t = types[_i];
	size_t be = ref_block_elems(t), bb = ref_block_bytes(t);
	char why[256];
	uint64_t ok[2] = { 2 * be, 3 }, ragged[2] = { be + be / 2, 3 }, huge[2] = { 1ull << 40, 1ull << 20 },
		 big[2] = { 1ull << 40, 1 };
	/* 6 blocks of data, padded to the 32-byte alignment: cutting one byte more than the padding */
	size_t pad = (32 - 6 * bb % 32) % 32;
	ck_assert_msg(parse_one_tensor(t, ok, 6 * bb, pad, why, sizeof why) == 0, "%s", why);
	ck_assert_int_eq(parse_one_tensor(t, ok, 6 * bb, pad + 1, why, sizeof why), -EINVAL);
	ck_assert_msg(strstr(why, "exceeds"), "%s", why);
	ck_assert_int_eq(parse_one_tensor(t, ragged, 6 * bb, 0, why, sizeof why), -EINVAL);
	ck_assert_msg(strstr(why, "not a multiple"), "%s", why);
	ck_assert_int_eq(parse_one_tensor(t, huge, bb, 0, why, sizeof why), -EINVAL);
	ck_assert_msg(strstr(why, "bad shape"), "%s", why);
	ck_assert_int_eq(parse_one_tensor(t, big, bb, 0, why, sizeof why), -EINVAL);
	ck_assert_msg(strstr(why, "exceeds"), "%s", why);
}
END_TEST

int main(void)
{
	if (!mkdtemp(dir) || write_models())
		return 99;
	Suite *s = suite_create("kquant_model");
	TCase *tc = tcase_create("models");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, matrices_convert_to_the_reference_bytes, 0, N_TYPES);
	tcase_add_loop_test(tc, logits_equal_the_converted_model, 0, N_TYPES);
	tcase_add_loop_test(tc, truncated_kquant_data_fails_to_load, 0, N_TYPES);
	tcase_add_loop_test(tc, bad_kquant_geometry_is_rejected, 0, N_TYPES);
	suite_add_tcase(s, tc);
	int failed = suite_main(s);
	for (int i = 0; i < N_TYPES; i++)
		for (int f = 0; f < N_FORMS; f++)
			unlink(path[i][f]);
	rmdir(dir);
	return failed;
}
