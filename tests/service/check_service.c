/* SPDX-License-Identifier: MIT */
/* pagedkvd as systemd runs it, without systemd: this test is the launcher. It passes a listening socket
 * as fd 3 with LISTEN_FDS/LISTEN_PID and reads sd_notify datagrams from NOTIFY_SOCKET; then SIGHUP
 * reloads limits without dropping a client, and a plain start keeps its pid file and lock tidy. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pagedkv/pagedkv.h>
#include "../daemon/harness.h"
#include "../suite_main.h"

static char dir[64], sock[128], notify[128], conf[128], log_path[128];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/pkv-svc.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	snprintf(notify, sizeof(notify), "%s/notify", dir);
	snprintf(conf, sizeof(conf), "%s/pagedkvd.conf", dir);
	snprintf(log_path, sizeof(log_path), "%s/log", dir);
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd))
		fprintf(stderr, "# cannot remove %s\n", dir);
}

static void write_conf(const char *text)
{
	FILE *f = fopen(conf, "w");

	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

static int bound_socket(int type, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/* Starts pagedkvd the way systemd does: the socket as fd 3, LISTEN_PID set to the child's own pid. */
static pid_t launch(int listen_fd, const char *const *extra)
{
	char plugin[512], bin[512];
	const char *top = getenv("PKV_TOP_BUILDDIR");
	const char *argv[32];
	int n = 0;
	pid_t pid;

	snprintf(bin, sizeof(bin), "%s/src/daemon/pagedkvd", top ? top : "..");
	snprintf(plugin, sizeof(plugin), "%s/examples/.libs/pkv_naive.so", top ? top : "..");
	argv[n++] = bin;
	argv[n++] = "-f";
	argv[n++] = "--config";
	argv[n++] = conf;
	argv[n++] = "--backend";
	argv[n++] = plugin;
	argv[n++] = "--workers";
	argv[n++] = "1";
	while (extra && *extra)
		argv[n++] = *extra++;
	argv[n] = NULL;
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		char num[32];
		int log = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);

		if (log >= 0)
			dup2(log, 2);
		if (listen_fd >= 0) {
			if (dup2(listen_fd, 3) < 0) /* dup2 clears close-on-exec on fd 3 */
				_exit(126);
			snprintf(num, sizeof(num), "%d", (int)getpid());
			setenv("LISTEN_PID", num, 1);
			setenv("LISTEN_FDS", "1", 1);
		}
		setenv("NOTIFY_SOCKET", notify, 1);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* The next sd_notify datagram that mentions `want`; fails after 60 s of silence. */
static void expect_notify(int nfd, const char *want)
{
	char buf[512];

	for (;;) {
		ssize_t n = recv(nfd, buf, sizeof(buf) - 1, 0);

		ck_assert_msg(n > 0, "no sd_notify datagram containing %s (%s)", want, strerror(errno));
		buf[n] = 0;
		if (strstr(buf, want))
			return;
	}
}

