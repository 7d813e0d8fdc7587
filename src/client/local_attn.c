/* SPDX-License-Identifier: MIT */
/* Attention in the client: the pool's backends run in this process over the daemon's shared KV memory. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "client/local_attn.h"
#include "common/spin.h"
#include "loader/loader.h"

struct local_attn {
	struct local_attn_params p;
	struct pkv_host *host;
	struct pkv_plugin varlen, decode;
	int same_plugin;
	struct pkv_dispatch disp;
	void *map;
	size_t map_len;
	/* the current step's tables, copied out of the arena (a later request may reuse that buffer) */
	uint8_t *tables;
	uint64_t tables_cap;
	struct pkv_wire_step step;
	struct pkv_wire_step_offs offs;
	int in_step;
};

/*
 * The plugin spec for a file the daemon named: only "pkv_NAME.so", NAME of
 * letters, digits, '_' and '-', looked up in our own plugin directory. The
 * daemon is trusted with our KV, not with what code we load.
 */
static int spec_of(const char *file, char *spec, size_t len)
{
	size_t n = strnlen(file, PKV_NAME_MAX);

	if (n == PKV_NAME_MAX || n < 8 || strncmp(file, "pkv_", 4) || strcmp(file + n - 3, ".so") ||
	    n - 7 >= len)
		return -EINVAL;
	for (size_t i = 4; i < n - 3; i++)
		if (!(file[i] == '_' || file[i] == '-' || (file[i] >= '0' && file[i] <= '9') ||
		      ((file[i] | 0x20) >= 'a' && (file[i] | 0x20) <= 'z')))
			return -EINVAL;
	memcpy(spec, file + 4, n - 7);
	spec[n - 7] = 0;
	return 0;
}

static int load(struct local_attn *la, const char *file, const char *backend, struct pkv_plugin *out, char *err,
		size_t err_len)
{
	char spec[PKV_NAME_MAX];

	if (spec_of(file, spec, sizeof(spec)) || !memchr(backend, 0, PKV_NAME_MAX) || !backend[0]) {
		snprintf(err, err_len, "the daemon names backend file '%.*s', which is not pkv_NAME.so", PKV_NAME_MAX,
			 file);
		return -EPROTO;
	}
	return pkv_plugin_load(spec, backend, NULL, NULL, la->host, out, err, err_len);
}

int local_attn_open(int fd, uint64_t bytes, const struct pkv_wire_pool_mem *w, const struct local_attn_params *p,
		    struct local_attn **out, char *err, size_t err_len)
{
	struct pkv_pool_desc desc = { PKV_BACKEND_ABI_VERSION, sizeof(desc), p->geo, p->act_dtype };
	struct pkv_cache_mem lay;
	struct local_attn *la;
	struct stat st;
	int r;

	*out = NULL;
	la = calloc(1, sizeof(*la));
	if (!la) {
		close(fd);
		return -ENOMEM;
	}
	la->p = *p;
	la->map = MAP_FAILED;
	if (pkv_shared_cache_layout(&p->geo, &lay) != bytes || fstat(fd, &st) || (uint64_t)st.st_size != bytes) {
		snprintf(err, err_len, "the pool's shared memory is not the %llu bytes its geometry takes",
			 (unsigned long long)bytes);
		r = -EPROTO;
		goto fail;
	}
	la->map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (la->map == MAP_FAILED) {
		r = -errno;
		snprintf(err, err_len, "cannot map the pool's memory: %s", strerror(errno));
		goto fail;
	}
	la->map_len = bytes;
	close(fd);
	fd = -1;
	r = pkv_host_create(p->threads ? p->threads : 1, PKV_LOG_WARN, &la->host);
	if (r) {
		snprintf(err, err_len, "backend threads: %s", strerror(-r));
		goto fail;
	}
	/* A pool thread spins only while a core would otherwise idle: the caller's own threads need theirs. */
	pkv_host_set_shared_cpus(la->host, 1);
	r = load(la, w->varlen_file, w->varlen_backend, &la->varlen, err, err_len);
	if (r)
		goto fail;
	la->same_plugin = !strncmp(w->varlen_file, w->decode_file, PKV_NAME_MAX) &&
			  !strncmp(w->varlen_backend, w->decode_backend, PKV_NAME_MAX);
	if (!la->same_plugin && (r = load(la, w->decode_file, w->decode_backend, &la->decode, err, err_len))) {
		pkv_plugin_unload(&la->varlen);
		goto fail;
	}
	r = pkv_dispatch_open_shared(&la->disp, &la->varlen, la->same_plugin ? &la->varlen : &la->decode, &desc,
				     la->map, la->map_len, err, err_len);
	if (r) {
		if (!la->same_plugin)
			pkv_plugin_unload(&la->decode);
		pkv_plugin_unload(&la->varlen);
		goto fail;
	}
	*out = la;
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	if (la->map != MAP_FAILED)
		munmap(la->map, la->map_len);
	pkv_host_destroy(la->host);
	free(la);
	return r;
}

