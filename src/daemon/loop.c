/* SPDX-License-Identifier: MIT */
/* The event loop: one io_uring for control sockets, doorbells, signals and timers, plus ring sweeps. */
#include "config.h"
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "common/barrier.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/spin.h"
#include "daemon/daemon.h"

#define HELLO_TIMEOUT_NS (5ull * 1000000000ull)
/* Hello timeout for a uid holding more than half its max_unauth_per_uid, or while descriptors run out. */
#define HELLO_TIMEOUT_SHORT_NS (1ull * 1000000000ull)
/* How long after running out of descriptors every pre-hello connection gets the short timeout. */
#define FD_PRESSURE_NS (10ull * 1000000000ull)

static struct io_uring_sqe *get_sqe(struct pkv_daemon *d)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);

	if (!sqe) {
		io_uring_submit(&d->ring);
		sqe = io_uring_get_sqe(&d->ring);
	}
	return sqe;
}

static int arm_poll(struct pkv_daemon *d, int fd, unsigned events, struct watch *w)
{
	struct io_uring_sqe *sqe = get_sqe(d);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_multishot(sqe, fd, events);
	io_uring_sqe_set_data(sqe, w);
	return 0;
}

static int arm_read(struct pkv_daemon *d, int fd, uint64_t *buf, struct watch *w)
{
	struct io_uring_sqe *sqe = get_sqe(d);

	if (!sqe)
		return -EBUSY;
	/* A read, not poll + read(2): the client shares the eventfd's file
	 * description and could make it blocking; io_uring never blocks us. */
	io_uring_prep_read(sqe, fd, buf, sizeof(*buf), 0);
	io_uring_sqe_set_data(sqe, w);
	return 0;
}

static int arm_timer(struct pkv_daemon *d)
{
	struct io_uring_sqe *sqe = get_sqe(d);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_timeout(sqe, &d->tick, 0, 0);
	io_uring_sqe_set_data(sqe, &d->w_timer);
	return 0;
}

void loop_arm_session(struct pkv_daemon *d, struct session *s)
{
	if (!arm_read(d, s->sq_bell, &s->bell_buf, &s->w_bell)) {
		s->armed++;
		s->bell_armed = 1;
	}
}

/* Connections of this uid, not counting s itself nor those already hanging up. */
static uint32_t uid_sessions(const struct pkv_daemon *d, const struct session *s)
{
	uint32_t n = 0;

	for (const struct session *o = d->sessions; o; o = o->next)
		n += o != s && o->uid == s->uid && !o->closing;
	return n;
}

/*
 * Whether s's uid already holds its share of connections; says why. Checked
 * at the hello, once the hello is read: closing a socket whose receive queue
 * still holds a message makes the peer's recv fail with ECONNRESET before it
 * can read our reason.
 */
int loop_over_uid_limit(const struct pkv_daemon *d, const struct session *s, char *why, size_t why_len)
{
	if (uid_sessions(d, s) < d->cfg.max_clients_per_uid)
		return 0;
	snprintf(why, why_len, "uid %u already holds %u connections (max_clients_per_uid)",
		 (unsigned)s->uid, d->cfg.max_clients_per_uid);
	return 1;
}

/* Connections of uid still before their hello (not counting those already hanging up). */
static uint32_t uid_unauth(const struct pkv_daemon *d, uid_t uid)
{
	uint32_t n = 0;

	for (const struct session *o = d->sessions; o; o = o->next)
		n += !o->role && !o->closing && o->uid == uid;
	return n;
}

/*
 * Sessions for the connections the acceptor queued (accept.c, which refused
 * a uid's excess before their hello). At most a batch per turn: a flood of
 * connects must not keep the loop from the rings.
 */
static int take_accepted(struct pkv_daemon *d)
{
	struct accepted got[64];
	int n = acceptor_take(d, got, 64);

	if (n == ACCEPTOR_BUSY)
		return 1; /* activity: the loop looks again before it sleeps */
	for (int i = 0; i < n; i++) {
		struct session *s = session_new(d, got[i].fd);

		if (!s) {
			close(got[i].fd);
			if (got[i].counted)
				acceptor_hello_done(d, got[i].uid);
			continue;
		}
		s->unauth_counted = got[i].counted;
		pkv_dbg("client %u: accepted (fd %d, pid %d)", s->id, got[i].fd, (int)s->pid);
		if (arm_poll(d, got[i].fd, POLLIN | POLLRDHUP, &s->w_ctl)) {
			pkv_store_relaxed(&s->closing, 1);
			s->released = 1;
			session_maybe_free(d, s);
			continue;
		}
		s->armed++;
	}
	return n;
}

