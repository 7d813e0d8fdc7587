/* SPDX-License-Identifier: MIT */
/* Standalone driver for the protocol fuzz target: built-in seeds plus random mutations, TAP output. */
#include "config.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/region.h"
#include "fuzz_proto.h"

#define MAXLEN 600

struct seed {
	uint8_t buf[MAXLEN];
	size_t len;
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

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

static void mutate(uint8_t *b, size_t *len)
{
	int k = 1 + (int)(next() % 8);

	while (k--) {
		size_t i = *len ? next() % *len : 0;

		switch (next() % 6) {
		case 0: b[i] ^= (uint8_t)(1u << (next() % 8)); break;
		case 1: b[i] = (uint8_t)next(); break;
		case 2: if (*len > 1) (*len)--; break;
		case 3: if (*len < MAXLEN) b[(*len)++] = (uint8_t)next(); break;
		case 4: /* interesting 32-bit values */
			if (i + 4 <= *len) {
				static const uint32_t v[] = { 0, 1, 0x7fffffff, 0x80000000, 0xffffffff, 4096, 64 };
				uint32_t x = v[next() % 7];

				memcpy(b + i, &x, 4);
			}
			break;
		case 5:
			if (i + 8 <= *len) {
				uint64_t x = next() % 2 ? UINT64_MAX - (next() % 4096) : next() % (1u << 21);

				memcpy(b + i, &x, 8);
			}
			break;
		}
	}
}

static size_t run_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d))) {
		char path[4096];
		uint8_t buf[MAXLEN];
		FILE *f;
		size_t len;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		f = fopen(path, "rb");
		if (!f)
			continue;
		len = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		LLVMFuzzerTestOneInput(buf, len);
		n++;
	}
	closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	static struct seed s[64];
	const char *env = getenv("PKV_FUZZ_ITERS");
	long iters = env ? atol(env) : 200000;
	size_t ns = seeds(s), from_dir = 0;

	if (argc > 1)
		from_dir = run_dir(argv[1]);
	for (size_t i = 0; i < ns; i++)
		LLVMFuzzerTestOneInput(s[i].buf, s[i].len);
	for (long it = 0; it < iters; it++) {
		struct seed m = s[next() % ns];

		mutate(m.buf, &m.len);
		LLVMFuzzerTestOneInput(m.buf, m.len);
	}
	/* Reaching here means no input crashed or broke an invariant (those abort). */
	printf("1..1\nok 1 - protocol parsers: %zu seeds, %zu corpus files, %ld mutations\n", ns, from_dir,
	       iters);
	return 0;
}
