/* SPDX-License-Identifier: MIT */
/* Issue 9, client memory: hugetlbfs regions refused, a SIGBUS in client memory ends that client only, arena quotas, big replies. */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "common/msg.h"
#include "common/region.h"
#include "harness.h"
#include "../suite_main.h"

#define UID_HOSTILE 61011
#define UID_VICTIM 61012
#define HUGE (2u << 20)

static struct dmn D;

static void start(const char *const *extra)
{
	ck_assert_int_eq(dmn_start(&D, extra), 0);
	ck_assert_int_eq(chmod(D.dir, 0755), 0);
}

static void stop(void)
{
	ck_assert_int_eq(dmn_stop(&D), 0);
	dmn_cleanup(&D);
}

#ifdef HUGE_TESTS
/* ---------------------------------------------------------------- huge pages */

static long read_long(const char *path)
{
	FILE *f = fopen(path, "r");
	long v = -1;

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static int write_long(const char *path, long v)
{
	FILE *f = fopen(path, "w");
	int r;

	if (!f)
		return -1;
	r = fprintf(f, "%ld\n", v) > 0 ? 0 : -1;
	return fclose(f) || r ? -1 : 0;
}

#define NR_HUGE "/proc/sys/vm/nr_hugepages"
static long huge_orig = -1;

static void huge_restore(void);

/* Adds n huge pages to the pool (restored by huge_restore); 0, or -1 when this machine cannot. */
static int huge_add(long n)
{
	long now;

	huge_orig = read_long(NR_HUGE);
	if (huge_orig < 0 || write_long(NR_HUGE, huge_orig + n))
		return -1;
	/* Given back even when an assertion ends the test early. */
	atexit(huge_restore);
	now = read_long(NR_HUGE);
	if (now < huge_orig + n) {
		write_long(NR_HUGE, huge_orig);
		return -1;
	}
	return 0;
}

static void huge_restore(void)
{
	if (huge_orig >= 0)
		write_long(NR_HUGE, huge_orig);
	huge_orig = -1;
}

/*
 * A raw client whose region is one huge page of a hugetlbfs memfd, sealed
 * exactly as the daemon asks (shrink + grow): what the attacker passes.
 */
static int hugetlb_raw_n(struct raw *r, const char *sock, uint64_t size)
{
	struct pkv_shm_hdr h;

	memset(r, 0, sizeof(*r));
	r->sock = r->memfd = r->sq_bell = -1;
	if (pkv_region_layout(4096, 64, 64, &h) || pkv_region_layout(size - h.arena_off, 64, 64, &r->hdr) ||
	    r->hdr.region_size != size)
		return -EINVAL;
	r->memfd = memfd_create("huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
	if (r->memfd < 0 || ftruncate(r->memfd, (off_t)size) < 0)
		return -errno;
	r->size = size;
	r->region = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd, 0);
	if (r->region == MAP_FAILED)
		return -errno;
	memcpy(r->region, &r->hdr, sizeof(r->hdr));
	if (fcntl(r->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		return -errno;
	pkv_ring_bind(&r->sq, r->region + r->hdr.sq_ring_off, r->region + r->hdr.sq_sqes_off,
		      r->hdr.sq_entries, r->hdr.sqe_size, &r->hdr);
	pkv_ring_bind(&r->cq, r->region + r->hdr.cq_ring_off, r->region + r->hdr.cq_cqes_off,
		      r->hdr.cq_entries, r->hdr.cqe_size, &r->hdr);
	*r->sq.sh_flags = PKV_RING_NEED_WAKEUP;
	r->arena = r->region + r->hdr.arena_off;
	r->sq_bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	r->sock = pkv_sock_connect(sock, 5000);
	return r->sock < 0 ? r->sock : 0;
}

static int hugetlb_raw(struct raw *r, const char *sock)
{
	return hugetlb_raw_n(r, sock, HUGE);
}

/* Status of an unsolicited reply the daemon sent before hanging up (naming SIGBUS), or -EPROTO. */
static int raw_reason(struct raw *r)
{
	struct pkv_msg_reply rep;
	ssize_t n = pkv_msg_recv(r->sock, &rep, sizeof(rep), NULL, 0, NULL, 5000);

	if (n < (ssize_t)PKV_REPLY_HDR_SIZE || !memmem(rep.text, (size_t)n - PKV_REPLY_HDR_SIZE, "SIGBUS", 6))
		return -EPROTO;
	return rep.status;
}

/* Takes every free huge page (kept until the process exits); returns how many. */
static int take_free_huge_pages(void)
{
	int taken = 0;

	for (int i = 0; i < 64; i++) {
		int fd = memfd_create("hog", MFD_CLOEXEC | MFD_HUGETLB);

		if (fd < 0 || ftruncate(fd, HUGE) < 0 ||
		    mmap(NULL, HUGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0) == MAP_FAILED)
			break;
		taken++;
	}
	return taken;
}

/* Whether the daemon serves a client of uid (fork; attach, one full step, checked against the reference). */
static int serves(uid_t uid, const char *pool)
{
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		static const int32_t toks[5] = { 3, 1, 4, 1, 5 };
		float out[T_LAYERS * 5 * T_HEADS * T_DIM], ref[5 * T_HEADS * T_DIM];
		struct pkv_client *c;
		uint32_t seq, n_cached;

		if (uid && (setgid(uid) || setuid(uid)))
			_exit(2);
		c = test_client(D.sock, pool, 1 << 20, 5000);
		if (!c || pkv_seq_open(c, toks, 5, &seq, &n_cached) || run_step(c, seq, toks, 0, 5, out))
			_exit(3);
		for (uint32_t l = 0; l < T_LAYERS; l++) {
			ref_attend(toks, 5, 0, l, ref);
			if (max_diff(out + (size_t)l * 5 * T_HEADS * T_DIM, ref, 5 * T_HEADS * T_DIM) > 1e-4f)
				_exit(4);
		}
		pkv_disconnect(c);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

START_TEST(test_hugetlbfs_region_refused)
{
	pid_t pid;
	int st;

	ck_assert_int_eq(huge_add(1), 0); /* main() probed it */
	start((const char *const[]){ "--socket-mode", "0666", NULL });
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		char why[512] = "";
		struct raw r;
		int e;

		if (setgid(UID_HOSTILE) || setuid(UID_HOSTILE))
			_exit(2);
		if (hugetlb_raw(&r, D.sock))
			_exit(3);
		e = raw_hello(&r, PKV_PROTO_VERSION, HUGE, 1, why, sizeof(why));
		if (e != -EINVAL)
			_exit(4);
		if (!strstr(why, "hugetlbfs"))
			_exit(5);
		raw_close(&r);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	huge_restore();
	ck_assert_int_eq(child_status(st), 0);
	ck_assert(dmn_alive(&D));
	/* The refused uid and another one are still served. */
	ck_assert_int_eq(serves(UID_VICTIM, "victim"), 0);
	ck_assert_int_eq(serves(UID_HOSTILE, "hostile"), 0);
	stop();
}
END_TEST

/* Appends opt=value to ASAN_OPTIONS (a preloaded shim must not trip the link-order check). */
static void asan_allow_preload(void)
{
	const char *old = getenv("ASAN_OPTIONS");
	char buf[1024];

	snprintf(buf, sizeof(buf), "%s%sverify_asan_link_order=0", old ? old : "", old && *old ? ":" : "");
	setenv("ASAN_OPTIONS", buf, 1);
}

/* Preloads the fstatfs shim into the next daemon (see fstatfs_shim.c). */
static int preload_shim(void)
{
	const char *top = getenv("PKV_TOP_BUILDDIR");
	static char shim[512];

	snprintf(shim, sizeof(shim), "%s/tests/daemon/.libs/pkv_fstatfs_shim.so", top ? top : ".");
	if (access(shim, R_OK))
		return -errno;
	setenv("LD_PRELOAD", shim, 1);
	asan_allow_preload();
	return 0;
}

/*
 * The attack, carried all the way: with the filesystem check fooled
 * (fstatfs_shim), a client punches the huge page holding its arena data and
 * takes every free huge page, then asks for a seq_open whose tokens lie in
 * it: the loop thread's copy of the tokens is a real SIGBUS. (The rings sit
 * in the first huge page, which stays: the daemon reads them all the time
 * and would otherwise win the freed page back before the client takes it.)
 * That client loses its connection; the daemon and everyone else carry on.
 */
START_TEST(test_sigbus_in_client_memory_costs_only_that_client)
{
	char audit[4096];
	pid_t pid;
	int st;

	ck_assert_int_eq(preload_shim(), 0);
	ck_assert_int_eq(huge_add(2), 0);
	start((const char *const[]){ "--socket-mode", "0666", NULL });
	unsetenv("LD_PRELOAD");
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pkv_msg_attach m;
		struct pkv_sqe e = { .opcode = PKV_OP_NOP };
		struct pkv_cqe c;
		char why[512] = "";
		struct raw r;
		uint64_t hi;

		if (setgid(UID_HOSTILE) || setuid(UID_HOSTILE))
			_exit(2);
		if (hugetlb_raw_n(&r, D.sock, 2 * (uint64_t)HUGE))
			_exit(3);
		if (raw_hello(&r, PKV_PROTO_VERSION, r.size, 1, why, sizeof(why)))
			_exit(4); /* the shim should have let it in */
		raw_attach_msg(&m, "hostile");
		if (raw_attach(&r, &m, why, sizeof(why)) || raw_call(&r, &e, &c) || c.res)
			_exit(5);
		/* Tokens in the second huge page (written: an untouched page keeps its reservation). */
		hi = (HUGE - r.hdr.arena_off + 4095) & ~4095ull;
		memset(r.arena + hi, 0, 4096);
		/* Give that page back to the pool, then take every free huge page. */
		if (fallocate(r.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, HUGE, HUGE) < 0)
			_exit(6);
		if (!take_free_huge_pages())
			_exit(7);
		e = (struct pkv_sqe){ .opcode = PKV_OP_SEQ_OPEN, .n = 16, .off = { hi } };
		if (raw_call(&r, &e, &c) != -ECONNRESET)
			_exit(8);
		/* The reason arrives on the control socket (the region's error text is gone). */
		if (raw_reason(&r) != -EFAULT)
			_exit(9);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	huge_restore();
	ck_assert_int_eq(child_status(st), 0);
	ck_assert(dmn_alive(&D));
	ck_assert_int_eq(serves(UID_VICTIM, "victim"), 0);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, audit, sizeof(audit)), 0);
	stop();
}
END_TEST

/*
 * The same fault, taken by the backend on the worker thread: the ring stays
 * readable (first huge page), the attend's Q/K/V/O lie in the second, punched
 * after the step began. The backend's read faults; the daemon survives, the
 * client is dropped, its step is released.
 */
START_TEST(test_sigbus_in_the_backend_costs_only_that_client)
{
	char audit[4096];
	pid_t pid;
	int st;

	ck_assert_int_eq(preload_shim(), 0);
	ck_assert_int_eq(huge_add(2), 0);
	start((const char *const[]){ "--socket-mode", "0666", NULL });
	unsetenv("LD_PRELOAD");
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pkv_msg_attach m;
		struct pkv_sqe e;
		struct pkv_cqe c;
		char why[512] = "";
		struct raw r;
		uint64_t hi;
		uint32_t seq, *u;
		int32_t *tok;

		if (setgid(UID_HOSTILE) || setuid(UID_HOSTILE))
			_exit(2);
		if (hugetlb_raw_n(&r, D.sock, 2 * (uint64_t)HUGE))
			_exit(3);
		if (raw_hello(&r, PKV_PROTO_VERSION, r.size, 1, why, sizeof(why)))
			_exit(4);
		raw_attach_msg(&m, "hostile");
		if (raw_attach(&r, &m, why, sizeof(why)))
			_exit(5);
		/* Open a sequence of 4 tokens and begin a step of 4 more, all from the first huge page. */
		tok = (int32_t *)r.arena;
		for (int i = 0; i < 4; i++)
			tok[i] = 5 + i;
		e = (struct pkv_sqe){ .opcode = PKV_OP_SEQ_OPEN, .n = 4, .off = { 0 } };
		if (raw_call(&r, &e, &c) || c.res)
			_exit(6);
		seq = (uint32_t)c.payload[0];
		u = (uint32_t *)(r.arena + 64);
		u[0] = seq;
		u[1] = 4;
		e = (struct pkv_sqe){ .opcode = PKV_OP_STEP_BEGIN, .n = 1, .off = { 64, 68, 0 } };
		if (raw_call(&r, &e, &c) || c.res)
			_exit(7);
		/* Q, K, V, O in the second huge page; then that page goes back and the pool is taken. */
		hi = (HUGE - r.hdr.arena_off + 4095) & ~4095ull;
		e = (struct pkv_sqe){ .opcode = PKV_OP_ATTEND, .layer = 0,
				      .off = { hi, hi + 8192, hi + 16384, hi + 24576 } };
		/* Written first, as a client does (an untouched page keeps its reservation when punched). */
		memset(r.arena + hi, 0x3c, 32768);
		if (fallocate(r.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, HUGE, HUGE) < 0)
			_exit(8);
		if (!take_free_huge_pages())
			_exit(9);
		/* Its completion cannot come: the daemon's copy of our memory is zeros by then. */
		if (raw_call(&r, &e, &c) != -ECONNRESET)
			_exit(10);
		if (raw_reason(&r) != -EFAULT)
			_exit(11);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	huge_restore();
	ck_assert_int_eq(child_status(st), 0);
	ck_assert(dmn_alive(&D));
	ck_assert_int_eq(serves(UID_VICTIM, "victim"), 0);
	ck_assert_int_eq(audit_until_clean(D.sock, 5000, audit, sizeof(audit)), 0);
	stop();
}
END_TEST

#else
/* ---------------------------------------------------------------- arena quota */

static int connect_as(uid_t uid, int n, size_t arena)
{
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct pkv_connect_opts o = { .socket_path = D.sock, .arena_bytes = arena, .timeout_ms = 5000 };
		struct pkv_client *c;
		int i, r = 0;

		if (uid && (setgid(uid) || setuid(uid)))
			_exit(100);
		for (i = 0; i < n; i++) {
			r = pkv_connect(&o, &c);
			if (r)
				break;
		}
		/* Exit code: how many connected, and whether the refusal was the quota. */
		_exit(i + (r == -EDQUOT ? 50 : 0));
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return child_status(st);
}

START_TEST(test_arena_bytes_per_uid)
{
	start((const char *const[]){ "--socket-mode", "0666", "--max-arena-per-uid", "3M", NULL });
	/* 1 MiB arenas (plus rings): two fit in 3 MiB, the third is refused for the quota... */
	ck_assert_int_eq(connect_as(UID_HOSTILE, 3, 1 << 20), 2 + 50);
	/* ...however many connections: one arena larger than the quota is refused too. */
	ck_assert_int_eq(connect_as(UID_HOSTILE, 1, 4 << 20), 0 + 50);
	/* Another uid has its own. */
	ck_assert_int_eq(connect_as(UID_VICTIM, 2, 1 << 20), 2);
	ck_assert(dmn_alive(&D));
	stop();
}
END_TEST

/* ---------------------------------------------------------------- replies of any size */

#define N_POOLS 3000

static size_t count(const char *s, const char *needle)
{
	size_t n = 0;

	for (; (s = strstr(s, needle)); s++)
		n++;
	return n;
}

START_TEST(test_replies_of_thousands_of_pools)
{
	size_t cap = 16u << 20;
	char *out = malloc(cap), name[32];

	ck_assert_ptr_nonnull(out);
	/* One uid owns every pool, idle once created: per-uid pool limits and the idle reaper must let them be. */
	start((const char *const[]){ "--max-clients-per-uid", "100000", "--memory-budget", "1G", "--uid-max-pools",
				     "65536", "--uid-budget-share", "100", "--pool-idle-grace-s", "3600", NULL });
	for (int i = 0; i < N_POOLS; i++) {
		struct pkv_msg_attach m;
		struct raw r;

		ck_assert_int_eq(raw_open(&r, D.sock, 4096, F_SEAL_SHRINK | F_SEAL_GROW), 0);
		ck_assert_int_eq(raw_hello(&r, PKV_PROTO_VERSION, r.size, 1, NULL, 0), 0);
		snprintf(name, sizeof(name), "p%d", i);
		raw_attach_msg(&m, name);
		m.geo.num_blocks = 2; /* small pools: thousands fit the budget */
		ck_assert_int_eq(raw_attach(&r, &m, NULL, 0), 0);
		raw_close(&r);
	}
	/* Text: every pool's first line, whole. */
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_TEXT, out, cap), 0);
	ck_assert_uint_gt(strlen(out), 108030);
	ck_assert_uint_eq(count(out, "\npool p"), N_POOLS);
	ck_assert_ptr_nonnull(strstr(out, "pool p2999: "));
	/* JSON: every pool, and the closing of the document. */
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_JSON, out, cap), 0);
	ck_assert_uint_eq(count(out, "{\"name\":\"p"), N_POOLS);
	ck_assert_str_eq(out + strlen(out) - 3, "]}\n");
	/* Prometheus: the last family has every pool. */
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_METRICS, PKV_FMT_PROM, out, cap), 0);
	ck_assert_uint_eq(count(out, "pagedkv_cow_copies_total{pool=\"p"), N_POOLS);
	/* Audit: every pool, then the verdict. */
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_AUDIT, PKV_FMT_TEXT, out, cap), 0);
	ck_assert_uint_eq(count(out, ": ok\n"), N_POOLS);
	ck_assert_ptr_nonnull(strstr(out, "audit: 0 problems\n"));
	free(out);
	stop();
}
END_TEST

