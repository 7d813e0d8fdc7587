/* SPDX-License-Identifier: MIT */
/*
 * The acceptor: a thread of its own, at a lower priority than the loop and
 * the worker, takes connections off the listening socket, refuses those of
 * a uid already holding max_unauth_per_uid connections before their hello,
 * and queues the rest for the loop.
 *
 * Why a thread: every connection costs the kernel work of accepting and
 * closing a socket, and a uid that floods connects makes the daemon pay it
 * as fast as it can connect. On the loop that work took half a CPU from
 * the others' clients and the worker (pkv-bench isolation connection_flood:
 * another uid's decode step p50 4.5x, p99 8x its solo figures, against 1.05x
 * for a process that only computes). Here it runs ACCEPT_NICE nice levels
 * below the daemon: while a core idles it accepts as fast as before; while
 * every core has work, the flood gets what a low-priority process would, and
 * the backlog pushes back on the flooder's connects.
 *
 * A uid's connections also reach the loop at most ACCEPT_RATE a second
 * (bursts of ACCEPT_BURST pass at once): one that connects and hangs up
 * again and again, never over its cap, cost the loop a session's whole life
 * each (10 % of the samples, another uid's step p99 4-5x solo). The excess
 * waits here, counted among the uid's connections before their hello, so the
 * cap still refuses a flood. A uid holds at most max_clients_per_uid (64)
 * connections anyway, so a burst that opens all of them is never paced.
 */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "common/clock.h"
#include "common/log.h"
#include "common/msg.h"
#include "daemon/daemon.h"

/* Weight 110 against 1,024 at nice 0: about a tenth of a core its threads would otherwise share. */
#define ACCEPT_NICE 10
/* Connections taken per wake-up before the loop hears of them. */
#define ACCEPT_BATCH 64
/* Per uid: connections a second handed to the loop, and how many may go at once. */
#define ACCEPT_RATE 500.0
#define ACCEPT_BURST 128.0
/*
 * Accepted at one wake-up, beyond which the thread lets the backlog gather
 * ACCEPT_GATHER_NS (four times that after a whole batch: at most 16,000
 * connections a second then, most of them refused).
 */
#define ACCEPT_GATHER_AFTER 4
#define ACCEPT_GATHER_NS 1000000

/* Logs at most one line a second for a flood of refusals; says how many were not logged. */
static void log_refusal(struct acceptor *a, const char *fmt, uid_t uid)
{
	uint64_t now = pkv_now_ns();

	a->refused_unlogged++;
	if (now - a->refused_logged_ns < 1000000000ull)
		return;
	pkv_warn(fmt, (unsigned)uid, (unsigned long long)a->refused_unlogged);
	a->refused_unlogged = 0;
	a->refused_logged_ns = now;
}

/* Refills g's tokens up to now (a clock read before another thread's refill may lag it: no refill then). */
static void refill(struct uid_gate *g, uint64_t now)
{
	if (now <= g->at_ns)
		return;
	g->tokens += (double)(now - g->at_ns) * (ACCEPT_RATE / 1e9);
	if (g->tokens > ACCEPT_BURST)
		g->tokens = ACCEPT_BURST;
	g->at_ns = now;
}

/*
 * uid's gate (a->mu held), refilled to now; NULL when the table is full. A
 * slot is free again once its uid holds nothing before a hello and its
 * tokens are whole: forgetting it then changes nothing.
 */
static struct uid_gate *gate_of(struct acceptor *a, uid_t uid, uint64_t now, int add)
{
	struct uid_gate *free_slot = NULL;

	for (uint32_t i = 0; i < a->n_gates; i++) {
		struct uid_gate *g = &a->gates[i];

		if (g->used && g->uid == uid) {
			refill(g, now);
			return g;
		}
		if (g->used && !g->n) {
			refill(g, now);
			g->used = g->tokens < ACCEPT_BURST;
		}
		if (!g->used && !free_slot)
			free_slot = g;
	}
	if (!add)
		return NULL;
	if (!free_slot && a->n_gates < PKV_ACCEPT_MAX_UIDS)
		free_slot = &a->gates[a->n_gates++];
	if (free_slot)
		*free_slot = (struct uid_gate){ .uid = uid, .used = 1, .tokens = ACCEPT_BURST, .at_ns = now };
	return free_slot;
}

