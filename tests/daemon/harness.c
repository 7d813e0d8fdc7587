/* SPDX-License-Identifier: MIT */
/* Test harness implementation: daemon processes, control client, raw protocol, reference attention. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pagedkv/dtype.h>
#include <pagedkv/pagedkv.h>
#include "common/msg.h"
#include "common/region.h"
#include "conformance/ref.h"
#include "harness.h"

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

int ctl_cmd(const char *sock, uint32_t cmd, uint32_t fmt, char *out, size_t len)
{
	struct pkv_msg_hello h = { { PKV_MSG_HELLO, sizeof(h) }, PKV_PROTO_VERSION, PKV_ROLE_CTL, 0 };
	struct pkv_msg_ctl m = { { PKV_MSG_CTL, sizeof(m) }, cmd, fmt };
	struct pkv_msg_reply rep;
	int s = pkv_sock_connect(sock, 5000), status = 0;

	if (out && len)
		out[0] = 0;
	if (s < 0)
		return s;
	if (pkv_msg_send(s, &h, sizeof(h), NULL, 0) ||
	    pkv_msg_recv(s, &rep, sizeof(rep), NULL, 0, NULL, 5000) < (ssize_t)PKV_REPLY_HDR_SIZE ||
	    rep.status) {
		close(s);
		return -EPROTO;
	}
	if (pkv_msg_send(s, &m, sizeof(m), NULL, 0)) {
		close(s);
		return -EPIPE;
	}
	{
		char *buf = NULL;
		size_t n = 0;
		int r = pkv_recv_output(s, 5000, &buf, &n, &status);

		if (r) {
			close(s);
			return r;
		}
		if (out && len) {
			size_t t = n < len - 1 ? n : len - 1;

			memcpy(out, buf, t);
			out[t] = 0;
		}
		free(buf);
	}
	close(s);
	return status;
}

uint64_t pool_counter_sum(const char *sock, const char *key)
{
	static char out[1 << 16];
	char pat[64];
	uint64_t n = 0;
	size_t k;

	if (ctl_cmd(sock, PKV_CTL_STATUS, PKV_FMT_JSON, out, sizeof(out)))
		return UINT64_MAX; /* no status: what the caller compares against fails */
	k = (size_t)snprintf(pat, sizeof(pat), "\"%s\":", key);
	for (const char *p = out; (p = strstr(p, pat)); p += k)
		n += strtoull(p + k, NULL, 10);
	return n;
}

int audit_until_clean(const char *sock, int timeout_ms, char *out, size_t len)
{
	int r = -1;

	for (int t = 0; t <= timeout_ms; t += 5) {
		r = ctl_cmd(sock, PKV_CTL_AUDIT, PKV_FMT_TEXT, out, len);
		if (r == 0)
			return 0;
		sleep_ms(5);
	}
	return r;
}

void test_pool_params(struct pkv_pool_params *p, const char *name)
{
	*p = (struct pkv_pool_params)PKV_POOL_PARAMS_INIT;
	p->name = name;
	p->geo = (struct pkv_geometry){ T_LAYERS, T_HEADS, T_KV_HEADS, T_DIM, PKV_DTYPE_F32, T_BS, T_BLOCKS };
	p->act_dtype = PKV_DTYPE_F32;
	p->model_id = 0x1234;
	p->window_left = -1;
}

struct pkv_client *test_client(const char *sock, const char *pool, size_t arena_bytes, uint32_t timeout_ms)
{
	struct pkv_connect_opts o = { .socket_path = sock, .arena_bytes = arena_bytes, .timeout_ms = timeout_ms };
	struct pkv_pool_params p;
	struct pkv_client *c;

	if (pkv_connect(&o, &c))
		return NULL;
	test_pool_params(&p, pool);
	if (pkv_pool_attach(c, &p)) {
		pkv_disconnect(c);
		return NULL;
	}
	return c;
}

float act_q(int32_t tok, uint32_t pos, uint32_t layer, uint32_t h, uint32_t x)
{
	return sinf(0.37f * tok + 0.11f * pos + 1.3f * layer + 0.7f * h + 0.05f * x);
}

