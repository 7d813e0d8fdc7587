/* SPDX-License-Identifier: MIT */
/* libpagedkv: connection setup, the shared region, and every request as an SQE/CQE round trip. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "client/arena.h"
#include "client/local_attn.h"
#include "common/clock.h"
#include "common/msg.h"
#include "common/region.h"
#include "common/ring.h"
#include "common/spin.h"

#define DEFAULT_ARENA (64u << 20)
#define DEFAULT_TIMEOUT_MS 10000u
#define DEFAULT_SPIN_US 50u
/* The longest spin for a completion, however long completions have been taking. */
#define WAIT_SPIN_MAX_NS 2000000ull
#define RING_ENTRIES 256u
#define MAX_DONE 256u
/* Longest futex sleep between looks at the socket for a dead daemon. */
#define DEATH_CHECK_MS 50
/* How long a one-sequence step waits for another connection to compute a shared prefix. */
#define INFLIGHT_WAIT_NS (30ull * 1000000000ull)

static_assert(PKV_POOL_SHARE_ACROSS_USERS == PKV_WIRE_POOL_SHARED, "pool flags are wire format");
static_assert(PKV_POOL_CLIENT_ATTENTION == PKV_WIRE_POOL_CLIENT_ATTN, "pool flags are wire format");
/* In a completion of done[]: the attend ran in this process (client attention), not in the daemon. */
#define CQE_LOCAL (1u << 31)
/* The first buffer for a step's tables when this process attends itself (grown to what steps need). */
#define TABLES_FIRST (16u << 10)

/* A buffer in the arena, reused while large enough. */
struct arena_buf {
	int64_t off;      /* -1: none */
	uint64_t len;
};

/* A completion that arrived while waiting for another one (async attends). */
struct done {
	uint64_t ud;
	struct pkv_cqe cqe;
};

struct pkv_client {
	int sock, memfd, sq_bell;
	uint8_t *region;
	size_t region_size;
	struct pkv_shm_hdr hdr;
	struct pkv_ring sq, cq;
	uint8_t *arena;
	struct pkv_arena alloc;
	uint32_t timeout_ms, spin_us;
	uint64_t spin_ns;      /* learned spin budget: halves when a spin ends asleep, doubles when it pays */
	uint64_t wait_ns;      /* how long completions have been taking (exponential average) */
	/*
	 * compute_threads covers every CPU we may use: a wait never spins. The
	 * daemon's worker needs a core for our attend, and the caller's other
	 * threads keep theirs (a 2-thread SmolLM2 client: 76.6 -> 88.1 tok/s,
	 * hand-off 29 -> 12 us per attend, medians of 5 same-run pairs).
	 */
	int owns_cpus;
	uint64_t next_ud;
	uint32_t inflight;     /* SQEs whose CQE we have not consumed yet */
	int dead;              /* 0, or the error every call now returns */
	int attached;
	struct pkv_geometry geo;
	uint32_t act_dtype;
	struct arena_buf stage;   /* staging buffer for index arrays */
	struct done done[MAX_DONE];
	uint32_t n_done;
	char last_err[PKV_ERR_LEN + 1];
	uint32_t blocked_seq;     /* named by the last step_begin that failed -EAGAIN/-ESTALE */
	int open_settled;         /* opens find only committed prefixes ($PAGEDKV_INFLIGHT_SHARING=0) */
	uint32_t sleeps, lost_wakeups;  /* pkv_stats' client_* counters */
	uint64_t attends, attend_wait_ns, attend_backend_ns, attend_daemon_ns; /* pkv_stats' (pkv_attend only) */
	uint32_t compute_threads;
	/* Attention in this process (PKV_POOL_CLIENT_ATTENTION), else NULL: the daemon attends. */
	struct local_attn *local;
	struct arena_buf tables;  /* where the daemon writes a step's tables */
};


const char *pkv_strerror(int err)
{
	if (err > 0)
		err = -err;
	switch (err) {
	case 0: return "success";
	case -ECONNRESET: return "the daemon went away";
	case -ETIMEDOUT: return "the daemon did not answer in time";
	case -ENOSPC: return "out of cache blocks or over this client's quota";
	case -EPROTO: return "protocol version mismatch or corrupted shared region";
	case -EBUSY: return "sequence is in an open step, or too many requests in flight";
	/* From pkv_connect these mean "no daemon there"; its error_buf names the socket. */
	case -ENOENT: return "no such sequence (for this client), or from pkv_connect: no socket at the path";
	case -ECONNREFUSED: return "no daemon listens on the socket (a stale socket?)";
	case -ENOMEM: return "out of memory (arena or daemon budget)";
	case -EDQUOT: return "over this user's share of the daemon's memory budget";
	case -EINVAL: return "invalid argument";
	case -ENOTCONN: return "not attached to a pool";
	}
	return strerror(-err);
}

const char *pkv_last_error(const struct pkv_client *c)
{
	return c ? c->last_err : "";
}

static void set_err(struct pkv_client *c, const char *fmt, const char *arg)
{
	snprintf(c->last_err, sizeof(c->last_err), fmt, arg);
}

