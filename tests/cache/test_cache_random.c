/* SPDX-License-Identifier: MIT */
/* Randomized model-based test of the cache manager against a simple reference and a fake KV store. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "helpers.h"
#include "cache/cache_int.h"

/*
 * The reference is deliberately naive: each sequence is an array of token
 * ids. The fake KV store holds, for every slot, a hash of the whole prefix
 * (namespace, tokens 0..p) that produced it, the way real K/V depends on
 * every earlier token. After every operation each sequence is read back
 * through its block table: a block shared when it should not be, a copy
 * that was skipped or a stale hit shows up as a wrong value.
 */

#define RBS 4            /* small blocks: many boundaries, partial blocks and copies */
#define NBLK 40          /* small pool: constant eviction pressure */
#define MAXT 96          /* max_tokens_per_seq */
#define MAXSEQ 16        /* max_seqs, also the model's slots */
#define NOWN 4
#define NNS 2
#define NPROMPT 6
#define PLEN 40
#define NPIN 8
#define NSTEP 3          /* steps open at once */

struct mseq {
	int used, in_step;
	uint32_t step_new;   /* tokens reserved by the open step */
	uint32_t h, owner, len, npend;
	int ns;
	int32_t tok[MAXT], pend[MAXT];
	uint64_t hv[MAXT];
	uint8_t pub[MAXT / RBS];   /* exact mode: full block i is the published copy of its prefix */
};

struct mpin {
	int used, ns;
	uint32_t owner;
	uint32_t n;
	int32_t tok[PLEN];
};

struct model {
	struct pkv_cache *c;
	uint64_t rng, seed;
	unsigned long op;
	struct mseq s[MAXSEQ];
	struct mpin pin[NPIN];
	uint32_t lim_seqs[NOWN], lim_blocks[NOWN];
	int32_t prompt[NPROMPT][PLEN];
	struct pkv_key ns[NNS];
	uint32_t nblk;
	int exact;                 /* no eviction: every open's n_cached is predicted exactly */
	uint64_t *kv;              /* the fake KV store, [nblk * RBS] */
	uint64_t *pset;            /* exact mode: prefix hashes of the published blocks */
	uint32_t pmask;
	struct mstep {             /* steps left open across operations */
		struct pkv_step *st;
		uint32_t owner;
		int n, seqs[MAXSEQ];
		uint32_t nnew[MAXSEQ];
		int32_t tok[MAXSEQ][MAXT];
	} steps[NSTEP];
};

static struct model M;

#define FAIL_IF(cond, ...) do { if (cond) ck_abort_msg("seed %" PRIu64 " op %lu: %s %s", \
	M.seed, M.op, #cond, fmt_detail(__VA_ARGS__)); } while (0)

