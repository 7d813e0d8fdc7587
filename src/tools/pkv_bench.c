/* SPDX-License-Identifier: MIT */
/* pkv-bench: runs the benchmark named by its first argument (cache, attn, ipc, e2e, isolation, tier) as
 * pkv-bench-NAME. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "pkv_paths.h"

static const char *const subcommands[] = { "cache", "attn", "ipc", "e2e", "isolation", "tier" };

static void usage(FILE *f)
{
	fprintf(f, "usage: pkv-bench {cache|attn|ipc|e2e|isolation|tier} [--json] [options]\n"
		   "       pkv-bench NAME --help   options of one benchmark\n");
}

/* Tries DIR/pkv-bench-NAME with the caller's arguments after it; returns only if it could not be
 * executed. argv[0] of the benchmark is set in a copy: writing it into our own argv would make the
 * next try read its NAME from this function's dead stack buffer. */
static void try_exec(const char *dir, const char *name, int argc, char **args)
{
	char path[PATH_MAX];
	char *argv[argc + 2];

	if (snprintf(path, sizeof(path), "%s/pkv-bench-%s", dir, name) >= (int)sizeof(path))
		return;
	argv[0] = path;
	memcpy(argv + 1, args, sizeof(*args) * (size_t)argc);
	argv[argc + 1] = NULL;
	execv(path, argv);
}

int main(int argc, char **argv)
{
	char self[PATH_MAX];
	size_t i;

	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	for (i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
		if (!strcmp(argv[1], subcommands[i]))
			break;
	if (i == sizeof(subcommands) / sizeof(subcommands[0])) {
		fprintf(stderr, "pkv-bench: unknown benchmark '%s'\n", argv[1]);
		usage(stderr);
		return 2;
	}
	/* Beside argv[0] first (the build tree, where libtool wrappers live), then the install. */
	snprintf(self, sizeof(self), "%s", argv[0]);
	if (strchr(self, '/'))
		try_exec(dirname(self), argv[1], argc - 2, argv + 2);
	try_exec(PKV_LIBEXEC_DIR, argv[1], argc - 2, argv + 2);
	fprintf(stderr, "pkv-bench: cannot run pkv-bench-%s: %s\n", argv[1], strerror(errno));
	return 1;
}
