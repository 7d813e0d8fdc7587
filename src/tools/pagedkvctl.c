/* SPDX-License-Identifier: MIT */
/* pagedkvctl: asks a running pagedkvd for status, an audit, a flush of cached blocks, or metrics. */
#include "config.h"
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/msg.h"

static void usage(FILE *f)
{
	fprintf(f,
"usage: pagedkvctl [--socket PATH] [--json] COMMAND\n"
"  status    pools (geometry, blocks free/cached/in use, prefix hit rate) and clients\n"
"  audit     check the cache invariants of every pool; exit 1 when a problem is found\n"
"  flush     drop every cached (unreferenced, unpinned) block (spilled to the disk tier, if any)\n"
"  flush --disk   drop every block of the disk tier\n"
"  metrics   Prometheus text format (--json: the status object)\n"
"  audit and flush are for admins (root, the daemon's uid, its admin_group); anyone\n"
"  else sees only their own pools and connections, without prefix or attend counters\n"
"  -s, --socket PATH   daemon socket (default: $PAGEDKV_SOCKET, else\n"
"                      $XDG_RUNTIME_DIR/pagedkv.sock, else /run/pagedkv.sock)\n"
"  -j, --json          JSON output\n"
"  -t, --timeout MS    wait at most this long for the daemon, 1 to 3600000 (default 5000)\n"
"  -h, --help          this text\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "timeout", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ "disk", no_argument, NULL, 'd' },
		{ NULL, 0, NULL, 0 }
	};
	static const char *const cmds[] = { NULL, "status", "audit", "flush", "metrics", "flush --disk" };
	struct pkv_msg_hello hello = { { PKV_MSG_HELLO, sizeof(hello) }, PKV_PROTO_VERSION, PKV_ROLE_CTL, 0 };
	struct pkv_msg_ctl m = { { PKV_MSG_CTL, sizeof(m) }, 0, PKV_FMT_TEXT };
	struct pkv_msg_reply rep;
	const char *sock = NULL;
	int json = 0, timeout = 5000, disk = 0, c, s, status;
	ssize_t n;

	while ((c = getopt_long(argc, argv, "s:jt:h", opts, NULL)) != -1) {
		switch (c) {
		case 's': sock = optarg; break;
		case 'j': json = 1; break;
		case 't': {
			char *end;
			long v = strtol(optarg, &end, 10);

			if (!*optarg || *end || v < 1 || v > 3600000) {
				fprintf(stderr, "pagedkvctl: -t/--timeout: '%s' is not a number of milliseconds from 1 "
					"to 3600000\n", optarg);
				return 2;
			}
			timeout = (int)v;
			break;
		}
		case 'h': usage(stdout); return 0;
		case 'd': disk = 1; break;
		default: /* getopt said which flag */
			fprintf(stderr, "pagedkvctl: 'pagedkvctl --help' lists the commands and flags\n");
			return 2;
		}
	}
	if (optind != argc - 1) {
		usage(stderr);
		return 2;
	}
	for (uint32_t i = 1; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (!strcmp(argv[optind], cmds[i]))
			m.cmd = i;
	if (disk && m.cmd == PKV_CTL_FLUSH)
		m.cmd = PKV_CTL_FLUSH_DISK;
	else if (disk)
		m.cmd = 0;
	if (!m.cmd) {
		fprintf(stderr, "pagedkvctl: unknown command '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	m.format = json ? PKV_FMT_JSON : (m.cmd == PKV_CTL_METRICS ? PKV_FMT_PROM : PKV_FMT_TEXT);
	s = pkv_sock_connect(sock, timeout);
	if (s < 0) {
		char def[108] = "";

		if (!sock)
			pkv_default_socket_path(def, sizeof(def));
		fprintf(stderr, "pagedkvctl: cannot connect to %s: %s%s\n", sock ? sock : def, strerror(-s),
			s == -ENOENT ? " (no pagedkvd runs there: start one, or name its socket with --socket or "
				       "$PAGEDKV_SOCKET)"
			: s == -ECONNREFUSED ? " (a stale socket: no pagedkvd listens there)"
			: s == -EACCES ? " (the socket's group may connect: ask to be added to it)" : "");
		return 2;
	}
	if (pkv_msg_send(s, &hello, sizeof(hello), NULL, 0) ||
	    (n = pkv_msg_recv(s, &rep, sizeof(rep), NULL, 0, NULL, timeout)) < (ssize_t)PKV_REPLY_HDR_SIZE) {
		fprintf(stderr, "pagedkvctl: the daemon did not answer the hello\n");
		return 2;
	}
	if (rep.status) {
		fprintf(stderr, "pagedkvctl: refused: %.*s\n", (int)(n - PKV_REPLY_HDR_SIZE), rep.text);
		return 2;
	}
	if (pkv_msg_send(s, &m, sizeof(m), NULL, 0)) {
		fprintf(stderr, "pagedkvctl: cannot send the command\n");
		return 2;
	}
	{
		char *out = NULL;
		size_t len = 0;
		int r = pkv_recv_output(s, timeout, &out, &len, &status);

		if (r) {
			fprintf(stderr, "pagedkvctl: %s\n", r == -EPROTO ? "malformed reply" : strerror(-r));
			return 2;
		}
		/* A refusal's reason is text for a person: stderr, so scripts reading stdout see nothing. */
		fwrite(out, 1, len, status < 0 ? stderr : stdout);
		free(out);
	}
	close(s);
	if (status < 0) {
		fprintf(stderr, "pagedkvctl: %s failed: %s\n", cmds[m.cmd], strerror(-status));
		return 2;
	}
	return status > 0 ? 1 : 0;
}
