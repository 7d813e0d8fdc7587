/* SPDX-License-Identifier: MIT */
/* Validation of SQEs and control messages, separate from their execution so it can be fuzzed alone. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "common/region.h"
#include "daemon/validate.h"

static int range(uint64_t arena, uint64_t off, uint64_t count, uint64_t elem, uint64_t align,
		 const char *what, char *why, size_t why_len)
{
	uint64_t bytes;

	if (!pkv_mul_ok(count, elem, &bytes) || !pkv_range_ok(arena, off, bytes)) {
		snprintf(why, why_len, "%s: %llu x %llu bytes at offset %llu is outside the %llu-byte arena",
			 what, (unsigned long long)count, (unsigned long long)elem,
			 (unsigned long long)off, (unsigned long long)arena);
		return -EINVAL;
	}
	if (off % align) {
		snprintf(why, why_len, "%s: offset %llu is not %llu-byte aligned", what,
			 (unsigned long long)off, (unsigned long long)align);
		return -EINVAL;
	}
	return 0;
}

static int tokens_op(const struct pkv_sqe *e, const struct sqe_limits *l, int allow_zero,
		     char *why, size_t why_len)
{
	if ((!allow_zero && e->n == 0) || e->n > PKV_MAX_SEQ_TOKENS) {
		snprintf(why, why_len, "token count %u not in [%u, %u]", e->n, allow_zero ? 0 : 1,
			 PKV_MAX_SEQ_TOKENS);
		return -EINVAL;
	}
	return range(l->arena_size, e->off[0], e->n, 4, 4, "tokens", why, why_len);
}

int pkv_sqe_check(const struct pkv_sqe *e, const struct sqe_limits *l, char *why, size_t why_len)
{
	static const char *const names[] = { "q", "k", "v", "o" };
	uint64_t per_tok[4];
	int r;

	if (e->opcode >= PKV_OP_COUNT) {
		snprintf(why, why_len, "unknown opcode %u", e->opcode);
		return -EINVAL;
	}
	if ((e->flags & ~(e->opcode == PKV_OP_SEQ_OPEN    ? PKV_SQE_OPEN_SETTLED
			  : e->opcode == PKV_OP_STEP_BEGIN ? PKV_SQE_STEP_TABLES
							   : 0)) ||
	    e->reserved0 || (e->aux && !(e->opcode == PKV_OP_STEP_BEGIN && (e->flags & PKV_SQE_STEP_TABLES)))) {
		snprintf(why, why_len, "reserved SQE fields must be zero");
		return -EINVAL;
	}
	if (e->opcode != PKV_OP_NOP && !l->geo) {
		snprintf(why, why_len, "not attached to a pool");
		return -ENOTCONN;
	}
	switch (e->opcode) {
	case PKV_OP_NOP:
	case PKV_OP_SEQ_FORK:
	case PKV_OP_SEQ_CLOSE:
	case PKV_OP_STEP_END:
	case PKV_OP_STEP_ABORT:
		return 0;
	case PKV_OP_SEQ_OPEN:
		return tokens_op(e, l, 0, why, why_len);
	case PKV_OP_PIN:
	case PKV_OP_UNPIN:
		return tokens_op(e, l, 0, why, why_len);
	case PKV_OP_SEQ_TRUNCATE:
		if (e->n > PKV_MAX_SEQ_TOKENS) {
			snprintf(why, why_len, "truncate length %u too large", e->n);
			return -EINVAL;
		}
		return 0;
	case PKV_OP_STATS:
		return range(l->arena_size, e->off[0], 1, sizeof(struct pkv_wire_stats), 8, "stats",
			     why, why_len);
	case PKV_OP_STEP_BEGIN:
		if (e->n == 0 || e->n > PKV_MAX_STEP_SEQS) {
			snprintf(why, why_len, "step of %u sequences not in [1, %u]", e->n, PKV_MAX_STEP_SEQS);
			return -EINVAL;
		}
		r = range(l->arena_size, e->off[0], e->n, 4, 4, "sequence list", why, why_len);
		if (!r)
			r = range(l->arena_size, e->off[1], e->n, 4, 4, "new-token counts", why, why_len);
		if (!r) /* the token array's length is known only once the counts are copied */
			r = range(l->arena_size, e->off[2], 0, 4, 4, "tokens", why, why_len);
		if (!r && (e->flags & PKV_SQE_STEP_TABLES))
			r = range(l->arena_size, e->off[3], e->aux, 1, 8, "step tables", why, why_len);
		return r;
	case PKV_OP_ATTEND:
		if (!l->step_total_q) {
			snprintf(why, why_len, "attend outside a step");
			return -EINVAL;
		}
		if (e->layer >= l->geo->num_layers) {
			snprintf(why, why_len, "layer %u >= num_layers %u", e->layer, l->geo->num_layers);
			return -EINVAL;
		}
		per_tok[0] = per_tok[3] = (uint64_t)l->geo->num_heads * l->geo->head_dim * l->act_size;
		per_tok[1] = per_tok[2] = (uint64_t)l->geo->num_kv_heads * l->geo->head_dim * l->act_size;
		for (int i = 0; i < 4; i++) {
			r = range(l->arena_size, e->off[i], l->step_total_q, per_tok[i], l->act_size,
				  names[i], why, why_len);
			if (r)
				return r;
		}
		return 0;
	}
	snprintf(why, why_len, "unknown opcode %u", e->opcode);
	return -EINVAL;
}

