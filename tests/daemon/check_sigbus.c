/* SPDX-License-Identifier: MIT */
/* The daemon's SIGBUS handler on real faults: a watched mapping survives as zeros, anything else still dies. */
#include "config.h"
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "daemon/sigbus.h"
#include "../suite_main.h"

#define PAGES 4

struct victim {
	int fd;
	volatile uint8_t *map;
	size_t len;
};

/* A shared mapping of a memfd that is then truncated: every access is a real SIGBUS. */
static void make_victim(struct victim *v)
{
	v->len = PAGES * (size_t)sysconf(_SC_PAGESIZE);
	v->fd = memfd_create("sigbus-victim", MFD_CLOEXEC);
	ck_assert_int_ge(v->fd, 0);
	ck_assert_int_eq(ftruncate(v->fd, (off_t)v->len), 0);
	v->map = mmap(NULL, v->len, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
	ck_assert_ptr_ne((void *)v->map, MAP_FAILED);
	memset((void *)v->map, 0xab, v->len);
	ck_assert_int_eq(ftruncate(v->fd, 0), 0);
}

static void drop_victim(struct victim *v)
{
	munmap((void *)v->map, v->len);
	close(v->fd);
}

START_TEST(test_watched_fault_becomes_zeros_and_a_flag)
{
	struct victim v;
	uint64_t woken = 0;
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), slot, other;
	struct victim w;

	ck_assert_int_ge(efd, 0);
	ck_assert_int_eq(pkv_sigbus_install(efd), 0);
	make_victim(&v);
	make_victim(&w);
	slot = pkv_sigbus_watch((void *)v.map, v.len);
	other = pkv_sigbus_watch((void *)w.map, w.len);
	ck_assert_int_ge(slot, 0);
	ck_assert_int_ne(slot, other);
	ck_assert_int_eq(pkv_sigbus_faulted(slot), 0);
	/* The file is gone under the mapping: this read is a SIGBUS, handled. */
	ck_assert_uint_eq(v.map[3 * 4096 + 5], 0);
	ck_assert_int_eq(pkv_sigbus_faulted(slot), 1);
	/* The whole mapping was replaced, not one page: no second fault, writes land in private memory. */
	v.map[0] = 7;
	ck_assert_uint_eq(v.map[0], 7);
	ck_assert_uint_eq(v.map[4096], 0);
	ck_assert_int_eq(read(efd, &woken, sizeof(woken)), (ssize_t)sizeof(woken));
	ck_assert_uint_eq(woken, 1);
	/* Another client's mapping is not affected until it faults itself. */
	ck_assert_int_eq(pkv_sigbus_faulted(other), 0);
	pkv_sigbus_unwatch(slot);
	pkv_sigbus_unwatch(other);
	/* A freed slot is reused with a clear flag. */
	ck_assert_int_eq(pkv_sigbus_watch((void *)v.map, v.len), slot);
	ck_assert_int_eq(pkv_sigbus_faulted(slot), 0);
	pkv_sigbus_unwatch(slot);
	drop_victim(&v);
	drop_victim(&w);
	close(efd);
}
END_TEST

static void *read_from_thread(void *arg)
{
	struct victim *v = arg;
	uintptr_t sum = 0;

	/* What the CPU plugin does with Q/K/V in a client's arena, on a worker thread. */
	for (size_t i = 0; i < v->len; i += 512)
		sum += v->map[i];
	return (void *)sum;
}

START_TEST(test_fault_on_another_thread_is_survived)
{
	struct victim v;
	pthread_t t;
	void *sum = (void *)1;
	int slot;

	ck_assert_int_eq(pkv_sigbus_install(-1), 0);
	make_victim(&v);
	slot = pkv_sigbus_watch((void *)v.map, v.len);
	ck_assert_int_ge(slot, 0);
	ck_assert_int_eq(pthread_create(&t, NULL, read_from_thread, &v), 0);
	ck_assert_int_eq(pthread_join(t, &sum), 0);
	ck_assert_ptr_eq(sum, NULL);
	ck_assert_int_eq(pkv_sigbus_faulted(slot), 1);
	pkv_sigbus_unwatch(slot);
	drop_victim(&v);
}
END_TEST

/* Many watched mappings: the table grows past its first chunk, and each fault finds its own slot. */
START_TEST(test_many_watches)
{
	enum { N = 200 };
	static struct victim v[N];
	int slot[N];

	ck_assert_int_eq(pkv_sigbus_install(-1), 0);
	for (int i = 0; i < N; i++) {
		make_victim(&v[i]);
		slot[i] = pkv_sigbus_watch((void *)v[i].map, v[i].len);
		ck_assert_int_ge(slot[i], 0);
	}
	ck_assert_uint_eq(v[N - 3].map[100], 0);
	for (int i = 0; i < N; i++)
		ck_assert_int_eq(pkv_sigbus_faulted(slot[i]), i == N - 3);
	for (int i = 0; i < N; i++) {
		pkv_sigbus_unwatch(slot[i]);
		drop_victim(&v[i]);
	}
}
END_TEST

static void previous_handler(int sig, siginfo_t *si, void *ctx)
{
	(void)sig;
	(void)si;
	(void)ctx;
	_exit(42);
}

/* Forks a child that faults in an unwatched mapping; returns its wait status. */
static int fault_unwatched(int with_previous)
{
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct sigaction sa;
		struct victim v, other;

		memset(&sa, 0, sizeof(sa));
		sigemptyset(&sa.sa_mask);
		if (with_previous) {
			sa.sa_sigaction = previous_handler;
			sa.sa_flags = SA_SIGINFO;
		} else {
			sa.sa_handler = SIG_DFL; /* whatever a sanitizer installed: a plain death */
		}
		sigaction(SIGBUS, &sa, NULL);
		if (pkv_sigbus_install(-1))
			_exit(3);
		make_victim(&v);
		make_victim(&other);
		/* Watching some other range must not make this one survivable. */
		if (pkv_sigbus_watch((void *)other.map, other.len) < 0)
			_exit(4);
		(void)v.map[0];
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return st;
}

START_TEST(test_unwatched_fault_still_kills)
{
	int st = fault_unwatched(0);

	ck_assert(WIFSIGNALED(st));
	ck_assert_int_eq(WTERMSIG(st), SIGBUS);
}
END_TEST

START_TEST(test_unwatched_fault_goes_to_previous_handler)
{
	int st = fault_unwatched(1);

	ck_assert(WIFEXITED(st));
	ck_assert_int_eq(WEXITSTATUS(st), 42);
}
END_TEST

/* A SIGBUS sent with kill(2) is no fault: it must not be swallowed. */
START_TEST(test_sent_sigbus_is_not_swallowed)
{
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		signal(SIGBUS, SIG_DFL);
		if (pkv_sigbus_install(-1))
			_exit(3);
		raise(SIGBUS);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFSIGNALED(st));
	ck_assert_int_eq(WTERMSIG(st), SIGBUS);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sigbus");
	TCase *tc = tcase_create("sigbus");

	tcase_add_test(tc, test_watched_fault_becomes_zeros_and_a_flag);
	tcase_add_test(tc, test_fault_on_another_thread_is_survived);
	tcase_add_test(tc, test_many_watches);
	tcase_add_test(tc, test_unwatched_fault_still_kills);
	tcase_add_test(tc, test_unwatched_fault_goes_to_previous_handler);
	tcase_add_test(tc, test_sent_sigbus_is_not_swallowed);
	suite_add_tcase(s, tc);
	return suite_main(s);
}
