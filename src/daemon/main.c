/* SPDX-License-Identifier: MIT */
/* pagedkvd: options, lock file, plugins and threads, then the listening socket and the event loop until SIGTERM. */
#include "config.h"
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "common/log.h"
#include "daemon/daemon.h"
#include "daemon/sd.h"
#include "daemon/sigbus.h"
#include "daemon/tenant.h"
#include "daemon/tier_glue.h"
#include "pkv_paths.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: pagedkvd [options]\n"
		   "%-32s%s\n%32s%s\n", "  -c, --config FILE", "read `key = value` settings (flags override them;",
		   "", "SIGHUP re-reads both)");
	pkv_config_usage(f);
	fprintf(f, "%-32s%s\n%-32s%s\n%-32s%s\n%-32s%s\n", "      --print-config",
		"print the settings in effect as a config file", "      --list-backends",
		"print the backends in the plugin dir, their caps and options", "  -h, --help", "this text",
		"  -V, --version", "print the version");
}

/* What the first parse saw, for SIGHUP to parse again. */
static int g_argc;
static char **g_argv;
static const char *g_config;

enum { OPT_PRINT_CONFIG = 1, OPT_LIST_BACKENDS, OPT_KEY = 256 };

static char g_flag_names[96][64];

/* getopt's tables, built from the settings table. */
static void build_opts(struct option *lo, char *so)
{
	char (*names)[64] = g_flag_names;
	size_t i, n = 0;

	so += sprintf(so, "c:hV");
	for (i = 0; i < pkv_conf_nkeys; i++) {
		const struct pkv_conf_key *k = &pkv_conf_keys[i];

		if (k->flag)
			snprintf(names[i], sizeof(names[i]), "%s", k->flag);
		else
			for (size_t j = 0; j < sizeof(names[i]); j++)
				if (!(names[i][j] = k->key[j] == '_' ? '-' : k->key[j]))
					break;
		lo[n++] = (struct option){ names[i], k->arg ? required_argument : no_argument, NULL,
					   OPT_KEY + (int)i };
		if (k->short_flag)
			so += sprintf(so, "%c%s", k->short_flag, k->arg ? ":" : "");
	}
	lo[n++] = (struct option){ "config", required_argument, NULL, 'c' };
	lo[n++] = (struct option){ "print-config", no_argument, NULL, OPT_PRINT_CONFIG };
	lo[n++] = (struct option){ "list-backends", no_argument, NULL, OPT_LIST_BACKENDS };
	lo[n++] = (struct option){ "help", no_argument, NULL, 'h' };
	lo[n++] = (struct option){ "version", no_argument, NULL, 'V' };
	lo[n] = (struct option){ NULL, 0, NULL, 0 };
}

static int key_of_short(int c)
{
	for (size_t i = 0; i < pkv_conf_nkeys; i++)
		if (pkv_conf_keys[i].short_flag == c)
			return (int)i;
	return -1;
}

/* --list-backends: every pkv_*.so in the plugin directory, described without init. Returns 1 (exit 0). */
static int list_backends(const struct pkv_config *cfg)
{
	struct dirent **names;
	char path[4352], err[512];
	int i, n, found = 0;

	n = scandir(cfg->plugin_dir, &names, NULL, alphasort);
	if (n < 0) {
		fprintf(stderr, "pagedkvd: cannot read plugin dir %s: %s\n", cfg->plugin_dir, strerror(errno));
		return -1;
	}
	for (i = 0; i < n; i++) {
		const char *f = names[i]->d_name;
		size_t len = strlen(f);

		if (!strncmp(f, "pkv_", 4) && len > 7 && !strcmp(f + len - 3, ".so")) {
			snprintf(path, sizeof(path), "%s/%s", cfg->plugin_dir, f);
			if (pkv_plugin_describe(path, stdout, err, sizeof(err)) < 0)
				printf("  (not usable: %s)\n", err);
			found++;
		}
		free(names[i]);
	}
	free(names);
	if (!found)
		printf("no backends (pkv_*.so) in %s\n", cfg->plugin_dir);
	return 1;
}