static int wait_exit(pid_t pid)
{
	int st;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int file_has(const char *path, const char *needle)
{
	char buf[65536];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	return strstr(buf, needle) != NULL;
}

START_TEST(socket_activation_notify_and_reload)
{
	struct timeval tv = { .tv_sec = 60 };
	struct pkv_client *c, *c2;
	char lock[160], refusal[64];
	int lfd, nfd;
	pid_t pid;

	write_conf("memory_budget = 64M   # small: a test\nlog_level = info\nmax_clients_per_uid = 4\n");
	lfd = bound_socket(SOCK_SEQPACKET, sock);
	ck_assert_int_eq(listen(lfd, 16), 0);
	nfd = bound_socket(SOCK_DGRAM, notify);
	ck_assert_int_eq(setsockopt(nfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	pid = launch(lfd, NULL);
	close(lfd); /* the daemon holds the only copy now, as with systemd's socket unit */
	expect_notify(nfd, "READY=1");

	c = test_client(sock, "p", 1 << 20, 10000);
	ck_assert_msg(c != NULL, "cannot use the socket passed as fd 3");
	ck_assert_int_eq(pkv_nop(c), 0);

	/* SIGHUP: one connection per uid from now on, debug logging; the connected client stays. */
	write_conf("memory_budget = 64M\nlog_level = debug\nmax_clients_per_uid = 1\n");
	ck_assert_int_eq(kill(pid, SIGHUP), 0);
	expect_notify(nfd, "RELOADING=1");
	expect_notify(nfd, "READY=1");
	ck_assert_int_eq(pkv_nop(c), 0);
	c2 = test_client(sock, "p", 1 << 20, 10000);
	ck_assert_msg(c2 == NULL, "max_clients_per_uid = 1 was not applied by SIGHUP");
	ck_assert_int_eq(pkv_nop(c), 0);
	ck_assert(file_has(log_path, "reload: max_clients_per_uid = 1 (was 4)"));
	ck_assert(file_has(log_path, "reload: log_level = debug (was info)"));
	snprintf(refusal, sizeof(refusal), "(uid %u, pid %d)", (unsigned)getuid(), (int)getpid());
	ck_assert_msg(file_has(log_path, refusal), "the refusal does not name the client %s", refusal);
	pkv_disconnect(c);

	ck_assert_int_eq(kill(pid, SIGTERM), 0);
	expect_notify(nfd, "STOPPING=1");
	ck_assert_int_eq(wait_exit(pid), 0);
	/* systemd owns the socket file; there was nothing to lock */
	ck_assert_int_eq(access(sock, F_OK), 0);
	snprintf(lock, sizeof(lock), "%s.lock", sock);
	ck_assert_int_ne(access(lock, F_OK), 0);
	close(nfd);
}
END_TEST

START_TEST(activation_refuses_a_wrong_socket)
{
	int fd = bound_socket(SOCK_DGRAM, sock);
	pid_t pid;

	write_conf("log_level = error\n");
	pid = launch(fd, NULL);
	close(fd);
	ck_assert_int_eq(wait_exit(pid), 1);
	ck_assert(file_has(log_path, "must be a listening AF_UNIX SOCK_SEQPACKET socket"));
}
END_TEST

START_TEST(pid_file_and_lock_removed_at_clean_stop)
{
	const char *extra[] = { "--socket", sock, "--pid-file", NULL, NULL };
	char pidf[160], lock[160], buf[32] = "";
	int nfd;
	struct timeval tv = { .tv_sec = 60 };
	pid_t pid;
	FILE *f;

	snprintf(pidf, sizeof(pidf), "%s/pagedkvd.pid", dir);
	snprintf(lock, sizeof(lock), "%s.lock", sock);
	extra[3] = pidf;
	write_conf("log_level = warn # trailing comment\n");
	nfd = bound_socket(SOCK_DGRAM, notify);
	ck_assert_int_eq(setsockopt(nfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	pid = launch(-1, extra);
	expect_notify(nfd, "READY=1");
	f = fopen(pidf, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), f));
	fclose(f);
	ck_assert_int_eq(atoi(buf), pid);
	ck_assert_int_eq(access(lock, F_OK), 0);
	ck_assert_int_eq(kill(pid, SIGTERM), 0);
	ck_assert_int_eq(wait_exit(pid), 0);
	ck_assert_msg(access(pidf, F_OK) != 0, "pid file left behind");
	ck_assert_msg(access(lock, F_OK) != 0, "lock file left behind");
	ck_assert_msg(access(sock, F_OK) != 0, "socket left behind");
	close(nfd);
}
END_TEST

int main(void)
{
	Suite *su = suite_create("service");
	TCase *tc = tcase_create("systemd-protocols");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, socket_activation_notify_and_reload);
	tcase_add_test(tc, activation_refuses_a_wrong_socket);
	tcase_add_test(tc, pid_file_and_lock_removed_at_clean_stop);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
