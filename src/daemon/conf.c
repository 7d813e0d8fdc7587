/* SPDX-License-Identifier: MIT */
/* Configuration: the one table of settings, and the parsing that validates each, from a file or a flag. */
#include "config.h"
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/log.h"
#include "common/msg.h"
#include "daemon/conf.h"
#include "pkv_paths.h"

#define F(field) offsetof(struct pkv_config, field), sizeof(((struct pkv_config *)0)->field)

/* Engineers adding a setting: append one entry (a contiguous block per area keeps merges easy). */
const struct pkv_conf_key pkv_conf_keys[] = {
	{ .key = "socket", .short_flag = 's', .type = PKV_CONF_STRING, F(socket_path), .arg = "PATH",
	  .help = "listening socket (default: $PAGEDKV_SOCKET, else $XDG_RUNTIME_DIR/pagedkv.sock, "
		  "else /run/pagedkv.sock; ignored when systemd passes the socket)" },
	{ .key = "socket_mode", .type = PKV_CONF_MODE, F(socket_mode), .lo = 0, .hi = 0777, .def = "0660",
	  .arg = "MODE", .help = "octal permissions of the socket" },
	{ .key = "socket_group", .type = PKV_CONF_STRING, F(socket_group), .arg = "GROUP",
	  .help = "group owning the socket (its members may connect)" },
	{ .key = "pid_file", .type = PKV_CONF_STRING, F(pid_file), .arg = "PATH",
	  .help = "write the daemon's pid here once it listens; removed at a clean stop" },
	{ .key = "plugin_dir", .type = PKV_CONF_STRING, F(plugin_dir), .def = PKV_PLUGIN_DIR, .arg = "DIR",
	  .help = "where backend plugins pkv_NAME.so live (default: $PAGEDKV_PLUGIN_DIR, else the installed one)" },
	{ .key = "backend", .type = PKV_CONF_STRING, F(backend_varlen), .also_off = offsetof(struct pkv_config, backend_decode),
	  .def = "cpu", .arg = "SPEC", .help = "plugin for both paths (a name in the plugin dir, or a path)" },
	{ .key = "backend_varlen", .type = PKV_CONF_STRING, F(backend_varlen), .arg = "SPEC",
	  .help = "plugin for batches with prefill (default: --backend)" },
	{ .key = "backend_decode", .type = PKV_CONF_STRING, F(backend_decode), .arg = "SPEC",
	  .help = "plugin for one-token-per-sequence batches (default: --backend; LIB:NAME picks one backend of a library, e.g. cuda:decode)" },
	{ .key = "backend_option", .type = PKV_CONF_BACKEND_OPTION, F(backend_options), .arg = "N.K=V",
	  .help = "option K=V for backend or library N (repeatable; e.g. cpu.isa=avx2; see --list-backends)" },
	{ .key = "memory_budget", .short_flag = 'm', .type = PKV_CONF_SIZE, F(memory_budget), .lo = 1 << 20,
	  .hi = 0, .def = "1G", .arg = "SIZE", .flags = PKV_CONF_RELOAD,
	  .help = "memory of all pools (KV and its index), e.g. 512M, 4G (at most the machine's memory)" },
	{ .key = "worker_threads", .flag = "workers", .short_flag = 'w', .type = PKV_CONF_UINT, F(worker_threads),
	  .lo = 0, .hi = 1024, .def = "0", .arg = "N", .help = "threads a backend may use (0 = one per CPU)" },
	{ .key = "client_max_seqs", .type = PKV_CONF_UINT, F(client_max_seqs), .lo = 1, .hi = 1u << 20,
	  .def = "1024", .arg = "N", .flags = PKV_CONF_RELOAD, .help = "sequences one connection may hold" },
	{ .key = "max_clients_per_uid", .type = PKV_CONF_UINT, F(max_clients_per_uid), .lo = 1, .hi = 1u << 20,
	  .def = "64", .arg = "N", .flags = PKV_CONF_RELOAD, .help = "connections one user may hold at once" },
	{ .key = "spin_us", .type = PKV_CONF_UINT, F(spin_us), .lo = 0, .hi = 1000000, .def = "50", .arg = "N",
	  .help = "busy-poll this many microseconds after activity before sleeping" },
	{ .key = "coalesce", .flag = "no-coalesce", .type = PKV_CONF_BOOL, F(coalesce), .def = "yes",
	  .flag_sets = 0, .help = "run every attend as its own backend call (file: coalesce = no)" },
	{ .key = "gather_us", .type = PKV_CONF_UINT, F(gather_us), .lo = 0, .hi = 10000, .def = "20", .arg = "N",
	  .help = "wait up to N microseconds for clients in lockstep to fill a batch" },
	/* per-uid limits, pool scope and lifetime, fair scheduling (tenant.c, pool.c, worker.c) */
	{ .key = "uid_max_seqs", .type = PKV_CONF_UINT, F(uid_max_seqs), .lo = 1, .hi = 1u << 20, .def = "4096",
	  .arg = "N", .flags = PKV_CONF_RELOAD, .help = "sequences one uid may hold over all its connections" },
	{ .key = "uid_block_share", .type = PKV_CONF_UINT, F(uid_block_share), .lo = 1, .hi = 100, .def = "50",
	  .arg = "P", .flags = PKV_CONF_RELOAD,
	  .help = "percent of a shared pool's blocks one uid may hold" },
	{ .key = "client_block_share", .type = PKV_CONF_UINT, F(uid_block_share), .lo = 1, .hi = 100,
	  .arg = "P", .flags = PKV_CONF_RELOAD | PKV_CONF_OLD_NAME,
	  .help = "old name of uid_block_share, now counted per uid" },
	{ .key = "uid_max_pins", .type = PKV_CONF_UINT, F(uid_max_pins), .lo = 0, .hi = 1u << 20, .def = "256",
	  .arg = "N", .flags = PKV_CONF_RELOAD, .help = "prefix pins one uid may hold" },
	{ .key = "uid_max_region", .type = PKV_CONF_SIZE, F(uid_max_region), .lo = 4096, .hi = 1ull << 50,
	  .def = "4G", .arg = "SIZE", .flags = PKV_CONF_RELOAD,
	  .help = "bytes of shared memory (rings and arenas) one uid's connections may map" },
	{ .key = "uid_max_pools", .type = PKV_CONF_UINT, F(uid_max_pools), .lo = 1, .hi = 1u << 16, .def = "8",
	  .arg = "N", .flags = PKV_CONF_RELOAD, .help = "pools one uid may own (create) at once" },
	{ .key = "uid_budget_share", .type = PKV_CONF_UINT, F(uid_budget_share), .lo = 1, .hi = 100, .def = "50",
	  .arg = "P", .flags = PKV_CONF_RELOAD, .help = "percent of the memory budget one uid's pools may take" },
	{ .key = "pool_idle_grace_s", .type = PKV_CONF_UINT, F(pool_idle_grace_s), .lo = 0, .hi = 7u * 24 * 3600,
	  .def = "60", .arg = "N", .flags = PKV_CONF_RELOAD,
	  .help = "free a pool N seconds after its last client left (at once when the budget is needed)" },
	{ .key = "attend_slice_us", .type = PKV_CONF_UINT, F(attend_slice_us), .lo = 0, .hi = 10000000,
	  .def = "500", .arg = "N", .help = "split attends longer than this so other clients get a turn (0: never)" },
	/* isolation of clients' memory, connections and the admin tool (DESIGN.md §5) */
	{ .key = "admin_group", .type = PKV_CONF_STRING, F(admin_group), .arg = "GROUP",
	  .help = "members may audit, flush and see every client (root and the daemon's uid always may)" },
	{ .key = "max_unauth_per_uid", .type = PKV_CONF_UINT, F(max_unauth_per_uid), .lo = 1, .hi = 1u << 16,
	  .def = "16", .arg = "N", .flags = PKV_CONF_RELOAD,
	  .help = "connections one user may hold before their hello" },
	{ .key = "max_arena_per_uid", .type = PKV_CONF_SIZE, F(uid_max_region), .lo = 4096, .hi = 1ull << 50,
	  .arg = "SIZE", .flags = PKV_CONF_RELOAD | PKV_CONF_OLD_NAME, .help = "old name of uid_max_region" },
	/* disk tier (tier_glue.c, src/tier) */
	{ .key = "disk_cache", .type = PKV_CONF_STRING, F(disk_cache), .arg = "DIR", .flags = PKV_CONF_ABSPATH,
	  .help = "keep prefix blocks that leave RAM in DIR (an absolute path; default: none, no disk tier)" },
	{ .key = "disk_budget", .type = PKV_CONF_SIZE, F(disk_budget), .lo = 1 << 20, .hi = 1ull << 50, .def = "10G",
	  .arg = "SIZE", .help = "disk bytes for them" },
	{ .key = "disk_uid_share", .type = PKV_CONF_UINT, F(disk_uid_share), .lo = 1, .hi = 100, .def = "100",
	  .arg = "P", .help = "percent of the disk budget one user may fill" },
	{ .key = "disk_wait_ms", .type = PKV_CONF_UINT, F(disk_wait_ms), .lo = 1, .hi = 60000, .def = "200",
	  .arg = "N", .help = "longest an open waits for its disk reads" },
	/* in-flight prefix sharing (src/cache/inflight.c) */
	{ .key = "inflight_sharing", .flag = "no-inflight-sharing", .type = PKV_CONF_BOOL, F(inflight_sharing),
	  .def = "yes", .flag_sets = 0,
	  .help = "an open finds only committed prefixes, not ones another sequence is computing "
		  "(file: inflight_sharing = no)" },
	{ .key = "log_level", .short_flag = 'l', .type = PKV_CONF_LOGLEVEL, F(log_level), .def = "info",
	  .arg = "LEVEL", .flags = PKV_CONF_RELOAD, .help = "error, warn, info or debug" },
	{ .key = "foreground", .short_flag = 'f', .type = PKV_CONF_BOOL, F(foreground), .def = "no",
	  .flag_sets = 1, .help = "stay in the foreground, log to stderr" },
};
const size_t pkv_conf_nkeys = sizeof(pkv_conf_keys) / sizeof(pkv_conf_keys[0]);

