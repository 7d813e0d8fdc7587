/* SPDX-License-Identifier: MIT */
/* sd_notify and socket activation as systemd documents them (sd_notify(3), sd_listen_fds(3)). */
#include "config.h"
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "daemon/sd.h"

#define SD_LISTEN_FDS_START 3

int pkv_sd_notify(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len;
	int fd, r = 0;

	if (!path || !*path)
		return 0;
	len = (socklen_t)strlen(path);
	if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sa.sun_path))
		return -EINVAL;
	memcpy(sa.sun_path, path, len);
	if (path[0] == '@')
		sa.sun_path[0] = 0; /* abstract namespace */
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa,
		   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0)
		r = -errno;
	close(fd);
	return r;
}

int pkv_sd_listen_fd(char *path, unsigned long path_len, char *why, unsigned long why_len)
{
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	struct sockaddr_un sa;
	socklen_t sl = sizeof(sa);
	int fd = SD_LISTEN_FDS_START, type = 0, listening = 0;
	socklen_t ol = sizeof(int);
	char *end;
	long n;

	if (!pid || !fds || strtol(pid, &end, 10) != (long)getpid() || *end)
		return -ENOENT;
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	n = strtol(fds, &end, 10);
	if (*end || n != 1) {
		snprintf(why, why_len, "LISTEN_FDS=%s: pagedkvd takes exactly one socket", fds);
		return -EINVAL;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &ol) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
		snprintf(why, why_len, "fd 3 from LISTEN_FDS is not a socket: %s", strerror(errno));
		return -ENOTSOCK;
	}
	if (sa.sun_family != AF_UNIX || type != SOCK_SEQPACKET || !listening) {
		snprintf(why, why_len, "fd 3 from LISTEN_FDS must be a listening AF_UNIX SOCK_SEQPACKET socket "
			 "(ListenSequentialPacket= in the .socket unit)");
		return -EINVAL;
	}
	if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 ||
	    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
		snprintf(why, why_len, "fd 3: %s", strerror(errno));
		return -errno;
	}
	if (sl > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0])
		snprintf(path, path_len, "%.*s", (int)(sl - offsetof(struct sockaddr_un, sun_path)), sa.sun_path);
	return fd;
}