static const char *fmt_detail(const char *fmt, ...)
{
	static char buf[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return buf;
}

static uint32_t rnd(uint32_t n)
{
	M.rng ^= M.rng >> 12;
	M.rng ^= M.rng << 25;
	M.rng ^= M.rng >> 27;
	return (uint32_t)((M.rng * 0x2545F4914F6CDD1Dull) >> 32) % n;
}

static uint64_t kv_hash(uint64_t prev, int32_t tok)
{
	uint64_t x = (prev ^ (uint32_t)tok) * 0x9E3779B97F4A7C15ull;

	return x ^ (x >> 29);
}

static void seq_push(struct mseq *q, int32_t t)
{
	uint64_t prev = q->len ? q->hv[q->len - 1] : 0x1234567ull + (uint64_t)q->ns;

	q->tok[q->len] = t;
	q->hv[q->len] = kv_hash(prev, t);
	q->len++;
}

/* The reference's prefix table: a set of prefix hashes (0 is the empty mark). */
static bool pset_has(uint64_t h)
{
	h |= 1;
	for (uint32_t i = (uint32_t)h & M.pmask;; i = (i + 1) & M.pmask) {
		if (!M.pset[i])
			return false;
		if (M.pset[i] == h)
			return true;
	}
}

static void pset_add(uint64_t h)
{
	uint32_t i;

	h |= 1;
	for (i = (uint32_t)h & M.pmask; M.pset[i]; i = (i + 1) & M.pmask)
		;
	M.pset[i] = h;
}

static uint64_t hash_at(const struct mseq *q, uint32_t len_before, const int32_t *newt, uint32_t j)
{
	uint64_t h = len_before ? q->hv[len_before - 1] : 0x1234567ull + (uint64_t)q->ns;

	for (uint32_t i = 0; i <= j; i++)
		h = kv_hash(h, newt[i]);
	return h;
}

static struct seq *cseq(const struct mseq *q)
{
	return &M.c->seqs[q->h & ((1u << M.c->idx_bits) - 1)];
}

static uint32_t owner_refs(uint32_t o)
{
	uint32_t n = 0;

	for (int i = 0; i < MAXSEQ; i++)
		if (M.s[i].used && M.s[i].owner == o)
			n += (M.s[i].len + (M.s[i].in_step ? M.s[i].step_new : 0) + RBS - 1) / RBS;
	return n;
}

/* Blocks the owner's pins hold: they count against its block limit with its references. */
static uint32_t owner_pinned(uint32_t o)
{
	uint32_t n = 0;

	for (int i = 0; i < NPIN; i++)
		if (M.pin[i].used && M.pin[i].owner == o)
			n += M.pin[i].n / RBS;
	return n;
}

static uint32_t owner_seqs(uint32_t o)
{
	uint32_t n = 0;

	for (int i = 0; i < MAXSEQ; i++)
		n += M.s[i].used && M.s[i].owner == o;
	return n;
}

/* Everything the reference can say about the cache, checked after every operation. */
static void verify(void)
{
	char why[512];
	int n = !M.exact || M.op % 32 == 0 ? pkv_cache_audit(M.c, why, sizeof(why)) : 0;
	struct pkv_cache_stats st;
	uint32_t open = 0;

	if (!M.exact || M.op % 32 == 0)
		FAIL_IF(n != 0, "audit: %s", why);
	pkv_cache_stats(M.c, &st);
	for (int i = 0; i < MAXSEQ; i++) {
		struct mseq *q = &M.s[i];
		struct seq *s;

		if (!q->used)
			continue;
		open++;
		FAIL_IF(pkv_cache_seq_len(M.c, q->owner, q->h) != q->len, "seq %d", i);
		s = cseq(q);
		for (uint32_t p = 0; p < q->len; p++) {
			int32_t b = s->tab[p / RBS];
			uint64_t v = M.kv[(size_t)b * RBS + p % RBS];

			FAIL_IF(v != q->hv[p], "seq %d pos %u block %d: KV of other tokens", i, p, b);
			FAIL_IF(M.c->tok[(size_t)b * RBS + p % RBS] != q->tok[p], "seq %d pos %u token", i, p);
		}
	}
	FAIL_IF(open != st.open_seqs, "%u vs %u", open, st.open_seqs);
	FAIL_IF(st.free_blocks + st.cached_blocks + st.in_use_blocks != M.nblk, "");
	for (int o = 0; o < NOWN; o++) {
		struct pkv_owner_usage u;

		pkv_cache_owner_usage(M.c, (uint32_t)o, &u);
		FAIL_IF(u.seqs != owner_seqs((uint32_t)o), "owner %d", o);
		/* ceil(len / bs) references per sequence, len counting tokens reserved by a step. */
		FAIL_IF(u.blocks != owner_refs((uint32_t)o), "owner %d: %u vs %u", o, u.blocks,
				owner_refs((uint32_t)o));
	}
	/* A pinned path stays cached whatever the pressure. */
	for (int i = 0; i < NPIN; i++) {
		int32_t out[PLEN];

		if (M.pin[i].used)
			FAIL_IF(pkv_prefix_walk(M.c, M.ns[M.pin[i].ns], M.pin[i].tok, M.pin[i].n / RBS, out)
				!= M.pin[i].n / RBS, "pin %d lost", i);
	}
}

static int free_mseq(void)
{
	for (int i = 0; i < MAXSEQ; i++)
		if (!M.s[i].used)
			return i;
	return -1;
}

static int pick_seq(int want_idle)
{
	int c[MAXSEQ], n = 0;

	for (int i = 0; i < MAXSEQ; i++)
		if (M.s[i].used && (!want_idle || !M.s[i].in_step))
			c[n++] = i;
	return n ? c[rnd((uint32_t)n)] : -1;
}

/* Like test_snapshot, but the large pool is audited only every 32 operations (in verify). */
static struct test_snap snap(uint32_t owner)
{
	struct test_snap t;

	memset(&t, 0, sizeof(t));
	pkv_cache_stats(M.c, &t.st);
	pkv_cache_owner_usage(M.c, owner, &t.u);
	t.audit = M.exact ? 0 : pkv_cache_audit(M.c, NULL, 0);
	return t;
}

/* Runs call and, when it fails, checks that nothing observable changed. */
#define EXPECT_UNCHANGED_ON_ERROR(owner, call) ({                                       \
	struct test_snap _a = snap(owner), _b;                                            \
	int _r = (call);                                                                  \
	if (_r < 0) {                                                                     \
		_b = snap(owner);                                                         \
		FAIL_IF(memcmp(&_a.st.free_blocks, &_b.st.free_blocks, 6 * 4) ||          \
			_a.st.evictions != _b.st.evictions || _a.u.blocks != _b.u.blocks ||  \
			_a.u.seqs != _b.u.seqs || _b.audit, "state changed by failing call %d", _r); \
	}                                                                                 \
	_r; })

