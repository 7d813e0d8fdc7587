/* SPDX-License-Identifier: MIT */
/* Sessions: the hello/attach handshake, SQE execution, completions, and release on hang-up. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "common/log.h"
#include "common/msg.h"
#include "common/region.h"
#include "daemon/daemon.h"
#include "daemon/validate.h"

#define MAX_REGION (64ull << 30)
#define SQES_PER_SWEEP 64

struct session *session_new(struct pkv_daemon *d, int sock)
{
	struct session *s = calloc(1, sizeof(*s));
	struct ucred cred;
	socklen_t cl = sizeof(cred);

	if (!s)
		return NULL;
	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
		free(s);
		return NULL;
	}
	s->uid = cred.uid;
	s->pid = cred.pid;
	s->sock = sock;
	s->memfd = s->sq_bell = -1;
	do
		s->id = ++d->next_id;
	while (s->id == 0);
	s->created_ns = pkv_now_ns();
	s->w_ctl = (struct watch){ W_CTL, s };
	s->w_bell = (struct watch){ W_BELL, s };
	s->w_cancel = (struct watch){ W_CANCEL, s };
	pthread_spin_init(&s->cq_lock, PTHREAD_PROCESS_PRIVATE);
	s->next = d->sessions;
	if (d->sessions)
		d->sessions->prev = s;
	d->sessions = s;
	d->n_sessions++;
	return s;
}

void session_set_err(struct session *s, const char *fmt, ...)
{
	char buf[PKV_ERR_LEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	pkv_dbg("client %u: %s", s->id, buf);
	if (s->region) {
		size_t n = strlen(buf) + 1;

		if (n > s->hdr.err_len)
			n = s->hdr.err_len;
		memcpy(s->region + s->hdr.err_off, buf, n);
		s->region[s->hdr.err_off + s->hdr.err_len - 1] = 0;
	}
}

/* ---------------------------------------------------------------- completions */

/*
 * Wakes a client sleeping on its CQ: a futex word in the shared region, never
 * a write(2) to a descriptor the client shares (it could make it blocking and
 * fill the counter between any check and the write, and stall the loop).
 */
static void wake_cq(struct session *s)
{
	pkv_ring_wake(&s->cq);
}

/*
 * Posts one completion. Called by the loop and by the worker (attends, so a
 * result reaches the client without another thread hop); the region stays
 * mapped while the worker holds attends of this session, since release
 * waits for them.
 */
int session_post(struct session *s, uint64_t ud, int32_t res, uint64_t p0, uint64_t p1)
{
	struct pkv_cqe cqe = { .user_data = ud, .res = res, .payload = { p0, p1 } };
	int64_t space;
	int wake;

	if (!s->region)
		return -ECONNRESET;
	pthread_spin_lock(&s->cq_lock);
	space = pkv_ring_space(&s->cq);
	if (space <= 0 || s->cq_broken) {
		/* Room was checked before the SQE was taken: the client corrupted its ring. */
		s->cq_broken = 1;
		pthread_spin_unlock(&s->cq_lock);
		return -EPROTO;
	}
	memcpy(pkv_ring_prod_slot(&s->cq), &cqe, sizeof(cqe));
	pkv_ring_publish(&s->cq);
	wake = pkv_ring_needs_wakeup(&s->cq);
	pthread_spin_unlock(&s->cq_lock);
	if (wake)
		wake_cq(s);
	return 0;
}

/* ---------------------------------------------------------------- sequences table */

static struct seq_ent *seq_find(struct session *s, uint32_t seq)
{
	for (uint32_t i = 0; i < s->n_seqs; i++)
		if (s->seqs[i].seq == seq)
			return &s->seqs[i];
	return NULL;
}

static int seq_add(struct session *s, uint32_t seq, uint32_t len)
{
	if (s->n_seqs == s->cap_seqs) {
		uint32_t c = s->cap_seqs ? s->cap_seqs * 2 : 16;
		struct seq_ent *n = realloc(s->seqs, c * sizeof(*n));

		if (!n)
			return -ENOMEM;
		s->seqs = n;
		s->cap_seqs = c;
	}
	s->seqs[s->n_seqs++] = (struct seq_ent){ seq, len };
	return 0;
}