/* ---------------------------------------------------------------- setup */

/*
 * The part of a caller's growable struct this library knows, in a zeroed
 * copy of the current size: struct_size 0 means version 1's size; a size
 * smaller than the struct_size field itself is refused.
 */
static int known_part(void *dst, size_t cur, const void *src, size_t v1)
{
	uint32_t size = *(const uint32_t *)src;
	size_t n = size ? size : v1;

	if (n < sizeof(uint32_t))
		return -EINVAL;
	memset(dst, 0, cur);
	memcpy(dst, src, n < cur ? n : cur);
	return 0;
}

/*
 * The reason a connect failed, for opts->error_buf: names the socket and
 * says whether a daemon is there (ENOENT: none; ECONNREFUSED: a stale
 * socket; EACCES: one runs but we may not talk to it).
 */
static void connect_reason(const struct pkv_connect_opts *o, const char *daemon_said, int r)
{
	char path[108];
	const char *sock = o->socket_path;

	if (!o->error_buf || !o->error_buf_len)
		return;
	if (!sock) {
		if (pkv_default_socket_path(path, sizeof(path)))
			snprintf(path, sizeof(path), "/run/pagedkv.sock");
		sock = path;
	}
	if (daemon_said && *daemon_said) {
		snprintf(o->error_buf, o->error_buf_len, "pagedkvd at %s refused the connection: %s", sock,
			 daemon_said);
		return;
	}
	switch (r) {
	case -ENOENT:
		snprintf(o->error_buf, o->error_buf_len,
			 "no socket at %s: no pagedkvd is running there (start one, or set $PAGEDKV_SOCKET)", sock);
		break;
	case -ECONNREFUSED:
		snprintf(o->error_buf, o->error_buf_len,
			 "nothing listens on %s: a stale socket, no pagedkvd is running there", sock);
		break;
	case -EACCES:
	case -EPERM:
		snprintf(o->error_buf, o->error_buf_len,
			 "permission denied on %s: a pagedkvd may be running, but this user may not connect "
			 "(socket mode and group)", sock);
		break;
	case -ETIMEDOUT:
		snprintf(o->error_buf, o->error_buf_len,
			 "pagedkvd at %s did not answer in time (running but busy or stopped?)", sock);
		break;
	case -ECONNRESET:
		snprintf(o->error_buf, o->error_buf_len, "pagedkvd at %s hung up without a reason", sock);
		break;
	default:
		snprintf(o->error_buf, o->error_buf_len, "cannot connect to %s: %s", sock, strerror(r < 0 ? -r : r));
	}
}