static const char *const level_names[] = { "error", "warn", "info", "debug" };

static void flag_name(const struct pkv_conf_key *k, char *buf, size_t len)
{
	size_t i;

	if (k->flag) {
		snprintf(buf, len, "%s", k->flag);
		return;
	}
	for (i = 0; k->key[i] && i + 1 < len; i++)
		buf[i] = k->key[i] == '_' ? '-' : k->key[i];
	buf[i] = 0;
}

const struct pkv_conf_key *pkv_config_find(const char *name)
{
	char n[64], fl[64];
	size_t i;

	if (name[0] == '-' && name[1] && name[1] != '-' && !name[2]) {
		for (i = 0; i < pkv_conf_nkeys; i++)
			if (pkv_conf_keys[i].short_flag == name[1])
				return &pkv_conf_keys[i];
		return NULL;
	}
	while (*name == '-')
		name++;
	if (strlen(name) >= sizeof(n))
		return NULL;
	for (i = 0; name[i]; i++)
		n[i] = name[i] == '-' ? '_' : name[i];
	n[i] = 0;
	for (i = 0; i < pkv_conf_nkeys; i++) {
		flag_name(&pkv_conf_keys[i], fl, sizeof(fl));
		if (!strcmp(n, pkv_conf_keys[i].key) || !strcmp(name, fl))
			return &pkv_conf_keys[i];
	}
	return NULL;
}