static void seq_del(struct session *s, uint32_t seq)
{
	struct seq_ent *e = seq_find(s, seq);

	if (e)
		*e = s->seqs[--s->n_seqs];
}

/* ---------------------------------------------------------------- handshake */

static int is_eventfd(int fd)
{
	char link[64], target[64];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0)
		return 0;
	target[n] = 0;
	return !strcmp(target, "anon_inode:[eventfd]");
}

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* Maps and checks a client's region; takes ownership of fds on success. */
static int client_hello(struct pkv_daemon *d, struct session *s, const struct pkv_msg_hello *m,
			int *fds, int nfds, char *why, size_t why_len)
{
	struct stat st;
	int seals, r;
	void *map;

	if (nfds != 2) {
		snprintf(why, why_len, "hello: expected 2 descriptors (memfd, submission eventfd), got %d", nfds);
		return -EINVAL;
	}
	if (fstat(fds[0], &st) < 0 || !S_ISREG(st.st_mode)) {
		snprintf(why, why_len, "hello: the region descriptor is not a memfd");
		return -EINVAL;
	}
	seals = fcntl(fds[0], F_GET_SEALS);
	if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
		snprintf(why, why_len, "hello: the memfd must be sealed against shrinking and growing "
			 "(F_SEAL_SHRINK | F_SEAL_GROW)");
		return -EINVAL;
	}
	if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) {
		snprintf(why, why_len, "hello: the memfd is write-sealed; the daemon must write completions");
		return -EINVAL;
	}
	if ((uint64_t)st.st_size != m->region_size || st.st_size < 4096 ||
	    (uint64_t)st.st_size > MAX_REGION) {
		snprintf(why, why_len, "hello: memfd has %lld bytes, hello says %llu (allowed 4 KiB .. 64 GiB)",
			 (long long)st.st_size, (unsigned long long)m->region_size);
		return -EINVAL;
	}
	if (!is_eventfd(fds[1])) {
		snprintf(why, why_len, "hello: the submission doorbell must be an eventfd");
		return -EINVAL;
	}
	map = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (map == MAP_FAILED) {
		snprintf(why, why_len, "hello: cannot map the memfd: %s", strerror(errno));
		return -EINVAL;
	}
	/* One copy of the header; the client may rewrite its own copy at will. */
	memcpy(&s->hdr, map, sizeof(s->hdr));
	r = pkv_region_check(&s->hdr, st.st_size, why, why_len);
	if (r) {
		munmap(map, st.st_size);
		return r;
	}
	s->region = map;
	s->region_size = st.st_size;
	s->memfd = fds[0];
	s->sq_bell = fds[1];
	pkv_ring_bind(&s->sq, s->region + s->hdr.sq_ring_off, s->region + s->hdr.sq_sqes_off,
		      s->hdr.sq_entries, s->hdr.sqe_size, &s->hdr);
	pkv_ring_bind(&s->cq, s->region + s->hdr.cq_ring_off, s->region + s->hdr.cq_cqes_off,
		      s->hdr.cq_entries, s->hdr.cqe_size, &s->hdr);
	s->arena = s->region + s->hdr.arena_off;
	s->arena_size = s->hdr.arena_size;
	(void)d;
	return 0;
}

static void reply(struct pkv_daemon *d, struct session *s, int status, uint64_t value, const char *text)
{
	int r = pkv_send_reply(s->sock, status, value, 0, text, text ? strlen(text) : 0);

	if (r)
		session_hangup(d, s);
}