/* Appends c to list *l (a->mu held); 0, or -ENOMEM. */
static int push(struct accepted **l, uint32_t *n, uint32_t *cap, struct accepted c)
{
	if (*n == *cap) {
		uint32_t nc = *cap ? *cap * 2 : 64;
		struct accepted *q = realloc(*l, nc * sizeof(*q));

		if (!q)
			return -ENOMEM;
		*l = q;
		*cap = nc;
	}
	(*l)[(*n)++] = c;
	return 0;
}

/*
 * Out of descriptors: the listening socket stays readable, and a poll that
 * cannot accept would spin. Give back the reserve descriptor, accept, tell
 * the peer why and close, then take the reserve again: the backlog keeps
 * draining and every caller gets an answer instead of a hang.
 */
static int shed_one(struct pkv_daemon *d, struct acceptor *a)
{
	int fd;

	__atomic_store_n(&a->fd_pressure_ns, pkv_now_ns(), __ATOMIC_RELAXED);
	if (a->reserve_fd >= 0)
		close(a->reserve_fd);
	a->reserve_fd = -1;
	fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd >= 0) {
		static const char msg[] = "pagedkvd is out of descriptors; try again later";
		struct ucred cred = { .uid = (uid_t)-1 };
		socklen_t cl = sizeof(cred);

		getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
		pkv_send_reply(fd, -EMFILE, 0, 0, msg, sizeof(msg) - 1);
		close(fd);
		log_refusal(a, "out of descriptors: refused a connection of uid %u (%llu refused since the last line)",
			    cred.uid);
	}
	a->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return fd >= 0;
}

/*
 * Decides one accepted connection: refused (closed here), queued for the
 * loop, or held until its uid's pace lets it go; 1 when queued.
 */
static int admit(struct pkv_daemon *d, struct acceptor *a, int fd)
{
	static const char msg[] = "too many connections of this uid before their hello (max_unauth_per_uid)";
	unsigned max = __atomic_load_n(&d->cfg.max_unauth_per_uid, __ATOMIC_RELAXED);
	uint64_t now;
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	struct uid_gate *g;
	int queued = 0, held = 0;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
		close(fd);
		return 0;
	}
	pthread_mutex_lock(&a->mu);
	now = pkv_now_ns();
	g = gate_of(a, cred.uid, now, 1);
	/*
	 * Every slot in use (as many uids, each with a connection before its
	 * hello or a pace not yet whole, as a user namespace can map): this uid
	 * goes to the loop unpaced and uncounted, as before the acceptor, rather
	 * than be refused for the others' sake. The loop's hello timeout still
	 * bounds what it holds.
	 */
	if (!g) {
		queued = !push(&a->queue, &a->n_queue, &a->cap_queue, (struct accepted){ fd, cred.uid, now, 0 });
		pthread_mutex_unlock(&a->mu);
		if (!queued)
			close(fd);
		return queued;
	}
	/*
	 * A uid may hold only a few connections that have not said hello
	 * (slowloris): refuse at once, before it costs the loop a session and
	 * a watch, so other users can still connect.
	 */
	if (g->n < max) {
		struct accepted c = { fd, cred.uid, now, 1 };

		if (g->tokens < 1)
			c.due_ns = now + (uint64_t)((1 - g->tokens) * (1e9 / ACCEPT_RATE));
		if (g->tokens >= 1 ? !push(&a->queue, &a->n_queue, &a->cap_queue, c)
				   : !push(&a->held, &a->n_held, &a->cap_held, c)) {
			g->tokens -= 1; /* below zero: the next ones are due later still */
			g->n++;
			queued = c.due_ns == now;
			held = !queued;
		}
	}
	pthread_mutex_unlock(&a->mu);
	if (queued || held)
		return queued;
	pkv_send_reply(fd, -EUSERS, 0, 0, msg, sizeof(msg) - 1);
	close(fd);
	log_refusal(a, "uid %u holds too many connections before their hello; refused "
		    "(%llu refused since the last line)", cred.uid);
	return 0;
}

