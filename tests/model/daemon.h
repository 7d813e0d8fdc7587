/* SPDX-License-Identifier: MIT */
/* Starts the built pagedkvd with the CPU backend on a private socket for a model test, and stops it. */
#ifndef PKV_TEST_MODEL_DAEMON_H
#define PKV_TEST_MODEL_DAEMON_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct test_daemon {
	pid_t pid;
	char dir[64];
	char sock[100];
};

/* 0 when running; -ENOENT when the daemon or plugin is not built (the caller skips). */
static inline int test_daemon_start(struct test_daemon *d)
{
	const char *top = getenv("PKV_TOP_BUILDDIR");
	char bin[512], plugin[512];
	snprintf(bin, sizeof bin, "%s/src/daemon/pagedkvd", top ? top : ".");
	snprintf(plugin, sizeof plugin, "%s/plugins/cpu/.libs/pkv_cpu.so", top ? top : ".");
	if (access(bin, X_OK) || access(plugin, R_OK))
		return -ENOENT;
	snprintf(d->dir, sizeof d->dir, "/tmp/pkv-model-test-XXXXXX");
	if (!mkdtemp(d->dir))
		return -errno;
	snprintf(d->sock, sizeof d->sock, "%s/pagedkv.sock", d->dir);
	d->pid = fork();
	if (d->pid < 0)
		return -errno;
	if (d->pid == 0) {
		execl(bin, bin, "-f", "--socket", d->sock, "--backend", plugin, "--memory-budget", "512M",
		      "--workers", "2", "--log-level", getenv("PKV_TEST_DAEMON_LOG") ? getenv("PKV_TEST_DAEMON_LOG") : "error",
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 1000; i++) {
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), st;
		snprintf(a.sun_path, sizeof a.sun_path, "%s", d->sock);
		if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0) {
			close(s);
			return 0;
		}
		if (s >= 0)
			close(s);
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			d->pid = 0;
			return -ECHILD;
		}
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	return -ETIMEDOUT;
}

static inline void test_daemon_stop(struct test_daemon *d)
{
	int st;
	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		for (int i = 0; i < 500 && waitpid(d->pid, &st, WNOHANG) != d->pid; i++) {
			struct timespec ts = { 0, 10 * 1000 * 1000 };
			nanosleep(&ts, NULL);
			if (i == 499) {
				kill(d->pid, SIGKILL);
				waitpid(d->pid, &st, 0);
			}
		}
	}
	d->pid = 0;
	unlink(d->sock);
	char lock[128];
	snprintf(lock, sizeof lock, "%s.lock", d->sock);
	unlink(lock);
	rmdir(d->dir);
}

#endif