/* Parses options twice: --config first, so that flags override the file. Returns 0, 1 (exit 0) or -1.
 * quiet: a SIGHUP re-parse, which prints nothing and acts on no --help. */
static int parse_args(int argc, char **argv, struct pkv_config *cfg, int quiet)
{
	struct option lo[96 + 6];
	char so[3 * 96 + 8], why[512], flag[80];
	int c, idx, print = 0, list = 0;

	if (pkv_conf_nkeys > 96) { /* g_flag_names and lo have room for 96 settings */
		fprintf(stderr, "pagedkvd: %zu settings; raise the option table sizes in main.c\n", pkv_conf_nkeys);
		return -1;
	}
	build_opts(lo, so);
	opterr = 0;
	optind = 1;
	g_config = NULL;
	while ((c = getopt_long(argc, argv, so, lo, &idx)) != -1)
		if (c == 'c')
			g_config = optarg;
	if (g_config && pkv_config_load(cfg, g_config, why, sizeof(why))) {
		if (quiet)
			pkv_err("%s", why);
		else
			fprintf(stderr, "pagedkvd: %s\n", why);
		return -1;
	}
	opterr = !quiet;
	optind = 1;
	while ((c = getopt_long(argc, argv, so, lo, &idx)) != -1) {
		const struct pkv_conf_key *k;
		int ki = c >= OPT_KEY ? c - OPT_KEY : key_of_short(c);

		if (c == 'c')
			continue;
		if (ki < 0) {
			if (quiet)
				continue;
			switch (c) {
			case OPT_PRINT_CONFIG: print = 1; continue;
			case OPT_LIST_BACKENDS: list = 1; continue;
			case 'h': usage(stdout); return 1;
			case 'V': printf("pagedkvd %s (protocol %u)\n", PACKAGE_VERSION, PKV_PROTO_VERSION); return 1;
			default: /* getopt said which flag */
				fprintf(stderr, "pagedkvd: 'pagedkvd --help' lists the flags\n");
				return -1;
			}
		}
		k = &pkv_conf_keys[ki];
		if (c >= OPT_KEY)
			snprintf(flag, sizeof(flag), "--%s", lo[ki].name);
		else
			snprintf(flag, sizeof(flag), "-%c", c);
		if (pkv_config_set_key(cfg, k, flag, k->arg ? optarg : k->flag_sets ? "yes" : "no", why, sizeof(why))) {
			if (quiet)
				pkv_err("%s", why);
			else
				fprintf(stderr, "pagedkvd: %s\n", why);
			return -1;
		}
	}
	if (optind < argc) {
		if (!quiet)
			fprintf(stderr, "pagedkvd: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (print) {
		pkv_config_print(cfg, stdout);
		return 1;
	}
	return list ? list_backends(cfg) : 0;
}

/* SIGHUP: defaults, the config file and the flags again; the limits and the log level take effect at
 * once (new connections, attaches and pools see them; nothing connected is dropped), the rest is
 * reported as needing a restart. */
int daemon_reload(struct pkv_daemon *d)
{
	struct pkv_config *n = malloc(sizeof(*n));
	char old[4200], new[4200];

	if (!n)
		return -ENOMEM;
	pkv_sd_notify("RELOADING=1");
	pkv_config_defaults(n);
	if (parse_args(g_argc, g_argv, n, 1)) {
		pkv_err("reload: keeping the current settings");
		goto out;
	}
	for (size_t i = 0; i < pkv_conf_nkeys; i++) {
		const struct pkv_conf_key *k = &pkv_conf_keys[i];

		pkv_config_format(&d->cfg, k, old, sizeof(old));
		pkv_config_format(n, k, new, sizeof(new));
		if (!strcmp(old, new))
			continue;
		if (!(k->flags & PKV_CONF_RELOAD)) {
			if (strcmp(k->key, "socket") || !d->activated)
				pkv_warn("reload: %s changed to '%s'; restart pagedkvd to apply it", k->key, new);
			continue;
		}
		memcpy((char *)&d->cfg + k->off, (char *)n + k->off, k->size);
		pkv_info("reload: %s = %s (was %s)", k->key, new, old);
	}
	pkv_log_setup("pagedkvd", d->cfg.log_level, !d->cfg.foreground);
out:
	free(n);
	pkv_sd_notify("READY=1");
	return 0;
}

/* Takes the lock beside the socket; a second daemon on the same socket stops here. The file is
 * removed at a clean stop, so after flock we check that the path still names the file we locked (a
 * stopping daemon may have unlinked it between our open and our flock); if not, we try again. */
static int take_lock(struct pkv_daemon *d)
{
	char *path = d->lock_path;

	snprintf(path, sizeof(d->lock_path), "%s.lock", d->cfg.socket_path);
	for (int tries = 0; tries < 8; tries++) {
		struct stat a, b;

		d->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (d->lock_fd < 0) {
			int e = errno;

			if (e == ENOENT)
				pkv_err("the directory of socket %s does not exist", d->cfg.socket_path);
			else
				pkv_err("cannot open lock file %s: %s", path, strerror(e));
			return -e;
		}
		if (flock(d->lock_fd, LOCK_EX | LOCK_NB) < 0) {
			int e = errno;

			/* Not ours: drop_lock must not unlink the running daemon's lock on our way out. */
			close(d->lock_fd);
			d->lock_fd = -1;
			pkv_err("another pagedkvd is running on %s (lock %s held)", d->cfg.socket_path, path);
			return e == EWOULDBLOCK ? -EADDRINUSE : -e;
		}
		if (fstat(d->lock_fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			return 0;
		close(d->lock_fd);
		d->lock_fd = -1;
	}
	pkv_err("lock file %s keeps being replaced", path);
	return -EAGAIN;
}

/* Removes the lock file while still holding the lock (see take_lock). */
static void drop_lock(struct pkv_daemon *d)
{
	if (d->lock_fd < 0)
		return;
	unlink(d->lock_path);
	close(d->lock_fd);
	d->lock_fd = -1;
}

static int write_pid_file(const struct pkv_daemon *d)
{
	char tmp[sizeof(d->cfg.pid_file) + 8];
	FILE *f;

	if (!d->cfg.pid_file[0])
		return 0;
	snprintf(tmp, sizeof(tmp), "%s.new", d->cfg.pid_file);
	f = fopen(tmp, "we");
	if (!f)
		goto err;
	if (fprintf(f, "%d\n", (int)getpid()) < 0) {
		fclose(f);
		goto err;
	}
	if (fclose(f) != 0 || rename(tmp, d->cfg.pid_file) < 0)
		goto err;
	return 0;
err:
	pkv_err("cannot write pid file %s: %s", d->cfg.pid_file, strerror(errno));
	unlink(tmp);
	return -1;
}

static int open_socket(struct pkv_daemon *d)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(d->cfg.socket_path) >= sizeof(sa.sun_path)) {
		pkv_err("socket path too long: %s", d->cfg.socket_path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, d->cfg.socket_path);
	/* We hold the lock: whatever socket is there belongs to a dead daemon. */
	if (unlink(sa.sun_path) == 0)
		pkv_info("replaced a stale socket at %s", sa.sun_path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		pkv_err("cannot bind %s: %s", sa.sun_path, strerror(errno));
		goto err;
	}
	if (chmod(sa.sun_path, d->cfg.socket_mode) < 0) {
		pkv_err("cannot chmod %s: %s", sa.sun_path, strerror(errno));
		goto err;
	}
	if (d->cfg.socket_group[0]) {
		struct group *g = getgrnam(d->cfg.socket_group);

		if (!g || chown(sa.sun_path, (uid_t)-1, g->gr_gid) < 0) {
			pkv_err("cannot give %s to group %s: %s", sa.sun_path, d->cfg.socket_group,
				g ? strerror(errno) : "no such group");
			errno = EINVAL;
			goto err;
		}
	}
	if (listen(fd, 128) < 0)
		goto err;
	d->listen_fd = fd;
	return 0;
err:
	{
		int e = -errno;

		close(fd);
		return e;
	}
}

/* Plugins log through the host; their lines go where the daemon's go (stderr or syslog). */
static void plugin_log(void *ud, int level, const char *msg)
{
	(void)ud;
	pkv_log(level, "%s", msg);
}

/* True when this pagedkvd is the build tree's (run before `make install`): /proc/self/exe lies under
 * the build directory configure was run in. */
static int running_uninstalled(void)
{
#ifdef PKV_BUILD_DIR
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n <= 0)
		return 0;
	exe[n] = 0;
	return !strncmp(exe, PKV_BUILD_DIR "/", strlen(PKV_BUILD_DIR) + 1);
#else
	return 0;
#endif
}

/* Uninstalled and left at the default plugin dir, which holds nothing of this build yet: look for
 * pkv_NAME.so in the build tree's plugins/<dir>/.libs and use that directory. */
static void use_build_plugins(struct pkv_daemon *d)
{
#ifdef PKV_BUILD_DIR
	const char *spec = d->cfg.backend_varlen;
	char dir[PATH_MAX], so[PATH_MAX + 64];
	size_t name_len = strcspn(spec, ":");
	struct dirent *e;
	DIR *top;

	if (!running_uninstalled() || strcmp(d->cfg.plugin_dir, PKV_PLUGIN_DIR) || strchr(spec, '/') ||
	    getenv("PAGEDKV_PLUGIN_DIR"))
		return;
	top = opendir(PKV_BUILD_DIR "/plugins");
	if (!top)
		return;
	while ((e = readdir(top))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(dir, sizeof(dir), "%s/plugins/%s/.libs", PKV_BUILD_DIR, e->d_name);
		snprintf(so, sizeof(so), "%s/pkv_%.*s.so", dir, (int)name_len, spec);
		if (access(so, R_OK) == 0) {
			snprintf(d->cfg.plugin_dir, sizeof(d->cfg.plugin_dir), "%s", dir);
			pkv_info("running from the build tree: plugins from %s", dir);
			break;
		}
	}
	closedir(top);
#else
	(void)d;
#endif
}

/* After a failed load: names the backends the plugin dir does have, and how to point at others. */
static void explain_plugin_dir(const struct pkv_daemon *d)
{
	char names[1024] = "";
	size_t used = 0;
	struct dirent *e;
	DIR *dir = opendir(d->cfg.plugin_dir);

	while (dir && (e = readdir(dir))) {
		size_t n = strlen(e->d_name);

		if (n > 7 && !strncmp(e->d_name, "pkv_", 4) && !strcmp(e->d_name + n - 3, ".so") &&
		    used + n < sizeof(names) - 8)
			used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%.*s", used ? ", " : "",
						 (int)(n - 7), e->d_name + 4);
	}
	if (dir)
		closedir(dir);
	pkv_err("installed backends in %s: %s", d->cfg.plugin_dir, used ? names : "none");
	if (running_uninstalled())
		pkv_err("this pagedkvd runs from the build tree: pass --plugin-dir BUILDDIR/plugins/cpu/.libs "
			"(or another plugins/*/.libs), or run make install");
	else
		pkv_err("choose one with --backend NAME, another directory with --plugin-dir DIR, "
			"or a plugin file with --backend /path/to/pkv_NAME.so");
}

