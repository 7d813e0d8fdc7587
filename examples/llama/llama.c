/* SPDX-License-Identifier: MIT */
/* Llama-family forward (llama, qwen2): RMSNorm, RoPE, GQA attention through pkv_attn, SwiGLU. */
#include "llama.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

__attribute__((format(printf, 2, 3)))
static int lfail(struct llama *m, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m->err, sizeof m->err, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static int get_mat(struct llama *m, const char *name, uint32_t rows, uint32_t cols, struct wmat *w, int optional)
{
	const struct gguf_tensor *t = gguf_tensor(&m->g, name);
	int r;
	if (!t)
		return optional ? -ENOENT : lfail(m, "tensor %s is missing", name);
	if (t->n_dims > 2 || t->ne[0] != cols || t->ne[1] != rows)
		return lfail(m, "tensor %s has shape [%llu, %llu], expected [%u, %u]", name,
			     (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], cols, rows);
	if (pkv_wmat_is_quant(t->type) && cols % QK)
		return lfail(m, "tensor %s: quantized rows must be a multiple of 32", name);
	w->type = t->type;
	w->rows = rows;
	w->cols = cols;
	w->row_bytes = pkv_row_bytes(t->type, cols);
	w->data = t->data;
	/* Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: computed in Q4_1 / Q8_0, converted once here (convert.c) */
	r = pkv_wmat_convert(w);
	if (r == -ENOMEM)
		return lfail(m, "tensor %s: out of memory converting %s to %s", name, ggml_type_name(t->type),
			     ggml_type_name(pkv_convert_target(t->type)));
	if (r)
		return lfail(m, "tensor %s: cannot convert %s rows of %u", name, ggml_type_name(t->type), cols);
	return 0;
}

static int get_vec(struct llama *m, const char *name, uint32_t n, float **out)
{
	const struct gguf_tensor *t = gguf_tensor(&m->g, name);
	if (!t)
		return lfail(m, "tensor %s is missing", name);
	if (t->n_dims != 1 || t->ne[0] != n)
		return lfail(m, "tensor %s should be a vector of %u", name, n);
	*out = malloc(n * sizeof(float));
	if (!*out)
		return -ENOMEM;
	pkv_dequant_row(t->type, t->data, *out, n);
	return 0;
}

/* The model's metadata key "ARCH.suffix" (llama.embedding_length, qwen2.embedding_length...). */
static const char *arch_key(const struct llama *m, const char *suffix, char *buf, size_t len)
{
	snprintf(buf, len, "%s.%s", m->arch->name, suffix);
	return buf;
}

static int arch_u32(const struct llama *m, const char *suffix, uint32_t *v)
{
	char k[96];

	return gguf_get_u32(&m->g, arch_key(m, suffix, k, sizeof k), v);
}

static int arch_f32(const struct llama *m, const char *suffix, float *v)
{
	char k[96];

	return gguf_get_f32(&m->g, arch_key(m, suffix, k, sizeof k), v);
}

/* An optional bias vector: NULL when the file has none. */
static int get_bias(struct llama *m, const char *name, uint32_t n, float **out)
{
	*out = NULL;
	return gguf_tensor(&m->g, name) ? get_vec(m, name, n, out) : 0;
}

static int hp_u32(struct llama *m, const char *suffix, uint32_t *v, uint32_t dflt)
{
	char key[96];
	int r = gguf_get_u32(&m->g, arch_key(m, suffix, key, sizeof key), v);
	if (r == -ENOENT && dflt) {
		*v = dflt;
		return 0;
	}
	if (r)
		return lfail(m, "metadata %s is %s", key, r == -ENOENT ? "missing" : "not an unsigned integer");
	return 0;
}


/* A layer's seven weight matrices, in the order of the letters "qkvogud" ($PKV_ACT16). */
#define LAYER_MATS 7
static void layer_mats(struct llama_layer *L, struct wmat *ws[LAYER_MATS])
{
	ws[0] = &L->wq;
	ws[1] = &L->wk;
	ws[2] = &L->wv;
	ws[3] = &L->wo;
	ws[4] = &L->gate;
	ws[5] = &L->up;
	ws[6] = &L->down;
}

/*
 * Rope scaling as llama.cpp reads it for this architecture: linear scaling
 * (positions times 1/factor) and rope_freqs.weight (per rotated pair, the
 * angle divided by its factor: Llama 3.1 and later). Other kinds (YaRN,
 * LongRoPE) are refused rather than run unscaled: the logits would be wrong
 * with no error anywhere.
 */
static int load_rope_scaling(struct llama *m, const char *path)
{
	const struct llama_hparams *hp = &m->hp;
	struct gguf_str type;
	float f = 1.f;
	int r;

	m->rope_pos_scale = 1.f;
	char k[96];

	if (!gguf_get_str(&m->g, arch_key(m, "rope.scaling.type", k, sizeof k), &type) && !gguf_str_eq(type, "none")) {
		if (!gguf_str_eq(type, "linear"))
			return lfail(m, "%s: rope scaling '%.*s' is not supported (linear, rope_freqs)", path,
				     (int)(type.len > 32 ? 32 : type.len), type.s);
		if (arch_f32(m, "rope.scaling.factor", &f))
			return lfail(m, "%s: linear rope scaling without %s.rope.scaling.factor", path, m->arch->name);
	} else if (arch_f32(m, "rope.scale_linear", &f)) {
		f = 1.f; /* the older key, absent: no scaling */
	}
	if (!(f >= 1.f && f <= 1024.f))
		return lfail(m, "%s: rope scaling factor %g (1 to 1024)", path, (double)f);
	m->rope_pos_scale = 1.f / f;
	if (!gguf_tensor(&m->g, "rope_freqs.weight"))
		return 0;
	if ((r = get_vec(m, "rope_freqs.weight", hp->rope_dims / 2, &m->rope_freq_div)))
		return r;
	for (uint32_t p = 0; p < hp->rope_dims / 2; p++)
		if (!(m->rope_freq_div[p] > 0.f && m->rope_freq_div[p] < 1e30f))
			return lfail(m, "%s: rope_freqs.weight[%u] is %g (must be positive)", path, p,
				     (double)m->rope_freq_div[p]);
	return 0;
}

/*
 * The architectures: the same decoder, told apart by their metadata prefix, the rotary pair layout
 * (llama: pairs (2i, 2i+1), as its converter permutes Q and K; qwen2: NeoX pairs (i, i + d/2)) and
 * Qwen2's biases on Q, K and V.
 */
static const struct llama_arch archs[] = {
	{ .name = "llama", .rope_neox = 0, .qkv_bias = 0 },
	{ .name = "qwen2", .rope_neox = 1, .qkv_bias = 1 },
};

int llama_load(struct llama *m, const char *path)
{
	struct llama_hparams *hp = &m->hp;
	struct gguf_str arch;
	char name[96];
	int r;

	memset(m, 0, sizeof *m);
	if ((r = gguf_open(&m->g, path))) {
		snprintf(m->err, sizeof m->err, "%s", m->g.err);
		return r;
	}
	if (gguf_get_str(&m->g, "general.architecture", &arch)) {
		r = lfail(m, "%s: no general.architecture", path);
		goto err;
	}
	for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]) && !m->arch; i++)
		if (gguf_str_eq(arch, archs[i].name))
			m->arch = &archs[i];
	if (!m->arch) {
		r = lfail(m, "%s: architecture '%.*s' is not supported (llama, qwen2)", path,
			  (int)(arch.len > 32 ? 32 : arch.len), arch.s);
		goto err;
	}
	if ((r = hp_u32(m, "embedding_length", &hp->dim, 0)) || (r = hp_u32(m, "block_count", &hp->n_layers, 0)) ||
	    (r = hp_u32(m, "attention.head_count", &hp->n_heads, 0)) ||
	    (r = hp_u32(m, "feed_forward_length", &hp->ffn, 0)) || (r = hp_u32(m, "context_length", &hp->ctx, 2048)))
		goto err;
	if (arch_u32(m, "attention.head_count_kv", &hp->n_kv_heads))
		hp->n_kv_heads = hp->n_heads;
	if (!hp->dim || !hp->n_layers || !hp->n_heads || !hp->n_kv_heads || hp->dim % hp->n_heads ||
	    hp->n_heads % hp->n_kv_heads || hp->n_layers > 1024 || hp->dim > 65536 || hp->ffn > 1 << 20 ||
	    !hp->ffn) {
		r = lfail(m, "%s: inconsistent hyper-parameters (dim %u, heads %u/%u, layers %u, ffn %u)", path,
			  hp->dim, hp->n_heads, hp->n_kv_heads, hp->n_layers, hp->ffn);
		goto err;
	}
	hp->head_dim = hp->dim / hp->n_heads;
	if (arch_u32(m, "rope.dimension_count", &hp->rope_dims))
		hp->rope_dims = hp->head_dim;
	if (hp->rope_dims > hp->head_dim || hp->rope_dims % 2) {
		r = lfail(m, "%s: rope dimension %u does not fit head dim %u", path, hp->rope_dims, hp->head_dim);
		goto err;
	}
	if (arch_f32(m, "rope.freq_base", &hp->rope_base))
		hp->rope_base = 10000.f;
	if (arch_f32(m, "attention.layer_norm_rms_epsilon", &hp->eps))
		hp->eps = 1e-5f;
	if ((r = load_rope_scaling(m, path)))
		goto err;
	{
		const struct gguf_tensor *te = gguf_tensor(&m->g, "token_embd.weight");
		if (!te || te->n_dims != 2 || te->ne[0] != hp->dim || te->ne[1] > (1u << 24)) {
			r = lfail(m, "%s: token_embd.weight missing or not [dim, vocab]", path);
			goto err;
		}
		hp->n_vocab = (uint32_t)te->ne[1];
	}
	if ((r = get_mat(m, "token_embd.weight", hp->n_vocab, hp->dim, &m->tok_embd, 0)))
		goto err;
	r = get_mat(m, "output.weight", hp->n_vocab, hp->dim, &m->output, 1);
	if (r == -ENOENT) {
		m->output = m->tok_embd; /* tied embeddings (SmolLM2) */
		m->output.converted = NULL; /* a converted copy stays tok_embd's to free */
	} else if (r)
		goto err;
	if ((r = get_vec(m, "output_norm.weight", hp->dim, &m->output_norm)))
		goto err;
	m->layers = calloc(hp->n_layers, sizeof *m->layers);
	if (!m->layers) {
		r = -ENOMEM;
		goto err;
	}
	uint32_t qd = hp->n_heads * hp->head_dim, kd = hp->n_kv_heads * hp->head_dim;
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		struct llama_layer *L = &m->layers[l];
#define T(s) (snprintf(name, sizeof name, "blk.%u." s ".weight", l), name)
		if ((r = get_vec(m, T("attn_norm"), hp->dim, &L->attn_norm)) ||
		    (r = get_vec(m, T("ffn_norm"), hp->dim, &L->ffn_norm)) ||
		    (r = get_mat(m, T("attn_q"), qd, hp->dim, &L->wq, 0)) ||
		    (r = get_mat(m, T("attn_k"), kd, hp->dim, &L->wk, 0)) ||
		    (r = get_mat(m, T("attn_v"), kd, hp->dim, &L->wv, 0)) ||
		    (r = get_mat(m, T("attn_output"), hp->dim, qd, &L->wo, 0)) ||
		    (r = get_mat(m, T("ffn_gate"), hp->ffn, hp->dim, &L->gate, 0)) ||
		    (r = get_mat(m, T("ffn_up"), hp->ffn, hp->dim, &L->up, 0)) ||
		    (r = get_mat(m, T("ffn_down"), hp->dim, hp->ffn, &L->down, 0)))
			goto err;
