/* SPDX-License-Identifier: MIT */
/* pkv-bench: runs the benchmark named by its first argument (cache, attn, ipc, e2e, tier) as pkv-bench-NAME. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *const subcommands[] = { "cache", "attn", "ipc", "e2e", "tier" };

static void usage(FILE *f)
{
	fprintf(f, "usage: pkv-bench {cache|attn|ipc|e2e|tier} [--json] [options]\n"
		   "       pkv-bench NAME --help   options of one benchmark\n");
}

/* Tries DIR/pkv-bench-NAME; returns only if it could not be executed. */
static void try_exec(const char *dir, const char *name, char **argv)
{
	char path[PATH_MAX];

	if (snprintf(path, sizeof(path), "%s/pkv-bench-%s", dir, name) >= (int)sizeof(path))
		return;
	argv[0] = path;
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
		try_exec(dirname(self), argv[1], argv + 1);
	try_exec(PKV_LIBEXEC_DIR, argv[1], argv + 1);
	fprintf(stderr, "pkv-bench: cannot run pkv-bench-%s: %s\n", argv[1], strerror(errno));
	return 1;
}