static void op_open(void)
{
	int i = free_mseq(), ns = (int)rnd(NNS);
	uint32_t owner = rnd(NOWN), n = 0, h, nc;
	int32_t t[MAXT + 1];
	int r, expect_err = 0;
	struct mseq *q;

	if (rnd(2)) {
		const int32_t *p = M.prompt[rnd(NPROMPT)];

		n = 1 + rnd(PLEN);
		memcpy(t, p, n * sizeof(*t));
		for (uint32_t k = rnd(13); k > 0; k--)
			t[n++] = (int32_t)(100000 + rnd(1000000));
	} else {
		n = 1 + rnd(30);
		for (uint32_t k = 0; k < n; k++)
			t[k] = (int32_t)(100000 + rnd(1000000));
	}
	if (rnd(50) == 0) {
		n = MAXT + 1;   /* too long */
		expect_err = -EINVAL;
	}
	r = EXPECT_UNCHANGED_ON_ERROR(owner, pkv_cache_seq_open(M.c, owner, M.ns[ns], t, n, &h, &nc));
	if (expect_err) {
		FAIL_IF(r != expect_err, "open too long: %d", r);
		return;
	}
	if (i < 0) {
		FAIL_IF(r != -ENOSPC, "open with %d seqs: %d", MAXSEQ, r);
		return;
	}
	if (M.lim_seqs[owner] && owner_seqs(owner) >= M.lim_seqs[owner]) {
		FAIL_IF(r != -ENOSPC, "owner seq limit: %d", r);
		return;
	}
	if (r == -ENOSPC && M.lim_blocks[owner])
		return;    /* the hit would have exceeded the owner's block limit */
	FAIL_IF(r != 0, "open: %d", r);
	FAIL_IF(nc % RBS || nc > n - 1, "n_cached %u of %u", nc, n);
	q = &M.s[i];
	memset(q, 0, sizeof(*q));
	q->used = 1;
	q->h = h;
	q->owner = owner;
	q->ns = ns;
	for (uint32_t k = 0; k < nc; k++)
		seq_push(q, t[k]);
	q->npend = n - nc;
	if (M.exact) {
		/* Whole blocks of the prompt whose prefix is published, last token excluded. */
		uint32_t want = 0;
		uint64_t ph = 0x1234567ull + (uint64_t)ns;

		for (uint32_t k = 0; k + 1 < n; k++) {
			ph = kv_hash(ph, t[k]);
			if ((k + 1) % RBS)
				continue;
			if (!pset_has(ph))
				break;
			want = k + 1;
		}
		FAIL_IF(nc != want, "n_cached %u, reference %u", nc, want);
		for (uint32_t b = 0; b < nc / RBS; b++)
			q->pub[b] = 1;
	}
	memcpy(q->pend, t + nc, q->npend * sizeof(*t));
}

