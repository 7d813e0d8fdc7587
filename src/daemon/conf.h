/* SPDX-License-Identifier: MIT */
/* pagedkvd's configuration: defaults, `key = value` files and command-line flags share one setter. */
#ifndef PKV_DAEMON_CONF_H
#define PKV_DAEMON_CONF_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PKV_CONF_MAX_BACKEND_OPTIONS 32

struct pkv_config {
	char socket_path[108];
	mode_t socket_mode;
	char socket_group[64];          /* "" = leave the group alone */
	char plugin_dir[4096];
	char backend_varlen[256];       /* plugin spec: name (pkv_NAME.so in plugin_dir) or path */
	char backend_decode[256];
	/* backend_option = NAME.KEY=VALUE, repeatable: handed to the backend(s) NAME names */
	char backend_options[PKV_CONF_MAX_BACKEND_OPTIONS][256];
	unsigned n_backend_options;
	uint64_t memory_budget;         /* bytes of KV cache for all pools */
	unsigned worker_threads;        /* threads a backend's parallel_for uses */
	int log_level;
	int foreground;
	unsigned client_max_seqs;       /* per connection */
	unsigned client_block_share;    /* percent of a pool's blocks one connection may hold */
	unsigned max_clients_per_uid;   /* connections one uid may hold at once */
	unsigned spin_us;               /* busy-poll the rings this long after activity */
	int coalesce;                   /* merge attends of the same pool and layer */
	unsigned gather_us;             /* wait this long for a lockstep batch to fill (0: never) */
};

void pkv_config_defaults(struct pkv_config *cfg);
/* Sets one key (file syntax: underscores; flags use dashes and are mapped). -EINVAL with why. */
int pkv_config_set(struct pkv_config *cfg, const char *key, const char *value, char *why, size_t why_len);
/* Reads a `key = value` file ('#' comments, blank lines). -errno with "FILE:LINE: reason". */
int pkv_config_load(struct pkv_config *cfg, const char *path, char *why, size_t why_len);
/* Parses "123", "64K", "512M", "2G" into bytes. */
int pkv_parse_size(const char *s, uint64_t *out);

#endif