/* Hands the held connections that are due to the loop; returns how many, and *next_ns the next one due (or 0). */
static int release_due(struct acceptor *a, uint64_t now, uint64_t *next_ns)
{
	uint32_t kept = 0;
	int moved = 0;

	*next_ns = 0;
	pthread_mutex_lock(&a->mu);
	for (uint32_t i = 0; i < a->n_held; i++) {
		struct accepted c = a->held[i];

		if (c.due_ns <= now && !push(&a->queue, &a->n_queue, &a->cap_queue, c)) {
			moved++;
			continue;
		}
		if (c.due_ns <= now)
			c.due_ns = now + 10000000; /* out of memory: try again in 10 ms, not at once */
		if (!*next_ns || c.due_ns < *next_ns)
			*next_ns = c.due_ns;
		a->held[kept++] = c;
	}
	a->n_held = kept;
	pthread_mutex_unlock(&a->mu);
	return moved;
}

/* Accepts until the backlog is empty or a batch is taken; returns how many were queued, *taken how many accepted. */
static int accept_some(struct pkv_daemon *d, struct acceptor *a, int *taken)
{
	int queued = 0;

	*taken = 0;
	for (int i = 0; i < ACCEPT_BATCH; i++) {
		int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE) {
				if (!shed_one(d, a))
					break; /* without a reserve (someone took it): the next poll retries */
				continue;
			}
			if (errno == ECONNABORTED || errno == EINTR)
				continue;
			if (errno != EAGAIN)
				pkv_warn("accept: %s", strerror(errno));
			break;
		}
		++*taken;
		queued += admit(d, a, fd);
	}
	return queued;
}