float act_k(int32_t tok, uint32_t pos, uint32_t layer, uint32_t h, uint32_t x)
{
	return cosf(0.23f * tok + 0.13f * pos + 0.9f * layer + 0.5f * h + 0.07f * x);
}

float act_v(int32_t tok, uint32_t pos, uint32_t layer, uint32_t h, uint32_t x)
{
	return sinf(0.19f * tok - 0.17f * pos + 0.6f * layer + 0.3f * h + 0.09f * x) * 2.0f;
}

/* Key and value elements of the synthetic sequence, for the shared reference (src/conformance/ref.c). */
struct ref_seq {
	const int32_t *toks;
	uint32_t layer, kh, first; /* key j of the reference is position first + j */
};

static double seq_key(const void *p, uint32_t j, uint32_t x)
{
	const struct ref_seq *r = p;

	return act_k(r->toks[r->first + j], r->first + j, r->layer, r->kh, x);
}

static double seq_value(const void *p, uint32_t j, uint32_t x)
{
	const struct ref_seq *r = p;

	return act_v(r->toks[r->first + j], r->first + j, r->layer, r->kh, x);
}

void ref_attend_window(const int32_t *toks, uint32_t n, uint32_t p0, uint32_t layer, int32_t window, float *out)
{
	for (uint32_t p = p0; p < n; p++)
		for (uint32_t h = 0; h < T_HEADS; h++) {
			/* Causal: position p sees keys 0..p, and with a window only p - window on. */
			uint32_t first = window >= 0 && p > (uint32_t)window ? p - (uint32_t)window : 0;
			struct ref_seq seq = { toks, layer, h / (T_HEADS / T_KV_HEADS), first };
			double q[T_DIM], o[T_DIM];
			float *dst = out + ((size_t)(p - p0) * T_HEADS + h) * T_DIM;

			for (uint32_t x = 0; x < T_DIM; x++)
				q[x] = act_q(toks[p], p, layer, h, x);
			pkv_ref_attend_row(q, T_DIM, p + 1 - first, seq_key, seq_value, &seq, 1.0 / sqrt((double)T_DIM),
					   0, o);
			for (uint32_t x = 0; x < T_DIM; x++)
				dst[x] = (float)o[x];
		}
}

void ref_attend(const int32_t *toks, uint32_t n, uint32_t p0, uint32_t layer, float *out)
{
	ref_attend_window(toks, n, p0, layer, -1, out);
}

unsigned run_step_pause_us;

void act_row(int32_t tok, uint32_t pos, uint32_t layer, float *q, float *k, float *v)
{
	for (uint32_t h = 0; h < T_HEADS; h++)
		for (uint32_t x = 0; x < T_DIM; x++)
			q[h * T_DIM + x] = act_q(tok, pos, layer, h, x);
	for (uint32_t h = 0; h < T_KV_HEADS; h++)
		for (uint32_t x = 0; x < T_DIM; x++) {
			k[h * T_DIM + x] = act_k(tok, pos, layer, h, x);
			v[h * T_DIM + x] = act_v(tok, pos, layer, h, x);
		}
}

uint32_t run_step_act_dtype = PKV_DTYPE_F32;

/* f32 values to the arena's dtype, in place (a 16-bit dtype's values take the first half). */
static void to_act(float *a, size_t n)
{
	uint16_t *h = (uint16_t *)a;

	if (run_step_act_dtype == PKV_DTYPE_F32)
		return;
	for (size_t i = 0; i < n; i++)
		h[i] = run_step_act_dtype == PKV_DTYPE_BF16 ? pkv_f32_to_bf16(a[i]) : pkv_f32_to_f16(a[i]);
}

static float from_act(const void *a, size_t i)
{
	if (run_step_act_dtype == PKV_DTYPE_BF16)
		return pkv_bf16_to_f32(((const uint16_t *)a)[i]);
	if (run_step_act_dtype == PKV_DTYPE_F16)
		return pkv_f16_to_f32(((const uint16_t *)a)[i]);
	return ((const float *)a)[i];
}