static int check_attach(const struct pkv_msg_attach *m, char *why, size_t why_len)
{
	if (!memchr(m->name, 0, sizeof(m->name)) || !m->name[0]) {
		snprintf(why, why_len, "attach: pool name empty or not NUL-terminated");
		return -EINVAL;
	}
	/* Printed in logs and in pagedkvctl's text output: no line breaks or terminal escapes from a client. */
	for (const char *c = m->name; *c; c++)
		if (*c < 0x20 || *c > 0x7e) {
			snprintf(why, why_len, "attach: pool name has byte 0x%02x (printable ASCII only)",
				 (unsigned)(unsigned char)*c);
			return -EINVAL;
		}
	if (m->salt_len > PKV_SALT_MAX) {
		snprintf(why, why_len, "attach: cache salt of %u bytes (max %u)", m->salt_len, PKV_SALT_MAX);
		return -EINVAL;
	}
	if (m->act_dtype >= PKV_DTYPE_COUNT || m->geo.cache_dtype >= PKV_DTYPE_COUNT) {
		snprintf(why, why_len, "attach: unknown dtype (activation %u, cache %u)", m->act_dtype,
			 m->geo.cache_dtype);
		return -EINVAL;
	}
	if (m->flags & ~(PKV_WIRE_POOL_SHARED | PKV_WIRE_POOL_CLIENT_ATTN)) {
		snprintf(why, why_len, "attach: unknown pool flags 0x%x", m->flags);
		return -EINVAL;
	}
	/* Its clients map the whole pool: that must never show one uid another's KV. */
	if ((m->flags & PKV_WIRE_POOL_SHARED) && (m->flags & PKV_WIRE_POOL_CLIENT_ATTN)) {
		snprintf(why, why_len, "attach: client attention needs a private pool, not one shared across users");
		return -EINVAL;
	}
	if (!isfinite(m->scale) || m->scale < 0 || !isfinite(m->softcap) || m->softcap < 0) {
		snprintf(why, why_len, "attach: scale and softcap must be finite and >= 0");
		return -EINVAL;
	}
	if (m->reserved0) {
		snprintf(why, why_len, "attach: reserved field must be zero");
		return -EINVAL;
	}
	return 0;
}

int pkv_msg_check(const void *buf, size_t len, int role, char *why, size_t why_len)
{
	struct pkv_msg_hdr h;

	if (len < sizeof(h)) {
		snprintf(why, why_len, "message of %zu bytes is too short", len);
		return -EBADMSG;
	}
	memcpy(&h, buf, sizeof(h));
	if (h.size != len) {
		snprintf(why, why_len, "message says %u bytes, %zu arrived", h.size, len);
		return -EBADMSG;
	}
	switch (h.type) {
	case PKV_MSG_HELLO: {
		struct pkv_msg_hello m;

		if (role) {
			snprintf(why, why_len, "hello sent twice");
			return -EPROTO;
		}
		/* The version is checked before the size so an older or newer client
		 * whose hello grew or shrank still hears why it was refused. */
		if (len < offsetof(struct pkv_msg_hello, version) + 4) {
			snprintf(why, why_len, "hello too short");
			return -EBADMSG;
		}
		memset(&m, 0, sizeof(m));
		memcpy(&m, buf, len < sizeof(m) ? len : sizeof(m));
		if (m.version != PKV_PROTO_VERSION) {
			snprintf(why, why_len, "protocol version %u is not supported (pagedkvd speaks %u)",
				 m.version, PKV_PROTO_VERSION);
			return -EPROTO;
		}
		if (len != sizeof(m)) {
			snprintf(why, why_len, "hello of %zu bytes, expected %zu", len, sizeof(m));
			return -EBADMSG;
		}
		if (m.role != PKV_ROLE_CLIENT && m.role != PKV_ROLE_CTL) {
			snprintf(why, why_len, "unknown role %u", m.role);
			return -EINVAL;
		}
		return PKV_MSG_HELLO;
	}
	case PKV_MSG_ATTACH: {
		struct pkv_msg_attach m;

		if (role != PKV_ROLE_CLIENT) {
			snprintf(why, why_len, "attach before hello, or from a control connection");
			return -EPROTO;
		}
		if (len != sizeof(m)) {
			snprintf(why, why_len, "attach of %zu bytes, expected %zu", len, sizeof(m));
			return -EBADMSG;
		}
		memcpy(&m, buf, sizeof(m));
		if (check_attach(&m, why, why_len))
			return -EINVAL;
		return PKV_MSG_ATTACH;
	}
	case PKV_MSG_CTL: {
		struct pkv_msg_ctl m;

		if (role != PKV_ROLE_CTL) {
			snprintf(why, why_len, "control command before a control hello");
			return -EPROTO;
		}
		if (len != sizeof(m)) {
			snprintf(why, why_len, "control command of %zu bytes, expected %zu", len, sizeof(m));
			return -EBADMSG;
		}
		memcpy(&m, buf, sizeof(m));
		if (m.cmd < PKV_CTL_STATUS || m.cmd > PKV_CTL_FLUSH_DISK || m.format > PKV_FMT_PROM) {
			snprintf(why, why_len, "unknown control command %u or format %u", m.cmd, m.format);
			return -EINVAL;
		}
		return PKV_MSG_CTL;
	}
	}
	snprintf(why, why_len, "unknown message type %u", h.type);
	return -EBADMSG;
}
