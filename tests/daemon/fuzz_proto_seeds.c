/* SPDX-License-Identifier: MIT */
/* The protocol fuzz target's seeds for the tests' one fuzz driver (tests/fuzz_driver.c): a valid input of every kind. */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "common/region.h"
#include "fuzz_driver.h"
#include "fuzz_proto.h"

#define MAXLEN 600

struct seed {
	uint8_t buf[MAXLEN];
	size_t len;
};

static size_t add(struct seed *s, size_t n, uint8_t mode, const void *p, size_t len)
{
	s[n].buf[0] = mode;
	memcpy(s[n].buf + 1, p, len);
	s[n].len = len + 1;
	return n + 1;
}

/* Valid examples of every input kind, so mutations start from the interesting paths. */
static size_t seeds(struct seed *s)
{
	struct pkv_msg_hello h = { { PKV_MSG_HELLO, sizeof(h) }, PKV_PROTO_VERSION, PKV_ROLE_CLIENT, 1 << 20 };
	struct pkv_msg_attach a;
	struct pkv_msg_ctl c = { { PKV_MSG_CTL, sizeof(c) }, PKV_CTL_STATUS, PKV_FMT_JSON };
	struct pkv_shm_hdr hdr;
	uint8_t buf[MAXLEN];
	size_t n = 0;

	memset(buf, 0, sizeof(buf));
	memcpy(buf + 1, &h, sizeof(h));
	buf[0] = 0; /* role: before hello */
	n = add(s, n, 0, buf, 1 + sizeof(h));
	memset(&a, 0, sizeof(a));
	a.hdr.type = PKV_MSG_ATTACH;
	a.hdr.size = sizeof(a);
	a.geo = (struct pkv_geometry){ 30, 9, 3, 64, 0, 16, 1024 };
	strcpy(a.name, "smollm2");
	buf[0] = PKV_ROLE_CLIENT;
	memcpy(buf + 1, &a, sizeof(a));
	n = add(s, n, 0, buf, 1 + sizeof(a));
	buf[0] = PKV_ROLE_CTL;
	memcpy(buf + 1, &c, sizeof(c));
	n = add(s, n, 0, buf, 1 + sizeof(c));
	pkv_region_layout(1 << 20, 256, 256, &hdr);
	memcpy(buf, &hdr, sizeof(hdr));
	memcpy(buf + sizeof(hdr), &hdr.region_size, 8);
	n = add(s, n, 1, buf, sizeof(hdr) + 8);
	for (uint8_t op = 0; op < PKV_OP_COUNT; op++) {
		struct pkv_sqe e;
		uint8_t rest[48] = { 0 };
		uint64_t arena = 1 << 20;
		uint32_t g[4] = { 30, 9, 3, 64 }, tq = 4;

		memset(&e, 0, sizeof(e));
		e.opcode = op;
		e.n = 4;
		e.off[1] = 256;
		e.off[2] = 512;
		e.off[3] = 8192;
		memcpy(rest, g, sizeof(g));
		memcpy(rest + 16, &arena, 8);
		memcpy(rest + 28, &tq, 4);
		memcpy(buf, &e, sizeof(e));
		memcpy(buf + sizeof(e), rest, sizeof(rest));
		n = add(s, n, 2, buf, sizeof(e) + sizeof(rest));
	}
	return n;
}

static int proto_seeds(uint8_t **out, size_t *lens, int max)
{
	static struct seed s[64];
	int n = (int)seeds(s), i, k = 0;

	for (i = 0; i < n && k < max; i++) {
		out[k] = malloc(MAXLEN);
		if (!out[k])
			break;
		memcpy(out[k], s[i].buf, s[i].len);
		lens[k++] = s[i].len;
	}
	return k;
}

const struct pkv_fuzz_target pkv_fuzz_target = {
	.name = "protocol parsers",
	.max_len = MAXLEN,
	.default_iters = 200000,
	.seeds = proto_seeds,
};