/* Checks the metadata against the reference, then plays the backend: copies, then K/V writes. */
static void play_step(const struct pkv_step_meta *m, const int *idx, const uint32_t *nnew,
		      int32_t (*toks)[MAXT], int n)
{
	uint32_t q0 = 0, maxq = 0, maxk = 0;

	FAIL_IF(m->num_seqs != (uint32_t)n, "");
	for (uint32_t k = 0; k < m->num_copies; k++)
		memcpy(&M.kv[(size_t)m->copies[k].dst * RBS], &M.kv[(size_t)m->copies[k].src * RBS],
		       RBS * sizeof(uint64_t));
	for (int j = 0; j < n; j++) {
		struct mseq *q = &M.s[idx[j]];
		struct seq *s = cseq(q);
		uint32_t nl = q->len + nnew[j], nb = (nl + RBS - 1) / RBS;

		FAIL_IF(m->cu_seq_lens_q[j] != (int32_t)q0, "");
		FAIL_IF(m->cu_seq_lens_q[j + 1] != (int32_t)(q0 + nnew[j]), "");
		FAIL_IF(m->cu_seq_lens_k[j + 1] - m->cu_seq_lens_k[j] != (int32_t)nl, "");
		FAIL_IF(m->cache_seqlens[j] != (int32_t)q->len, "");
		for (uint32_t b = 0; b < m->max_blocks_per_seq; b++)
			FAIL_IF(m->block_tables[(size_t)j * m->max_blocks_per_seq + b] !=
				(b < nb ? s->tab[b] : -1), "block table row %d entry %u", j, b);
		for (uint32_t k = 0; k < nnew[j]; k++) {
			uint32_t p = q->len + k;
			int64_t slot = m->slot_mapping[q0 + k];

			FAIL_IF(slot != (int64_t)s->tab[p / RBS] * RBS + p % RBS, "slot");
			M.kv[slot] = hash_at(q, q->len, toks[j], k);
		}
		q0 += nnew[j];
		maxq = nnew[j] > maxq ? nnew[j] : maxq;
		maxk = nl > maxk ? nl : maxk;
	}
	FAIL_IF(m->total_q != q0 || m->max_length_q != maxq || m->max_length_k != maxk, "");
	FAIL_IF(m->decode_only != (maxq == 1), "");
}

/* Ends an open step in the cache and in the reference. */
static void finish_step(struct mstep *ms, int commit)
{
	for (int j = 0; j < ms->n; j++) {
		struct mseq *q = &M.s[ms->seqs[j]];
		uint32_t used = ms->nnew[j] < q->npend ? ms->nnew[j] : q->npend;

		uint32_t old = q->len;

		q->in_step = 0;
		if (!commit)
			continue;
		for (uint32_t k = 0; k < ms->nnew[j]; k++)
			seq_push(q, ms->tok[j][k]);
		/*
		 * Publication rule: a newly full block is published unless its prefix
		 * already is, and only when the block before it is the published one.
		 */
		for (uint32_t b = old / RBS; M.exact && b < q->len / RBS; b++) {
			uint64_t h = q->hv[(b + 1) * RBS - 1];

			q->pub[b] = !pset_has(h) && (b == 0 || q->pub[b - 1]);
			if (q->pub[b])
				pset_add(h);
		}
		/* The prompt tokens the step carried are no longer pending. */
		memmove(q->pend, q->pend + used, (q->npend - used) * sizeof(int32_t));
		q->npend -= used;
	}
	if (commit)
		FAIL_IF(test_commit(M.c, ms->st) != 0, "");
	else
		pkv_cache_step_abort(M.c, ms->st);
	ms->st = NULL;
}