static void begin_stop(struct pkv_daemon *d)
{
	if (d->stopping)
		return;
	d->stopping = 1;
	pkv_info("stopping: finishing in-flight work, releasing %u connections", d->n_sessions);
	acceptor_stop(d);
	for (struct session *s = d->sessions; s; s = s->next)
		session_hangup(d, s);
}

static void on_ctl(struct pkv_daemon *d, struct session *s, struct io_uring_cqe *cqe)
{
	pkv_dbg("client %u: control socket event 0x%x%s", s->id, (unsigned)cqe->res,
		(cqe->flags & IORING_CQE_F_MORE) ? " (more)" : "");
	if (!(cqe->flags & IORING_CQE_F_MORE)) {
		s->armed--;
		if (!s->closing && cqe->res >= 0 && !arm_poll(d, s->sock, POLLIN | POLLRDHUP, &s->w_ctl))
			s->armed++;
	}
	if (cqe->res < 0) {
		if (cqe->res != -ECANCELED && !s->closing)
			session_hangup(d, s);
		return;
	}
	if (cqe->res & POLLIN) {
		/* Several messages may be queued behind one wake-up. */
		for (int i = 0; i < 16 && !s->closing; i++) {
			char peek;
			ssize_t n = recv(s->sock, &peek, 1, MSG_PEEK | MSG_DONTWAIT);

			if (n < 0 && (errno == EAGAIN || errno == EINTR))
				break;
			session_ctl_message(d, s);
		}
	} else if (cqe->res & (POLLHUP | POLLERR | POLLRDHUP)) {
		session_hangup(d, s);
	}
}

/*
 * A doorbell read completed. While the worker owns the ring it sleeps on
 * this doorbell itself (worker.c): our read, still armed from before the
 * hand-off, may have taken a count the worker's epoll then finds gone, so
 * pass the wake-up on, and leave the doorbell to the worker until the ring
 * comes back (process_done re-arms it). The loop is then woken once per
 * hand-off, not once per attend.
 */
static void on_bell(struct pkv_daemon *d, struct session *s, struct io_uring_cqe *cqe)
{
	s->armed--;
	s->bell_armed = 0;
	if (cqe->res == -ECANCELED || s->closing)
		return;
	if (cqe->res < 0) {
		pkv_warn("client %u: doorbell: %s", s->id, strerror(-cqe->res));
		session_hangup(d, s);
		return;
	}
	if (s->worker_owned) {
		worker_kick(d);
		return;
	}
	if (pkv_ring_avail(&s->sq) == 0 && ++s->empty_bells >= EMPTY_BELLS_PER_TICK) {
		s->bell_parked = 1; /* re-armed by the timer; the sweep still serves it on every wake-up */
		return;
	}
	loop_arm_session(d, s);
}

static void on_signal(struct pkv_daemon *d)
{
	struct signalfd_siginfo si;

	while (read(d->signal_fd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)
			begin_stop(d);
		else if (si.ssi_signo == SIGHUP && !d->stopping) {
			/* The worker reads limits (uid_block_share) at step boundaries, under a pool's lock. */
			pool_lock_all(d);
			daemon_reload(d);
			pool_unlock_all(d);
		}
	}
}

static void on_timer(struct pkv_daemon *d)
{
	uint64_t now = pkv_now_ns(), fd_pressure = __atomic_load_n(&d->acceptor.fd_pressure_ns, __ATOMIC_RELAXED);
	int pressure = fd_pressure && now - fd_pressure < FD_PRESSURE_NS;

	for (struct session *s = d->sessions; s; s = s->next) {
		uint64_t age = now - s->created_ns;

		s->empty_bells = 0;
		if (s->bell_parked && !s->closing && !s->worker_owned && !s->bell_armed)
			loop_arm_session(d, s);
		s->bell_parked = 0;
		if (s->role || s->closing || age <= HELLO_TIMEOUT_SHORT_NS)
			continue;
		if (age > HELLO_TIMEOUT_NS || pressure ||
		    uid_unauth(d, s->uid) > d->cfg.max_unauth_per_uid / 2) {
			pkv_info("client %u (pid %d, uid %u): no hello within %llu ms; closing", s->id,
				 (int)s->pid, (unsigned)s->uid, (unsigned long long)(age / 1000000));
			session_hangup(d, s);
		}
	}
	pool_reap(d, now);
	arm_timer(d);
}