int attend_layer(struct pkv_client *c, const int32_t *toks, uint32_t p0, uint32_t k, uint32_t l, float *out)
{
	size_t qn = (size_t)k * T_HEADS * T_DIM, kn = (size_t)k * T_KV_HEADS * T_DIM;
	float *q = pkv_alloc(c, qn * 4), *kk = pkv_alloc(c, kn * 4), *v = pkv_alloc(c, kn * 4),
	      *o = pkv_alloc(c, qn * 4);
	int r = -ENOMEM;

	if (!q || !kk || !v || !o)
		goto out;
	for (uint32_t t = 0; t < k; t++)
		act_row(toks[p0 + t], p0 + t, l, q + t * T_HEADS * T_DIM, kk + t * T_KV_HEADS * T_DIM,
			v + t * T_KV_HEADS * T_DIM);
	to_act(q, qn);
	to_act(kk, kn);
	to_act(v, kn);
	if (run_step_pause_us)
		usleep(run_step_pause_us);
	r = pkv_attend(c, l, q, kk, v, o);
	if (!r && out)
		for (size_t i = 0; i < qn; i++)
			out[i] = from_act(o, i);
out:
	pkv_free(c, q);
	pkv_free(c, kk);
	pkv_free(c, v);
	pkv_free(c, o);
	return r;
}

int run_step(struct pkv_client *c, uint32_t seq, const int32_t *toks, uint32_t p0, uint32_t k, float *out)
{
	size_t qn = (size_t)k * T_HEADS * T_DIM;
	int r = pkv_step_begin(c, &seq, &k, toks + p0, 1);

	if (r)
		return r;
	for (uint32_t l = 0; l < T_LAYERS; l++) {
		r = attend_layer(c, toks, p0, k, l, out ? out + l * qn : NULL);
		if (r) {
			pkv_step_abort(c);
			return r;
		}
	}
	return pkv_step_end(c);
}

float max_diff(const float *a, const float *b, size_t n)
{
	float m = 0;

	for (size_t i = 0; i < n; i++) {
		float d = fabsf(a[i] - b[i]);

		if (isnan(d) || d > m)
			m = d; /* a NaN stays: it is a failure */
	}
	return m;
}

/* ---------------------------------------------------------------- raw protocol */

int raw_open(struct raw *r, const char *sock, uint64_t arena, int seals)
{
	memset(r, 0, sizeof(*r));
	r->sock = r->memfd = r->sq_bell = -1;
	if (pkv_region_layout(arena, 64, 64, &r->hdr))
		return -EINVAL;
	r->memfd = memfd_create("raw", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (r->memfd < 0 || ftruncate(r->memfd, r->hdr.region_size) < 0)
		return -errno;
	if (seals && fcntl(r->memfd, F_ADD_SEALS, seals) < 0)
		return -errno;
	r->size = r->hdr.region_size;
	r->region = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd, 0);
	if (r->region == MAP_FAILED)
		return -errno;
	memcpy(r->region, &r->hdr, sizeof(r->hdr));
	pkv_ring_bind(&r->sq, r->region + r->hdr.sq_ring_off, r->region + r->hdr.sq_sqes_off,
		      r->hdr.sq_entries, r->hdr.sqe_size, &r->hdr);
	pkv_ring_bind(&r->cq, r->region + r->hdr.cq_ring_off, r->region + r->hdr.cq_cqes_off,
		      r->hdr.cq_entries, r->hdr.cqe_size, &r->hdr);
	*r->sq.sh_flags = PKV_RING_NEED_WAKEUP;
	r->arena = r->region + r->hdr.arena_off;
	r->sq_bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	r->sock = pkv_sock_connect(sock, 5000);
	return r->sock < 0 ? r->sock : 0;
}

static int raw_reply(struct raw *r, char *why, size_t len)
{
	struct pkv_msg_reply rep;
	ssize_t n = pkv_msg_recv(r->sock, &rep, sizeof(rep), NULL, 0, NULL, 5000);

	if (n == 0)
		return -ECONNRESET;
	if (n < (ssize_t)PKV_REPLY_HDR_SIZE)
		return n < 0 ? (int)n : -EPROTO;
	if (why && len) {
		size_t t = (size_t)n - PKV_REPLY_HDR_SIZE;

		if (t >= len)
			t = len - 1;
		memcpy(why, rep.text, t);
		why[t] = 0;
	}
	return rep.status;
}