#undef T
#define B(s) (snprintf(name, sizeof name, "blk.%u." s ".bias", l), name)
		if ((r = get_bias(m, B("attn_q"), qd, &L->bq)) || (r = get_bias(m, B("attn_k"), kd, &L->bk)) ||
		    (r = get_bias(m, B("attn_v"), kd, &L->bv)))
			goto err;
		if (m->arch->qkv_bias && !(L->bq && L->bk && L->bv)) {
			r = lfail(m, "%s: layer %u lacks the Q, K or V bias of the %s architecture", path, l,
				  m->arch->name);
			goto err;
		}
#undef B
	}
	{
		/* The fingerprint covers the shapes and every weight byte: two files with the same
		 * geometry but different weights must never share KV. */
		XXH3_state_t *st = XXH3_createState();
		if (!st) {
			r = -ENOMEM;
			goto err;
		}
		XXH3_64bits_reset(st);
		XXH3_64bits_update(st, hp, sizeof *hp);
		/* (rope_freqs.weight is a tensor, hashed below; files without scaling keep their old id) */
		if (m->rope_pos_scale != 1.f)
			XXH3_64bits_update(st, &m->rope_pos_scale, sizeof m->rope_pos_scale);
		if (m->arch->rope_neox) /* (llama files keep their old id) */
			XXH3_64bits_update(st, m->arch->name, strlen(m->arch->name));
		for (uint64_t i = 0; i < m->g.n_tensors; i++) {
			const struct gguf_tensor *t = &m->g.tensors[i];
			XXH3_64bits_update(st, t->name.s, t->name.len);
			XXH3_64bits_update(st, t->data, t->nbytes);
		}
		m->model_id = XXH3_64bits_digest(st);
		XXH3_freeState(st);
	}
	/* tok_embd stays unpacked: the embedding lookup reads single rows */
	if ((r = pkv_wmat_pack(&m->output)))
		goto err;
	{
		/*
		 * Which inputs keep 16 bits (two int8 planes) rather than plain int8 blocks, by matrix
		 * letter: q k v o gate up down, x = output. Default: all. SmolLM2's normalized inputs and
		 * its SwiGLU product carry outlier channels that int8 blocks round their neighbours away
		 * for: with all eight int8 (llama.cpp's choice) greedy decoding no longer answers "Paris"
		 * and top-1 agreement with 16 bits falls to 97.6 % (tests/model/test_q8agree); int8 on
		 * o and x only keeps 100 % agreement there but is past the 16-bit tolerance of
		 * tests/model/test_equality. $PKV_ACT16 overrides ("" = int8 everywhere).
		 */
		const char *a16 = getenv("PKV_ACT16");
		if (!a16)
			a16 = "qkvogudx";
		m->output.act16 = !!strchr(a16, 'x');
		for (uint32_t l = 0; l < hp->n_layers; l++) {
			struct wmat *ws[LAYER_MATS];
			layer_mats(&m->layers[l], ws);
			for (size_t i = 0; i < LAYER_MATS; i++) {
				if ((r = pkv_wmat_pack(ws[i])))
					goto err;
				ws[i]->act16 = !!strchr(a16, "qkvogud"[i]);
			}
		}
	}
	return 0;