static void handle_attach(struct pkv_daemon *d, struct session *s, const struct pkv_msg_attach *m)
{
	char why[PKV_REPLY_TEXT_MAX];
	struct pool *p;
	int r;

	if (s->pool) {
		reply(d, s, -EALREADY, 0, "already attached to a pool");
		return;
	}
	why[0] = 0;
	r = pool_attach(d, m, &p, why, sizeof(why));
	if (r) {
		pkv_info("client %u (pid %d): attach '%s' refused: %s", s->id, (int)s->pid, m->name, why);
		reply(d, s, r, 0, why);
		return;
	}
	r = pkv_cache_set_owner_limits(p->cache, s->id, d->cfg.client_max_seqs,
				       d->cfg.client_block_share >= 100 ? 0 :
				       (uint32_t)((uint64_t)p->geo.num_blocks * d->cfg.client_block_share / 100));
	if (r) {
		reply(d, s, r, 0, "cannot set this client's quotas");
		return;
	}
	s->pool = p;
	p->n_clients++;
	/* Sharing scope comes from the kernel's view of the peer, never from the message. */
	s->ns = pkv_namespace(m->model_id, &m->geo,
			      (p->flags & PKV_WIRE_POOL_SHARED) ? PKV_NS_SHARED : (uint32_t)s->uid,
			      m->salt, m->salt_len);
	reply(d, s, 0, 0, NULL);
}

static void handle_ctl(struct pkv_daemon *d, struct session *s, const struct pkv_msg_ctl *m)
{
	char *out = NULL;
	size_t len, off = 0;
	int status = ctl_run(d, m->cmd, m->format, &out);

	len = out ? strlen(out) : 0;
	do {
		size_t chunk = len - off > PKV_REPLY_TEXT_MAX ? PKV_REPLY_TEXT_MAX : len - off;
		uint32_t more = off + chunk < len ? PKV_REPLY_MORE : 0;

		if (pkv_send_reply(s->sock, status, 0, more, out ? out + off : NULL, chunk)) {
			session_hangup(d, s);
			break;
		}
		off += chunk;
	} while (off < len);
	free(out);
}

void session_ctl_message(struct pkv_daemon *d, struct session *s)
{
	union {
		struct pkv_msg_hdr hdr;
		struct pkv_msg_hello hello;
		struct pkv_msg_attach attach;
		struct pkv_msg_ctl ctl;
		char raw[512];
	} u;
	char why[PKV_REPLY_TEXT_MAX];
	int fds[PKV_MAX_FDS], nfds = 0, type, r;
	ssize_t n;

	if (s->closing)
		return;
	n = pkv_msg_recv(s->sock, &u, sizeof(u), fds, PKV_MAX_FDS, &nfds, 0);
	if (n == -EAGAIN)
		return;
	if (n <= 0) {
		/* A zero-byte message can still carry descriptors: they are ours to close. */
		if (n == 0)
			close_fds(fds, nfds);
		if (n < 0 && n != -ECONNRESET && n != -EBADMSG)
			pkv_dbg("client %u: recv: %s", s->id, strerror((int)-n));
		if (n == -EBADMSG && !s->role) {
			reply(d, s, -EBADMSG, 0, "message truncated or too many descriptors");
		}
		session_hangup(d, s);
		return;
	}
	why[0] = 0;
	type = pkv_msg_check(&u, (size_t)n, s->role, why, sizeof(why));
	if (type < 0) {
		close_fds(fds, nfds);
		pkv_info("client %u (pid %d): refused: %s", s->id, (int)s->pid, why);
		reply(d, s, type, 0, why);
		if (!s->role)
			session_hangup(d, s); /* a failed hello ends the connection */
		return;
	}
	if (type != PKV_MSG_HELLO && nfds) {
		close_fds(fds, nfds);
		reply(d, s, -EINVAL, 0, "unexpected descriptors");
		return;
	}
	switch (type) {
	case PKV_MSG_HELLO:
		if (loop_over_uid_limit(d, s, why, sizeof(why))) {
			close_fds(fds, nfds);
			pkv_info("client %u (pid %d): refused: %s", s->id, (int)s->pid, why);
			reply(d, s, -EUSERS, 0, why);
			session_hangup(d, s);
			return;
		}
		if (u.hello.role == PKV_ROLE_CLIENT) {
			r = client_hello(d, s, &u.hello, fds, nfds, why, sizeof(why));
			if (r) {
				close_fds(fds, nfds);
				pkv_info("client %u (pid %d): hello refused: %s", s->id, (int)s->pid, why);
				reply(d, s, r, 0, why);
				session_hangup(d, s);
				return;
			}
			s->role = PKV_ROLE_CLIENT;
			loop_arm_session(d, s);
		} else {
			if (nfds) {
				close_fds(fds, nfds);
				reply(d, s, -EINVAL, 0, "a control connection passes no descriptors");
				session_hangup(d, s);
				return;
			}
			s->role = PKV_ROLE_CTL;
		}
		pkv_dbg("client %u: hello from pid %d uid %u", s->id, (int)s->pid, (unsigned)s->uid);
		reply(d, s, 0, s->id, NULL);
		break;
	case PKV_MSG_ATTACH:
		handle_attach(d, s, &u.attach);
		break;
	case PKV_MSG_CTL:
		handle_ctl(d, s, &u.ctl);
		break;
	}
}