int raw_hello(struct raw *r, uint32_t version, uint64_t region_size, int pass_fds, char *why, size_t len)
{
	struct pkv_msg_hello h = { { PKV_MSG_HELLO, sizeof(h) }, version, PKV_ROLE_CLIENT, region_size };
	int fds[2] = { r->memfd, r->sq_bell };
	int e = pkv_msg_send(r->sock, &h, sizeof(h), fds, pass_fds ? 2 : 0);

	return e ? e : raw_reply(r, why, len);
}

void raw_attach_msg(struct pkv_msg_attach *m, const char *name)
{
	memset(m, 0, sizeof(*m));
	m->hdr.type = PKV_MSG_ATTACH;
	m->hdr.size = sizeof(*m);
	m->geo = (struct pkv_geometry){ T_LAYERS, T_HEADS, T_KV_HEADS, T_DIM, PKV_DTYPE_F32, T_BS, T_BLOCKS };
	m->act_dtype = PKV_DTYPE_F32;
	m->model_id = 0x1234;
	m->window_left = -1;
	snprintf(m->name, sizeof(m->name), "%s", name);
}

int raw_attach(struct raw *r, const struct pkv_msg_attach *m, char *why, size_t len)
{
	int e = pkv_msg_send(r->sock, m, sizeof(*m), NULL, 0);

	return e ? e : raw_reply(r, why, len);
}

int raw_submit(struct raw *r, struct pkv_sqe *sqe)
{
	uint64_t one = 1;

	sqe->user_data = ++r->ud;
	memcpy(pkv_ring_prod_slot(&r->sq), sqe, sizeof(*sqe));
	pkv_ring_publish(&r->sq);
	if (pkv_ring_needs_wakeup(&r->sq) && write(r->sq_bell, &one, 8) < 0)
		return -errno;
	return 0;
}

int raw_call(struct raw *r, struct pkv_sqe *sqe, struct pkv_cqe *cqe)
{
	int e = raw_submit(r, sqe);

	if (e)
		return e;
	/* Up to 20 s: a sanitizer build on a loaded machine; a completion ends the wait at once. */
	for (int i = 0; i < 20000; i++) {
		struct pollfd p = { .fd = r->sock, .events = POLLRDHUP };

		if (pkv_ring_avail(&r->cq) > 0) {
			pkv_ring_peek_copy(&r->cq, cqe);
			pkv_ring_consume(&r->cq);
			return 0;
		}
		if (poll(&p, 1, 1) > 0 && (p.revents & (POLLRDHUP | POLLHUP)))
			return -ECONNRESET;
	}
	return -ETIMEDOUT;
}

void raw_close(struct raw *r)
{
	if (r->region && r->region != MAP_FAILED)
		munmap(r->region, r->size);
	if (r->sock >= 0)
		close(r->sock);
	if (r->memfd >= 0)
		close(r->memfd);
	if (r->sq_bell >= 0)
		close(r->sq_bell);
	memset(r, 0, sizeof(*r));
	r->sock = r->memfd = r->sq_bell = -1;
}

float step_and_check(struct pkv_client *c, uint32_t seq, const int32_t *toks, uint32_t n, uint32_t n_cached,
		     float *got_out)
{
	uint32_t k = n - n_cached;
	size_t qn = (size_t)k * T_HEADS * T_DIM;
	float *got = malloc(T_LAYERS * qn * 4), *ref = malloc(qn * 4), worst = INFINITY;

	if (got && ref && !run_step(c, seq, toks, n_cached, k, got)) {
		worst = 0;
		for (uint32_t l = 0; l < T_LAYERS; l++) {
			float e;

			ref_attend(toks, n, n_cached, l, ref);
			e = max_diff(got + l * qn, ref, qn);
			if (isnan(e) || e > worst)
				worst = e; /* a NaN is the worst */
		}
		if (got_out)
			memcpy(got_out, got, T_LAYERS * qn * 4);
	}
	free(got);
	free(ref);
	return worst;
}

void make_prompt(int32_t *t, uint32_t n, int32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = (int32_t)((seed * 131 + i * 17) % 500);
}