static int make_region(struct pkv_client *c, uint64_t arena_bytes)
{
	struct pkv_shm_hdr *h = &c->hdr;
	int r;

	r = pkv_region_layout(arena_bytes, RING_ENTRIES, RING_ENTRIES, h);
	if (r)
		return r;
	c->memfd = memfd_create("pagedkv-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (c->memfd < 0)
		return -errno;
	if (ftruncate(c->memfd, h->region_size) < 0)
		return -errno;
	/* Sealed before the daemon maps it: a later truncate cannot SIGBUS the daemon. */
	if (fcntl(c->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return -errno;
	c->region = mmap(NULL, h->region_size, PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd, 0);
	if (c->region == MAP_FAILED) {
		c->region = NULL;
		return -errno;
	}
	c->region_size = h->region_size;
	memcpy(c->region, h, sizeof(*h));
	pkv_ring_bind(&c->sq, c->region + h->sq_ring_off, c->region + h->sq_sqes_off, h->sq_entries,
		      h->sqe_size, h);
	pkv_ring_bind(&c->cq, c->region + h->cq_ring_off, c->region + h->cq_cqes_off, h->cq_entries,
		      h->cqe_size, h);
	/* Until the daemon says it is spinning, assume it sleeps: the first SQE rings. */
	*c->sq.sh_flags = PKV_RING_NEED_WAKEUP;
	c->arena = c->region + h->arena_off;
	return pkv_arena_init(&c->alloc, h->arena_size);
}

/*
 * Waits for the reply to a control message; copies its text into last_err on
 * failure. With fd non-NULL a reply may pass one descriptor (else -1 there),
 * and *rep_out receives the whole reply.
 */
static int recv_reply_fd(struct pkv_client *c, uint64_t *value, int *fd, struct pkv_msg_reply *rep_out)
{
	struct pkv_msg_reply rep;
	int nfds = 0;
	ssize_t n;

	if (fd)
		*fd = -1;
	n = pkv_msg_recv(c->sock, &rep, sizeof(rep), fd, fd ? 1 : 0, &nfds, (int)c->timeout_ms);
	if (fd && nfds != 1)
		*fd = -1;
	if (n == 0 || n == -ECONNRESET || n == -EPIPE)
		return -ECONNRESET;
	if (n < 0)
		return (int)n;
	if ((size_t)n < PKV_REPLY_HDR_SIZE || rep.hdr.type != PKV_MSG_REPLY) {
		if (fd && *fd >= 0) {
			close(*fd);
			*fd = -1;
		}
		return -EPROTO;
	}
	if (rep_out) {
		memset(rep_out, 0, sizeof(*rep_out));
		memcpy(rep_out, &rep, (size_t)n);
	}
	if (rep.status < 0) {
		size_t tl = (size_t)n - PKV_REPLY_HDR_SIZE;

		if (tl >= sizeof(c->last_err))
			tl = sizeof(c->last_err) - 1;
		memcpy(c->last_err, rep.text, tl);
		c->last_err[tl] = 0;
	}
	if (value)
		*value = rep.value;
	return rep.status;
}

static int recv_reply(struct pkv_client *c, uint64_t *value)
{
	return recv_reply_fd(c, value, NULL, NULL);
}

int pkv_connect(const struct pkv_connect_opts *caller_opts, struct pkv_client **out)
{
	struct pkv_connect_opts o = PKV_CONNECT_OPTS_INIT;
	const struct pkv_connect_opts *opts = &o;
	struct pkv_msg_hello hello = { 0 };
	struct pkv_client *c;
	const char *env;
	int fds[3], r;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (caller_opts && known_part(&o, sizeof(o), caller_opts, PKV_CONNECT_OPTS_SIZE_V1))
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c) {
		connect_reason(opts, NULL, -ENOMEM);
		return -ENOMEM;
	}
	c->sock = c->memfd = c->sq_bell = -1;
	c->stage.off = c->tables.off = -1;
	c->compute_threads = o.compute_threads;
	c->timeout_ms = opts->timeout_ms ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
	c->spin_us = opts->spin_us ? opts->spin_us : DEFAULT_SPIN_US;
	if ((env = getenv("PAGEDKV_SPIN_US")) && *env)
		c->spin_us = (uint32_t)strtoul(env, NULL, 10);
	/* Benchmarks compare bursts with and without in-flight prefix sharing in one run. */
	c->open_settled = (env = getenv("PAGEDKV_INFLIGHT_SHARING")) && !strcmp(env, "0");
	c->next_ud = 1;
	r = make_region(c, opts->arena_bytes ? opts->arena_bytes : DEFAULT_ARENA);
	if (r)
		goto err;
	pkv_ring_set_threads(&c->cq, opts->compute_threads);
	{
		cpu_set_t m;
		long n = sched_getaffinity(0, sizeof(m), &m) ? sysconf(_SC_NPROCESSORS_ONLN) : CPU_COUNT(&m);

		c->owns_cpus = opts->compute_threads && n > 0 && opts->compute_threads >= (uint32_t)n;
	}
	c->sq_bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->sq_bell < 0) {
		r = -errno;
		goto err;
	}
	r = pkv_sock_connect(opts->socket_path, (int)c->timeout_ms);
	if (r < 0)
		goto err;
	c->sock = r;
	hello.hdr.type = PKV_MSG_HELLO;
	hello.hdr.size = sizeof(hello);
	hello.version = PKV_PROTO_VERSION;
	hello.role = PKV_ROLE_CLIENT;
	hello.region_size = c->region_size;
	fds[0] = c->memfd;
	fds[1] = c->sq_bell;
	r = pkv_msg_send(c->sock, &hello, sizeof(hello), fds, 2);
	/* A daemon that refuses us says why before hanging up: read it even if the send failed. */
	if (r && r != -EPIPE && r != -ECONNRESET)
		goto err;
	r = recv_reply(c, NULL);
	if (r)
		goto err;
	*out = c;
	return 0;
err:
	connect_reason(opts, c->last_err, r);
	pkv_disconnect(c);
	return r;
}

void pkv_disconnect(struct pkv_client *c)
{
	if (!c)
		return;
	/* Closing the socket is the hang-up: the daemon releases everything we held. */
	if (c->sock >= 0)
		close(c->sock);
	if (c->region)
		munmap(c->region, c->region_size);
	if (c->memfd >= 0)
		close(c->memfd);
	if (c->sq_bell >= 0)
		close(c->sq_bell);
	local_attn_close(c->local);
	pkv_arena_fini(&c->alloc);
	free(c);
}

/*
 * A pool whose clients attend themselves passed its memory with the attach
 * reply: map it and load its backends. When that fails here (no such plugin
 * in our plugin directory), the daemon attends for us as in any pool, and
 * last_err says why (pkv_stats' attention_in_client tells which).
 */
static void attend_here(struct pkv_client *c, const struct pkv_pool_params *p, uint64_t bytes, int fd,
			const struct pkv_msg_reply *rep)
{
	struct local_attn_params lp = { p->geo, p->act_dtype, p->scale, p->softcap, p->window_left,
					c->compute_threads, c->owns_cpus };
	struct pkv_wire_pool_mem w;
	char why[PKV_ERR_LEN - 48];
	int r;

	if (!(rep->flags & PKV_REPLY_POOL_MEM) || !(p->flags & PKV_POOL_CLIENT_ATTENTION)) {
		close(fd);
		return;
	}
	memcpy(&w, rep->text, sizeof(w));
	r = local_attn_open(fd, bytes, &w, &lp, &c->local, why, sizeof(why));
	if (r)
		snprintf(c->last_err, sizeof(c->last_err), "client attention off, the daemon attends: %s", why);
}

int pkv_pool_attach(struct pkv_client *c, const struct pkv_pool_params *caller_p)
{
	struct pkv_pool_params pp;
	const struct pkv_pool_params *p = &pp;
	struct pkv_msg_attach m;
	struct pkv_msg_reply rep;
	uint64_t value = 0;
	int r, fd = -1;

	if (!c || !caller_p || known_part(&pp, sizeof(pp), caller_p, PKV_POOL_PARAMS_SIZE_V1) || !p->name)
		return -EINVAL;
	if (c->dead)
		return c->dead;
	if (strlen(p->name) >= PKV_NAME_MAX || p->cache_salt_len > PKV_SALT_MAX ||
	    (p->cache_salt_len && !p->cache_salt)) {
		set_err(c, "%s", "pool name or cache salt too long");
		return -EINVAL;
	}
	memset(&m, 0, sizeof(m));
	m.hdr.type = PKV_MSG_ATTACH;
	m.hdr.size = sizeof(m);
	m.geo = p->geo;
	m.act_dtype = p->act_dtype;
	m.flags = p->flags;
	m.model_id = p->model_id;
	m.scale = p->scale;
	m.softcap = p->softcap;
	m.window_left = p->window_left;
	m.salt_len = (uint32_t)p->cache_salt_len;
	strcpy(m.name, p->name);
	if (p->cache_salt_len)
		memcpy(m.salt, p->cache_salt, p->cache_salt_len);
	r = pkv_msg_send(c->sock, &m, sizeof(m), NULL, 0);
	if (r == -EPIPE || r == -ECONNRESET)
		r = c->dead = -ECONNRESET;
	if (r)
		return r;
	r = recv_reply_fd(c, &value, &fd, &rep);
	if (r == -ECONNRESET)
		c->dead = r;
	if (r) {
		if (fd >= 0)
			close(fd);
		return r;
	}
	c->attached = 1;
	c->geo = p->geo;
	c->act_dtype = p->act_dtype;
	if (fd >= 0)
		attend_here(c, p, value, fd, &rep);
	return 0;
}

/* ---------------------------------------------------------------- arena */

void *pkv_alloc(struct pkv_client *c, size_t bytes)
{
	int64_t off;

	if (!c)
		return NULL;
	off = pkv_arena_alloc(&c->alloc, bytes);
	return off < 0 ? NULL : c->arena + off;
}

void pkv_free(struct pkv_client *c, void *ptr)
{
	if (c && ptr)
		pkv_arena_free(&c->alloc, (uint64_t)((uint8_t *)ptr - c->arena));
}

/* Arena offset of a pointer the caller got from pkv_alloc, or -EINVAL. */
static int64_t arena_off(const struct pkv_client *c, const void *p)
{
	const uint8_t *b = p;

	if (!b || b < c->arena || b >= c->arena + c->alloc.size)
		return -EINVAL;
	return b - c->arena;
}

/* Makes an arena buffer at least len bytes (its contents go: callers fill it afresh). */
static int arena_buf_reserve(struct pkv_client *c, struct arena_buf *b, uint64_t len)
{
	int64_t off;

	if (b->off >= 0 && b->len >= len)
		return 0;
	if (b->off >= 0)
		pkv_arena_free(&c->alloc, (uint64_t)b->off);
	b->off = -1;
	off = pkv_arena_alloc(&c->alloc, len);
	if (off < 0)
		return (int)off;
	b->off = off;
	b->len = len;
	return 0;
}

/* Makes the staging area for index arrays at least len bytes. */
static int stage(struct pkv_client *c, uint64_t len)
{
	return arena_buf_reserve(c, &c->stage, len < 4096 ? 4096 : len);
}

/* ---------------------------------------------------------------- ring round trips */

static int ring_bell(int fd)
{
	uint64_t one = 1;

	/* Plain write(2): an eventfd write through io_uring would be punted to a worker. */
	return write(fd, &one, sizeof(one)) == sizeof(one) || errno == EAGAIN ? 0 : -errno;
}

static int submit(struct pkv_client *c, struct pkv_sqe *sqe)
{
	int64_t space;

	if (c->dead)
		return c->dead;
	if (c->inflight >= c->hdr.cq_entries)
		return -EBUSY;
	space = pkv_ring_space(&c->sq);
	if (space < 0)
		return -EPROTO;
	if (space == 0)
		return -EBUSY;
	sqe->user_data = c->next_ud++;
	memcpy(pkv_ring_prod_slot(&c->sq), sqe, sizeof(*sqe));
	pkv_ring_publish(&c->sq);
	c->inflight++;
	if (pkv_ring_needs_wakeup(&c->sq) && ring_bell(c->sq_bell))
		return -ECONNRESET;
	return 0;
}

/* Moves every CQE from the ring into done[]. */
static int drain_cq(struct pkv_client *c)
{
	int64_t n = pkv_ring_avail(&c->cq);

	if (n < 0)
		return -EPROTO;
	while (n-- > 0) {
		struct pkv_cqe cqe;

		pkv_ring_peek_copy(&c->cq, &cqe);
		pkv_ring_consume(&c->cq);
		if (c->inflight)
			c->inflight--;
		if (c->n_done < MAX_DONE)
			c->done[c->n_done++] = (struct done){ cqe.user_data, cqe };
	}
	return 0;
}

static int take_done(struct pkv_client *c, uint64_t ud, struct pkv_cqe *out)
{
	for (uint32_t i = 0; i < c->n_done; i++)
		if (c->done[i].ud == ud) {
			*out = c->done[i].cqe;
			c->done[i] = c->done[--c->n_done];
			return 1;
		}
	return 0;
}

/*
 * Sleeps on the CQ's futex word for at most ms (and at most DEATH_CHECK_MS:
 * a futex cannot also watch the socket, so a sleep that times out looks at
 * it, to notice a dead daemon).
 */
static int sleep_cq(struct pkv_client *c, int ms)
{
	struct pollfd p = { .fd = c->sock, .events = POLLIN | POLLRDHUP };
	struct timespec ts;
	uint32_t seq;
	int64_t n;
	int r;

	if (ms > DEATH_CHECK_MS)
		ms = DEATH_CHECK_MS;
	ts.tv_sec = ms / 1000;
	ts.tv_nsec = (long)(ms % 1000) * 1000000L;
	n = pkv_ring_prepare_wait(&c->cq, &seq);
	if (n != 0) {
		pkv_ring_clear_wakeup(&c->cq);
		return n < 0 ? -EPROTO : 0;
	}
	c->sleeps++;
	/* Where we sleep: the daemon may serve us on the CPU this frees (worker.c follow_sleeper). */
	pkv_ring_set_cpu(&c->cq, (uint32_t)(sched_getcpu() + 1));
	r = pkv_ring_wait(&c->cq, seq, &ts);
	pkv_ring_clear_wakeup(&c->cq);
	/* Woken, or the word moved before we slept: a completion is there. */
	if (r == 0 || r == -EAGAIN || r == -EINTR)
		return 0;
	if (r != -ETIMEDOUT)
		return r;
	/*
	 * A completion posted while we slept with NEED_WAKEUP set, and the word
	 * still unbumped after our whole timeout: the daemon skipped the wake
	 * (a tests' counter in place of a stopwatch).
	 */
	if (pkv_ring_avail(&c->cq) > 0 && pkv_load_acquire(c->cq.sh_wake) == seq)
		c->lost_wakeups++;
	do
		r = poll(&p, 1, 0);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLIN)) {
		/* The daemon never sends unsolicited messages: readable means closed. */
		c->dead = -ECONNRESET;
		return drain_cq(c); /* completions already posted still count */
	}
	return 0;
}

