/* SPDX-License-Identifier: MIT */
/* The tests' one pagedkvd launcher (daemon, model and example tests). */
#ifndef PKV_TEST_LAUNCH_H
#define PKV_TEST_LAUNCH_H

#include <sys/types.h>

struct dmn {
	pid_t pid;
	char dir[64];
	char sock[128];
};

/* Backend plugin path for the next daemons (NULL: the naive test backend). */
extern const char *harness_backend;

/*
 * Starts build/src/daemon/pagedkvd -f on a socket in a fresh temp dir, with
 * the naive backend (examples/plugin_naive.c) unless harness_backend says
 * otherwise; extra flags come last and override the defaults (256M, one
 * worker). -ENOENT when the daemon or the plugin is not built.
 */
int dmn_start(struct dmn *d, const char *const *extra);
/* Same socket and dir as d (restart). */
int dmn_restart(struct dmn *d, const char *const *extra);
/* Runs a daemon on d's socket until it exits (one expected to refuse to start); returns its exit status. */
int dmn_run_to_exit(struct dmn *d, const char *const *extra);
/* SIGTERM and wait: returns the exit status, or -1 if it did not exit within 10 s. */
int dmn_stop(struct dmn *d);
void dmn_kill(struct dmn *d);
void dmn_cleanup(struct dmn *d);
int dmn_alive(struct dmn *d);

#endif