/* ---------------------------------------------------------------- SQE execution */

/* Copies n int32/uint32 values out of the arena (after the bounds were checked). */
static void *copy_out(const struct session *s, uint64_t off, uint64_t n)
{
	void *p = malloc(n ? n * 4 : 4);

	if (p && n)
		memcpy(p, s->arena + off, n * 4);
	return p;
}

static void step_clear(struct session *s)
{
	s->step = NULL;
	s->step_poisoned = 0;
	memset(&s->meta, 0, sizeof(s->meta));
	free(s->step_reqs);
	free(s->step_tokens);
	s->step_reqs = NULL;
	s->step_tokens = NULL;
	s->n_step_reqs = 0;
}

/* Says why the cache refused: a quota of this client, or the pool itself. */
static void explain(struct pkv_daemon *d, struct session *s, const char *what, int r)
{
	struct pkv_owner_usage u;

	if (r == -ENOSPC) {
		pkv_cache_owner_usage(s->pool->cache, s->id, &u);
		if (u.max_seqs && u.seqs >= u.max_seqs) {
			session_set_err(s, "%s: this client holds %u sequences, its quota", what, u.seqs);
			return;
		}
		if (u.max_blocks) {
			session_set_err(s, "%s: out of blocks, or over this client's quota of %u blocks (%u held)",
					what, u.max_blocks, u.blocks);
			return;
		}
		session_set_err(s, "%s: the pool is out of blocks", what);
		return;
	}
	(void)d;
	session_set_err(s, "%s: %s", what, strerror(-r));
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

static int op_step_begin(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e)
{
	struct pkv_step_req *reqs = NULL;
	uint32_t *seqs = NULL, *n_new = NULL;
	int32_t *tokens = NULL;
	uint64_t total = 0, pos = 0;
	int r;

	if (s->step) {
		session_set_err(s, "a step is already open");
		return -EBUSY;
	}
	seqs = copy_out(s, e->off[0], e->n);
	n_new = copy_out(s, e->off[1], e->n);
	reqs = calloc(e->n, sizeof(*reqs));
	r = -ENOMEM;
	if (!seqs || !n_new || !reqs)
		goto out;
	r = -EINVAL;
	for (uint32_t i = 0; i < e->n; i++) {
		if (n_new[i] == 0 || n_new[i] > PKV_MAX_STEP_TOKENS) {
			session_set_err(s, "sequence %u: %u new tokens", seqs[i], n_new[i]);
			goto out;
		}
		total += n_new[i];
	}
	if (total > PKV_MAX_STEP_TOKENS) {
		session_set_err(s, "step of %llu tokens (max %u)", (unsigned long long)total,
				PKV_MAX_STEP_TOKENS);
		goto out;
	}
	if (!pkv_range_ok(s->arena_size, e->off[2], total * 4)) {
		session_set_err(s, "tokens: %llu ids at offset %llu are outside the arena",
				(unsigned long long)total, (unsigned long long)e->off[2]);
		goto out;
	}
	tokens = copy_out(s, e->off[2], total);
	if (!tokens) {
		r = -ENOMEM;
		goto out;
	}
	/* Sorted copy: a duplicate check in O(n log n), not O(n^2) on the loop thread. */
	memcpy(reqs, seqs, (size_t)e->n * 4);
	qsort(reqs, e->n, 4, cmp_u32);
	for (uint32_t i = 1; i < e->n; i++)
		if (((uint32_t *)reqs)[i] == ((uint32_t *)reqs)[i - 1]) {
			session_set_err(s, "sequence %u named twice in one step", ((uint32_t *)reqs)[i]);
			goto out;
		}
	for (uint32_t i = 0; i < e->n; i++) {
		reqs[i] = (struct pkv_step_req){ seqs[i], n_new[i], tokens + pos };
		pos += n_new[i];
	}
	r = pkv_cache_step_begin(s->pool->cache, s->id, reqs, e->n, &s->step, &s->meta);
	if (r) {
		explain(d, s, "step", r);
		s->step = NULL;
		goto out;
	}
	s->step_reqs = reqs;
	s->n_step_reqs = e->n;
	s->step_tokens = tokens;
	reqs = NULL;
	tokens = NULL;
	s->pool->steps++;
	if (s->meta.num_copies) {
		struct job *j = calloc(1, sizeof(*j));

		if (!j) {
			pkv_cache_step_abort(s->pool->cache, s->step);
			step_clear(s);
			r = -ENOMEM;
			goto out;
		}
		j->kind = JOB_COPY;
		j->pool = s->pool;
		j->s = s;
		j->copies = s->meta.copies;
		j->n_copies = s->meta.num_copies;
		s->inflight++; /* copies must finish before a commit or abort */
		worker_push(d, j);
	}
	r = 0;
out:
	free(seqs);
	free(n_new);
	free(reqs);
	free(tokens);
	return r;
}

/* Hands the session's ring to the worker, which takes this attend and the ones after it. */
static void hand_to_worker(struct pkv_daemon *d, struct session *s)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j)
		return; /* retried at the next sweep */
	j->kind = JOB_POLL;
	j->pool = s->pool;
	j->s = s;
	s->worker_owned = 1;
	s->inflight++; /* released only once the worker hands the ring back */
	worker_push(d, j);
}