static void op_step(void)
{
	uint32_t owner = rnd(NOWN), need = 0, nr = 0;
	struct pkv_step_req req[MAXSEQ + 1];
	int idx[MAXSEQ], n = 0, r, inject = rnd(40);
	struct pkv_step_meta m;
	struct pkv_step *st;
	struct pkv_cache_stats cs;
	struct mstep *ms = NULL;

	for (int i = 0; i < NSTEP; i++)
		if (!M.steps[i].st)
			ms = &M.steps[i];
	if (!ms)
		return;
	for (int i = 0; i < MAXSEQ; i++) {
		struct mseq *q = &M.s[i];
		uint32_t k;

		if (!q->used || q->owner != owner || q->in_step || q->len >= MAXT || rnd(3) == 0)
			continue;
		if (q->npend)
			k = rnd(3) ? q->npend : 1 + rnd(q->npend);
		else
			k = rnd(4) ? 1 : 1 + rnd(6);
		if (q->len + k > MAXT)
			k = MAXT - q->len;
		for (uint32_t j = 0; j < k; j++)
			ms->tok[n][j] = j < q->npend ? q->pend[j] : (int32_t)rnd(1000000);
		ms->nnew[n] = k;
		idx[n] = i;
		req[n] = (struct pkv_step_req){ q->h, k, ms->tok[n] };
		need += (q->len + k + RBS - 1) / RBS - (q->len + RBS - 1) / RBS;
		n++;
	}
	if (!n)
		return;
	nr = (uint32_t)n;
	if (inject == 0) {
		req[nr++] = req[rnd((uint32_t)n)];            /* named twice */
	} else if (inject == 1) {
		req[nr++] = (struct pkv_step_req){ req[0].seq, 1, ms->tok[0] };
		req[0].seq ^= 1u << M.c->idx_bits;           /* stale generation */
	} else if (inject == 2) {
		req[0].n_new = MAXT + 1 - M.s[idx[0]].len;   /* one token too many */
	} else if (inject == 3) {
		int b = pick_seq(0);                          /* maybe one in another open step */

		if (b >= 0 && M.s[b].in_step && M.s[b].owner == owner)
			req[nr++] = (struct pkv_step_req){ M.s[b].h, 1, ms->tok[0] };
		else
			inject = -1;
	}
	pkv_cache_stats(M.c, &cs);
	r = EXPECT_UNCHANGED_ON_ERROR(owner, pkv_cache_step_begin(M.c, owner, req, nr, &st, &m));
	if (inject == 0 || inject == 2) {
		FAIL_IF(r != -EINVAL, "injected %d: %d", inject, r);
		return;
	}
	if (inject == 1) {
		FAIL_IF(r != -ENOENT, "stale handle: %d", r);
		return;
	}
	if (inject == 3) {
		FAIL_IF(r != -EBUSY, "sequence in another step: %d", r);
		return;
	}
	if (need && M.lim_blocks[owner] &&
	    owner_refs(owner) + owner_pinned(owner) + need > M.lim_blocks[owner]) {
		FAIL_IF(r != -ENOSPC, "owner block limit: %d", r);
		return;
	}
	if (need > cs.free_blocks + cs.cached_blocks) {
		FAIL_IF(r != -ENOSPC, "need %u > free %u + cached %u: %d", need, cs.free_blocks,
			cs.cached_blocks, r);
		return;
	}
	if (r == -ENOSPC) {
		/* Only pins or copies (at most one per sequence) can explain it. */
		FAIL_IF(need + nr <= cs.free_blocks, "ENOSPC with %u free for %u", cs.free_blocks, need);
		return;
	}
	FAIL_IF(r != 0, "begin: %d", r);
	play_step(&m, idx, ms->nnew, ms->tok, n);
	ms->st = st;
	ms->owner = owner;
	ms->n = n;
	for (int j = 0; j < n; j++) {
		ms->seqs[j] = idx[j];
		M.s[idx[j]].in_step = 1;
		M.s[idx[j]].step_new = ms->nnew[j];
	}
	/* Mostly commit at once; sometimes abort, sometimes leave the step open across operations. */
	r = (int)rnd(10);
	if (r < 6)
		finish_step(ms, 1);
	else if (r < 7)
		finish_step(ms, 0);
}

