/* SPDX-License-Identifier: MIT */
/* Sessions: the hello/attach handshake, SQE execution, completions, and release on hang-up. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <linux/magic.h>
#include <linux/sockios.h>
#include <unistd.h>
#include "common/log.h"
#include "common/msg.h"
#include "common/region.h"
#include "daemon/daemon.h"
#include "daemon/sigbus.h"
#include "daemon/tier_glue.h"
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
	s->bus_slot = -1;
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

/* The acceptor counted s among its uid's connections before their hello: no longer (once). */
static void session_hello_counted(struct pkv_daemon *d, struct session *s)
{
	if (!s->unauth_counted)
		return;
	s->unauth_counted = 0;
	acceptor_hello_done(d, s->uid);
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

int64_t session_cq_space(struct session *s)
{
	int64_t space;

	pthread_spin_lock(&s->cq_lock);
	space = pkv_ring_space(&s->cq);
	pthread_spin_unlock(&s->cq_lock);
	return space;
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

/*
 * Kept sorted by sequence id: a step's end looks up each of its sequences
 * (on the worker, between other clients' attends) in O(log n).
 */
static uint32_t seq_pos(const struct session *s, uint32_t seq)
{
	uint32_t lo = 0, hi = s->n_seqs;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (s->seqs[mid].seq < seq)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static struct seq_ent *seq_find(struct session *s, uint32_t seq)
{
	uint32_t i = seq_pos(s, seq);

	return i < s->n_seqs && s->seqs[i].seq == seq ? &s->seqs[i] : NULL;
}

static int seq_add(struct session *s, uint32_t seq, uint32_t len)
{
	uint32_t i;

	if (s->n_seqs == s->cap_seqs) {
		uint32_t c = s->cap_seqs ? s->cap_seqs * 2 : 16;
		struct seq_ent *n = realloc(s->seqs, c * sizeof(*n));

		if (!n)
			return -ENOMEM;
		s->seqs = n;
		s->cap_seqs = c;
	}
	i = seq_pos(s, seq);
	memmove(&s->seqs[i + 1], &s->seqs[i], (size_t)(s->n_seqs - i) * sizeof(*s->seqs));
	s->seqs[i] = (struct seq_ent){ seq, len };
	s->n_seqs++;
	return 0;
}

static void seq_del(struct session *s, uint32_t seq)
{
	struct seq_ent *e = seq_find(s, seq);

	if (e) {
		s->n_seqs--;
		memmove(e, e + 1, (size_t)(&s->seqs[s->n_seqs] - e) * sizeof(*e));
	}
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

/*
 * Whether the daemon can read this file's pages without a fault: only shmem
 * (a memfd) qualifies. hugetlbfs is sealable too, but a punched hole in it
 * needs a fresh huge page at the next touch, and with the pool exhausted
 * that touch is a SIGBUS in the daemon; any other filesystem can fail a
 * page-in (I/O error, a file truncated behind the seals' back).
 */
static int memfd_fs_ok(int fd, char *why, size_t why_len)
{
	struct statfs sf;

	if (fstatfs(fd, &sf) < 0) {
		snprintf(why, why_len, "hello: cannot inspect the region descriptor: %s", strerror(errno));
		return 0;
	}
	if ((unsigned long)sf.f_type == (unsigned long)TMPFS_MAGIC)
		return 1;
	if ((unsigned long)sf.f_type == (unsigned long)HUGETLBFS_MAGIC)
		snprintf(why, why_len, "hello: the region is on hugetlbfs (MFD_HUGETLB); the daemon maps "
			 "only shmem memfds, since a hugetlbfs page can fail to come back and fault the reader");
	else
		snprintf(why, why_len, "hello: the region is on filesystem 0x%lx, not shmem; pass a "
			 "memfd_create() descriptor", (unsigned long)sf.f_type);
	return 0;
}

/* Maps and checks a client's region; takes ownership of fds on success. */
static int client_hello(struct pkv_daemon *d, struct session *s, const struct pkv_msg_hello *m,
			int *fds, int nfds, char *why, size_t why_len)
{
	struct stat st;
	int seals, r, slot;
	void *map;

	if (nfds != 2) {
		snprintf(why, why_len, "hello: expected 2 descriptors (memfd, submission eventfd), got %d", nfds);
		return -EINVAL;
	}
	if (fstat(fds[0], &st) < 0 || !S_ISREG(st.st_mode)) {
		snprintf(why, why_len, "hello: the region descriptor is not a memfd");
		return -EINVAL;
	}
	if (!memfd_fs_ok(fds[0], why, why_len))
		return -EINVAL;
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
	/* Watched before the first read: even the header copy below may fault. */
	slot = pkv_sigbus_watch(map, st.st_size);
	if (slot < 0) {
		munmap(map, st.st_size);
		snprintf(why, why_len, "hello: out of memory");
		return -ENOMEM;
	}
	/* One copy of the header; the client may rewrite its own copy at will. */
	memcpy(&s->hdr, map, sizeof(s->hdr));
	r = pkv_sigbus_faulted(slot) ? -EFAULT : pkv_region_check(&s->hdr, st.st_size, why, why_len);
	if (r) {
		if (r == -EFAULT)
			snprintf(why, why_len, "hello: reading the region faulted (SIGBUS)");
		pkv_sigbus_unwatch(slot);
		munmap(map, st.st_size);
		return r;
	}
	s->bus_slot = slot;
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
	return 0;
}

static void reply(struct pkv_daemon *d, struct session *s, int status, uint64_t value, const char *text)
{
	int r = pkv_send_reply(s->sock, status, value, 0, text, text ? strlen(text) : 0);

	if (r)
		session_hangup(d, s);
}

/* The file name of a plugin the daemon loaded (its directory is the client's own business). */
static void plugin_file(const struct pkv_plugin *pl, char *file, char *backend)
{
	const char *slash = strrchr(pl->path, '/'), *name = slash ? slash + 1 : pl->path;
	size_t n = strlen(name), nb = strlen(pl->be->name);

	/* A longer name arrives empty: the client then refuses to guess and attends through us. */
	if (n < PKV_NAME_MAX)
		memcpy(file, name, n + 1);
	if (nb < PKV_NAME_MAX)
		memcpy(backend, pl->be->name, nb + 1);
}

/*
 * The attach reply of a pool whose clients attend themselves: its KV memory
 * (only ever this uid's: the pool is private, DESIGN §8) and which backends
 * to load over it.
 */
static void reply_pool_mem(struct pkv_daemon *d, struct session *s, const struct pool *p)
{
	struct pkv_wire_pool_mem w;

	memset(&w, 0, sizeof(w));
	plugin_file(&d->plug_varlen, w.varlen_file, w.varlen_backend);
	plugin_file(d->same_plugin ? &d->plug_varlen : &d->plug_decode, w.decode_file, w.decode_backend);
	if (pkv_send_reply_fd(s->sock, 0, p->shared_len, PKV_REPLY_POOL_MEM, &w, sizeof(w), p->shared_fd))
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
	r = pool_attach(d, m, s->uid, &p, why, sizeof(why));
	if (r) {
		pkv_info("client %u (uid %u, pid %d): attach '%s' refused: %s", s->id, (unsigned)s->uid, (int)s->pid, m->name, why);
		reply(d, s, r, 0, why);
		return;
	}
	/* The limits that hold are set before every call that may grow (tenant_limit). */
	pool_lock(p);
	r = pkv_cache_set_owner_limits(p->cache, s->id, d->cfg.client_max_seqs, 0);
	if (r) {
		pool_unlock(p);
		reply(d, s, r, 0, "cannot set this client's quotas");
		pool_left(d, p);
		return;
	}
	s->pool = p;
	p->n_clients++;
	r = tenant_attach(d, s);
	if (r) {
		pkv_cache_release_owner(p->cache, s->id);
		pool_unlock(p);
		s->pool = NULL;
		p->n_clients--;
		pool_left(d, p);
		reply(d, s, r, 0, "cannot account this client's uid");
		return;
	}
	pool_unlock(p);
	/* Sharing scope comes from the kernel's view of the peer, never from the message. */
	s->ns = pkv_namespace(m->model_id, &m->geo,
			      (p->flags & PKV_WIRE_POOL_SHARED) ? PKV_NS_SHARED : (uint32_t)s->uid,
			      m->salt, m->salt_len);
	if (p->shared_fd >= 0) {
		reply_pool_mem(d, s, p);
		return;
	}
	reply(d, s, 0, 0, NULL);
}

static void handle_ctl(struct pkv_daemon *d, struct session *s, const struct pkv_msg_ctl *m)
{
	char *out = NULL;
	size_t len = 0;
	int status, queued = 0;

	/*
	 * One reply in flight per connection: a peer that asks again and again
	 * without reading would otherwise pile up outputs (memfds) the daemon
	 * pays for.
	 */
	if (ioctl(s->sock, SIOCOUTQ, &queued) == 0 && queued > 0) {
		pkv_info("client %u (pid %d): control command before reading the last reply; closing",
			 s->id, (int)s->pid);
		session_hangup(d, s);
		return;
	}
	status = ctl_run(d, s, m->cmd, m->format, &out, &len);
	if (pkv_send_output(s->sock, status, out, len))
		session_hangup(d, s);
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
		pkv_info("client %u (uid %u, pid %d): refused: %s", s->id, (unsigned)s->uid, (int)s->pid, why);
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
			pkv_info("client %u (uid %u, pid %d): refused: %s", s->id, (unsigned)s->uid, (int)s->pid, why);
			reply(d, s, -EUSERS, 0, why);
			session_hangup(d, s);
			return;
		}
		r = tenant_hello(d, s, u.hello.role == PKV_ROLE_CLIENT ? u.hello.region_size : 0,
				 why, sizeof(why));
		if (r) {
			close_fds(fds, nfds);
			pkv_info("client %u (pid %d): refused: %s", s->id, (int)s->pid, why);
			reply(d, s, r, 0, why);
			session_hangup(d, s);
			return;
		}
		if (u.hello.role == PKV_ROLE_CLIENT) {
			r = client_hello(d, s, &u.hello, fds, nfds, why, sizeof(why));
			if (r) {
				close_fds(fds, nfds);
				pkv_info("client %u (uid %u, pid %d): hello refused: %s", s->id, (unsigned)s->uid, (int)s->pid, why);
				reply(d, s, r, 0, why);
				session_hangup(d, s);
				return;
			}
			s->role = PKV_ROLE_CLIENT;
			session_hello_counted(d, s);
			loop_arm_session(d, s);
		} else {
			if (nfds) {
				close_fds(fds, nfds);
				reply(d, s, -EINVAL, 0, "a control connection passes no descriptors");
				session_hangup(d, s);
				return;
			}
			s->role = PKV_ROLE_CTL;
			session_hello_counted(d, s);
			s->admin = ctl_peer_is_admin(d, s->sock, s->uid);
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
	s->step_units = 0;
	free(s->step_reqs);
	free(s->step_tokens);
	s->step_reqs = NULL;
	s->step_tokens = NULL;
	s->n_step_reqs = 0;
}

/* Says why the cache refused: a limit of this connection or its uid, or the pool itself. */
static void explain(struct pkv_daemon *d, struct session *s, const char *what, int r)
{
	struct pkv_owner_usage u;

	if (r == -ENOSPC) {
		pkv_cache_owner_usage(s->pool->cache, s->id, &u);
		/* A step opens no sequence: its refusal is about blocks (and the uid's
		 * sequence count is the loop's, not to be read on the worker). */
		if (u.max_seqs && u.seqs >= u.max_seqs && strcmp(what, "step")) {
			session_set_err(s, "%s: this connection is at its quota of %u sequences "
					"(client_max_seqs %u; uid_max_seqs %u, %u held by the uid)", what, u.seqs,
					d->cfg.client_max_seqs, d->cfg.uid_max_seqs, s->tenant ? s->tenant->seqs : 0);
			return;
		}
		if (u.max_blocks) {
			session_set_err(s, "%s: out of blocks, or over the block quota of uid %u in pool '%s' "
					"(%llu of %llu blocks held, uid_block_share %u%%)", what, (unsigned)s->uid,
					s->pool->name, (unsigned long long)(s->tp ? s->tp->blocks : 0),
					(unsigned long long)tenant_block_limit(d, s->pool), d->cfg.uid_block_share);
			return;
		}
		/* The cap every connection has (forks count each reference), once near it. */
		if ((uint64_t)u.blocks + u.pin_blocks >= u.block_cap / 2) {
			session_set_err(s, "%s: out of blocks, or over this connection's cap of %u block "
					"references (%u held, %u pinned)", what, u.block_cap, u.blocks, u.pin_blocks);
			return;
		}
		session_set_err(s, "%s: the pool is out of blocks", what);
		return;
	}
	if (r == -E2BIG) {
		session_set_err(s, "%s: its block table (sequences x the longest one's blocks) exceeds %u entries",
				what, PKV_MAX_STEP_TABLE);
		return;
	}
	if (r == -EAGAIN) {
		session_set_err(s, "%s: sequence %u shares a prefix another sequence is still computing; "
				"step it later", what, pkv_cache_blocked_seq(s->pool->cache, NULL));
		return;
	}
	if (r == -ESTALE) {
		session_set_err(s, "%s: sequence %u was cut back: the prefix it shared was withdrawn "
				"by its producer; resume from its length", what,
				pkv_cache_blocked_seq(s->pool->cache, NULL));
		return;
	}
	session_set_err(s, "%s: %s", what, strerror(-r));
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * A step its client attends itself (PKV_SQE_STEP_TABLES): the tables go to
 * the client's arena, and every layer counts as attended. What the step's
 * slots then hold is the client's own doing, in a pool that only its uid's
 * processes read (validate.c refuses client attention in a shared pool), so
 * the commit rule protects nobody else there. -ENOBUFS, *p0 = the bytes
 * needed, when they do not fit; the caller then aborts the step.
 */
static int give_step_tables(struct session *s, const struct pkv_sqe *e, uint64_t *p0)
{
	const struct pkv_step_meta *m = &s->meta;
	struct pkv_wire_step h = { m->num_seqs, m->total_q, m->max_length_q, m->max_length_k,
				   m->max_blocks_per_seq, 0 };
	struct pkv_wire_step_offs o;
	uint64_t need = pkv_wire_step_layout(m->num_seqs, m->max_blocks_per_seq, m->total_q, &o);
	uint8_t *dst = s->arena + e->off[3];

	if (!need || need > e->aux) {
		*p0 = need;
		session_set_err(s, "step tables need %llu bytes, %llu given", (unsigned long long)need,
				(unsigned long long)e->aux);
		return -ENOBUFS;
	}
	memcpy(dst, &h, sizeof(h));
	memcpy(dst + o.cu_q, m->cu_seq_lens_q, 4 * ((size_t)m->num_seqs + 1));
	memcpy(dst + o.cu_k, m->cu_seq_lens_k, 4 * ((size_t)m->num_seqs + 1));
	memcpy(dst + o.seqlens, m->cache_seqlens, 4 * (size_t)m->num_seqs);
	memcpy(dst + o.tables, m->block_tables, 4 * (size_t)m->num_seqs * m->max_blocks_per_seq);
	memcpy(dst + o.slots, m->slot_mapping, 8 * (size_t)m->total_q);
	for (uint32_t l = 0; l < s->pool->geo.num_layers; l++)
		pkv_cache_step_layer_done(s->step, l);
	return 0;
}

static int op_step_begin(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
			 uint64_t *p0, uint64_t *p1)
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
	if ((e->flags & PKV_SQE_STEP_TABLES) && !(s->pool->flags & PKV_WIRE_POOL_CLIENT_ATTN)) {
		session_set_err(s, "step tables: pool '%s' was not created for client attention", s->pool->name);
		return -EINVAL;
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
	/* Too long for the thread asking (session_exec's max_step): nothing has changed yet. */
	if (s->exec_max_step && total > s->exec_max_step) {
		r = SESSION_NOT_HERE;
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
		/*
		 * Which sequence waits on a prefix in flight, or was cut back, and
		 * whether this connection itself computes what it waits for (then
		 * waiting cannot help: the client must step that sequence first).
		 */
		if (r == -EAGAIN || r == -ESTALE) {
			uint32_t by;

			*p0 = pkv_cache_blocked_seq(s->pool->cache, &by);
			*p1 = r == -EAGAIN && by == s->id;
		}
		goto out;
	}
	s->step_reqs = reqs;
	s->n_step_reqs = e->n;
	s->step_tokens = tokens;
	s->step_units = worker_attend_units(s->pool, &s->meta);
	reqs = NULL;
	tokens = NULL;
	if (e->flags & PKV_SQE_STEP_TABLES) {
		r = give_step_tables(s, e, p0);
		if (r) {
			pkv_cache_step_abort(s->pool->cache, s->step);
			step_clear(s);
			goto out;
		}
	}
	s->pool->steps++;
	r = 0;
out:
	free(seqs);
	free(n_new);
	free(reqs);
	free(tokens);
	return r;
}

/*
 * A step the loop began: its copy-on-write goes to the worker's queue, which
 * runs it before it takes any attend of the session (the ring is handed over
 * after it). A client that attends itself (PKV_SQE_STEP_TABLES) sends no
 * attends to order: its begin completes only when the copies are done
 * (loop.c process_done), and this returns SESSION_LATER. Called with the
 * pool's lock held.
 */
static int queue_copies(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e, uint64_t p0,
			uint64_t p1)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j) {
		pkv_cache_step_abort(s->pool->cache, s->step);
		step_clear(s);
		session_set_err(s, "step: out of memory");
		return -ENOMEM;
	}
	j->kind = JOB_COPY;
	j->pool = s->pool;
	j->s = s;
	j->copies = s->meta.copies;
	j->n_copies = s->meta.num_copies;
	s->inflight++; /* copies must finish before a commit or abort */
	/* A client attending itself starts on the step's slots at the begin's completion: after the copies. */
	j->post_begin = (e->flags & PKV_SQE_STEP_TABLES) != 0;
	j->begin_ud = e->user_data;
	j->begin_p0 = p0;
	j->begin_p1 = p1;
	worker_push(d, j);
	return j->post_begin ? SESSION_LATER : 0;
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

/* Tokens of an open or pin worth reading: one past the longest match, so an open still computes its last token. */
static uint32_t walk_tokens(uint32_t n)
{
	return n <= PKV_MAX_OPEN_WALK_TOKENS ? n : PKV_MAX_OPEN_WALK_TOKENS + 1;
}

/* Prefix blocks an open may walk in one turn: PKV_SWEEP_WORK_TOKENS worth. */
static uint32_t turn_blocks(const struct pkv_cache *c)
{
	uint32_t n = PKV_SWEEP_WORK_TOKENS / pkv_cache_geometry(c)->block_size;

	return n ? n : 1;
}

/*
 * Opens the sequence: the completion's result (payload in p0, p1), or
 * SESSION_LATER when its walk goes on over the next turns (open_continue).
 * Takes tok.
 */
static int open_begin(struct pkv_daemon *d, struct session *s, int32_t *tok, uint32_t n, uint32_t flags,
		      uint32_t lookup, uint64_t ud, uint64_t *p0, uint64_t *p1)
{
	struct pkv_cache *c = s->pool->cache;
	uint32_t seq, n_cached;
	int r;

	r = pkv_cache_seq_open_partial(c, s->id, s->ns, tok, n,
				       flags & PKV_SQE_OPEN_SETTLED ? PKV_OPEN_SETTLED : 0,
				       turn_blocks(c), &seq, &n_cached);
	if (r < 0) {
		free(tok);
		explain(d, s, "open", r);
		return r;
	}
	if (seq_add(s, seq, n_cached)) {
		free(tok);
		pkv_cache_seq_close(c, s->id, seq);
		return -ENOMEM;
	}
	/* This connection's own lookups: STATS reports them, never the pool's. */
	s->lookup_tokens += lookup;
	if (r == 1) {
		/* The walk goes on over the next turns (open_continue); the completion waits. */
		s->open_tokens = tok;
		s->open_n = n;
		s->open_seq = seq;
		s->open_ud = ud;
		return SESSION_LATER;
	}
	free(tok);
	s->hit_tokens += n_cached;
	*p0 = seq;
	*p1 = n_cached;
	return 0;
}

/*
 * Walks one more turn of the pending open; returns 1 when it completed (its
 * completion posted), 0 when it goes on at the next turn.
 */
static int open_continue(struct pkv_daemon *d, struct session *s)
{
	struct pkv_cache *c = s->pool->cache;
	struct seq_ent *se;
	uint32_t nc = 0;
	int r, limited;

	if (s->open_fetch) {
		/* Its disk reads are in (or timed out): the open begins now. */
		uint64_t p0 = 0, p1 = 0;
		int32_t *tok = s->open_tokens;

		tier_glue_fetch_release(d, s);
		s->open_tokens = NULL;
		pool_lock(s->pool);
		/* The uid's other connections may have spent its headroom while this open was parked. */
		r = tenant_limit(d, s, PKV_OP_SEQ_OPEN);
		if (r)
			free(tok);
		else
			r = open_begin(d, s, tok, s->open_n, s->open_flags, s->open_lookup, s->open_ud, &p0, &p1);
		tenant_sync(d, s);
		pool_unlock(s->pool);
		if (r == SESSION_LATER)
			return 0;
		if (r < 0)
			s->errors++;
		if (session_post(s, s->open_ud, r, p0, p1)) {
			pkv_warn("client %u (pid %d): completion ring corrupted or overrun; disconnecting",
				 s->id, (int)s->pid);
			session_hangup(d, s);
		}
		return 1;
	}

	/* One turn of the walk under the pool's lock (the worker, finding it held, hands step boundaries back). */
	pool_lock(s->pool);
	/*
	 * Each turn takes blocks against what the uid has left now, not when the
	 * open arrived: its other connections spend the same share meanwhile.
	 * (STEP_BEGIN's limit: blocks only, the sequence exists already.)
	 */
	limited = tenant_limit(d, s, PKV_OP_STEP_BEGIN);   /* sets its own reason */
	r = limited ? limited
		    : pkv_cache_seq_open_more(c, s->id, s->open_seq, s->open_tokens, s->open_n, turn_blocks(c), &nc);
	if (r < 0)
		pkv_cache_seq_close(c, s->id, s->open_seq);
	tenant_sync(d, s);   /* the walk took (or gave back) blocks of this uid */
	pool_unlock(s->pool);
	if (r == 1)
		return 0;
	if (r < 0) {
		if (!limited)
			session_set_err(s, "open: %s", strerror(-r));
		seq_del(s, s->open_seq);
		s->errors++;
	} else if ((se = seq_find(s, s->open_seq))) {
		se->len = nc;
		s->hit_tokens += nc;
	}
	free(s->open_tokens);
	s->open_tokens = NULL;
	if (session_post(s, s->open_ud, r, r < 0 ? 0 : s->open_seq, nc)) {
		pkv_warn("client %u (pid %d): completion ring corrupted or overrun; disconnecting",
			 s->id, (int)s->pid);
		session_hangup(d, s);
	}
	return 1;
}

/* Loop-thread work of one SQE, in tokens read or hashed, for the per-sweep budget. */
static uint64_t sqe_work(const struct session *s, const struct pkv_sqe *e)
{
	switch (e->opcode) {
	case PKV_OP_SEQ_OPEN:
		return PKV_SWEEP_WORK_TOKENS;   /* at most one turn of walk; the rest waits */
	case PKV_OP_PIN:
	case PKV_OP_UNPIN:
		return walk_tokens(e->n);
	case PKV_OP_STEP_BEGIN:
		return s->step ? s->meta.total_q + s->meta.num_seqs : e->n;
	default:
		return 1;
	}
}

/*
 * One handler per opcode, reached through op_defs below (the shape of Linux
 * io_uring/opdef.c): each returns the completion's result (0, a count, or
 * -errno with the reason already set) and fills the payload, or 1 when the
 * completion is posted later by someone else.
 */
typedef int (*op_fn)(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
		     uint64_t *p0, uint64_t *p1);

static int op_nop(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
		  uint64_t *p0, uint64_t *p1)
{
	(void)d, (void)s, (void)e, (void)p0, (void)p1;
	return 0;
}

static int op_seq_open(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
		       uint64_t *p0, uint64_t *p1)
{
	uint32_t n = walk_tokens(e->n);
	int32_t *tok;

	/* Only the tokens the prefix walk can match (PKV_MAX_OPEN_WALK_TOKENS) are read. */
	tok = copy_out(s, e->off[0], n);
	if (!tok)
		return -ENOMEM;
	/*
	 * Blocks of this prompt that only the disk tier holds come back into the
	 * pool first. The open is parked meanwhile (session_process skips this
	 * session, the loop serves the others) and begins once they are in.
	 */
	if (tier_glue_fetch_start(d, s, tok, n)) {
		s->open_tokens = tok;
		s->open_n = n;
		s->open_ud = e->user_data;
		s->open_flags = e->flags;
		s->open_lookup = e->n;
		return SESSION_LATER;
	}
	return open_begin(d, s, tok, n, e->flags, e->n, e->user_data, p0, p1);
}

static int op_seq_fork(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
		       uint64_t *p0, uint64_t *p1)
{
	struct pkv_cache *c = s->pool->cache;
	struct seq_ent *se = seq_find(s, e->seq);
	uint32_t seq;
	int64_t len;
	int r;

	(void)p1;
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

static int op_seq_truncate(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
			   uint64_t *p0, uint64_t *p1)
{
	struct seq_ent *se;
	int r;

	(void)d, (void)p0, (void)p1;
	r = pkv_cache_seq_truncate(s->pool->cache, s->id, e->seq, e->n);
	if (r) {
		session_set_err(s, "truncate of sequence %u to %u: %s", e->seq, e->n, strerror(-r));
		return r;
	}
	if ((se = seq_find(s, e->seq)))
		se->len = e->n < se->len ? e->n : se->len;
	return 0;
}

static int op_seq_close(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
			uint64_t *p0, uint64_t *p1)
{
	int r;

	(void)d, (void)p0, (void)p1;
	r = pkv_cache_seq_close(s->pool->cache, s->id, e->seq);
	if (r) {
		session_set_err(s, "close of sequence %u: %s", e->seq, strerror(-r));
		return r;
	}
	seq_del(s, e->seq);
	return 0;
}

/* Attends in a step run on the worker (session_process hands the ring over); one that passed validation had a step. */
static int op_attend(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
		     uint64_t *p0, uint64_t *p1)
{
	(void)d, (void)e, (void)p0, (void)p1;
	session_set_err(s, "attend reached the loop thread");
	return -EPROTO;
}

static int op_step_end(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
		       uint64_t *p0, uint64_t *p1)
{
	struct pkv_cache *c = s->pool->cache;
	struct seq_ent *se;
	int r;

	(void)d, (void)e, (void)p0, (void)p1;
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
	{
		/* Unattended slots hold the blocks' previous K/V (maybe another uid's): never commit them. */
		char miss[160];

		if (pkv_cache_step_missing_layers(c, s->step, miss, sizeof(miss))) {
			pkv_cache_step_abort(c, s->step);
			step_clear(s);
			session_set_err(s, "step_end: layers %s not attended; the step was aborted, nothing committed",
					miss);
			return -EINVAL;
		}
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
}

static int op_step_abort(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
			 uint64_t *p0, uint64_t *p1)
{
	(void)d, (void)e, (void)p0, (void)p1;
	if (!s->step) {
		session_set_err(s, "no open step");
		return -EINVAL;
	}
	pkv_cache_step_abort(s->pool->cache, s->step);
	step_clear(s);
	return 0;
}

/* PIN and UNPIN: the same arguments, the opposite call. */
static int op_pin(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
		  uint64_t *p0, uint64_t *p1)
{
	struct pkv_cache *c = s->pool->cache;
	int pin = e->opcode == PKV_OP_PIN;
	int32_t *tok;
	int r;

	(void)d, (void)p0, (void)p1;
	tok = copy_out(s, e->off[0], walk_tokens(e->n));
	if (!tok)
		return -ENOMEM;
	r = pin ? pkv_prefix_pin(c, s->id, s->ns, tok, walk_tokens(e->n))
		: pkv_prefix_unpin(c, s->id, s->ns, tok, walk_tokens(e->n));
	free(tok);
	/* Each pin that pinned blocks, and each unpin, adds or drops one pin record (uid_max_pins). */
	if ((pin ? r > 0 : r >= 0) && s->tenant && (pin || s->pins)) {
		s->pins += pin ? 1 : -1;
		s->tenant->pins += pin ? 1 : -1;
	}
	if (r < 0)
		session_set_err(s, "%s: %s", pin ? "pin" : "unpin", strerror(-r));
	return r;
}

static int op_stats(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
		    uint64_t *p0, uint64_t *p1)
{
	struct pkv_cache_stats cs;
	struct pkv_wire_stats w = { 0 };

	(void)d, (void)p0, (void)p1;
	pkv_cache_stats(s->pool->cache, &cs);
	w.num_blocks = cs.num_blocks;
	w.free_blocks = cs.free_blocks;
	w.cached_blocks = cs.cached_blocks;
	w.in_use_blocks = cs.in_use_blocks;
	w.open_seqs = s->n_seqs;
	/* The pool's counters would tell this client about other users' prompts (issue 9, class 2). */
	w.prefix_lookup_tokens = s->lookup_tokens;
	w.prefix_hit_tokens = s->hit_tokens;
	memcpy(s->arena + e->off[0], &w, sizeof(w));
	return 0;
}

/*
 * Every opcode once: its name (for logs and errors), its handler, and
 * whether it runs on the worker thread (in an open step, session_process
 * hands the ring over at the first such SQE instead of executing it).
 */
static const struct op_def {
	const char *name;
	op_fn exec;
	unsigned on_worker : 1;
} op_defs[] = {
	[PKV_OP_NOP] = { "nop", op_nop, 0 },
	[PKV_OP_SEQ_OPEN] = { "seq_open", op_seq_open, 0 },
	[PKV_OP_SEQ_FORK] = { "seq_fork", op_seq_fork, 0 },
	[PKV_OP_SEQ_TRUNCATE] = { "seq_truncate", op_seq_truncate, 0 },
	[PKV_OP_SEQ_CLOSE] = { "seq_close", op_seq_close, 0 },
	[PKV_OP_STEP_BEGIN] = { "step_begin", op_step_begin, 0 },
	[PKV_OP_ATTEND] = { "attend", op_attend, 1 },
	[PKV_OP_STEP_END] = { "step_end", op_step_end, 0 },
	[PKV_OP_STEP_ABORT] = { "step_abort", op_step_abort, 0 },
	[PKV_OP_PIN] = { "pin", op_pin, 0 },
	[PKV_OP_UNPIN] = { "unpin", op_pin, 0 },
	[PKV_OP_STATS] = { "stats", op_stats, 0 },
};
_Static_assert(sizeof(op_defs) / sizeof(op_defs[0]) == PKV_OP_COUNT,
	       "every opcode in proto.h needs an entry in op_defs");

/* The opcode's definition, or NULL for one the protocol does not have (the SQE is untrusted). */
static const struct op_def *op_def(uint8_t opcode)
{
	return opcode < PKV_OP_COUNT && op_defs[opcode].exec ? &op_defs[opcode] : NULL;
}

/* Executes one validated SQE; returns its result, or 1 when it completes asynchronously. */
static int exec_sqe(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e,
		    uint64_t *p0, uint64_t *p1)
{
	const struct op_def *op = op_def(e->opcode);

	if (!op) {
		session_set_err(s, "unknown opcode %u", e->opcode);
		return -EINVAL;
	}
	return op->exec(d, s, e, p0, p1);
}

int session_exec(struct pkv_daemon *d, struct session *s, const struct pkv_sqe *e, uint32_t max_step,
		 uint64_t *p0, uint64_t *p1)
{
	struct sqe_limits lim;
	char why[PKV_ERR_LEN];
	int r;

	/* A step's commit or abort costs in proportion to its tokens, as its begin does. */
	if (max_step && (e->opcode == PKV_OP_STEP_END || e->opcode == PKV_OP_STEP_ABORT) && s->step &&
	    s->meta.total_q > max_step)
		return SESSION_NOT_HERE;
	if (max_step && e->opcode == PKV_OP_STEP_BEGIN && e->n > max_step)
		return SESSION_NOT_HERE;  /* one token per sequence at least */
	memset(&lim, 0, sizeof(lim));
	lim.arena_size = s->arena_size;
	lim.geo = s->pool ? &s->pool->geo : NULL;
	lim.act_size = s->pool ? pkv_dtype_size(s->pool->act_dtype) : 1;
	lim.step_total_q = s->step ? s->meta.total_q : 0;
	why[0] = 0;
	r = pkv_sqe_check(e, &lim, why, sizeof(why));
	if (r) {
		session_set_err(s, "%s", why);
		return r;
	}
	r = tenant_limit(d, s, e->opcode);
	if (r)
		return r;
	s->exec_max_step = max_step;
	r = exec_sqe(d, s, e, p0, p1);
	s->exec_max_step = 0;
	tenant_sync(d, s);
	return r;
}

int session_step_on_worker(const struct session *s, const struct pkv_sqe *e)
{
	switch (e->opcode) {
	case PKV_OP_STEP_END:
	case PKV_OP_STEP_ABORT:
		return 1;
	case PKV_OP_STEP_BEGIN:
		/* A begin may evict, and a pool's eviction hook (its disk tier) is the loop's to call. */
		return !s->pool->tier;
	default:
		return 0;
	}
}

int session_faulted(struct pkv_daemon *d, struct session *s)
{
	if (s->closing || !pkv_sigbus_faulted(s->bus_slot))
		return 0;
	/* The handler already swapped the mapping for zero pages; nothing reads the client's memory now. */
	pkv_warn("client %u (pid %d, uid %u): its shared memory faulted (SIGBUS); disconnecting",
		 s->id, (int)s->pid, (unsigned)s->uid);
	/* Its error text lives in that memory, so the reason goes on the control socket (best effort). */
	{
		static const char msg[] = "reading this connection's shared region faulted (SIGBUS: a page "
					  "could not be brought in); the connection is closed";

		pkv_send_reply(s->sock, -EFAULT, 0, 0, msg, sizeof(msg) - 1);
	}
	session_hangup(d, s);
	return 1;
}

int session_process(struct pkv_daemon *d, struct session *s)
{
	uint64_t work = 0;
	int done = 0;

	if (session_faulted(d, s))
		return 0;
	if (s->closing || !s->region || s->worker_owned)
		return 0;
	/* A pending open takes this turn first; the SQEs after it wait for its completion. */
	if (s->open_tokens) {
		/* Parked on the disk tier: no work here until the tier thread wakes the loop. */
		if (s->open_fetch) {
			int ready;

			pool_lock(s->pool);   /* the fetched blocks are adopted into the cache */
			ready = tier_glue_fetch_ready(d, s, s->open_tokens);
			pool_unlock(s->pool);
			if (!ready)
				return 0;
		}
		if (!open_continue(d, s))
			return 1;
	}
	/* The client spins without yielding only while we poll from another CPU. */
	pkv_ring_set_cpu(&s->sq, d->cpu1);
	/* A turn ends after PKV_SWEEP_WORK_TOKENS of work too: other clients wait while we run. */
	while (done < SQES_PER_SWEEP && work < PKV_SWEEP_WORK_TOKENS) {
		const struct op_def *op;
		struct pkv_sqe e;
		uint64_t p0 = 0, p1 = 0;
		int64_t avail = pkv_ring_avail(&s->sq), space;
		int r;

		if (avail == 0)
			break;
		space = session_cq_space(s);
		if (avail < 0 || space < 0) {
			pkv_warn("client %u (uid %u, pid %d): ring indices corrupted; disconnecting", s->id, (unsigned)s->uid, (int)s->pid);
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
		op = op_def(e.opcode);
		if (op && op->on_worker && s->step) {
			hand_to_worker(d, s);
			break;
		}
		/*
		 * A client that attends itself sends no attends: its steps' ends and
		 * begins go to the worker instead, which keeps the ring between them
		 * as it does between a step's attends (and spins through the gap
		 * while a core idles) rather than the loop waking for each.
		 */
		if (e.opcode == PKV_OP_STEP_END && s->step && (s->pool->flags & PKV_WIRE_POOL_CLIENT_ATTN) &&
		    !s->inflight && s->meta.total_q <= WORKER_STEP_TOKENS && e.user_data != s->end_handed) {
			/* Once per end: the worker hands it back when the pool's lock is busy, then it runs here. */
			s->end_handed = e.user_data;
			hand_to_worker(d, s);
			break;
		}
		/* Anything but an attend waits for the attends before it (ordering). */
		if (!(op && op->on_worker) && s->inflight)
			break;
		pkv_ring_consume(&s->sq);
		done++;
		s->ops++;
		/* One SQE under the pool's lock (the worker, finding it held, hands step boundaries back). */
		if (s->pool)
			pool_lock(s->pool);
		r = session_exec(d, s, &e, 0, &p0, &p1);
		if (!r && e.opcode == PKV_OP_STEP_BEGIN && s->meta.num_copies)
			r = queue_copies(d, s, &e, p0, p1);
		if (s->pool)
			pool_unlock(s->pool);
		/* A fault while executing it (arena reads): the rings are zeros now, nothing to post. */
		if (session_faulted(d, s))
			break;
		work += sqe_work(s, &e);
		if (r == SESSION_LATER) {
			if (s->open_tokens)
				break;   /* a long open: its walk goes on next turn */
			continue;
		}
		if (r < 0)
			s->errors++;
		if (session_post(s, e.user_data, r, p0, p1)) {
			pkv_warn("client %u (uid %u, pid %d): completion ring corrupted or overrun; disconnecting",
				 s->id, (unsigned)s->uid, (int)s->pid);
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
		pool_lock(s->pool);
		if (s->step)
			pkv_cache_step_abort(s->pool->cache, s->step);
		step_clear(s);
		pkv_cache_release_owner(s->pool->cache, s->id);
		tenant_sync(d, s);
		tenant_leave(d, s);
		pool_unlock(s->pool);
		s->pool->n_clients--;
		pool_left(d, s->pool);
		s->pool = NULL;
	}
	tenant_leave(d, s);
	tier_glue_fetch_release(d, s);   /* a parked open's reads finish unseen */
	free(s->open_tokens);   /* its sequence went with the owner's */
	s->open_tokens = NULL;
	free(s->seqs);
	s->seqs = NULL;
	s->n_seqs = 0;
	/* Unwatched first: once unmapped, the addresses may be reused by anything. */
	pkv_sigbus_unwatch(s->bus_slot);
	s->bus_slot = -1;
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
	pkv_dbg("client %u (uid %u, pid %d): hung up", s->id, (unsigned)s->uid, (int)s->pid);
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
	 * and into blocks this client holds) and for our copies; it may sleep holding it. */
	if (s->worker_owned)
		worker_kick(d);
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
	session_hello_counted(d, s); /* gone before its hello */
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