err:
	llama_free(m);
	if (!m->err[0])
		snprintf(m->err, sizeof m->err, "%s: %s", path, strerror(-r));
	return r;
}

void llama_unpack(struct llama *m)
{
	pkv_wmat_unpack(&m->output);
	if (m->layers)
		for (uint32_t l = 0; l < m->hp.n_layers; l++) {
			struct wmat *ws[LAYER_MATS];
			layer_mats(&m->layers[l], ws);
			for (size_t i = 0; i < LAYER_MATS; i++)
				pkv_wmat_unpack(ws[i]);
		}
}

void llama_free(struct llama *m)
{
	llama_unpack(m);
	pkv_wmat_free_converted(&m->tok_embd);
	pkv_wmat_free_converted(&m->output);
	if (m->layers)
		for (uint32_t l = 0; l < m->hp.n_layers; l++) {
			struct wmat *ws[LAYER_MATS];
			layer_mats(&m->layers[l], ws);
			for (size_t i = 0; i < LAYER_MATS; i++)
				pkv_wmat_free_converted(ws[i]);
			free(m->layers[l].attn_norm);
			free(m->layers[l].ffn_norm);
			free(m->layers[l].bq);
			free(m->layers[l].bk);
			free(m->layers[l].bv);
		}
	free(m->layers);
	free(m->output_norm);
	free(m->rope_freq_div);
	m->layers = NULL;
	m->output_norm = NULL;
	m->rope_freq_div = NULL;
	gguf_close(&m->g);
}

