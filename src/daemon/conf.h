/* SPDX-License-Identifier: MIT */
/* pagedkvd's settings: one table (conf.c) gives each its config key, flag, type, range, default and
 * help; the defaults, the file parser, the flags and --help are all read from it. */
#ifndef PKV_DAEMON_CONF_H
#define PKV_DAEMON_CONF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define PKV_CONF_MAX_BACKEND_OPTIONS 32

struct pkv_config {
	char socket_path[108];
	mode_t socket_mode;
	char socket_group[64];          /* "" = leave the group alone */
	char pid_file[4096];            /* "" = none */
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
	unsigned max_clients_per_uid;   /* connections one uid may hold at once */
	unsigned spin_us;               /* busy-poll the rings this long after activity */
	int coalesce;                   /* merge attends of the same pool and layer */
	unsigned gather_us;             /* wait this long for a lockstep batch to fill (0: never) */
	/* per-uid limits, pool scope and lifetime, fair scheduling (tenant.c, pool.c, worker.c) */
	unsigned uid_max_seqs;          /* open sequences of one uid, all connections and pools */
	unsigned uid_block_share;       /* percent of a shared pool's blocks one uid may hold */
	unsigned uid_max_pins;          /* prefix pins one uid may hold */
	uint64_t uid_max_region;        /* bytes of shared regions (rings + arenas) of one uid */
	unsigned uid_max_pools;         /* pools one uid may own (create) at once */
	unsigned uid_budget_share;      /* percent of memory_budget one uid's pools may take */
	unsigned pool_idle_grace_s;     /* free a pool this long after its last client left */
	unsigned attend_slice_us;       /* longest backend call before others get a turn */
	int inflight_sharing;           /* opens claim their prompt's blocks for later opens (cache.h) */
	/* isolation of clients' memory, connections and the admin tool (DESIGN.md §5) */
	char admin_group[64];           /* "" = admins are root and the daemon's uid only */
	unsigned max_unauth_per_uid;    /* connections one uid may hold before their hello */
	/* disk tier (tier_glue.c); 0 / "" = default / off */
	char disk_cache[4096];          /* directory; "" = no disk tier */
	uint64_t disk_budget;           /* bytes of records (0 = 10G) */
	unsigned disk_uid_share;        /* percent of the budget one uid may fill (0 = 100) */
	unsigned disk_wait_ms;          /* longest an open waits for disk reads (0 = 200) */
};

enum pkv_conf_type {
	PKV_CONF_STRING,
	PKV_CONF_MODE,    /* octal permissions */
	PKV_CONF_SIZE,    /* bytes, with K/M/G/T suffixes */
	PKV_CONF_UINT,
	PKV_CONF_BOOL,
	PKV_CONF_LOGLEVEL,
	PKV_CONF_BACKEND_OPTION,  /* NAME.KEY=VALUE, repeatable: appended to backend_options */
};

enum {
	PKV_CONF_RELOAD = 1 << 0,  /* SIGHUP applies a new value; others need a restart */
	PKV_CONF_ABSPATH = 1 << 1, /* a string that must be an absolute path */
	PKV_CONF_OLD_NAME = 1 << 2, /* an old name of the key before it with the same field: warns when used */
};

struct pkv_conf_key {
	const char *key;           /* in the file: `key = value` */
	const char *flag;          /* long flag without "--"; NULL: the key with '-' for '_' */
	int short_flag;            /* 0: none */
	enum pkv_conf_type type;
	size_t off, size;          /* the field in struct pkv_config */
	size_t also_off;           /* a second field set to the same value (0: none) */
	uint64_t lo, hi;           /* numbers: valid range; a SIZE with hi 0 is capped at physical memory */
	const char *def;           /* default as a value string; NULL: computed (said in help) */
	const char *arg;           /* placeholder in --help; NULL for a boolean flag */
	int flag_sets;             /* boolean flag: the value the flag sets (--no-coalesce sets 0) */
	unsigned flags;
	const char *help;
};

extern const struct pkv_conf_key pkv_conf_keys[];
extern const size_t pkv_conf_nkeys;

void pkv_config_defaults(struct pkv_config *cfg);
/* Sets one setting. NAME may be a file key, a flag ("--memory-budget" or "memory-budget") or an
 * alias; errors name it as given, with the valid values or range. -EINVAL with why. */
int pkv_config_set(struct pkv_config *cfg, const char *name, const char *value, char *why, size_t why_len);
/* The same for a known entry, shown in errors as NAME (say "-m" for the short flag). */
int pkv_config_set_key(struct pkv_config *cfg, const struct pkv_conf_key *k, const char *name, const char *value,
		       char *why, size_t why_len);
const struct pkv_conf_key *pkv_config_find(const char *name);
/* Reads a `key = value` file ('#' starts a comment anywhere after whitespace, blank lines are skipped).
 * -errno with "FILE:LINE: reason". */
int pkv_config_load(struct pkv_config *cfg, const char *path, char *why, size_t why_len);
/* Formats the value of one setting as the file would spell it. */
void pkv_config_format(const struct pkv_config *cfg, const struct pkv_conf_key *k, char *buf, size_t len);
/* Writes every setting as a commented config file (pagedkvd --print-config). */
void pkv_config_print(const struct pkv_config *cfg, FILE *f);
/* Writes the flags part of --help from the table. */
void pkv_config_usage(FILE *f);
/* Parses "123", "64K", "512M", "2G" into bytes. */
int pkv_parse_size(const char *s, uint64_t *out);

#endif