/*
 * How long to spin before sleeping. Spinning only pays while a core would
 * otherwise idle: on an oversubscribed machine it takes the CPU from the
 * daemon thread (or another client) we wait for. Within that, the budget
 * learns from the outcomes: a spin that ended asleep halves it (down to a
 * sixteenth of spin_us, so that it can learn back), one that saw its
 * completion doubles it (up to spin_us).
 *
 * While completions come back about wait_ns after the request (a decode
 * attend over a long context takes longer than spin_us), *long is how long
 * to spin instead, at most WAIT_SPIN_MAX_NS, and only while the daemon
 * thread we wait for polls from another CPU: on a core nobody else wants it
 * saves putting this thread to sleep and waking it at every attend, which
 * costs more than the sleep's length on a VM whose idle vCPU must be woken.
 */
static uint64_t spin_budget(struct pkv_client *c, uint64_t *longer)
{
	uint64_t max = (uint64_t)c->spin_us * 1000ull, want = c->wait_ns + c->wait_ns / 4 + 10000;

	*longer = 0;
	if (!max || c->owns_cpus || !pkv_spin_worthwhile())
		return 0;
	if (!c->spin_ns || c->spin_ns > max)
		c->spin_ns = max;
	if (c->wait_ns && want > c->spin_ns)
		*longer = want < WAIT_SPIN_MAX_NS ? want : WAIT_SPIN_MAX_NS;
	return c->spin_ns;
}