static void op_end_step(void)
{
	struct mstep *ms = &M.steps[rnd(NSTEP)];

	if (ms->st)
		finish_step(ms, rnd(4) != 0);
}

static void op_fork(void)
{
	int p = pick_seq(0), i = free_mseq();
	uint32_t h;
	int r;

	if (p < 0)
		return;
	r = EXPECT_UNCHANGED_ON_ERROR(M.s[p].owner, pkv_cache_seq_fork(M.c, M.s[p].owner, M.s[p].h, &h));
	if (M.s[p].in_step) {
		FAIL_IF(r != -EBUSY, "fork in step: %d", r);
		return;
	}
	if (i < 0 || (M.lim_seqs[M.s[p].owner] && owner_seqs(M.s[p].owner) >= M.lim_seqs[M.s[p].owner]) ||
	    (M.s[p].len && M.lim_blocks[M.s[p].owner] &&
	     owner_refs(M.s[p].owner) + owner_pinned(M.s[p].owner) + (M.s[p].len + RBS - 1) / RBS >
	     M.lim_blocks[M.s[p].owner])) {
		FAIL_IF(r != -ENOSPC, "fork over a limit: %d", r);
		return;
	}
	FAIL_IF(r != 0, "fork: %d", r);
	M.s[i] = M.s[p];
	M.s[i].h = h;
}

static void op_truncate(void)
{
	int p = pick_seq(0);
	uint32_t n;
	int r;

	if (p < 0)
		return;
	n = rnd(M.s[p].len + 2);   /* sometimes one past the end */
	r = EXPECT_UNCHANGED_ON_ERROR(M.s[p].owner, pkv_cache_seq_truncate(M.c, M.s[p].owner, M.s[p].h, n));
	if (M.s[p].in_step) {
		FAIL_IF(r != -EBUSY, "truncate in step: %d", r);
		return;
	}
	if (n > M.s[p].len) {
		FAIL_IF(r != -EINVAL, "truncate past end: %d", r);
		return;
	}
	FAIL_IF(r != 0, "truncate: %d", r);
	M.s[p].len = n;
	M.s[p].npend = 0;
}

static void op_close(void)
{
	int p = pick_seq(0);
	uint32_t wrong;
	int r;

	if (p < 0)
		return;
	wrong = (M.s[p].owner + 1 + rnd(NOWN - 1)) % NOWN;
	r = EXPECT_UNCHANGED_ON_ERROR(wrong, pkv_cache_seq_close(M.c, wrong, M.s[p].h));
	FAIL_IF(r != -ENOENT, "close by another owner: %d", r);
	r = EXPECT_UNCHANGED_ON_ERROR(M.s[p].owner, pkv_cache_seq_close(M.c, M.s[p].owner, M.s[p].h));
	if (M.s[p].in_step) {
		FAIL_IF(r != -EBUSY, "close in step: %d", r);
		return;
	}
	FAIL_IF(r != 0, "close: %d", r);
	FAIL_IF(pkv_cache_seq_close(M.c, M.s[p].owner, M.s[p].h) != -ENOENT, "closed twice");
	M.s[p].used = 0;
}