/* Executes one validated SQE; returns its result, or 1 when it completes asynchronously. */
static int exec_sqe(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
		    uint64_t *p0, uint64_t *p1)
{
	struct pkv_cache *c = s->pool ? s->pool->cache : NULL;
	struct seq_ent *se;
	uint32_t seq, n_cached;
	int32_t *tok;
	int64_t len;
	int r;

	switch (e->opcode) {
	case PKV_OP_NOP:
		return 0;
	case PKV_OP_SEQ_OPEN:
	case PKV_OP_SEQ_FORK:
		if (e->opcode == PKV_OP_SEQ_FORK) {
			se = seq_find(s, e->seq);
			r = pkv_cache_seq_fork(c, s->id, e->seq, &seq);
			if (r) {
				explain(d, s, "fork", r);
				return r;
			}
			len = pkv_cache_seq_len(c, s->id, seq);
			r = seq_add(s, seq, len > 0 ? (uint32_t)len : (se ? se->len : 0));
			if (r) {
				/* Untracked, the child would hold blocks and a quota slot under a handle the client never learns. */
				pkv_cache_seq_close(c, s->id, seq);
				session_set_err(s, "fork: %s", strerror(-r));
				return r;
			}
			*p0 = seq;
			return 0;
		}
		tok = copy_out(s, e->off[0], e->n);
		if (!tok)
			return -ENOMEM;
		r = pkv_cache_seq_open(c, s->id, s->ns, tok, e->n, &seq, &n_cached);
		free(tok);
		if (r) {
			explain(d, s, "open", r);
			return r;
		}
		r = seq_add(s, seq, n_cached);
		if (r) {
			pkv_cache_seq_close(c, s->id, seq);
			return r;
		}
		*p0 = seq;
		*p1 = n_cached;
		return 0;
	case PKV_OP_SEQ_TRUNCATE:
		r = pkv_cache_seq_truncate(c, s->id, e->seq, e->n);
		if (r) {
			session_set_err(s, "truncate of sequence %u to %u: %s", e->seq, e->n, strerror(-r));
			return r;
		}
		if ((se = seq_find(s, e->seq)))
			se->len = e->n < se->len ? e->n : se->len;
		return 0;
	case PKV_OP_SEQ_CLOSE:
		r = pkv_cache_seq_close(c, s->id, e->seq);
		if (r) {
			session_set_err(s, "close of sequence %u: %s", e->seq, strerror(-r));
			return r;
		}
		seq_del(s, e->seq);
		return 0;
	case PKV_OP_STEP_BEGIN:
		return op_step_begin(d, s, e);
	case PKV_OP_ATTEND:
		/* Attends in a step run on the worker; one that passed validation had a step. */
		return -EPROTO;
	case PKV_OP_STEP_END:
		if (!s->step) {
			session_set_err(s, "no open step");
			return -EINVAL;
		}
		if (s->step_poisoned) {
			/* Its copy-on-write failed: publishing those blocks would share wrong KV. */
			pkv_cache_step_abort(c, s->step);
			step_clear(s);
			session_set_err(s, "copy-on-write failed in the backend; the step was aborted");
			return -EIO;
		}
		r = pkv_cache_step_commit(c, s->step);
		if (r) {
			session_set_err(s, "commit: %s", strerror(-r));
			return r;
		}
		for (uint32_t i = 0; i < s->n_step_reqs; i++)
			if ((se = seq_find(s, s->step_reqs[i].seq)))
				se->len += s->step_reqs[i].n_new;
		step_clear(s);
		return 0;
	case PKV_OP_STEP_ABORT:
		if (!s->step) {
			session_set_err(s, "no open step");
			return -EINVAL;
		}
		pkv_cache_step_abort(c, s->step);
		step_clear(s);
		return 0;
	case PKV_OP_PIN:
	case PKV_OP_UNPIN:
		tok = copy_out(s, e->off[0], e->n);
		if (!tok)
			return -ENOMEM;
		r = e->opcode == PKV_OP_PIN ? pkv_prefix_pin(c, s->id, s->ns, tok, e->n)
					    : pkv_prefix_unpin(c, s->id, s->ns, tok, e->n);
		free(tok);
		if (r < 0)
			session_set_err(s, "%s: %s", e->opcode == PKV_OP_PIN ? "pin" : "unpin", strerror(-r));
		return r;
	case PKV_OP_STATS: {
		struct pkv_cache_stats cs;
		struct pkv_wire_stats w = { 0 };

		pkv_cache_stats(c, &cs);
		w.num_blocks = cs.num_blocks;
		w.free_blocks = cs.free_blocks;
		w.cached_blocks = cs.cached_blocks;
		w.in_use_blocks = cs.in_use_blocks;
		w.open_seqs = s->n_seqs;
		w.prefix_lookup_tokens = cs.lookup_tokens;
		w.prefix_hit_tokens = cs.hit_tokens;
		memcpy(s->arena + e->off[0], &w, sizeof(w));
		return 0;
	}
	}
	session_set_err(s, "unknown opcode %u", e->opcode);
	return -EINVAL;
}