static void spin_learn(struct pkv_client *c, int paid)
{
	uint64_t max = (uint64_t)c->spin_us * 1000ull;

	if (paid)
		c->spin_ns = c->spin_ns * 2 > max ? max : c->spin_ns * 2;
	else if (c->spin_ns / 2 >= max / 16)
		c->spin_ns /= 2;
}

static int wait_cqe(struct pkv_client *c, uint64_t ud, struct pkv_cqe *out)
{
	uint64_t start = pkv_now_ns(), deadline = start + (uint64_t)c->timeout_ms * 1000000ull, longer;
	uint64_t budget = spin_budget(c, &longer), spin_end = start + budget, long_end = start + longer;
	unsigned iter = 0;
	int r, slept = 0;

	for (;;) {
		uint64_t t;

		if (take_done(c, ud, out))
			goto got;
		r = drain_cq(c);
		if (r)
			return c->dead = r;
		if (take_done(c, ud, out))
			goto got;
		if (c->dead)
			return c->dead;
		if (++iter & 63) {
			pkv_cpu_relax();
			continue;
		}
		t = pkv_now_ns();
		if (t >= deadline)
			return -ETIMEDOUT;
		if (t < spin_end || t < long_end) {
			uint32_t me = (uint32_t)(sched_getcpu() + 1), peer = pkv_ring_peer_cpu(&c->sq);

			if (t >= spin_end && !(peer && me && peer != me))
				long_end = 0; /* it shares our CPU (or we cannot tell): it cannot finish while we spin */
			pkv_ring_set_cpu(&c->cq, me);
			/*
			 * Past the first microseconds, let the daemon thread we wait for
			 * have this core when it shares it (or we cannot tell); when it
			 * polls from another CPU, a yield would only hand our core to
			 * some other process, so only past a typical attend (a backend
			 * thread of the daemon may want this core then).
			 */
			if (t - start > (peer && me && peer != me ? 20000u : 2000u))
				sched_yield();
			continue;
		}
		if (budget && !slept)
			spin_learn(c, 0);
		slept = 1;
		r = sleep_cq(c, (int)((deadline - t) / 1000000ull) + 1);
		if (r)
			return c->dead = r;
		/* After a wake-up, spin again briefly: more completions tend to follow. */
		spin_end = pkv_now_ns() + spin_budget(c, &longer);
		long_end = 0;
	}
got:
	if (budget && !slept && iter > 1)
		spin_learn(c, 1);
	{
		uint64_t took = pkv_now_ns() - start;

		/* Longer waits are pauses (a prefill, a busy daemon): they say nothing about the next one. */
		if (took < 2 * WAIT_SPIN_MAX_NS)
			c->wait_ns = c->wait_ns ? (7 * c->wait_ns + took) / 8 : took;
	}
	return 0;
}