/* A control client that asks twice without reading is cut off (one reply in flight), the daemon lives. */
START_TEST(test_unread_replies_do_not_pile_up)
{
	struct pkv_msg_hello h = { { PKV_MSG_HELLO, sizeof(h) }, PKV_PROTO_VERSION, PKV_ROLE_CTL, 0 };
	struct pkv_msg_ctl m = { { PKV_MSG_CTL, sizeof(m) }, PKV_CTL_STATUS, PKV_FMT_JSON };
	struct pkv_msg_reply rep;
	struct pollfd p;
	char out[4096];
	int s, sent = 0;

	start(NULL);
	s = pkv_sock_connect(D.sock, 5000);
	ck_assert_int_ge(s, 0);
	ck_assert_int_eq(pkv_msg_send(s, &h, sizeof(h), NULL, 0), 0);
	ck_assert_int_ge(pkv_msg_recv(s, &rep, sizeof(rep), NULL, 0, NULL, 5000), (ssize_t)PKV_REPLY_HDR_SIZE);
	for (int i = 0; i < 1000; i++)
		sent += pkv_msg_send(s, &m, sizeof(m), NULL, 0) == 0;
	ck_assert_int_gt(sent, 1);
	p = (struct pollfd){ .fd = s, .events = POLLRDHUP };
	ck_assert_int_eq(poll(&p, 1, 10000), 1);
	ck_assert(p.revents & (POLLRDHUP | POLLHUP));
	close(s);
	ck_assert(dmn_alive(&D));
	ck_assert_int_eq(ctl_cmd(D.sock, PKV_CTL_STATUS, PKV_FMT_TEXT, out, sizeof(out)), 0);
	stop();
}
END_TEST