int session_process(struct pkv_daemon *d, struct session *s)
{
	char why[PKV_ERR_LEN];
	int done = 0;

	if (s->closing || !s->region || s->worker_owned)
		return 0;
	/* The client spins without yielding only while we poll from another CPU. */
	pkv_ring_set_cpu(&s->sq, d->cpu1);
	while (done < SQES_PER_SWEEP) {
		struct sqe_limits lim;
		struct pkv_sqe e;
		uint64_t p0 = 0, p1 = 0;
		int64_t avail = pkv_ring_avail(&s->sq), space;
		int r;

		if (avail == 0)
			break;
		pthread_spin_lock(&s->cq_lock); /* the worker may be posting */
		space = pkv_ring_space(&s->cq);
		pthread_spin_unlock(&s->cq_lock);
		if (avail < 0 || space < 0) {
			pkv_warn("client %u (pid %d): ring indices corrupted; disconnecting", s->id, (int)s->pid);
			session_hangup(d, s);
			break;
		}
		if (space == 0)
			break; /* no room for the completion: wait for the client to reap */
		pkv_ring_peek_copy(&s->sq, &e);
		/*
		 * An attend in an open step: the worker takes the ring from here and
		 * runs the attends itself, posting their completions straight away.
		 * (One outside a step fails validation below.)
		 */
		if (e.opcode == PKV_OP_ATTEND && s->step) {
			hand_to_worker(d, s);
			break;
		}
		/* Anything but an attend waits for the attends before it (ordering). */
		if (e.opcode != PKV_OP_ATTEND && s->inflight)
			break;
		pkv_ring_consume(&s->sq);
		done++;
		s->ops++;
		memset(&lim, 0, sizeof(lim));
		lim.arena_size = s->arena_size;
		lim.geo = s->pool ? &s->pool->geo : NULL;
		lim.act_size = s->pool ? pkv_dtype_size(s->pool->act_dtype) : 1;
		lim.step_total_q = s->step ? s->meta.total_q : 0;
		why[0] = 0;
		r = pkv_sqe_check(&e, &lim, why, sizeof(why));
		if (r)
			session_set_err(s, "%s", why);
		else
			r = exec_sqe(d, s, &e, &p0, &p1);
		if (r == 1)
			continue;
		if (r < 0)
			s->errors++;
		if (session_post(s, e.user_data, r, p0, p1)) {
			pkv_warn("client %u (pid %d): completion ring corrupted or overrun; disconnecting",
				 s->id, (int)s->pid);
			session_hangup(d, s);
			break;
		}
	}
	return done;
}