/* Descriptors: as many as allowed (each client holds three), and one in reserve for the acceptor's shed_one. */
void loop_setup_fds(struct pkv_daemon *d)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	d->acceptor.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

/* Handles every io_uring completion available now; returns how many. */
static int drain_uring(struct pkv_daemon *d)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;

	io_uring_for_each_cqe(&d->ring, head, cqe) {
		struct watch *w = io_uring_cqe_get_data(cqe);

		n++;
		if (!w)
			continue;
		switch (w->kind) {
		case W_SIGNAL:
			on_signal(d);
			if (!(cqe->flags & IORING_CQE_F_MORE))
				arm_poll(d, d->signal_fd, POLLIN, &d->w_signal);
			break;
		case W_WAKE:
			arm_read(d, d->wake_fd, &d->wake_buf, &d->w_wake);
			break;
		case W_TIMER:
			on_timer(d);
			break;
		case W_CTL:
			on_ctl(d, w->s, cqe);
			break;
		case W_BELL:
			on_bell(d, w->s, cqe);
			break;
		case W_CANCEL:
			w->s->armed--;
			break;
		}
	}
	io_uring_cq_advance(&d->ring, n);
	return (int)n;
}

/* Frees every session that finished closing. */
static void reap(struct pkv_daemon *d)
{
	struct session *s = d->sessions, *next;

	for (; s; s = next) {
		next = s->next;
		if (s->closing)
			session_maybe_free(d, s);
	}
}

static int process_done(struct pkv_daemon *d)
{
	struct job *j = worker_take_done(d), *next;
	int n = 0;

	for (; j; j = next) {
		struct session *s = j->s;

		next = j->next;
		if (j->kind == JOB_POLL) {
			/* The ring is ours again: its head (if any) is not an attend. */
			s->worker_owned = 0;
			/* Its doorbell too (the count the worker left unread completes this read at once). */
			if (!s->closing && !s->bell_armed)
				loop_arm_session(d, s);
			s->inflight--;
			s->ops += j->ops;
			s->errors += j->errors;
			/* A fault in its memory reads as corrupted rings to the worker: say what it was. */
			if (j->res < 0 && !session_faulted(d, s) && !s->closing) {
				pkv_warn("client %u (uid %u, pid %d): %s; disconnecting", s->id, (unsigned)s->uid, (int)s->pid,
					 j->res == -ENOMEM ? "out of memory" : "rings corrupted or overrun");
				session_hangup(d, s);
			}
		} else if (s->inflight) {
			/* A copy job: a failure poisoned the step (its end aborts it), the worker said so. */
			s->inflight--;
			/* Its begin completes now (a client attending itself: session.c queue_copies). */
			if (j->post_begin && !s->closing && session_post(s, j->begin_ud, 0, j->begin_p0, j->begin_p1)) {
				pkv_warn("client %u (uid %u, pid %d): completion ring corrupted or overrun; disconnecting",
					 s->id, (unsigned)s->uid, (int)s->pid);
				session_hangup(d, s);
			}
		}
		job_free(j);
		n++;
	}
	return n;
}

/*
 * Admin commands that act on what the pools cache (flush, audit) first let
 * the worker hand back the rings of connections that hung up, and release
 * them: their blocks are then cached (or free) as they would be had the
 * ring been the loop's at the hang-up (the worker keeps a ring after a step
 * it ended). Bounded by SETTLE_NS, the loop waiting meanwhile: an
 * administrator's command, never a client's.
 */
#define SETTLE_NS 100000000ull

void loop_settle_releases(struct pkv_daemon *d)
{
	uint64_t end = pkv_now_ns() + SETTLE_NS;
	struct timespec nap = { 0, 50000 };

	for (;;) {
		int pending = 0;

		process_done(d);
		for (struct session *s = d->sessions; s; s = s->next) {
			if (!s->closing || s->released)
				continue;
			if (s->inflight)
				pending = 1;
			else
				session_release(d, s);
		}
		if (!pending || pkv_now_ns() >= end)
			return;
		nanosleep(&nap, NULL);
	}
}