void local_attn_close(struct local_attn *la)
{
	if (!la)
		return;
	pkv_dispatch_close(&la->disp);
	if (!la->same_plugin)
		pkv_plugin_unload(&la->decode);
	pkv_plugin_unload(&la->varlen);
	pkv_host_destroy(la->host);
	munmap(la->map, la->map_len);
	free(la->tables);
	free(la);
}

int local_attn_step(struct local_attn *la, const void *tables, uint64_t len, char *err, size_t err_len)
{
	struct pkv_wire_step h;
	uint64_t need;

	la->in_step = 0;
	if (len < sizeof(h))
		goto bad;
	memcpy(&h, tables, sizeof(h));
	need = pkv_wire_step_layout(h.num_seqs, h.max_blocks_per_seq, h.total_q, &la->offs);
	if (!need || need > len)
		goto bad;
	if (need > la->tables_cap) {
		uint8_t *t = realloc(la->tables, need);

		if (!t)
			return -ENOMEM;
		la->tables = t;
		la->tables_cap = need;
	}
	memcpy(la->tables, tables, need);
	la->step = h;
	la->in_step = 1;
	return 0;
bad:
	snprintf(err, err_len, "the daemon's step tables do not fit the %llu bytes given", (unsigned long long)len);
	return -EPROTO;
}

int local_attn_run(struct local_attn *la, uint32_t layer, const void *q, const void *k, const void *v, void *o,
		   char *err, size_t err_len)
{
	const struct pkv_geometry *g = &la->p.geo;
	struct pkv_attn_batch b;
	int r;

	if (!la->in_step) {
		snprintf(err, err_len, "attend outside a step");
		return -EINVAL;
	}
	memset(&b, 0, sizeof(b));
	b.abi_version = PKV_BACKEND_ABI_VERSION;
	b.struct_size = sizeof(b);
	b.layer = layer;
	b.num_seqs = la->step.num_seqs;
	b.total_q = la->step.total_q;
	b.act_dtype = la->p.act_dtype;
	b.q = q;
	b.k_new = k;
	b.v_new = v;
	b.o = o;
	b.q_stride_tok = b.o_stride_tok = (int64_t)g->num_heads * g->head_dim;
	b.kv_stride_tok = (int64_t)g->num_kv_heads * g->head_dim;
	b.q_stride_head = b.o_stride_head = b.kv_stride_head = g->head_dim;
	b.cu_seq_lens_q = (const int32_t *)(la->tables + la->offs.cu_q);
	b.cu_seq_lens_k = (const int32_t *)(la->tables + la->offs.cu_k);
	b.cache_seqlens = (const int32_t *)(la->tables + la->offs.seqlens);
	b.block_tables = (const int32_t *)(la->tables + la->offs.tables);
	b.slot_mapping = (const int64_t *)(la->tables + la->offs.slots);
	b.max_length_q = la->step.max_length_q;
	b.max_length_k = la->step.max_length_k;
	b.max_blocks_per_seq = la->step.max_blocks_per_seq;
	b.scale = la->p.scale;
	b.softcap = la->p.softcap;
	b.window_left = la->p.window_left;
	/*
	 * Our compute threads yield their cores while we attend: split the call
	 * over them, unless other processes' threads wait for cores too (two
	 * 2-thread clients on 2 CPUs: 92-101 -> 89-97 tok/s together when each
	 * split regardless).
	 */
	pkv_host_set_cpus_lent(la->host, la->p.cpus_ours && pkv_spin_worthwhile());
	/* The dispatch checks every table entry against the pool before the backend sees it. */
	r = pkv_dispatch_attend(&la->disp, &b);
	if (r < 0)
		snprintf(err, err_len, "attend of layer %u in this process: %s", layer, strerror(-r));
	return r < 0 ? r : 0;
}

void local_attn_step_done(struct local_attn *la)
{
	la->in_step = 0;
}