int pkv_parse_size(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;
	int shift = 0;

	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	switch (*end) {
	case 0: break;
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	default: return -EINVAL;
	}
	if (*end == 'i' || *end == 'B' || *end == 'b')
		end++;
	if (*end == 'B')
		end++;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

/* Bytes as a person writes them: exact with a suffix when it is one ("512M"), else one decimal. */
static void fmt_size(uint64_t b, char *buf, size_t len)
{
	static const char suffix[] = "KMGT";
	int i;

	for (i = 4; i > 0; i--) {
		uint64_t unit = 1ull << (10 * i);

		if (b >= unit && !(b % unit)) {
			snprintf(buf, len, "%" PRIu64 "%c", b / unit, suffix[i - 1]);
			return;
		}
		if (b >= unit) {
			snprintf(buf, len, "%.1f%c", (double)b / (double)unit, suffix[i - 1]);
			return;
		}
	}
	snprintf(buf, len, "%" PRIu64, b);
}

static uint64_t physical_memory(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

	return pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : UINT64_MAX;
}

static int parse_uint(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

static int parse_bool(const char *s, int *out)
{
	if (!strcmp(s, "1") || !strcmp(s, "yes") || !strcmp(s, "true") || !strcmp(s, "on"))
		*out = 1;
	else if (!strcmp(s, "0") || !strcmp(s, "no") || !strcmp(s, "false") || !strcmp(s, "off"))
		*out = 0;
	else
		return -EINVAL;
	return 0;
}

static int set_one(struct pkv_config *cfg, const struct pkv_conf_key *k, size_t off, const char *name,
		   const char *value, char *why, size_t why_len)
{
	char *field = (char *)cfg + off;
	char lo[32], hi[32];
	uint64_t v;
	int b;

	switch (k->type) {
	case PKV_CONF_STRING:
		if (!*value || strlen(value) >= k->size) {
			snprintf(why, why_len, "%s: %s (1 to %zu characters)", name, *value ? "too long" : "empty",
				 k->size - 1);
			return -EINVAL;
		}
		if ((k->flags & PKV_CONF_ABSPATH) && *value != '/') {
			snprintf(why, why_len, "%s: '%.64s' is not an absolute path", name, value);
			return -EINVAL;
		}
		memcpy(field, value, strlen(value) + 1);
		return 0;
	case PKV_CONF_MODE: {
		char *end;
		unsigned long m = strtoul(value, &end, 8);

		if (!*value || *end || !isdigit((unsigned char)*value) || m > k->hi) {
			snprintf(why, why_len, "%s: '%.64s' is not an octal mode from 0 to 0777", name, value);
			return -EINVAL;
		}
		*(mode_t *)field = (mode_t)m;
		return 0;
	}
	case PKV_CONF_SIZE: {
		uint64_t max = k->hi ? k->hi : physical_memory();

		fmt_size(k->lo, lo, sizeof(lo));
		fmt_size(max, hi, sizeof(hi));
		if (pkv_parse_size(value, &v)) {
			snprintf(why, why_len, "%s: '%.64s' is not a size (a number with K, M, G or T: %s to %s)",
				 name, value, lo, hi);
			return -EINVAL;
		}
		if (v < k->lo || v > max) {
			snprintf(why, why_len, "%s: %.64s is too %s: valid from %s to %s%s", name, value,
				 v < k->lo ? "small" : "large", lo, hi, k->hi ? "" : " (this machine's memory)");
			return -ERANGE;
		}
		*(uint64_t *)field = v;
		return 0;
	}
	case PKV_CONF_UINT:
		if (parse_uint(value, &v) || v < k->lo || v > k->hi) {
			snprintf(why, why_len, "%s: '%.64s' is not a whole number from %" PRIu64 " to %" PRIu64,
				 name, value, k->lo, k->hi);
			return -EINVAL;
		}
		*(unsigned *)field = (unsigned)v;
		return 0;
	case PKV_CONF_BOOL:
		if (parse_bool(value, &b)) {
			snprintf(why, why_len, "%s: '%.64s' is not yes/no (also true/false, on/off, 1/0)", name, value);
			return -EINVAL;
		}
		*(int *)field = b;
		return 0;
	case PKV_CONF_LOGLEVEL:
		b = pkv_log_parse_level(value);
		if (b < 0) {
			snprintf(why, why_len, "%s: unknown level '%.64s' (valid: error, warn, info, debug)", name, value);
			return -EINVAL;
		}
		*(int *)field = b;
		return 0;
	case PKV_CONF_BACKEND_OPTION: {
		const char *dot = strchr(value, '.'), *eq = strchr(value, '=');

		/* Only the shape is checked here; the loader checks key and type against the backend's list. */
		if (!dot || !eq || dot > eq || dot == value || eq == dot + 1) {
			snprintf(why, why_len, "%s: '%.60s' is not NAME.KEY=VALUE (e.g. cpu.isa=avx2)", name, value);
			return -EINVAL;
		}
		if (cfg->n_backend_options == PKV_CONF_MAX_BACKEND_OPTIONS ||
		    strlen(value) >= sizeof(cfg->backend_options[0])) {
			snprintf(why, why_len, "%s: more than %d settings, or one over %zu characters", name,
				 PKV_CONF_MAX_BACKEND_OPTIONS, sizeof(cfg->backend_options[0]) - 1);
			return -EINVAL;
		}
		memcpy(cfg->backend_options[cfg->n_backend_options++], value, strlen(value) + 1);
		return 0;
	}
	}
	return -EINVAL;
}

int pkv_config_set(struct pkv_config *cfg, const char *name, const char *value, char *why, size_t why_len)
{
	const struct pkv_conf_key *k = pkv_config_find(name);

	if (!k) {
		snprintf(why, why_len, "unknown key '%.64s' (pagedkvd --help lists the settings)", name);
		return -EINVAL;
	}
	return pkv_config_set_key(cfg, k, name, value, why, why_len);
}

int pkv_config_set_key(struct pkv_config *cfg, const struct pkv_conf_key *k, const char *name, const char *value,
		       char *why, size_t why_len)
{
	int r;

	if (k->flags & PKV_CONF_OLD_NAME)
		for (const struct pkv_conf_key *n = pkv_conf_keys; n < k; n++)
			if (n->off == k->off && !(n->flags & PKV_CONF_OLD_NAME)) {
				/* the meaning may have moved with the name (client_block_share: per uid now) */
				pkv_warn("%s is an old name: use %s (%s)", name, n->key, n->help);
				break;
			}
	r = set_one(cfg, k, k->off, name, value, why, why_len);
	if (!r && k->also_off)
		r = set_one(cfg, k, k->also_off, name, value, why, why_len);
	return r;
}

void pkv_config_defaults(struct pkv_config *cfg)
{
	char why[256];
	size_t i;

	memset(cfg, 0, sizeof(*cfg));
	if (pkv_default_socket_path(cfg->socket_path, sizeof(cfg->socket_path)))
		snprintf(cfg->socket_path, sizeof(cfg->socket_path), "/run/pagedkv.sock");
	for (i = 0; i < pkv_conf_nkeys; i++)
		if (pkv_conf_keys[i].def && pkv_config_set(cfg, pkv_conf_keys[i].key, pkv_conf_keys[i].def, why, sizeof(why)))
			pkv_err("built-in default: %s", why); /* a bug in the table; check_conf catches it */
	/* The environment is a default too: a config file or a flag still decides. */
	if (getenv("PAGEDKV_PLUGIN_DIR") && *getenv("PAGEDKV_PLUGIN_DIR") &&
	    pkv_config_set(cfg, "plugin_dir", getenv("PAGEDKV_PLUGIN_DIR"), why, sizeof(why)))
		pkv_warn("$PAGEDKV_PLUGIN_DIR ignored: %s", why);
}

void pkv_config_format(const struct pkv_config *cfg, const struct pkv_conf_key *k, char *buf, size_t len)
{
	const char *field = (const char *)cfg + k->off;

	switch (k->type) {
	case PKV_CONF_STRING: snprintf(buf, len, "%s", field); break;
	case PKV_CONF_MODE: snprintf(buf, len, "0%o", (unsigned)*(const mode_t *)field); break;
	case PKV_CONF_SIZE: fmt_size(*(const uint64_t *)field, buf, len); break;
	case PKV_CONF_UINT: snprintf(buf, len, "%u", *(const unsigned *)field); break;
	case PKV_CONF_BOOL: snprintf(buf, len, "%s", *(const int *)field ? "yes" : "no"); break;
	case PKV_CONF_LOGLEVEL: {
		int l = *(const int *)field;

		snprintf(buf, len, "%s", l >= 0 && l < 4 ? level_names[l] : "info");
		break;
	}
	case PKV_CONF_BACKEND_OPTION:   /* the first; pkv_config_print writes each */
		snprintf(buf, len, "%s", cfg->n_backend_options ? cfg->backend_options[0] : "");
		break;
	}
}

void pkv_config_print(const struct pkv_config *cfg, FILE *f)
{
	char v[4200];

	fprintf(f, "# pagedkvd settings (pagedkv.conf(5)); '#' starts a comment\n");
	for (size_t i = 0; i < pkv_conf_nkeys; i++) {
		const struct pkv_conf_key *k = &pkv_conf_keys[i];

		if (k->flags & PKV_CONF_OLD_NAME)
			continue; /* its value is the new name's, printed there */
		pkv_config_format(cfg, k, v, sizeof(v));
		fprintf(f, "\n# %s%s\n%s%s = %s\n", k->help, k->flags & PKV_CONF_RELOAD ? " (SIGHUP reloads it)" : "",
			*v ? "" : "# ", k->key, v);
		for (unsigned j = 1; k->type == PKV_CONF_BACKEND_OPTION && j < cfg->n_backend_options; j++)
			fprintf(f, "%s = %s\n", k->key, cfg->backend_options[j]);
	}
}

/* Writes TEXT from column `col`, wrapping at 79 columns, continuation lines indented to `col`. */
static void wrap(FILE *f, int col, const char *text)
{
	int at = col;

	while (*text) {
		int w = (int)strcspn(text, " ");

		if (at > col && at + 1 + w > 79) {
			fprintf(f, "\n%*s", col, "");
			at = col;
		} else if (at > col) {
			fputc(' ', f);
			at++;
		}
		fprintf(f, "%.*s", w, text);
		at += w;
		text += w;
		while (*text == ' ')
			text++;
	}
	fputc('\n', f);
}

void pkv_config_usage(FILE *f)
{
	char fl[64], left[96], text[512];

	for (size_t i = 0; i < pkv_conf_nkeys; i++) {
		const struct pkv_conf_key *k = &pkv_conf_keys[i];

		flag_name(k, fl, sizeof(fl));
		if (k->short_flag)
			snprintf(left, sizeof(left), "  -%c, --%s%s%s", k->short_flag, fl, k->arg ? " " : "",
				 k->arg ? k->arg : "");
		else
			snprintf(left, sizeof(left), "      --%s%s%s", fl, k->arg ? " " : "", k->arg ? k->arg : "");
		snprintf(text, sizeof(text), "%s%s%s%s", k->help, k->def && k->arg ? " (default " : "",
			 k->def && k->arg ? k->def : "", k->def && k->arg ? ")" : "");
		fprintf(f, "%-32s", left);
		if (strlen(left) >= 32)
			fprintf(f, "\n%32s", "");
		wrap(f, 32, text);
	}
}

/* Ends the line at a '#' that starts it or follows whitespace ("key = 5  # why"). */
static void strip_comment(char *s)
{
	for (char *p = s; *p; p++)
		if (*p == '#' && (p == s || isspace((unsigned char)p[-1]))) {
			*p = 0;
			return;
		}
}

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	return s;
}

int pkv_config_load(struct pkv_config *cfg, const char *path, char *why, size_t why_len)
{
	char line[4608], sub[512];
	unsigned lineno = 0;
	FILE *f;
	int r = 0;

	f = fopen(path, "re");
	if (!f) {
		r = -errno;
		snprintf(why, why_len, "%s: %s", path, strerror(errno));
		return r;
	}
	while (fgets(line, sizeof(line), f)) {
		char *k, *v, *eq;

		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			snprintf(why, why_len, "%s:%u: line too long", path, lineno);
			r = -EINVAL;
			break;
		}
		strip_comment(line);
		k = trim(line);
		if (!*k)
			continue;
		eq = strchr(k, '=');
		if (!eq) {
			snprintf(why, why_len, "%s:%u: expected 'key = value'", path, lineno);
			r = -EINVAL;
			break;
		}
		*eq = 0;
		k = trim(k);
		v = trim(eq + 1);
		r = pkv_config_set(cfg, k, v, sub, sizeof(sub));
		if (r) {
			snprintf(why, why_len, "%s:%u: %s", path, lineno, sub);
			break;
		}
	}
	fclose(f);
	return r;
}