/* Runs every session's ready SQEs (attends hand the ring to the worker). */
static int sweep(struct pkv_daemon *d)
{
	int n = 0;

	d->cpu1 = (uint32_t)(sched_getcpu() + 1);
	for (struct session *s = d->sessions; s; s = s->next)
		n += session_process(d, s);
	return n;
}

/* Tells every client we sleep; returns 1 when work arrived meanwhile. */
static int prepare_sleep(struct pkv_daemon *d)
{
	int work = 0;

	for (struct session *s = d->sessions; s; s = s->next) {
		int64_t a;

		/* The worker polls its rings: a doorbell flag would make the client ring for nothing. */
		if (!s->region || s->closing || s->worker_owned)
			continue;
		if (s->open_tokens && !s->open_fetch)
			work = 1;   /* an open's walk goes on at the next sweep */
		a = pkv_ring_prepare_sleep(&s->sq);
		/*
		 * A session waiting on its attends, or on the disk tier, is woken by
		 * their completion. One whose CQ is full waits for its client to reap
		 * (only a client breaking the protocol fills it): its next SQE rings
		 * the doorbell, and the timer sweeps it too; counted as work, it kept
		 * the loop from ever sleeping, a core spent for as long as that
		 * client stayed connected.
		 */
		if (a != 0 && !s->inflight && !s->open_fetch && session_cq_space(s) != 0) /* < 0: the sweep hangs it up */
			work = 1;
	}
	pkv_store_relaxed(&d->loop_sleeping, 1);
	/* Pairs with the worker's fence between publishing a job and reading loop_sleeping. */
	pkv_smp_mb();
	if (pkv_load_relaxed(&d->worker.done))
		work = 1;
	return work;
}

static void wake_up(struct pkv_daemon *d)
{
	pkv_store_relaxed(&d->loop_sleeping, 0);
	/* Not the worker's rings: it sets and clears their flags itself. */
	for (struct session *s = d->sessions; s; s = s->next)
		if (s->region && !s->closing && !s->worker_owned)
			pkv_ring_clear_wakeup(&s->sq);
}

int loop_run(struct pkv_daemon *d)
{
	uint64_t spin_ns = (uint64_t)d->cfg.spin_us * 1000, last = pkv_now_ns();
	int r;

	d->w_signal = (struct watch){ W_SIGNAL, NULL };
	d->w_wake = (struct watch){ W_WAKE, NULL };
	d->w_timer = (struct watch){ W_TIMER, NULL };
	d->tick.tv_sec = 1;
	d->tick.tv_nsec = 0;
	if (arm_poll(d, d->signal_fd, POLLIN, &d->w_signal) ||
	    arm_read(d, d->wake_fd, &d->wake_buf, &d->w_wake) || arm_timer(d))
		return -EBUSY;
	io_uring_submit(&d->ring);
	for (;;) {
		int act;

		act = drain_uring(d);
		act += take_accepted(d);
		act += process_done(d);
		act += sweep(d);
		reap(d);
		if (io_uring_sq_ready(&d->ring))
			io_uring_submit(&d->ring);
		if (d->stopping && !d->sessions)
			break;
		if (act) {
			last = pkv_now_ns();
			continue;
		}
		/*
		 * Spin spin_us after activity even while the worker polls every
		 * ring: a ring handed back at step_end then finds the loop awake.
		 * (Sleeping at once measured 23 % vs 11 % step overhead, median of
		 * 7 alternated runs.) Only while a core idles: otherwise the spin
		 * takes the CPU from the worker or a client that has work.
		 */
		if (pkv_now_ns() - last < spin_ns && pkv_spin_worthwhile()) {
			for (int i = 0; i < 16; i++)
				pkv_cpu_relax();
			/* Spinning must not starve the worker when cores are scarce. */
			if (pkv_now_ns() - last > 2000)
				sched_yield();
			continue;
		}
		if (prepare_sleep(d)) {
			wake_up(d);
			last = pkv_now_ns();
			continue;
		}
		r = io_uring_submit_and_wait(&d->ring, 1);
		if (r < 0 && r != -EINTR && r != -ETIME) {
			pkv_err("io_uring wait: %s", strerror(-r));
			return r;
		}
		wake_up(d);
		last = pkv_now_ns();
	}
	return 0;
}
