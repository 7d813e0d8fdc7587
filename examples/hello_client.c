/* SPDX-License-Identifier: MIT */
/* The first libpagedkv program to read: connect, attach a pool, open a sequence, one step, one attend, close. */
/* Build: cc hello_client.c $(pkg-config --cflags --libs pagedkv); run with pagedkvd up: ./hello_client [SOCKET] */
#include <errno.h>
#include <stdio.h>
#include <pagedkv/pagedkv.h>

#define HEADS 4
#define KV_HEADS 2
#define DIM 64
#define N 4 /* prompt tokens */

/* Every call returns 0 (or a count) or -errno: print the library's and the daemon's words and stop. */
static int check(struct pkv_client *c, int r, const char *what)
{
	if (r < 0)
		fprintf(stderr, "hello_client: %s: %s%s%s\n", what, pkv_strerror(r), c ? ": " : "",
			c ? pkv_last_error(c) : "");
	return r < 0;
}

int main(int argc, char **argv)
{
	char why[256] = "";
	struct pkv_connect_opts co = PKV_CONNECT_OPTS_INIT;
	struct pkv_pool_params pp = PKV_POOL_PARAMS_INIT;
	const int32_t prompt[N] = { 101, 7592, 2088, 102 };
	uint32_t seq, n_cached, n_new = N;
	struct pkv_client *c;
	float *q, *k, *v, *o;
	int ok;

	co.socket_path = argc > 1 ? argv[1] : NULL; /* NULL: $PAGEDKV_SOCKET, then the default */
	co.error_buf = why;
	co.error_buf_len = sizeof(why);
	if (pkv_connect(&co, &c) < 0) {
		fprintf(stderr, "hello_client: %s\n", why); /* names the socket and whether a daemon runs */
		return 1;
	}
	pp.name = "hello"; /* a pool is one model geometry: created by the first client, shared after */
	pp.geo = (struct pkv_geometry){ .num_layers = 1, .num_heads = HEADS, .num_kv_heads = KV_HEADS,
				       .head_dim = DIM, .cache_dtype = PKV_DTYPE_F32, .block_size = 16,
				       .num_blocks = 64 };
	pp.act_dtype = PKV_DTYPE_F32;
	/* Tensors live in the shared arena so the daemon reads and writes them in place. */
	q = pkv_alloc(c, sizeof(float) * N * HEADS * DIM);
	o = pkv_alloc(c, sizeof(float) * N * HEADS * DIM);
	k = pkv_alloc(c, sizeof(float) * N * KV_HEADS * DIM);
	v = pkv_alloc(c, sizeof(float) * N * KV_HEADS * DIM);
	ok = !check(c, pkv_pool_attach(c, &pp), "attach") && !check(c, q && o && k && v ? 0 : -ENOMEM, "pkv_alloc") &&
	     !check(c, pkv_seq_open(c, prompt, N, &seq, &n_cached), "open");
	if (ok) {
		for (int i = 0; i < N * KV_HEADS * DIM; i++)
			k[i] = v[i] = (float)(i % 7) / 7.0f;
		for (int i = 0; i < N * HEADS * DIM; i++)
			q[i] = (float)(i % 5) / 5.0f;
		/* A step reserves cache slots for the new tokens; attend writes K/V there and attends. */
		ok = !check(c, pkv_step_begin(c, &seq, &n_new, prompt, 1), "step_begin") &&
		     !check(c, pkv_attend(c, 0, q, k, v, o), "attend") && !check(c, pkv_step_end(c), "step_end") &&
		     !check(c, pkv_seq_close(c, seq), "close");
	}
	if (ok)
		printf("hello_client: %u of %u tokens were cached; last row o[0] = %f\n", n_cached, N,
		       o[(N - 1) * HEADS * DIM]);
	pkv_disconnect(c); /* the hang-up releases everything this connection held */
	return ok ? 0 : 1;
}
