/* SPDX-License-Identifier: MIT */
/* Control-socket helpers shared by the daemon, the client library and pagedkvctl. */
#include "config.h"
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>
#include <fcntl.h>
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
	return pkv_send_reply_fd(sock, status, value, flags, text, text_len, -1);
}

int pkv_send_reply_fd(int sock, int status, uint64_t value, uint32_t flags, const void *text,
		      size_t text_len, int fd)
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
	return pkv_msg_send(sock, &r, r.hdr.size, &fd, fd >= 0);
}

/* Writes all of buf to fd; -errno on failure. */
static int write_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t n = write(fd, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

int pkv_send_output(int sock, int status, const char *text, size_t len)
{
	int fd, r;

	if (len <= PKV_REPLY_TEXT_MAX)
		return pkv_send_reply(sock, status, 0, 0, text, len);
	/*
	 * Streaming chunks over a nonblocking socket fails once the peer's
	 * receive queue is full (about 100 KB); a memfd makes the reply one
	 * small message. Sealed, so the reader gets exactly what was written.
	 */
	fd = memfd_create("pagedkv-output", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	r = write_all(fd, text, len);
	if (!r && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
		r = -errno;
	if (!r) {
		struct pkv_msg_reply rep;

		memset(&rep, 0, PKV_REPLY_HDR_SIZE);
		rep.hdr.type = PKV_MSG_REPLY;
		rep.hdr.size = PKV_REPLY_HDR_SIZE;
		rep.status = status;
		rep.flags = PKV_REPLY_FD;
		rep.value = len;
		r = pkv_msg_send(sock, &rep, PKV_REPLY_HDR_SIZE, &fd, 1);
	}
	close(fd);
	return r;
}

/* Appends n bytes to the growing buffer *out of *len bytes (NUL kept after them). */
static int append(char **out, size_t *len, const char *p, size_t n)
{
	char *b;

	if (n > PKV_OUTPUT_MAX || *len > PKV_OUTPUT_MAX - n)
		return -EMSGSIZE;
	b = realloc(*out, *len + n + 1);
	if (!b)
		return -ENOMEM;
	memcpy(b + *len, p, n);
	*len += n;
	b[*len] = 0;
	*out = b;
	return 0;
}

/* Reads the memfd of a PKV_REPLY_FD reply (read(2), never mmap: a short file must not fault us). */
static int read_output_fd(int fd, uint64_t size, char **out, size_t *len)
{
	char buf[65536];
	struct stat st;
	uint64_t got = 0;

	/* Only a sealed memfd: a pipe, device or network file could block or change under us. */
	int seals = fcntl(fd, F_GET_SEALS);
	int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

	if (seals < 0 || (seals & want) != want || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size != size || size > PKV_OUTPUT_MAX)
		return -EPROTO;
	while (got < size) {
		ssize_t n = pread(fd, buf, sizeof(buf), (off_t)got);
		int r;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EPROTO;
		r = append(out, len, buf, (size_t)n);
		if (r)
			return r;
		got += (uint64_t)n;
	}
	return 0;
}

int pkv_recv_output(int sock, int timeout_ms, char **out, size_t *len, int *status)
{
	struct pkv_msg_reply rep;
	int r = 0;

	*out = NULL;
	*len = 0;
	r = append(out, len, "", 0);
	while (!r) {
		int fd = -1, nfds = 0;
		ssize_t n = pkv_msg_recv(sock, &rep, sizeof(rep), &fd, 1, &nfds, timeout_ms);

		if (n < (ssize_t)PKV_REPLY_HDR_SIZE || rep.hdr.type != PKV_MSG_REPLY) {
			r = n < 0 ? (int)n : -EPROTO;
			if (nfds)
				close(fd);
			break;
		}
		*status = rep.status;
		if (rep.flags & PKV_REPLY_FD) {
			r = nfds == 1 ? read_output_fd(fd, rep.value, out, len) : -EPROTO;
			if (nfds)
				close(fd);
			break;
		}
		if (nfds)
			close(fd);
		r = append(out, len, rep.text, (size_t)n - PKV_REPLY_HDR_SIZE);
		if (!(rep.flags & PKV_REPLY_MORE))
			break;
	}
	if (r) {
		free(*out);
		*out = NULL;
		*len = 0;
	}
	return r;
}