/* Reads the daemon's reason for an error CQE into last_err. */
static void fetch_err(struct pkv_client *c)
{
	size_t n = c->hdr.err_len < sizeof(c->last_err) - 1 ? c->hdr.err_len : sizeof(c->last_err) - 1;

	memcpy(c->last_err, c->region + c->hdr.err_off, n);
	c->last_err[n] = 0;
}

static int call(struct pkv_client *c, struct pkv_sqe *sqe, struct pkv_cqe *cqe)
{
	struct pkv_cqe tmp;
	int r;

	if (!cqe)
		cqe = &tmp;
	r = submit(c, sqe);
	if (r)
		return r;
	r = wait_cqe(c, sqe->user_data, cqe);
	if (r)
		return r;
	if (cqe->res < 0)
		fetch_err(c);
	return cqe->res;
}

static int need_pool(struct pkv_client *c)
{
	if (!c)
		return -EINVAL;
	if (c->dead)
		return c->dead;
	return c->attached ? 0 : -ENOTCONN;
}

/* ---------------------------------------------------------------- sequences */

int pkv_seq_open(struct pkv_client *c, const int32_t *tokens, uint32_t n_tokens,
		 uint32_t *seq, uint32_t *n_cached)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_SEQ_OPEN, .n = n_tokens };
	struct pkv_cqe cqe;
	int r = need_pool(c);

	if (r)
		return r;
	if (c->open_settled)
		sqe.flags = PKV_SQE_OPEN_SETTLED;
	if (!seq || (n_tokens && !tokens))
		return -EINVAL;
	r = stage(c, (uint64_t)n_tokens * 4);
	if (r)
		return r;
	memcpy(c->arena + c->stage.off, tokens, (size_t)n_tokens * 4);
	sqe.off[0] = (uint64_t)c->stage.off;
	r = call(c, &sqe, &cqe);
	if (r < 0)
		return r;
	*seq = (uint32_t)cqe.payload[0];
	if (n_cached)
		*n_cached = (uint32_t)cqe.payload[1];
	return 0;
}

int pkv_seq_fork(struct pkv_client *c, uint32_t seq, uint32_t *child)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_SEQ_FORK, .seq = seq };
	struct pkv_cqe cqe;
	int r = need_pool(c);

	if (r)
		return r;
	if (!child)
		return -EINVAL;
	r = call(c, &sqe, &cqe);
	if (r < 0)
		return r;
	*child = (uint32_t)cqe.payload[0];
	return 0;
}

int pkv_seq_truncate(struct pkv_client *c, uint32_t seq, uint32_t n_tokens)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_SEQ_TRUNCATE, .seq = seq, .n = n_tokens };
	int r = need_pool(c);

	return r ? r : call(c, &sqe, NULL);
}

int pkv_seq_close(struct pkv_client *c, uint32_t seq)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_SEQ_CLOSE, .seq = seq };
	int r = need_pool(c);

	return r ? r : call(c, &sqe, NULL);
}

/* ---------------------------------------------------------------- steps */