void llama_geometry(const struct llama *m, uint32_t block_size, uint32_t num_blocks, struct pkv_geometry *geo)
{
	memset(geo, 0, sizeof *geo);
	geo->num_layers = m->hp.n_layers;
	geo->num_heads = m->hp.n_heads;
	geo->num_kv_heads = m->hp.n_kv_heads;
	geo->head_dim = m->hp.head_dim;
	geo->cache_dtype = PKV_DTYPE_F32;
	geo->block_size = block_size;
	geo->num_blocks = num_blocks;
}

int llama_ctx_init(struct llama_ctx *c, const struct llama *m, struct pkv_attn *attn, struct tpool *tp,
		   uint32_t max_tokens)
{
	const struct llama_hparams *hp = &m->hp;
	size_t T = max_tokens, qd = (size_t)hp->n_heads * hp->head_dim, kd = (size_t)hp->n_kv_heads * hp->head_dim;
	memset(c, 0, sizeof *c);
	c->m = m;
	c->attn = attn;
	c->tp = tp;
	c->cap_tokens = max_tokens;
	c->x = malloc(T * hp->dim * sizeof(float));
	c->xb = malloc(T * (hp->dim > qd ? hp->dim : qd) * sizeof(float));
	c->hb = malloc(T * hp->ffn * sizeof(float));
	c->hb2 = malloc(T * hp->ffn * sizeof(float));
	c->rope = malloc(T * hp->rope_dims * sizeof(float));
	c->q = attn->ops->alloc(attn->ctx, T * qd * sizeof(float));
	c->o = attn->ops->alloc(attn->ctx, T * qd * sizeof(float));
	c->k = attn->ops->alloc(attn->ctx, T * kd * sizeof(float));
	c->v = attn->ops->alloc(attn->ctx, T * kd * sizeof(float));
	if (!c->x || !c->xb || !c->hb || !c->hb2 || !c->rope || !c->q || !c->o || !c->k || !c->v) {
		llama_ctx_free(c);
		return -ENOMEM;
	}
	return 0;
}