static void op_release(void)
{
	uint32_t o = rnd(NOWN);
	int n = (int)owner_seqs(o), r;

	/* The cache aborts the owner's steps itself; the reference just forgets them. */
	for (int i = 0; i < NSTEP; i++)
		if (M.steps[i].st && M.steps[i].owner == o) {
			for (int j = 0; j < M.steps[i].n; j++)
				M.s[M.steps[i].seqs[j]].in_step = 0;
			M.steps[i].st = NULL;
		}
	r = pkv_cache_release_owner(M.c, o);
	FAIL_IF(r != n, "release_owner: %d, expected %d", r, n);
	for (int i = 0; i < MAXSEQ; i++)
		if (M.s[i].used && M.s[i].owner == o)
			M.s[i].used = 0;
	/* Pins go with their owner. */
	for (int i = 0; i < NPIN; i++)
		if (M.pin[i].used && M.pin[i].owner == o)
			M.pin[i].used = 0;
	M.lim_seqs[o] = M.lim_blocks[o] = 0;
}

static void op_limits(void)
{
	uint32_t o = rnd(NOWN);

	M.lim_seqs[o] = rnd(2) ? 0 : 2 + rnd(5);
	M.lim_blocks[o] = rnd(2) ? 0 : 8 + rnd(24);
	FAIL_IF(pkv_cache_set_owner_limits(M.c, o, M.lim_seqs[o], M.lim_blocks[o]) != 0, "");
}

static void op_pin(void)
{
	int i, ns = (int)rnd(NNS);
	uint32_t n = 1 + rnd(PLEN), o = rnd(NOWN);
	struct mpin *p = NULL;
	int r;

	for (i = 0; i < NPIN; i++)
		if (!M.pin[i].used)
			p = &M.pin[i];
	if (!p)
		return;
	memcpy(p->tok, M.prompt[rnd(NPROMPT)], sizeof(p->tok));
	r = EXPECT_UNCHANGED_ON_ERROR(0, pkv_prefix_pin(M.c, o, M.ns[ns], p->tok, n));
	if (r == -ENOSPC)
		return;
	FAIL_IF(r < 0 || r % RBS || (uint32_t)r > n, "pin: %d", r);
	if (r > 0) {
		p->used = 1;
		p->ns = ns;
		p->owner = o;
		p->n = (uint32_t)r;
	}
}

static void op_unpin(void)
{
	int i = (int)rnd(NPIN), r;

	if (!M.pin[i].used) {
		/* Nothing pinned on a fresh random path: -ENOENT, nothing changes. */
		int32_t t[8];

		for (int k = 0; k < 8; k++)
			t[k] = (int32_t)(2000000 + rnd(1000));
		r = EXPECT_UNCHANGED_ON_ERROR(0, pkv_prefix_unpin(M.c, rnd(NOWN), M.ns[0], t, 8));
		FAIL_IF(r != -ENOENT, "unpin of nothing: %d", r);
		return;
	}
	r = pkv_prefix_unpin(M.c, M.pin[i].owner, M.ns[M.pin[i].ns], M.pin[i].tok, M.pin[i].n);
	FAIL_IF(r != (int)M.pin[i].n, "unpin: %d, expected %u", r, M.pin[i].n);
	M.pin[i].used = 0;
}

static void op_flush(void)
{
	struct pkv_cache_stats st;

	FAIL_IF(pkv_cache_flush(M.c) < 0, "");
	pkv_cache_stats(M.c, &st);
	FAIL_IF(st.cached_blocks > st.pinned_blocks, "flush left %u cached, %u pinned",
		st.cached_blocks, st.pinned_blocks);
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : def;
}

