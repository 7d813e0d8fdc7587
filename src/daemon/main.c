/* SPDX-License-Identifier: MIT */
/* pagedkvd: options, lock file, listening socket, plugins, then the event loop until SIGTERM. */
#include "config.h"
#include <errno.h>
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

static void usage(FILE *f)
{
	fprintf(f,
"usage: pagedkvd [options]\n"
"  -c, --config FILE           read `key = value` settings (flags override them)\n"
"  -s, --socket PATH           listening socket (default: $PAGEDKV_SOCKET, else\n"
"                              $XDG_RUNTIME_DIR/pagedkv.sock, else /run/pagedkv.sock)\n"
"      --socket-mode MODE      octal permissions of the socket (default 0660)\n"
"      --socket-group GROUP    group owning the socket\n"
"      --plugin-dir DIR        where backend plugins pkv_NAME.so live (default %s)\n"
"      --backend SPEC          plugin for both paths (name or path; default cpu)\n"
"      --backend-varlen SPEC   plugin for batches with prefill\n"
"      --backend-decode SPEC   plugin for one-token-per-sequence batches\n"
"                              (SPEC may name one backend of a library: cuda:decode)\n"
"      --backend-option N.K=V  option K=V for backend or library N (repeatable;\n"
"                              e.g. cpu.isa=avx2; see --list-backends)\n"
"      --list-backends         print the backends in the plugin dir, their caps and\n"
"                              options, and exit\n"
"  -m, --memory-budget SIZE    KV memory for all pools, e.g. 512M, 4G (default 1G)\n"
"  -w, --workers N             threads a backend may use (0 = one per CPU)\n"
"      --client-max-seqs N     sequences one connection may hold (default 1024)\n"
"      --client-block-share P  percent of a pool's blocks one connection may hold (default 100)\n"
"      --max-clients-per-uid N connections one user may hold at once (default 64)\n"
"      --spin-us N             busy-poll this long after activity before sleeping (default 50)\n"
"      --no-coalesce           run every attend as its own backend call\n"
"      --gather-us N           wait up to N us for clients in lockstep to fill a batch (default 20)\n"
"  -l, --log-level LEVEL       error, warn, info (default) or debug\n"
"  -f, --foreground            stay in the foreground, log to stderr\n"
"  -h, --help                  this text\n"
"  -V, --version               print the version\n", PKV_PLUGIN_DIR);
}

static const struct option longopts[] = {
	{ "config", required_argument, NULL, 'c' },
	{ "socket", required_argument, NULL, 's' },
	{ "socket-mode", required_argument, NULL, 1 },
	{ "socket-group", required_argument, NULL, 1 },
	{ "plugin-dir", required_argument, NULL, 1 },
	{ "backend", required_argument, NULL, 1 },
	{ "backend-varlen", required_argument, NULL, 1 },
	{ "backend-decode", required_argument, NULL, 1 },
	{ "backend-option", required_argument, NULL, 1 },
	{ "list-backends", no_argument, NULL, 3 },
	{ "memory-budget", required_argument, NULL, 'm' },
	{ "workers", required_argument, NULL, 'w' },
	{ "client-max-seqs", required_argument, NULL, 1 },
	{ "client-block-share", required_argument, NULL, 1 },
	{ "max-clients-per-uid", required_argument, NULL, 1 },
	{ "spin-us", required_argument, NULL, 1 },
	{ "no-coalesce", no_argument, NULL, 2 },
	{ "gather-us", required_argument, NULL, 1 },
	{ "log-level", required_argument, NULL, 'l' },
	{ "foreground", no_argument, NULL, 'f' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 }
};

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