/* ---------------------------------------------------------------- hang-up */

/*
 * Queued SQEs name fds by number and take their file only when submitted: a
 * re-armed doorbell read still in the SQ when we close the eventfd would,
 * once accept reuses the number, read (and eat) a new client's hello.
 * Submit before closing anything.
 */
static void flush_sqes(struct pkv_daemon *d)
{
	if (io_uring_sq_ready(&d->ring))
		io_uring_submit(&d->ring);
}

void session_release(struct pkv_daemon *d, struct session *s)
{
	if (s->released)
		return;
	s->released = 1;
	flush_sqes(d);
	if (s->pool) {
		if (s->step)
			pkv_cache_step_abort(s->pool->cache, s->step);
		step_clear(s);
		pkv_cache_release_owner(s->pool->cache, s->id);
		s->pool->n_clients--;
		s->pool = NULL;
	}
	free(s->seqs);
	s->seqs = NULL;
	s->n_seqs = 0;
	if (s->region)
		munmap(s->region, s->region_size);
	s->region = NULL;
	if (s->memfd >= 0)
		close(s->memfd);
	if (s->sq_bell >= 0)
		close(s->sq_bell);
	s->memfd = s->sq_bell = -1;
}

void session_hangup(struct pkv_daemon *d, struct session *s)
{
	struct io_uring_sqe *sqe;

	if (s->closing)
		return;
	/* The worker reads it to hand back a ring it polls. */
	pkv_store_relaxed(&s->closing, 1);
	pkv_dbg("client %u (pid %d): hung up", s->id, (int)s->pid);
	/*
	 * Cancel the requests that point at us. The cancels themselves count as
	 * armed until they complete: were the session freed while a cancel is
	 * still queued, a new session allocated at the same address would be
	 * the one cancelled.
	 */
	if (s->armed) {
		struct watch *targets[2] = { &s->w_ctl, &s->w_bell };

		for (int i = 0; i < 2; i++) {
			sqe = io_uring_get_sqe(&d->ring);
			if (!sqe) {
				io_uring_submit(&d->ring);
				sqe = io_uring_get_sqe(&d->ring);
			}
			if (!sqe)
				continue;
			io_uring_prep_cancel64(sqe, (uint64_t)(uintptr_t)targets[i], 0);
			io_uring_sqe_set_data(sqe, &s->w_cancel);
			s->armed++;
		}
	}
	/* Releasing waits for the worker to hand back our ring (attends write into our arena
	 * and into blocks this client holds) and for our copies. */
	if (!s->inflight)
		session_release(d, s);
}

int session_maybe_free(struct pkv_daemon *d, struct session *s)
{
	if (!s->closing)
		return 0;
	if (!s->released && !s->inflight)
		session_release(d, s);
	if (!s->released || s->armed)
		return 0;
	pkv_dbg("client %u: freed (fd %d)", s->id, s->sock);
	flush_sqes(d);
	close(s->sock);
	if (s->prev)
		s->prev->next = s->next;
	else
		d->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	d->n_sessions--;
	pthread_spin_destroy(&s->cq_lock);
	free(s);
	return 1;
}