static void *acceptor_main(void *arg)
{
	struct pkv_daemon *d = arg;
	struct acceptor *a = &d->acceptor;
	uint64_t next_ns = 0; /* when the first held connection is due */

	pid_t tid = (pid_t)syscall(SYS_gettid);
	int nice;

	pthread_setname_np(pthread_self(), "pkv-accept");
	/*
	 * ACCEPT_NICE below the loop, whatever the daemon was started at.
	 * Raising one's own nice needs no privilege (and is per thread on Linux).
	 */
	errno = 0;
	nice = getpriority(PRIO_PROCESS, (id_t)tid);
	if (!errno && setpriority(PRIO_PROCESS, (id_t)tid, nice + ACCEPT_NICE > 19 ? 19 : nice + ACCEPT_NICE))
		pkv_dbg("acceptor: cannot lower its priority: %s", strerror(errno));
	for (;;) {
		struct pollfd p[2] = { { .fd = d->listen_fd, .events = POLLIN }, { .fd = a->stop_fd, .events = POLLIN } };
		uint64_t one = 1, now = pkv_now_ns();
		int timeout = 1000, queued, taken = 0;

		if (next_ns)
			timeout = next_ns <= now ? 0 : (int)((next_ns - now) / 1000000 + 1);
		if (a->reserve_fd < 0)
			a->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		/*
		 * Out of descriptors with no reserve to shed with (the loop may have
		 * taken the one shed_one freed): leave the still readable socket
		 * alone for a while rather than fail accept after accept.
		 */
		if (a->reserve_fd < 0) {
			p[0].fd = -1;
			timeout = timeout > 10 || !next_ns ? 10 : timeout;
		}
		if (poll(p, 2, timeout) < 0 && errno != EINTR) {
			pkv_warn("acceptor: poll: %s", strerror(errno));
			nanosleep(&(struct timespec){ .tv_nsec = 10000000 }, NULL);
			continue;
		}
		if (__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE))
			break;
		if (p[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
			pkv_warn("acceptor: the listening socket reports an error (events 0x%x)", (unsigned)p[0].revents);
			nanosleep(&(struct timespec){ .tv_nsec = 100000000 }, NULL);
		}
		queued = p[0].revents & POLLIN ? accept_some(d, a, &taken) : 0;
		queued += release_due(a, pkv_now_ns(), &next_ns);
		if (queued && write(d->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			pkv_warn("acceptor: cannot wake the loop: %s", strerror(errno));
		/*
		 * Several connections at one wake-up: a flood, or a burst. Let the
		 * backlog gather for a while and take it in one go: woken for each
		 * connect, this thread's wake-ups preempted the others' clients.
		 */
		if (taken >= ACCEPT_GATHER_AFTER)
			nanosleep(&(struct timespec){ .tv_nsec = taken == ACCEPT_BATCH ? 4 * ACCEPT_GATHER_NS
										 : ACCEPT_GATHER_NS }, NULL);
	}
	return NULL;
}

int acceptor_start(struct pkv_daemon *d)
{
	struct acceptor *a = &d->acceptor;
	int r;

	if (a->reserve_fd < 0)
		a->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	a->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (a->stop_fd < 0)
		return -errno;
	pthread_mutex_init(&a->mu, NULL);
	r = -pthread_create(&a->thread, NULL, acceptor_main, d);
	if (r) {
		pthread_mutex_destroy(&a->mu);
		close(a->stop_fd);
		a->stop_fd = -1;
		return r;
	}
	a->started = 1;
	return 0;
}

void acceptor_stop(struct pkv_daemon *d)
{
	struct acceptor *a = &d->acceptor;
	uint64_t one = 1;

	if (!a->started)
		return;
	__atomic_store_n(&a->stop, 1, __ATOMIC_RELEASE);
	if (write(a->stop_fd, &one, sizeof(one)) < 0)
		pkv_warn("acceptor: cannot ask it to stop: %s", strerror(errno));
	pthread_join(a->thread, NULL);
	a->started = 0;
	for (uint32_t i = 0; i < a->n_queue; i++)
		close(a->queue[i].fd);
	for (uint32_t i = 0; i < a->n_held; i++)
		close(a->held[i].fd);
	free(a->queue);
	free(a->held);
	free(a->done_later);
	a->queue = a->held = NULL;
	a->done_later = NULL;
	a->n_later = a->cap_later = 0;
	a->n_queue = a->cap_queue = a->n_held = a->cap_held = a->n_gates = 0;
	pthread_mutex_destroy(&a->mu);
	close(a->stop_fd);
	a->stop_fd = -1;
	if (a->reserve_fd >= 0)
		close(a->reserve_fd);
	a->reserve_fd = -1;
}

/* The hellos (or hang-ups before one) the loop noted since its last take (a->mu held; the list is the loop's). */
static void apply_done_later(struct acceptor *a)
{
	uint64_t now = pkv_now_ns();

	for (uint32_t i = 0; i < a->n_later; i++) {
		struct uid_gate *g = gate_of(a, a->done_later[i], now, 0);

		if (g && g->n)
			g->n--;
	}
	a->n_later = 0;
}

int acceptor_take(struct pkv_daemon *d, struct accepted *out, uint32_t max)
{
	struct acceptor *a = &d->acceptor;
	uint32_t n;

	if (!a->started)
		return 0; /* stopped: what it held is closed */
	/*
	 * Never wait for the acceptor: it runs at a lower priority and may be
	 * preempted holding the lock, and the loop serves every uid. Busy: the
	 * caller tries again next turn.
	 */
	if (pthread_mutex_trylock(&a->mu))
		return ACCEPTOR_BUSY;
	apply_done_later(a);
	n = a->n_queue < max ? a->n_queue : max;
	if (n) {
		memcpy(out, a->queue, n * sizeof(*out));
		memmove(a->queue, a->queue + n, (a->n_queue - n) * sizeof(*out));
		a->n_queue -= n;
	}
	pthread_mutex_unlock(&a->mu);
	return (int)n;
}

void acceptor_hello_done(struct pkv_daemon *d, uid_t uid)
{
	struct acceptor *a = &d->acceptor;
	struct uid_gate *g;

	if (!a->started)
		return; /* stopped: nothing is counted any more */
	/* Counted down at the loop's next acceptor_take, this turn or the next (never waiting for the lock). */
	if (a->n_later == a->cap_later) {
		uint32_t c = a->cap_later ? a->cap_later * 2 : 16;
		uid_t *l = realloc(a->done_later, c * sizeof(*l));

		if (!l) {
			/* Out of memory: now, waiting for the lock this once. */
			pthread_mutex_lock(&a->mu);
			apply_done_later(a);
			g = gate_of(a, uid, pkv_now_ns(), 0);
			if (g && g->n)
				g->n--;
			pthread_mutex_unlock(&a->mu);
			return;
		}
		a->done_later = l;
		a->cap_later = c;
	}
	a->done_later[a->n_later++] = uid;
}