void llama_ctx_free(struct llama_ctx *c)
{
	if (!c->m)
		return;
	free(c->x);
	free(c->xb);
	free(c->hb);
	free(c->hb2);
	free(c->rope);
	if (c->attn && c->attn->ops) {
		void *ts[4] = { c->q, c->o, c->k, c->v };
		for (int i = 0; i < 4; i++)
			if (ts[i])
				c->attn->ops->free(c->attn->ctx, ts[i]);
	}
	pkv_mm_scratch_free(&c->mm);
	memset(c, 0, sizeof *c);
}

static void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
	float ss = 0;
	for (uint32_t i = 0; i < n; i++)
		ss += x[i] * x[i];
	ss = 1.f / sqrtf(ss / (float)n + eps);
	for (uint32_t i = 0; i < n; i++)
		out[i] = x[i] * ss * w[i];
}

/* Rotates pair i of every head by pos * base^(-2i/rope_dims): pairs (2i, 2i+1), or (i, i + rd/2) for
 * NeoX. */
static void rope_apply(float *v, uint32_t heads, uint32_t hd, uint32_t rd, const float *cs, int neox)
{
	uint32_t step = neox ? 1 : 2, other = neox ? rd / 2 : 1;

	for (uint32_t h = 0; h < heads; h++) {
		float *p = v + (size_t)h * hd;
		for (uint32_t i = 0; i < rd / 2; i++) {
			float c = cs[2 * i], s = cs[2 * i + 1], *x = p + i * step, *y = x + other;
			float a = *x, b = *y;

			*x = a * c - b * s;
			*y = a * s + b * c;
		}
	}
}

static void add_bias(float *v, const float *b, uint32_t n, uint32_t T)
{
	if (b)
		for (uint32_t t = 0; t < T; t++)
			for (uint32_t i = 0; i < n; i++)
				v[(size_t)t * n + i] += b[i];
}