#endif

/*
 * Built twice: check_isolation_huge (HUGE_TESTS) holds the tests that need
 * huge pages and exits 77 where none can be set up; check_isolation_mem
 * holds the rest.
 */
static Suite *suite(void)
{
	Suite *s = suite_create("isolation_mem");
	TCase *t = tcase_create("mem");

#ifdef HUGE_TESTS
	tcase_add_test(t, test_hugetlbfs_region_refused);
	tcase_add_test(t, test_sigbus_in_client_memory_costs_only_that_client);
	tcase_add_test(t, test_sigbus_in_the_backend_costs_only_that_client);
#else
	tcase_add_test(t, test_arena_bytes_per_uid);
	tcase_add_test(t, test_replies_of_thousands_of_pools);
	tcase_add_test(t, test_unread_replies_do_not_pile_up);
#endif
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	/* Needs root: clients run as other uids, and huge pages are set up and given back. */
	if (geteuid() != 0)
		return 77;
#ifdef HUGE_TESTS
	/* Huge pages are a machine-wide pool: each test adds one and gives it back. */
	if (huge_add(1)) {
		fprintf(stderr, "no huge page can be added here (%s)\n", NR_HUGE);
		return 77;
	}
	huge_restore();
	{
		int probe = memfd_create("probe", MFD_CLOEXEC | MFD_HUGETLB);

		if (probe < 0) {
			fprintf(stderr, "memfd_create(MFD_HUGETLB): %s\n", strerror(errno));
			return 77;
		}
		close(probe);
	}
#endif
	return suite_main(suite());
}