int pkv_step_begin(struct pkv_client *c, const uint32_t *seqs, const uint32_t *n_new,
		   const int32_t *tokens, uint32_t n_seqs)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_STEP_BEGIN, .n = n_seqs };
	struct pkv_cqe cqe;
	uint64_t total = 0, a, b;
	int r = need_pool(c);

	if (r)
		return r;
	if (!n_seqs || !seqs || !n_new || !tokens)
		return -EINVAL;
	for (uint32_t i = 0; i < n_seqs; i++)
		total += n_new[i];
	if (total > (1u << 26))
		return -EINVAL;
	a = ((uint64_t)n_seqs * 4 + 63) & ~63ull;
	b = a * 2;
	r = stage(c, b + total * 4);
	if (r)
		return r;
	memcpy(c->arena + c->stage.off, seqs, (size_t)n_seqs * 4);
	memcpy(c->arena + c->stage.off + a, n_new, (size_t)n_seqs * 4);
	memcpy(c->arena + c->stage.off + b, tokens, (size_t)total * 4);
	sqe.off[0] = (uint64_t)c->stage.off;
	sqe.off[1] = (uint64_t)c->stage.off + a;
	sqe.off[2] = (uint64_t)c->stage.off + b;
	if (c->local) {
		/* We attend this step ourselves: the daemon writes its tables for us. */
		r = arena_buf_reserve(c, &c->tables, TABLES_FIRST);
		if (r)
			return r;
		sqe.flags = PKV_SQE_STEP_TABLES;
	}
	/*
	 * A step of one sequence that waits for another connection's prefill
	 * is retried here, so a simple client never sees in-flight sharing: the
	 * wait is bounded by that prefill (or by its withdrawal, -ESTALE). With
	 * several sequences only the caller can leave one out, and no wait can
	 * help when this connection computes the prefix itself.
	 */
	for (uint64_t nap = 200000, waited = 0;; waited += nap, nap = nap < 5000000 ? nap * 2 : nap) {
		if (c->local) {
			sqe.off[3] = (uint64_t)c->tables.off;
			sqe.aux = c->tables.len;
		}
		r = call(c, &sqe, &cqe);
		if (r == -ENOBUFS && c->local && cqe.payload[0] > c->tables.len) {
			/* Nothing was reserved: again, with the room the daemon asked for. */
			r = arena_buf_reserve(c, &c->tables, cqe.payload[0]);
			if (r)
				return r;
			sqe.off[3] = (uint64_t)c->tables.off;
			sqe.aux = c->tables.len;
			r = call(c, &sqe, &cqe);
		}
		if (r >= 0 && c->local) {
			r = local_attn_step(c->local, c->arena + c->tables.off, c->tables.len, c->last_err,
					    sizeof(c->last_err));
			if (r) {
				pkv_step_abort(c);
				return r;
			}
		}
		if (r != -EAGAIN && r != -ESTALE)
			return r;
		c->blocked_seq = (uint32_t)cqe.payload[0];
		if (r == -ESTALE || n_seqs != 1 || cqe.payload[1] || waited >= INFLIGHT_WAIT_NS)
			return r;
		nanosleep(&(struct timespec){ 0, (long)nap }, NULL);
	}
}

uint32_t pkv_blocked_seq(const struct pkv_client *c)
{
	return c ? c->blocked_seq : 0;
}

/*
 * An attend in this process (client attention): runs now; its result waits
 * under a ticket like a completion, for pkv_wait. Q/K/V/O need not be arena
 * memory here, but callers that may fall back to the daemon keep them there.
 */
static int attend_local(struct pkv_client *c, uint32_t layer, const void *q, const void *k, const void *v,
			void *o, uint64_t *ticket)
{
	struct pkv_cqe cqe = { 0 };
	uint64_t t0 = pkv_now_ns();

	if (c->n_done >= MAX_DONE)
		return -EBUSY;
	if (layer >= c->geo.num_layers) {
		set_err(c, "%s", "layer out of range");
		return -EINVAL;
	}
	cqe.user_data = c->next_ud++;
	cqe.flags = CQE_LOCAL;
	cqe.res = local_attn_run(c->local, layer, q, k, v, o, c->last_err, sizeof(c->last_err));
	cqe.payload[0] = pkv_now_ns() - t0; /* all of it is backend time; none is the daemon's */
	c->done[c->n_done++] = (struct done){ cqe.user_data, cqe };
	*ticket = cqe.user_data;
	return 0;
}

int pkv_attend_async(struct pkv_client *c, uint32_t layer, const void *q, const void *k,
		     const void *v, void *o, uint64_t *ticket)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_ATTEND, .layer = layer };
	const void *p[4] = { q, k, v, o };
	int r = need_pool(c);

	if (r)
		return r;
	if (!ticket)
		return -EINVAL;
	if (c->local)
		return attend_local(c, layer, q, k, v, o, ticket);
	for (int i = 0; i < 4; i++) {
		int64_t off = arena_off(c, p[i]);

		if (off < 0) {
			set_err(c, "%s", "Q, K, V and O must be arena memory from pkv_alloc");
			return -EINVAL;
		}
		sqe.off[i] = (uint64_t)off;
	}
	r = submit(c, &sqe);
	if (r)
		return r;
	*ticket = sqe.user_data;
	return 0;
}

