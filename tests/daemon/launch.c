/* SPDX-License-Identifier: MIT */
/* The tests' one pagedkvd launcher: a private daemon on a fresh socket, started, restarted, stopped, cleaned up. */
#include "config.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/msg.h"
#include "launch.h"

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

const char *harness_backend;

static int spawn(struct dmn *d, const char *const *extra, int wait_ready)
{
	const char *top = getenv("PKV_TOP_BUILDDIR");
	char bin[512], plugin[512];
	const char *argv[48];
	int n = 0;

	if (!top)
		top = ".";
	snprintf(bin, sizeof(bin), "%s/src/daemon/pagedkvd", top);
	if (harness_backend)
		snprintf(plugin, sizeof(plugin), "%s", harness_backend);
	else
		snprintf(plugin, sizeof(plugin), "%s/examples/.libs/pkv_naive.so", top);
	if (access(bin, X_OK) || access(plugin, R_OK))
		return -ENOENT; /* not built: the caller skips */
	argv[n++] = bin;
	argv[n++] = "-f";
	argv[n++] = "--socket";
	argv[n++] = d->sock;
	argv[n++] = "--backend";
	argv[n++] = plugin;
	argv[n++] = "--memory-budget";
	argv[n++] = "256M";
	argv[n++] = "--workers";
	argv[n++] = "1";
	argv[n++] = "--log-level";
	argv[n++] = getenv("PKV_TEST_DAEMON_LOG") ? getenv("PKV_TEST_DAEMON_LOG") : "error";
	for (; extra && *extra && n < 46; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	d->pid = fork();
	if (d->pid < 0)
		return -errno;
	if (d->pid == 0) {
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	if (!wait_ready) {
		int st;

		if (waitpid(d->pid, &st, 0) != d->pid)
			return -errno;
		d->pid = 0;
		return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	}
	/* Ready when the socket accepts a connection. */
	for (int i = 0; i < 1000; i++) {
		int s = pkv_sock_connect(d->sock, 1000), st;

		if (s >= 0) {
			close(s);
			return 0;
		}
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			d->pid = 0;
			return -ECHILD;
		}
		sleep_ms(10);
	}
	return -ETIMEDOUT;
}

int dmn_start(struct dmn *d, const char *const *extra)
{
	snprintf(d->dir, sizeof(d->dir), "/tmp/pkvd-test-XXXXXX");
	if (!mkdtemp(d->dir))
		return -errno;
	snprintf(d->sock, sizeof(d->sock), "%s/pagedkv.sock", d->dir);
	return spawn(d, extra, 1);
}

int dmn_restart(struct dmn *d, const char *const *extra)
{
	return spawn(d, extra, 1);
}

int dmn_run_to_exit(struct dmn *d, const char *const *extra)
{
	return spawn(d, extra, 0);
}

int dmn_alive(struct dmn *d)
{
	int st;

	return d->pid > 0 && waitpid(d->pid, &st, WNOHANG) == 0;
}

int dmn_stop(struct dmn *d)
{
	int st;

	if (d->pid <= 0)
		return -1;
	kill(d->pid, SIGTERM);
	for (int i = 0; i < 1000; i++) {
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			d->pid = 0;
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		}
		sleep_ms(10);
	}
	dmn_kill(d);
	return -1;
}

void dmn_kill(struct dmn *d)
{
	if (d->pid > 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, NULL, 0);
	}
	d->pid = 0;
}

void dmn_cleanup(struct dmn *d)
{
	char p[256];

	dmn_kill(d);
	unlink(d->sock);
	snprintf(p, sizeof(p), "%s.lock", d->sock);
	unlink(p);
	rmdir(d->dir);
}
