/* SPDX-License-Identifier: MIT */
/* Fuzz target for the daemon's parsers: control messages, the shared-region header and SQEs. */
#include "config.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/region.h"
#include "daemon/validate.h"
#include "fuzz_proto.h"

/* A check that passed must imply every named range is inside the arena (verified in 128 bits). */
static void verify_sqe(const struct pkv_sqe *e, const struct sqe_limits *l)
{
	unsigned __int128 end;

	switch (e->opcode) {
	case PKV_OP_SEQ_OPEN:
	case PKV_OP_PIN:
	case PKV_OP_UNPIN:
		end = (unsigned __int128)e->off[0] + (unsigned __int128)e->n * 4;
		if (end > l->arena_size || e->n == 0 || e->n > PKV_MAX_SEQ_TOKENS)
			abort();
		break;
	case PKV_OP_STEP_BEGIN:
		for (int i = 0; i < 2; i++) {
			end = (unsigned __int128)e->off[i] + (unsigned __int128)e->n * 4;
			if (end > l->arena_size)
				abort();
		}
		if (e->off[2] > l->arena_size || e->n == 0)
			abort();
		break;
	case PKV_OP_ATTEND: {
		uint64_t qrow = (uint64_t)l->geo->num_heads * l->geo->head_dim * l->act_size;
		uint64_t kvrow = (uint64_t)l->geo->num_kv_heads * l->geo->head_dim * l->act_size;

		if (e->layer >= l->geo->num_layers || !l->step_total_q)
			abort();
		for (int i = 0; i < 4; i++) {
			uint64_t row = (i == 1 || i == 2) ? kvrow : qrow;

			end = (unsigned __int128)e->off[i] + (unsigned __int128)row * l->step_total_q;
			if (end > l->arena_size || e->off[i] % l->act_size)
				abort();
		}
		break;
	}
	case PKV_OP_STATS:
		end = (unsigned __int128)e->off[0] + sizeof(struct pkv_wire_stats);
		if (end > l->arena_size)
			abort();
		break;
	default:
		if (e->opcode >= PKV_OP_COUNT)
			abort();
	}
}

static uint32_t rd32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char why[512];

	if (size < 1)
		return 0;
	switch (data[0] % 3) {
	case 0: { /* a control message, in one of the three connection states */
		uint8_t buf[PKV_MSG_MAX];
		size_t n = size - 1 > sizeof(buf) ? sizeof(buf) : size - 1;
		int role = size > 1 ? data[1] % 3 : 0;

		memcpy(buf, data + 1, n);
		(void)pkv_msg_check(buf, n, role, why, sizeof(why));
		break;
	}
	case 1: { /* a region header against a memfd size */
		struct pkv_shm_hdr h;
		uint64_t sz = 0;

		memset(&h, 0, sizeof(h));
		memcpy(&h, data + 1, size - 1 < sizeof(h) ? size - 1 : sizeof(h));
		if (size > 1 + sizeof(h))
			memcpy(&sz, data + 1 + sizeof(h), size - 1 - sizeof(h) < 8 ? size - 1 - sizeof(h) : 8);
		if (pkv_region_check(&h, sz, why, sizeof(why)) == 0) {
			/* Passed: every part must fit the region. */
			if (h.arena_off + h.arena_size > sz || h.arena_off + h.arena_size < h.arena_off ||
			    h.sq_sqes_off + (uint64_t)h.sq_entries * h.sqe_size > sz ||
			    h.cq_cqes_off + (uint64_t)h.cq_entries * h.cqe_size > sz)
				abort();
		}
		break;
	}
	case 2: { /* an SQE against limits taken from the input */
		struct pkv_geometry g = { 1, 1, 1, 1, 0, 1, 1 };
		struct sqe_limits l;
		struct pkv_sqe e;
		uint8_t rest[48];

		memset(&e, 0, sizeof(e));
		memset(rest, 0, sizeof(rest));
		memcpy(&e, data + 1, size - 1 < sizeof(e) ? size - 1 : sizeof(e));
		if (size > 1 + sizeof(e))
			memcpy(rest, data + 1 + sizeof(e),
			       size - 1 - sizeof(e) < sizeof(rest) ? size - 1 - sizeof(e) : sizeof(rest));
		g.num_layers = rd32(rest) | 1;
		g.num_heads = (rd32(rest + 4) & 0xffff) | 1;
		g.num_kv_heads = (rd32(rest + 8) & 0xffff) | 1;
		g.head_dim = (rd32(rest + 12) & 0xffff) | 1;
		memset(&l, 0, sizeof(l));
		memcpy(&l.arena_size, rest + 16, 8);
		l.geo = rest[24] & 1 ? NULL : &g;
		l.act_size = (rest[25] & 1) ? 2 : 4;
		l.step_total_q = rd32(rest + 28);
		if (pkv_sqe_check(&e, &l, why, sizeof(why)) == 0)
			verify_sqe(&e, &l);
		break;
	}
	}
	return 0;
}
