/* SPDX-License-Identifier: MIT */
/* Control-socket helpers shared by the daemon, the client library and pagedkvctl. */
#include "config.h"
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>
#include "common/msg.h"

int pkv_default_socket_path(char *buf, size_t len)
{
	const char *env = getenv("PAGEDKV_SOCKET");
	int n;

	if (env && *env)
		n = snprintf(buf, len, "%s", env);
	else if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
		n = snprintf(buf, len, "%s/pagedkv.sock", env);
	else
		n = snprintf(buf, len, "/run/pagedkv.sock");
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int pkv_msg_send(int sock, const void *msg, size_t len, const int *fds, int nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * PKV_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (nfds > PKV_MAX_FDS)
		return -EINVAL;
	if (nfds > 0) {
		struct cmsghdr *cm;

		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
	}
	do
		n = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EMSGSIZE;
}

ssize_t pkv_msg_recv(int sock, void *buf, size_t len, int *fds, int max_fds, int *nfds,
		     int timeout_ms)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 16)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *cm;
	int got = 0, bad = 0;
	ssize_t n;

	if (nfds)
		*nfds = 0;
	if (timeout_ms != 0) {
		struct pollfd p = { .fd = sock, .events = POLLIN };
		int r;

		do
			r = poll(&p, 1, timeout_ms);
		while (r < 0 && errno == EINTR);
		if (r < 0)
			return -errno;
		if (r == 0)
			return -ETIMEDOUT;
	}
	do
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		size_t i, k;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (i = 0; i < k; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (got < max_fds && fds)
				fds[got++] = fd;
			else {
				close(fd);
				bad = 1;
			}
		}
	}
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
		bad = 1;
	if (bad) {
		while (got > 0)
			close(fds[--got]);
		return -EBADMSG;
	}
	if (nfds)
		*nfds = got;
	return n;
}

int pkv_sock_connect(const char *path, int timeout_ms)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char def[sizeof(sa.sun_path)];
	int s, r;

	if (!path) {
		r = pkv_default_socket_path(def, sizeof(def));
		if (r)
			return r;
		path = def;
	}
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	if (timeout_ms > 0) {
		/* A Unix connect waits for backlog room with the send timeout. */
		struct timeval tv = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };

		setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	}
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		close(s);
		return r;
	}
	return s;
}

int pkv_send_reply(int sock, int status, uint64_t value, uint32_t flags, const char *text,
		   size_t text_len)
{
	struct pkv_msg_reply r;

	if (text_len > sizeof(r.text))
		text_len = sizeof(r.text);
	memset(&r, 0, PKV_REPLY_HDR_SIZE);
	r.hdr.type = PKV_MSG_REPLY;
	r.hdr.size = PKV_REPLY_HDR_SIZE + text_len;
	r.status = status;
	r.flags = flags;
	r.value = value;
	if (text_len)
		memcpy(r.text, text, text_len);
	return pkv_msg_send(sock, &r, r.hdr.size, NULL, 0);
}
