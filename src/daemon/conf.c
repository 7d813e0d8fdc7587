/* SPDX-License-Identifier: MIT */
/* Configuration parsing: every key is validated here, whether it comes from a file or a flag. */
#include "config.h"
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"
#include "common/msg.h"
#include "daemon/conf.h"

void pkv_config_defaults(struct pkv_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	if (pkv_default_socket_path(cfg->socket_path, sizeof(cfg->socket_path)))
		snprintf(cfg->socket_path, sizeof(cfg->socket_path), "/run/pagedkv.sock");
	cfg->socket_mode = 0660;
	snprintf(cfg->plugin_dir, sizeof(cfg->plugin_dir), "%s", PKV_PLUGIN_DIR);
	snprintf(cfg->backend_varlen, sizeof(cfg->backend_varlen), "cpu");
	snprintf(cfg->backend_decode, sizeof(cfg->backend_decode), "cpu");
	cfg->memory_budget = 1ull << 30;
	cfg->worker_threads = 0; /* 0: one per online CPU */
	cfg->log_level = PKV_LOG_INFO;
	cfg->client_max_seqs = 1024;
	cfg->client_block_share = 100;
	cfg->max_clients_per_uid = 64;
	cfg->spin_us = 50;
	cfg->coalesce = 1;
	cfg->gather_us = 20;
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

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out)
{
	unsigned long v;
	char *end;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*out = (unsigned)v;
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

static int copy_str(char *dst, size_t len, const char *v)
{
	if (strlen(v) >= len || !*v)
		return -EINVAL;
	strcpy(dst, v);
	return 0;
}

int pkv_config_set(struct pkv_config *cfg, const char *key, const char *value, char *why, size_t why_len)
{
	char k[64];
	size_t i;
	int r = -EINVAL;

	if (strlen(key) >= sizeof(k)) {
		snprintf(why, why_len, "unknown key '%.40s'", key);
		return -EINVAL;
	}
	for (i = 0; key[i]; i++)
		k[i] = key[i] == '-' ? '_' : key[i];
	k[i] = 0;
	if (!strcmp(k, "socket")) {
		r = copy_str(cfg->socket_path, sizeof(cfg->socket_path), value);
	} else if (!strcmp(k, "socket_mode")) {
		char *end;
		unsigned long m = strtoul(value, &end, 8);

		if (*value && !*end && m <= 0777) {
			cfg->socket_mode = (mode_t)m;
			r = 0;
		}
	} else if (!strcmp(k, "socket_group")) {
		r = copy_str(cfg->socket_group, sizeof(cfg->socket_group), value);
	} else if (!strcmp(k, "plugin_dir")) {
		r = copy_str(cfg->plugin_dir, sizeof(cfg->plugin_dir), value);
	} else if (!strcmp(k, "backend_varlen")) {
		r = copy_str(cfg->backend_varlen, sizeof(cfg->backend_varlen), value);
	} else if (!strcmp(k, "backend_decode")) {
		r = copy_str(cfg->backend_decode, sizeof(cfg->backend_decode), value);
	} else if (!strcmp(k, "backend_option")) {
		const char *dot = strchr(value, '.'), *eq = strchr(value, '=');

		/* Only the shape is checked here; the loader checks key and type against the backend's list. */
		if (!dot || !eq || dot > eq || dot == value || eq == dot + 1) {
			snprintf(why, why_len, "backend_option '%.60s' is not NAME.KEY=VALUE (e.g. cpu.isa=avx2)", value);
			return -EINVAL;
		}
		if (cfg->n_backend_options == PKV_CONF_MAX_BACKEND_OPTIONS) {
			snprintf(why, why_len, "more than %d backend_option settings", PKV_CONF_MAX_BACKEND_OPTIONS);
			return -EINVAL;
		}
		r = copy_str(cfg->backend_options[cfg->n_backend_options], sizeof(cfg->backend_options[0]), value);
		if (!r)
			cfg->n_backend_options++;
	} else if (!strcmp(k, "backend")) {
		r = copy_str(cfg->backend_varlen, sizeof(cfg->backend_varlen), value);
		if (!r)
			r = copy_str(cfg->backend_decode, sizeof(cfg->backend_decode), value);
	} else if (!strcmp(k, "memory_budget")) {
		uint64_t b;

		r = pkv_parse_size(value, &b);
		if (!r && b == 0)
			r = -EINVAL;
		if (!r)
			cfg->memory_budget = b;
	} else if (!strcmp(k, "worker_threads") || !strcmp(k, "workers")) {
		r = parse_uint(value, 0, 1024, &cfg->worker_threads);
	} else if (!strcmp(k, "log_level")) {
		r = pkv_log_parse_level(value);
		if (r >= 0) {
			cfg->log_level = r;
			r = 0;
		}
	} else if (!strcmp(k, "foreground")) {
		r = parse_bool(value, &cfg->foreground);
	} else if (!strcmp(k, "client_max_seqs")) {
		r = parse_uint(value, 1, 1u << 20, &cfg->client_max_seqs);
	} else if (!strcmp(k, "client_block_share")) {
		r = parse_uint(value, 1, 100, &cfg->client_block_share);
	} else if (!strcmp(k, "max_clients_per_uid")) {
		r = parse_uint(value, 1, 1u << 20, &cfg->max_clients_per_uid);
	} else if (!strcmp(k, "spin_us")) {
		r = parse_uint(value, 0, 1000000, &cfg->spin_us);
	} else if (!strcmp(k, "gather_us")) {
		r = parse_uint(value, 0, 10000, &cfg->gather_us);
	} else if (!strcmp(k, "coalesce")) {
		r = parse_bool(value, &cfg->coalesce);
	} else {
		snprintf(why, why_len, "unknown key '%s'", key);
		return -EINVAL;
	}
	if (r)
		snprintf(why, why_len, "bad value '%.200s' for %s", value, key);
	return r;
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
		k = trim(line);
		if (!*k || *k == '#')
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