/* Loads one "lib" or "lib:backend" spec with the options that name it. */
static int load_one(struct pkv_daemon *d, const char *spec, struct pkv_option_setting *opts, uint32_t n_opts,
		    struct pkv_plugin *out, char *err, size_t err_len)
{
	struct pkv_dict_item items[PKV_CONF_MAX_BACKEND_OPTIONS];
	char lib[sizeof(d->cfg.backend_varlen)], short_name[64];
	const char *name;
	struct pkv_dict dict;
	int r;

	if (pkv_backend_spec_split(spec, lib, sizeof(lib), &name))
		return -ENAMETOOLONG;
	pkv_spec_short_name(lib, short_name, sizeof(short_name));
	r = pkv_options_select(opts, n_opts, short_name, name, items, PKV_CONF_MAX_BACKEND_OPTIONS, &dict);
	if (r)
		return r;
	return pkv_plugin_load(lib, name, d->cfg.plugin_dir, &dict, d->host, out, err, err_len);
}

static int load_plugins(struct pkv_daemon *d)
{
	struct pkv_option_setting opts[PKV_CONF_MAX_BACKEND_OPTIONS];
	char bufs[PKV_CONF_MAX_BACKEND_OPTIONS][sizeof(d->cfg.backend_options[0])];
	char err[512];
	uint32_t i, n = d->cfg.n_backend_options;
	int r;

	for (i = 0; i < n; i++)
		if (pkv_option_parse(d->cfg.backend_options[i], bufs[i], sizeof(bufs[i]), &opts[i])) {
			pkv_err("backend_option '%s' is not NAME.KEY=VALUE", d->cfg.backend_options[i]);
			return -EINVAL;
		}
	r = pkv_host_create(d->cfg.worker_threads, d->cfg.log_level, &d->host);
	if (r) {
		pkv_err("cannot start the worker threads: %s", strerror(-r));
		return r;
	}
	pkv_host_set_log_sink(d->host, plugin_log, NULL);
	use_build_plugins(d);
	r = load_one(d, d->cfg.backend_varlen, opts, n, &d->plug_varlen, err, sizeof(err));
	if (r) {
		pkv_err("backend for varlen: %s", err);
		explain_plugin_dir(d);
		return r;
	}
	d->same_plugin = !strcmp(d->cfg.backend_varlen, d->cfg.backend_decode);
	if (!d->same_plugin) {
		r = load_one(d, d->cfg.backend_decode, opts, n, &d->plug_decode, err, sizeof(err));
		if (r) {
			pkv_err("backend for decode: %s", err);
			explain_plugin_dir(d);
			goto err_varlen;
		}
	}
	/* An option no loaded backend took is a typo in the name: say so rather than ignore it. */
	for (i = 0; i < n; i++)
		if (!opts[i].used) {
			pkv_err("backend_option '%s': no loaded backend or library is called '%s'",
				d->cfg.backend_options[i], opts[i].prefix);
			r = -EINVAL;
			goto err_decode;
		}
	pkv_info("backends: varlen %s (%s), decode %s (%s)", d->plug_varlen.path, d->plug_varlen.be->name,
		 d->same_plugin ? d->plug_varlen.path : d->plug_decode.path,
		 d->same_plugin ? d->plug_varlen.be->name : d->plug_decode.be->name);
	return 0;

err_decode:
	if (!d->same_plugin)
		pkv_plugin_unload(&d->plug_decode);
err_varlen:
	pkv_plugin_unload(&d->plug_varlen);
	return r;
}

