/* SPDX-License-Identifier: MIT */
/* The two systemd protocols pagedkvd speaks, without libsystemd: readiness notification and socket activation. */
#ifndef PKV_DAEMON_SD_H
#define PKV_DAEMON_SD_H

/* Sends STATE ("READY=1", "STOPPING=1", ...) as one datagram to $NOTIFY_SOCKET; 0 when there is none. */
int pkv_sd_notify(const char *state);
/* The listening socket passed as fd 3 when LISTEN_PID is our pid and LISTEN_FDS is 1: checked to be
 * a listening AF_UNIX SOCK_SEQPACKET socket, made non-blocking and close-on-exec. Returns the fd,
 * -ENOENT when nothing was passed, or -errno (with why) when what was passed is unusable.
 * Unsets LISTEN_* so children do not inherit them. */
int pkv_sd_listen_fd(char *path, unsigned long path_len, char *why, unsigned long why_len);

#endif