int llama_forward(struct llama_ctx *c, const uint32_t *seqs, const uint32_t *n_new, const uint32_t *pos0,
		  const int32_t *tokens, uint32_t n_seqs, float *logits, int all_logits)
{
	const struct llama *m = c->m;
	const struct llama_hparams *hp = &m->hp;
	const struct pkv_attn_ops *A = c->attn->ops;
	uint32_t T = 0, D = hp->dim, qd = hp->n_heads * hp->head_dim, kd = hp->n_kv_heads * hp->head_dim;
	int r;

	for (uint32_t i = 0; i < n_seqs; i++) {
		if (n_new[i] == 0 || n_new[i] > c->cap_tokens - T)
			return -E2BIG;
		T += n_new[i];
	}
	for (uint32_t t = 0; t < T; t++)
		if (tokens[t] < 0 || (uint32_t)tokens[t] >= hp->n_vocab)
			return -EINVAL;
	/* rope table: per token, (cos, sin) per rotated pair; angles in double so long positions stay exact */
	for (uint32_t i = 0, t = 0; i < n_seqs; i++)
		for (uint32_t j = 0; j < n_new[i]; j++, t++) {
			double pos = (double)pos0[i] + j;
			for (uint32_t p = 0; p < hp->rope_dims / 2; p++) {
				double th = pos * m->rope_pos_scale * pow((double)hp->rope_base, -2.0 * p / hp->rope_dims);

				if (m->rope_freq_div)
					th /= m->rope_freq_div[p];
				c->rope[(size_t)t * hp->rope_dims + 2 * p] = (float)cos(th);
				c->rope[(size_t)t * hp->rope_dims + 2 * p + 1] = (float)sin(th);
			}
		}
	for (uint32_t t = 0; t < T; t++)
		pkv_wmat_row(&m->tok_embd, (uint32_t)tokens[t], c->x + (size_t)t * D);

	if ((r = A->step_begin(c->attn->ctx, seqs, n_new, tokens, n_seqs)))
		return r;
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		const struct llama_layer *L = &m->layers[l];
		for (uint32_t t = 0; t < T; t++)
			rmsnorm(c->xb + (size_t)t * D, c->x + (size_t)t * D, L->attn_norm, D, hp->eps);
		{
			/* Q, K and V in one pass of the pool: one barrier and one activation quantization */
			const struct wmat *ws[] = { &L->wq, &L->wk, &L->wv };
			float *ys[] = { c->q, c->k, c->v };
			if ((r = pkv_matmul_n(c->tp, &c->mm, ws, ys, 3, c->xb, T, 0)))
				goto err;
		}
		add_bias(c->q, L->bq, qd, T);
		add_bias(c->k, L->bk, kd, T);
		add_bias(c->v, L->bv, kd, T);
		for (uint32_t t = 0; t < T; t++) {
			const float *cs = c->rope + (size_t)t * hp->rope_dims;
			int neox = m->arch->rope_neox;

			rope_apply(c->q + (size_t)t * qd, hp->n_heads, hp->head_dim, hp->rope_dims, cs, neox);
			rope_apply(c->k + (size_t)t * kd, hp->n_kv_heads, hp->head_dim, hp->rope_dims, cs, neox);
		}
		if (c->attn->remote)
			tpool_idle(c->tp);
		if ((r = A->attend(c->attn->ctx, l, c->q, c->k, c->v, c->o)))
			goto err;
		if ((r = pkv_matmul(c->tp, &c->mm, &L->wo, c->o, T, c->xb)))
			goto err;
		for (size_t i = 0; i < (size_t)T * D; i++)
			c->x[i] += c->xb[i];
		for (uint32_t t = 0; t < T; t++)
			rmsnorm(c->xb + (size_t)t * D, c->x + (size_t)t * D, L->ffn_norm, D, hp->eps);
		{
			/* gate, up and SwiGLU fused: each thread finishes the rows it computed */
			const struct wmat *ws[] = { &L->gate, &L->up };
			float *ys[] = { c->hb, c->hb2 };
			if ((r = pkv_matmul_n(c->tp, &c->mm, ws, ys, 2, c->xb, T, 1)))
				goto err;
		}
		if ((r = pkv_matmul(c->tp, &c->mm, &L->down, c->hb, T, c->xb)))
			goto err;
		for (size_t i = 0; i < (size_t)T * D; i++)
			c->x[i] += c->xb[i];
	}
	if ((r = A->step_end(c->attn->ctx)))
		return r;
	{
		/* final norm only on the rows whose logits are wanted */
		uint32_t n_out = 0;
		for (uint32_t i = 0, t = 0; i < n_seqs; i++) {
			t += n_new[i];
			if (all_logits) {
				for (uint32_t j = t - n_new[i]; j < t; j++, n_out++)
					rmsnorm(c->xb + (size_t)n_out * D, c->x + (size_t)j * D, m->output_norm, D, hp->eps);
			} else {
				rmsnorm(c->xb + (size_t)n_out * D, c->x + (size_t)(t - 1) * D, m->output_norm, D, hp->eps);
				n_out++;
			}
		}
		if ((r = pkv_matmul(c->tp, &c->mm, &m->output, c->xb, n_out, logits)))
			return r;
	}
	return 0;
err:
	A->step_abort(c->attn->ctx);
	return r;
}