/* Waits for ticket's completion into *cqe: its result, with the daemon's reason fetched for an error. */
static int wait_result(struct pkv_client *c, uint64_t ticket, struct pkv_cqe *cqe)
{
	int r = wait_cqe(c, ticket, cqe);

	if (r)
		return r;
	/* An attend we ran ourselves already left its reason in last_err, not in the daemon's error text. */
	if (cqe->res < 0 && !(cqe->flags & CQE_LOCAL))
		fetch_err(c);
	return cqe->res;
}

int pkv_wait(struct pkv_client *c, uint64_t ticket)
{
	struct pkv_cqe cqe;

	if (!c)
		return -EINVAL;
	return wait_result(c, ticket, &cqe);
}

int pkv_attend(struct pkv_client *c, uint32_t layer, const void *q, const void *k,
	       const void *v, void *o)
{
	uint64_t t, t0 = pkv_now_ns();
	struct pkv_cqe cqe;
	int r = pkv_attend_async(c, layer, q, k, v, o, &t);

	if (r)
		return r;
	r = wait_result(c, t, &cqe);
	if (r < 0)
		return r;
	/* The daemon's backend time and its own for this attend (hints from the peer, as everything shared). */
	c->attends++;
	c->attend_wait_ns += pkv_now_ns() - t0;
	c->attend_backend_ns += cqe.payload[0];
	c->attend_daemon_ns += cqe.payload[1];
	return r;
}

int pkv_step_end(struct pkv_client *c)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_STEP_END };
	int r = need_pool(c);

	if (r)
		return r;
	if (c->local)
		local_attn_step_done(c->local);
	return call(c, &sqe, NULL);
}

int pkv_step_abort(struct pkv_client *c)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_STEP_ABORT };
	int r = need_pool(c);

	if (r)
		return r;
	if (c->local)
		local_attn_step_done(c->local);
	return call(c, &sqe, NULL);
}

/* ---------------------------------------------------------------- pins, stats */

static int pin_op(struct pkv_client *c, uint8_t op, const int32_t *tokens, uint32_t n)
{
	struct pkv_sqe sqe = { .opcode = op, .n = n };
	int r = need_pool(c);

	if (r)
		return r;
	if (n && !tokens)
		return -EINVAL;
	r = stage(c, (uint64_t)n * 4);
	if (r)
		return r;
	memcpy(c->arena + c->stage.off, tokens, (size_t)n * 4);
	sqe.off[0] = (uint64_t)c->stage.off;
	return call(c, &sqe, NULL);
}

int pkv_pin(struct pkv_client *c, const int32_t *tokens, uint32_t n_tokens)
{
	return pin_op(c, PKV_OP_PIN, tokens, n_tokens);
}

int pkv_unpin(struct pkv_client *c, const int32_t *tokens, uint32_t n_tokens)
{
	return pin_op(c, PKV_OP_UNPIN, tokens, n_tokens);
}

int pkv_stats(struct pkv_client *c, struct pkv_stats *st)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_STATS };
	struct pkv_stats all = PKV_STATS_INIT;
	struct pkv_wire_stats w;
	uint32_t size;
	int r = need_pool(c);

	if (r)
		return r;
	if (!st)
		return -EINVAL;
	size = st->struct_size ? st->struct_size : (uint32_t)PKV_STATS_SIZE_V1;
	if (size < sizeof(uint32_t))
		return -EINVAL;
	r = stage(c, sizeof(w));
	if (r)
		return r;
	sqe.off[0] = (uint64_t)c->stage.off;
	r = call(c, &sqe, NULL);
	if (r < 0)
		return r;
	memcpy(&w, c->arena + c->stage.off, sizeof(w));
	all.num_blocks = w.num_blocks;
	all.free_blocks = w.free_blocks;
	all.cached_blocks = w.cached_blocks;
	all.in_use_blocks = w.in_use_blocks;
	all.open_seqs = w.open_seqs;
	all.prefix_lookup_tokens = w.prefix_lookup_tokens;
	all.prefix_hit_tokens = w.prefix_hit_tokens;
	all.client_sleeps = c->sleeps;
	all.client_lost_wakeups = c->lost_wakeups;
	all.attends = c->attends;
	all.attend_wait_ns = c->attend_wait_ns;
	all.attend_backend_ns = c->attend_backend_ns;
	all.attend_daemon_ns = c->attend_daemon_ns;
	all.attention_in_client = c->local != NULL;
	/* Only as much as the caller's struct holds: an older caller's is smaller. */
	all.struct_size = size < sizeof(all) ? size : (uint32_t)sizeof(all);
	memcpy(st, &all, all.struct_size);
	return 0;
}

int pkv_nop(struct pkv_client *c)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_NOP };

	if (!c)
		return -EINVAL;
	return call(c, &sqe, NULL);
}

int pkv_nop_async(struct pkv_client *c, uint64_t *ticket)
{
	struct pkv_sqe sqe = { .opcode = PKV_OP_NOP };
	int r;

	if (!c || !ticket)
		return -EINVAL;
	r = submit(c, &sqe);
	if (!r)
		*ticket = sqe.user_data;
	return r;
}
