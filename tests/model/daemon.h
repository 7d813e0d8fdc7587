/* SPDX-License-Identifier: MIT */
/* A model test's daemon: the tests' one launcher (tests/daemon/launch.c) with the CPU backend and room for a model. */
#ifndef PKV_TEST_MODEL_DAEMON_H
#define PKV_TEST_MODEL_DAEMON_H

#include <stdio.h>
#include <stdlib.h>
#include "../daemon/launch.h"

/* 0 when running; -ENOENT when the daemon or the CPU plugin is not built (the caller skips). */
static inline int test_daemon_start(struct dmn *d)
{
	static const char *const extra[] = { "--memory-budget", "512M", "--workers", "2", NULL };
	static char plugin[512];
	const char *top = getenv("PKV_TOP_BUILDDIR");

	snprintf(plugin, sizeof(plugin), "%s/plugins/cpu/.libs/pkv_cpu.so", top ? top : ".");
	harness_backend = plugin;
	return dmn_start(d, extra);
}

/* Clients of pools with client attention load the backend themselves: this build tree's CPU plugin. */
static inline void test_client_attention_plugins(void)
{
	static char dir[512];
	const char *top = getenv("PKV_TOP_BUILDDIR");

	snprintf(dir, sizeof(dir), "%s/plugins/cpu/.libs", top ? top : ".");
	setenv("PAGEDKV_PLUGIN_DIR", dir, 1);
}

static inline void test_daemon_stop(struct dmn *d)
{
	dmn_stop(d);
	dmn_cleanup(d);
}

#endif