static void run_ops(uint32_t nblk, int exact, unsigned long ops)
{
	struct pkv_geometry g = { 2, 4, 2, 8, PKV_DTYPE_F16, RBS, nblk };
	struct pkv_cache_limits lim = { .max_seqs = MAXSEQ, .max_tokens_per_seq = MAXT,
					.pin_budget_blocks = 8, .pin_cap_blocks = 12,
					/* the model's owner limits only; the refs bound has its own test */
					.max_refs_per_owner = 1u << 20 };
	struct pkv_cache_stats st;

	memset(&M, 0, sizeof(M));
	M.nblk = nblk;
	M.exact = exact;
	M.seed = env_u64("PKV_RANDOM_SEED", 0);
	if (!M.seed)
		M.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	/* Every seed its own stream (xorshift needs a non-zero state). */
	M.rng = M.seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
	if (!M.rng)
		M.rng = 1;
	fprintf(stderr, "test-cache-random: %s pool, seed %" PRIu64 ", %lu operations "
		"(PKV_RANDOM_SEED, PKV_RANDOM_OPS)\n", exact ? "large" : "small", M.seed, ops);
	M.kv = calloc((size_t)nblk * RBS, sizeof(*M.kv));
	for (M.pmask = 1; M.pmask < 2 * nblk; M.pmask <<= 1)
		;
	M.pset = calloc(M.pmask, sizeof(*M.pset));
	M.pmask--;
	ck_assert(M.kv && M.pset);
	ck_assert_int_eq(pkv_cache_create(&g, &lim, &M.c), 0);
	for (int n = 0; n < NNS; n++)
		M.ns[n] = pkv_namespace(7, &g, 1000 + (uint32_t)n, NULL, 0);
	/* Prompts 0-2 share their first two blocks, then branch: a prefix tree, not just chains. */
	for (int p = 0; p < NPROMPT; p++)
		for (int k = 0; k < PLEN; k++)
			M.prompt[p][k] = p < 3 ? k + (int32_t)p * (k >= 8 ? 1000 : 0) : (int32_t)rnd(100000);
	for (M.op = 0; M.op < ops; M.op++) {
		uint32_t w = rnd(100);

		if (w < 22)
			op_open();
		else if (w < 55)
			op_step();
		else if (w < 62)
			op_end_step();
		else if (w < 68)
			op_fork();
		else if (w < 74)
			op_truncate();
		else if (w < 88)
			op_close();
		else if (w < 90)
			op_release();
		else if (w < 92)
			op_limits();
		else if (w < 95)
			op_pin();
		else if (w < 98)
			op_unpin();
		else if (!exact)
			op_flush();   /* flushing would unpublish what the exact reference expects */
		verify();
	}
	/* What the run exercised, so a change that makes the mix degenerate is visible. */
	pkv_cache_stats(M.c, &st);
	fprintf(stderr, "test-cache-random: hit %" PRIu64 " of %" PRIu64 " looked-up tokens, "
		"%" PRIu64 " evictions, %" PRIu64 " copies\n", st.hit_tokens, st.lookup_tokens,
		st.evictions, st.cow_copies);
	ck_assert_uint_gt(st.hit_tokens, 0);
	ck_assert_uint_gt(st.cow_copies, 0);
	if (exact)
		ck_assert_msg(st.evictions == 0, "the large pool must never evict (%" PRIu64 ")",
			      st.evictions);
	else
		ck_assert_uint_gt(st.evictions, 0);
	pkv_cache_destroy(M.c);
	free(M.kv);
	free(M.pset);
}

/* A small pool under constant eviction pressure: content and accounting are checked. */
START_TEST(random_ops_under_eviction_pressure)
{
	run_ops(NBLK, 0, (unsigned long)env_u64("PKV_RANDOM_OPS", 100000));
}
END_TEST

/* A pool that never evicts: every open's n_cached must equal the reference's exactly. */
START_TEST(random_ops_exact_prefix_hits)
{
	run_ops(16384, 1, (unsigned long)env_u64("PKV_RANDOM_OPS", 100000) / 10);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cache-random");
	TCase *tc = tcase_create("model");

	tcase_add_test(tc, random_ops_under_eviction_pressure);
	tcase_add_test(tc, random_ops_exact_prefix_hits);
	tcase_set_timeout(tc, 600);
	suite_add_tcase(s, tc);
	return test_run(s);
}