/* Parses options twice: --config first, so that flags override the file. Returns 0, 1 (exit 0) or -1. */
static int parse_args(int argc, char **argv, struct pkv_config *cfg)
{
	const char *config = NULL;
	char why[512];
	int c, idx, list = 0;

	opterr = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "c:s:m:w:l:fhV", longopts, &idx)) != -1)
		if (c == 'c')
			config = optarg;
	if (config && pkv_config_load(cfg, config, why, sizeof(why))) {
		fprintf(stderr, "pagedkvd: %s\n", why);
		return -1;
	}
	opterr = 1;
	optind = 1;
	while ((c = getopt_long(argc, argv, "c:s:m:w:l:fhV", longopts, &idx)) != -1) {
		const char *key = NULL;

		switch (c) {
		case 'c': continue;
		case 's': key = "socket"; break;
		case 'm': key = "memory_budget"; break;
		case 'w': key = "worker_threads"; break;
		case 'l': key = "log_level"; break;
		case 'f': cfg->foreground = 1; continue;
		case 2: cfg->coalesce = 0; continue;
		case 3: list = 1; continue;
		case 1: key = longopts[idx].name; break;
		case 'h': usage(stdout); return 1;
		case 'V': printf("pagedkvd %s (protocol %u)\n", PACKAGE_VERSION, PKV_PROTO_VERSION); return 1;
		default: usage(stderr); return -1;
		}
		if (pkv_config_set(cfg, key, optarg, why, sizeof(why))) {
			fprintf(stderr, "pagedkvd: %s\n", why);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "pagedkvd: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	return list ? list_backends(cfg) : 0;
}

/* Takes the lock beside the socket; a second daemon on the same socket stops here. */
static int take_lock(struct pkv_daemon *d)
{
	char path[sizeof(d->cfg.socket_path) + 8];

	snprintf(path, sizeof(path), "%s.lock", d->cfg.socket_path);
	d->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (d->lock_fd < 0) {
		pkv_err("cannot open lock file %s: %s", path, strerror(errno));
		return -errno;
	}
	if (flock(d->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;

		pkv_err("another pagedkvd is running on %s (lock %s held)", d->cfg.socket_path, path);
		return e == EWOULDBLOCK ? -EADDRINUSE : -e;
	}
	return 0;
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
	r = load_one(d, d->cfg.backend_varlen, opts, n, &d->plug_varlen, err, sizeof(err));
	if (r) {
		pkv_err("backend for varlen: %s", err);
		return r;
	}
	d->same_plugin = !strcmp(d->cfg.backend_varlen, d->cfg.backend_decode);
	if (!d->same_plugin) {
		r = load_one(d, d->cfg.backend_decode, opts, n, &d->plug_decode, err, sizeof(err));
		if (r) {
			pkv_err("backend for decode: %s", err);
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
	d->listen_fd = d->signal_fd = d->wake_fd = d->lock_fd = -1;
	pthread_mutex_init(&d->backend_mu, NULL);
	pkv_config_defaults(&d->cfg);
	r = parse_args(argc, argv, &d->cfg);
	if (r) {
		free(d);
		return r > 0 ? 0 : 2;
	}
	pkv_log_setup("pagedkvd", d->cfg.log_level, 0);
	if (!d->cfg.foreground && daemonize(&ready_fd)) {
		pkv_err("cannot daemonize: %s", strerror(errno));
		goto out;
	}
	/* Signals arrive through a signalfd in the loop; every thread inherits this mask. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (take_lock(d) || open_socket(d))
		goto out;
	d->signal_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	d->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (d->signal_fd < 0 || d->wake_fd < 0) {
		pkv_err("signalfd/eventfd: %s", strerror(errno));
		goto out_sock;
	}
	r = io_uring_queue_init(1024, &d->ring, 0);
	if (r) {
		pkv_err("io_uring: %s", strerror(-r));
		goto out_sock;
	}
	if (load_plugins(d))
		goto out_ring;
	r = worker_start(d);
	if (r) {
		pkv_err("worker thread: %s", strerror(-r));
		goto out_plugins;
	}
	pkv_info("listening on %s (protocol %u, budget %llu MiB)", d->cfg.socket_path, PKV_PROTO_VERSION,
		 (unsigned long long)(d->cfg.memory_budget >> 20));
	if (ready_fd >= 0) {
		pkv_log_setup("pagedkvd", d->cfg.log_level, 1);
		detach_stdio();
		if (write(ready_fd, "r", 1) < 0)
			pkv_warn("cannot signal readiness: %s", strerror(errno));
		close(ready_fd);
		ready_fd = -1;
	}
	r = loop_run(d);
	rc = r ? 1 : 0;
	worker_stop(d);
	while (d->pools) {
		struct pool *p = d->pools;

		d->pools = p->next;
		pool_destroy(d, p);
	}
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
		unlink(d->cfg.socket_path);
	}
	if (d->signal_fd >= 0)
		close(d->signal_fd);
	if (d->wake_fd >= 0)
		close(d->wake_fd);
out:
	if (d->lock_fd >= 0)
		close(d->lock_fd);
	if (rc == 0)
		pkv_info("stopped");
	pthread_mutex_destroy(&d->backend_mu);
	free(d);
	return rc;
}