/* Forks into the background; the parent exits once the child is listening (ready_fd). */
static int daemonize(int *ready_fd)
{
	int p[2];
	pid_t pid;
	char c;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0) {
		close(p[1]);
		if (read(p[0], &c, 1) != 1)
			_exit(1);
		_exit(0);
	}
	close(p[0]);
	setsid();
	*ready_fd = p[1];
	return 0;
}

static void detach_stdio(void)
{
	int fd = open("/dev/null", O_RDWR);

	if (fd >= 0) {
		dup2(fd, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		if (fd > 2)
			close(fd);
	}
	if (chdir("/") < 0)
		pkv_warn("chdir /: %s", strerror(errno));
}

int main(int argc, char **argv)
{
	struct pkv_daemon *d;
	sigset_t mask;
	int r, ready_fd = -1, rc = 1;

	d = calloc(1, sizeof(*d));
	if (!d)
		return 1;
	d->listen_fd = d->signal_fd = d->wake_fd = d->lock_fd = d->acceptor.reserve_fd = d->acceptor.stop_fd = -1;
	pthread_mutex_init(&d->backend_mu, NULL);
	pkv_config_defaults(&d->cfg);
	g_argc = argc;
	g_argv = argv;
	r = parse_args(argc, argv, &d->cfg, 0);
	if (r) {
		free(d);
		return r > 0 ? 0 : 2;
	}
	pkv_log_setup("pagedkvd", d->cfg.log_level, 0);
	/* Socket activation (pagedkvd.socket): systemd owns the socket file and runs one of us at a time,
	 * so there is no lock to take and nothing to unlink at the end. */
	{
		char why[256];

		r = pkv_sd_listen_fd(d->cfg.socket_path, sizeof(d->cfg.socket_path), why, sizeof(why));
		if (r >= 0) {
			d->listen_fd = r;
			d->activated = 1;
		} else if (r != -ENOENT) {
			pkv_err("socket activation: %s", why);
			goto out;
		}
	}
	if (!d->cfg.foreground && daemonize(&ready_fd)) {
		pkv_err("cannot daemonize: %s", strerror(errno));
		goto out;
	}
	/* Signals arrive through a signalfd in the loop; every thread inherits this mask. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	loop_setup_fds(d);
	if (ctl_init(d) || (!d->activated && take_lock(d)))
		goto out;
	d->signal_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	d->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (d->signal_fd < 0 || d->wake_fd < 0) {
		pkv_err("signalfd/eventfd: %s", strerror(errno));
		goto out_sock;
	}
	/* A fault in client memory must end that client only (DESIGN.md §5). */
	r = pkv_sigbus_install(d->wake_fd);
	if (r) {
		pkv_err("SIGBUS handler: %s", strerror(-r));
		goto out_sock;
	}
	r = io_uring_queue_init(1024, &d->ring, 0);
	if (r) {
		pkv_err("io_uring: %s", strerror(-r));
		goto out_sock;
	}
	if (load_plugins(d))
		goto out_ring;
	if (tier_glue_start(d))
		goto out_plugins;
	r = worker_start(d);
	if (r) {
		pkv_err("worker thread: %s", strerror(-r));
		goto out_tier;
	}
	/*
	 * The socket comes last: a client whose connect succeeds finds every
	 * thread and descriptor of ours in place (a probe that waits for the
	 * socket to accept, as a test harness or a unit's ExecStartPost does,
	 * once saw the worker thread missing).
	 */
	if (!d->activated && open_socket(d))
		goto out_worker;
	pkv_info("listening on %s%s (protocol %u, budget %llu MiB)", d->cfg.socket_path,
		 d->activated ? " (from systemd)" : "", PKV_PROTO_VERSION,
		 (unsigned long long)(d->cfg.memory_budget >> 20));
	if (ready_fd >= 0) {
		pkv_log_setup("pagedkvd", d->cfg.log_level, 1);
		detach_stdio();
		if (write(ready_fd, "r", 1) < 0)
			pkv_warn("cannot signal readiness: %s", strerror(errno));
		close(ready_fd);
		ready_fd = -1;
	}
	/* After stdio is detached: an accepted socket must not land on a descriptor detach_stdio replaces. */
	r = acceptor_start(d);
	if (r) {
		pkv_err("acceptor thread: %s", strerror(-r));
		goto out_worker;
	}
	if (write_pid_file(d))
		goto out_worker;
	pkv_sd_notify("READY=1\nSTATUS=listening");
	r = loop_run(d);
	rc = r ? 1 : 0;
	pkv_sd_notify("STOPPING=1");
	if (d->cfg.pid_file[0])
		unlink(d->cfg.pid_file);
out_worker:
	acceptor_stop(d);
	worker_stop(d);
	while (d->pools) {
		struct pool *p = d->pools;

		d->pools = p->next;
		pool_destroy(d, p);
	}
	tenant_free_all(d);
out_tier:
	tier_glue_stop(d);
out_plugins:
	if (!d->same_plugin && d->plug_decode.be)
		pkv_plugin_unload(&d->plug_decode);
	if (d->plug_varlen.be)
		pkv_plugin_unload(&d->plug_varlen);
	if (d->host)
		pkv_host_destroy(d->host);
out_ring:
	io_uring_queue_exit(&d->ring);
out_sock:
	if (d->listen_fd >= 0) {
		close(d->listen_fd);
		if (!d->activated)
			unlink(d->cfg.socket_path);
	}
	if (d->signal_fd >= 0)
		close(d->signal_fd);
	if (d->wake_fd >= 0)
		close(d->wake_fd);
out:
	drop_lock(d);
	if (d->acceptor.reserve_fd >= 0)
		close(d->acceptor.reserve_fd);
	if (rc == 0)
		pkv_info("stopped");
	pthread_mutex_destroy(&d->backend_mu);
	free(d);
	return rc;
}
