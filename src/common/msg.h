/* SPDX-License-Identifier: MIT */
/* Control-socket helpers: socket path resolution, messages with passed fds, timed receive. */
#ifndef PKV_MSG_H
#define PKV_MSG_H

#include <stddef.h>
#include <stdint.h>
#include "common/proto.h"

#define PKV_MAX_FDS 3

/* Sends one message with nfds descriptors (SCM_RIGHTS). Returns 0 or -errno. */
int pkv_msg_send(int sock, const void *msg, size_t len, const int *fds, int nfds);

/*
 * Receives one message (nonblocking when timeout_ms == 0 on a nonblocking
 * socket; otherwise waits at most timeout_ms, < 0 forever). Returns its
 * length (0 = peer hung up) or -errno; passed fds land in fds[], their count
 * in *nfds, and any beyond max_fds (or a truncated message) are closed and
 * reported as -EBADMSG.
 */
ssize_t pkv_msg_recv(int sock, void *buf, size_t len, int *fds, int max_fds, int *nfds,
		     int timeout_ms);

/*
 * Connects a SOCK_SEQPACKET socket to path (NULL = pkv_default_socket_path),
 * waiting at most timeout_ms (0 = forever) when the daemon's backlog is
 * full. Returns the fd or -errno.
 */
int pkv_sock_connect(const char *path, int timeout_ms);

/* Sends a reply; text may be NULL. */
int pkv_send_reply(int sock, int status, uint64_t value, uint32_t flags, const char *text,
		   size_t text_len);
/* The same passing one descriptor with it (none when fd < 0); text may be binary. */
int pkv_send_reply_fd(int sock, int status, uint64_t value, uint32_t flags, const void *text,
		      size_t text_len, int fd);

/*
 * Sends a control command's output, whatever its size: one reply with the
 * text when it fits, else one reply passing a sealed memfd that holds it
 * (PKV_REPLY_FD). Returns 0 or -errno.
 */
int pkv_send_output(int sock, int status, const char *text, size_t len);

/* Largest output pkv_recv_output accepts from a memfd. */
#define PKV_OUTPUT_MAX (1ull << 30)

/*
 * Receives a control command's output (inline, chunked with PKV_REPLY_MORE,
 * or in a memfd) into a malloc'd NUL-terminated buffer. Returns 0 and the
 * daemon's status in *status, or -errno (no reply, malformed reply).
 */
int pkv_recv_output(int sock, int timeout_ms, char **out, size_t *len, int *status);

#endif
