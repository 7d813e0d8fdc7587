/* SPDX-License-Identifier: MIT */
/* Administrative commands for pagedkvctl: status, audit, flush and metrics, as text, JSON or Prometheus. */
#include "config.h"
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include "common/log.h"
#include "daemon/daemon.h"
#include "daemon/tier_glue.h"

/*
 * Who may do what. Admins (root, the daemon's own uid, members of
 * admin_group) run every command and see everything. Anyone else sees
 * only the pools its uid has a connection attached to and only its own
 * connections, never prefix lookup/hit counters or attend counts (they
 * are per pool, so they tell one user about another's prompts), and may
 * not audit or flush.
 */
int ctl_init(struct pkv_daemon *d)
{
	struct group *g;

	d->have_admin_gid = 0;
	if (!d->cfg.admin_group[0])
		return 0;
	g = getgrnam(d->cfg.admin_group);
	if (!g) {
		pkv_err("admin_group '%s': no such group", d->cfg.admin_group);
		return -ENOENT;
	}
	d->admin_gid = g->gr_gid;
	d->have_admin_gid = 1;
	return 0;
}

int ctl_peer_is_admin(const struct pkv_daemon *d, int sock, uid_t uid)
{
	gid_t groups[256];
	socklen_t len = sizeof(groups);
	struct ucred cred;
	socklen_t cl = sizeof(cred);

	if (uid == 0 || uid == geteuid())
		return 1;
	if (!d->have_admin_gid)
		return 0;
	/* The kernel's view of the peer at connect time, never what it says about itself. */
	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 && cred.gid == d->admin_gid)
		return 1;
	if (getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
		return 0;
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (groups[i] == d->admin_gid)
			return 1;
	return 0;
}

/* A pool counter the worker adds to atomically (attends, batches): read it the same way. */
static uint64_t pool_counter(const uint64_t *c)
{
	return __atomic_load_n(c, __ATOMIC_RELAXED);
}

/* Whether the asking connection may see pool p: admins all, others those their uid is attached to. */
static int pool_visible(const struct pkv_daemon *d, const struct session *who, const struct pool *p)
{
	if (who->admin)
		return 1;
	for (const struct session *o = d->sessions; o; o = o->next)
		if (o->pool == p && o->uid == who->uid && !o->closing)
			return 1;
	return 0;
}

static int session_visible(const struct session *who, const struct session *o)
{
	return who->admin || o->uid == who->uid;
}

static uint32_t visible_sessions(const struct pkv_daemon *d, const struct session *who)
{
	uint32_t n = 0;

	for (const struct session *o = d->sessions; o; o = o->next)
		n += session_visible(who, o);
	return n;
}

static const char *dtype_name(uint32_t t)
{
	static const char *const n[] = { "f32", "f16", "bf16" };

	return t < PKV_DTYPE_COUNT ? n[t] : "?";
}

/* JSON string body: pool names are client-chosen, so escape everything unusual. */
static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20 || c >= 0x7f)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* Prometheus label value: same concern, different escapes. */
static void prom_str(FILE *f, const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c >= 0x20 && c < 0x7f)
			fputc(c, f);
		else
			fputc('_', f);
	}
}

static double hit_rate(const struct pkv_cache_stats *cs)
{
	return cs->lookup_tokens ? (double)cs->hit_tokens / (double)cs->lookup_tokens : 0.0;
}

static void do_status(struct pkv_daemon *d, const struct session *who, FILE *f, uint32_t fmt)
{
	struct pkv_cache_stats cs;
	int first = 1;

	if (fmt == PKV_FMT_JSON) {
		fprintf(f, "{\"admin\":%s,\"connections\":%u,\"memory_budget\":%llu,\"memory_used\":%llu,",
			who->admin ? "true" : "false", visible_sessions(d, who),
			(unsigned long long)d->cfg.memory_budget, (unsigned long long)d->budget_used);
		/* The tier's hit rate is every user's: for admins only, as the pools' counters. */
		if (who->admin)
			tier_glue_status(d, f, 1);
		fprintf(f, "\"pools\":[");
		for (struct pool *p = d->pools; p; p = p->next) {
			if (!pool_visible(d, who, p))
				continue;
			pool_cache_stats(p, &cs);
			fprintf(f, "%s{\"name\":", first ? "" : ",");
			json_str(f, p->name);
			fprintf(f, ",\"num_layers\":%u,\"num_heads\":%u,\"num_kv_heads\":%u,\"head_dim\":%u,"
				   "\"cache_dtype\":\"%s\",\"act_dtype\":\"%s\",\"block_size\":%u,"
				   "\"num_blocks\":%u,\"free_blocks\":%u,\"cached_blocks\":%u,"
				   "\"in_use_blocks\":%u,\"pinned_blocks\":%u,\"open_seqs\":%u,",
				p->geo.num_layers, p->geo.num_heads, p->geo.num_kv_heads, p->geo.head_dim,
				dtype_name(p->geo.cache_dtype), dtype_name(p->act_dtype), p->geo.block_size,
				cs.num_blocks, cs.free_blocks, cs.cached_blocks, cs.in_use_blocks,
				cs.pinned_blocks, cs.open_seqs);
			if (who->admin)
				fprintf(f, "\"prefix_lookup_tokens\":%llu,\"prefix_hit_tokens\":%llu,"
					   "\"prefix_hit_rate\":%.4f,\"clients\":%u,\"attends\":%llu,"
					   "\"batches\":%llu,\"row_pieces\":%llu,\"layer_copies\":%llu,",
					(unsigned long long)cs.lookup_tokens, (unsigned long long)cs.hit_tokens,
					hit_rate(&cs), p->n_clients, (unsigned long long)pool_counter(&p->attends),
					(unsigned long long)pool_counter(&p->batches),
					(unsigned long long)pool_counter(&p->row_pieces),
					(unsigned long long)pool_counter(&p->layer_copies));
			fprintf(f, "\"shared_across_users\":%s,\"client_attention\":%s}",
				(p->flags & PKV_WIRE_POOL_SHARED) ? "true" : "false",
				(p->flags & PKV_WIRE_POOL_CLIENT_ATTN) ? "true" : "false");
			first = 0;
		}
		fprintf(f, "],\"clients\":[");
		first = 1;
		for (struct session *s = d->sessions; s; s = s->next) {
			if (s->role != PKV_ROLE_CLIENT || !session_visible(who, s))
				continue;
			fprintf(f, "%s{\"id\":%u,\"pid\":%d,\"uid\":%u,\"pool\":", first ? "" : ",", s->id,
				(int)s->pid, (unsigned)s->uid);
			json_str(f, s->pool ? s->pool->name : "");
			fprintf(f, ",\"seqs\":%u,\"ops\":%llu,\"errors\":%llu}", s->n_seqs,
				(unsigned long long)s->ops, (unsigned long long)s->errors);
			first = 0;
		}
		fprintf(f, "]}\n");
		return;
	}
	fprintf(f, "pagedkvd: %u connections%s, KV memory %llu of %llu MiB\n", visible_sessions(d, who),
		who->admin ? "" : " of yours", (unsigned long long)(d->budget_used >> 20),
		(unsigned long long)(d->cfg.memory_budget >> 20));
	if (!who->admin)
		fprintf(f, "(not an admin: only your uid's pools and connections, no prefix or attend counters)\n");
	else
		tier_glue_status(d, f, 0);
	for (struct pool *p = d->pools; p; p = p->next) {
		if (!pool_visible(d, who, p))
			continue;
		pool_cache_stats(p, &cs);
		fprintf(f, "pool %s: %u layers, %u/%u heads x %u, cache %s, act %s, %u blocks of %u tokens%s%s\n",
			p->name, p->geo.num_layers, p->geo.num_heads, p->geo.num_kv_heads, p->geo.head_dim,
			dtype_name(p->geo.cache_dtype), dtype_name(p->act_dtype), p->geo.num_blocks,
			p->geo.block_size, (p->flags & PKV_WIRE_POOL_SHARED) ? ", shared across users" : "",
			(p->flags & PKV_WIRE_POOL_CLIENT_ATTN) ? ", client attention" : "");
		fprintf(f, "  blocks: %u free, %u cached, %u in use, %u pinned\n", cs.free_blocks,
			cs.cached_blocks, cs.in_use_blocks, cs.pinned_blocks);
		if (!who->admin)
			continue;
		fprintf(f, "  prefix hits: %.1f%% (%llu of %llu tokens); %u sequences open; %u clients\n",
			100.0 * hit_rate(&cs), (unsigned long long)cs.hit_tokens,
			(unsigned long long)cs.lookup_tokens, cs.open_seqs, p->n_clients);
		fprintf(f, "  attends: %llu in %llu backend calls; %llu key pieces of split rows; "
			   "%llu copy-on-write pieces of a block's layers\n",
			(unsigned long long)pool_counter(&p->attends), (unsigned long long)pool_counter(&p->batches),
			(unsigned long long)pool_counter(&p->row_pieces),
			(unsigned long long)pool_counter(&p->layer_copies));
	}
	for (struct session *s = d->sessions; s; s = s->next)
		if (s->role == PKV_ROLE_CLIENT && session_visible(who, s))
			fprintf(f, "client %u: pid %d uid %u pool %s, %u sequences, %llu requests, %llu errors\n",
				s->id, (int)s->pid, (unsigned)s->uid, s->pool ? s->pool->name : "-",
				s->n_seqs, (unsigned long long)s->ops, (unsigned long long)s->errors);
}

/* The cache's own invariants plus the daemon's bookkeeping against it. */
static int do_audit(struct pkv_daemon *d, FILE *f, uint32_t fmt)
{
	int total = 0, first = 1;

	loop_settle_releases(d);
	if (fmt == PKV_FMT_JSON)
		fprintf(f, "{\"pools\":[");
	for (struct pool *p = d->pools; p; p = p->next) {
		char report[2048] = "";
		struct pkv_cache_stats cs;
		uint32_t seqs = 0, steps = 0;
		int n;

		/* One snapshot: the worker begins and ends steps of this pool under the same lock. */
		pool_lock(p);
		n = pkv_cache_audit(p->cache, report, sizeof(report));
		if (n < 0) {
			snprintf(report, sizeof(report), "audit failed: %s", strerror(-n));
			n = 1;
		}
		pkv_cache_stats(p->cache, &cs);
		for (struct session *s = d->sessions; s; s = s->next)
			if (s->pool == p) {
				seqs += s->n_seqs;
				steps += s->step != NULL;
			}
		pool_unlock(p);
		if (cs.open_seqs != seqs || cs.open_steps != steps) {
			size_t l = strlen(report);

			snprintf(report + l, sizeof(report) - l, "%scache has %u sequences / %u steps open, "
				 "connections hold %u / %u", l ? "; " : "", cs.open_seqs, cs.open_steps, seqs, steps);
			n++;
		}
		if (cs.free_blocks + cs.cached_blocks + cs.in_use_blocks != cs.num_blocks) {
			size_t l = strlen(report);

			snprintf(report + l, sizeof(report) - l, "%sfree %u + cached %u + in use %u != %u",
				 l ? "; " : "", cs.free_blocks, cs.cached_blocks, cs.in_use_blocks, cs.num_blocks);
			n++;
		}
		if (!seqs && !steps && cs.in_use_blocks) {
			size_t l = strlen(report);

			snprintf(report + l, sizeof(report) - l, "%s%u blocks in use with no sequence open",
				 l ? "; " : "", cs.in_use_blocks);
			n++;
		}
		total += n;
		if (fmt == PKV_FMT_JSON) {
			fprintf(f, "%s{\"name\":", first ? "" : ",");
			json_str(f, p->name);
			fprintf(f, ",\"problems\":%d,\"report\":", n);
			json_str(f, report);
			fprintf(f, "}");
		} else {
			fprintf(f, "pool %s: %s%s\n", p->name, n ? "PROBLEMS: " : "ok", n ? report : "");
		}
		first = 0;
	}
	if (fmt == PKV_FMT_JSON)
		fprintf(f, "],\"problems\":%d}\n", total);
	else
		fprintf(f, "audit: %d problem%s\n", total, total == 1 ? "" : "s");
	return total;
}

static void do_flush(struct pkv_daemon *d, FILE *f, uint32_t fmt)
{
	int first = 1;

	loop_settle_releases(d);
	if (fmt == PKV_FMT_JSON)
		fprintf(f, "{\"pools\":[");
	for (struct pool *p = d->pools; p; p = p->next) {
		int n;

		pool_lock(p);
		n = tier_glue_cache_flush(d, p);
		pool_unlock(p);

		if (fmt == PKV_FMT_JSON) {
			fprintf(f, "%s{\"name\":", first ? "" : ",");
			json_str(f, p->name);
			fprintf(f, ",\"flushed_blocks\":%d}", n);
		} else {
			fprintf(f, "pool %s: %d cached blocks dropped\n", p->name, n);
		}
		first = 0;
	}
	if (fmt == PKV_FMT_JSON)
		fprintf(f, "]}\n");
}

static void metric(FILE *f, const char *name, const char *pool, const char *extra, double v)
{
	fprintf(f, "%s{pool=\"", name);
	prom_str(f, pool);
	fprintf(f, "\"%s} %.17g\n", extra ? extra : "", v);
}

static void do_metrics(struct pkv_daemon *d, const struct session *who, FILE *f)
{
	static const struct { const char *name, *type, *help; } m[] = {
		/* the first entries are what a non-admin sees too */
		{ "pagedkv_blocks", "gauge", "KV blocks by state" },
		{ "pagedkv_open_sequences", "gauge", "sequences open" },
		{ "pagedkv_prefix_lookup_tokens_total", "counter", "prompt tokens looked up in the prefix table" },
		{ "pagedkv_prefix_hit_tokens_total", "counter", "prompt tokens found cached" },
		{ "pagedkv_clients", "gauge", "connections attached" },
		{ "pagedkv_attends_total", "counter", "attend requests" },
		{ "pagedkv_backend_calls_total", "counter", "backend attention calls (after coalescing)" },
		{ "pagedkv_evictions_total", "counter", "cached blocks evicted" },
		{ "pagedkv_cow_copies_total", "counter", "copy-on-write block copies" },
		{ "pagedkv_row_pieces_total", "counter", "key pieces of query rows split over keys" },
		{ "pagedkv_layer_copies_total", "counter", "copy-on-write pieces of a block's layers" },
	};

	const size_t n_public = 2;

	fprintf(f, "# HELP pagedkv_connections connections to the daemon\n# TYPE pagedkv_connections gauge\n"
		   "pagedkv_connections %u\n", visible_sessions(d, who));
	fprintf(f, "# HELP pagedkv_memory_bytes KV memory of all pools\n# TYPE pagedkv_memory_bytes gauge\n"
		   "pagedkv_memory_bytes %llu\n", (unsigned long long)d->budget_used);
	fprintf(f, "# HELP pagedkv_memory_budget_bytes KV memory budget\n# TYPE pagedkv_memory_budget_bytes gauge\n"
		   "pagedkv_memory_budget_bytes %llu\n", (unsigned long long)d->cfg.memory_budget);
	for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
		if (i >= n_public && !who->admin)
			break;
		fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", m[i].name, m[i].help, m[i].name, m[i].type);
		for (struct pool *p = d->pools; p; p = p->next) {
			struct pkv_cache_stats cs;

			if (!pool_visible(d, who, p))
				continue;
			pool_cache_stats(p, &cs);
			switch (i) {
			case 0:
				metric(f, m[i].name, p->name, ",state=\"free\"", cs.free_blocks);
				metric(f, m[i].name, p->name, ",state=\"cached\"", cs.cached_blocks);
				metric(f, m[i].name, p->name, ",state=\"in_use\"", cs.in_use_blocks);
				metric(f, m[i].name, p->name, ",state=\"pinned\"", cs.pinned_blocks);
				break;
			case 1: metric(f, m[i].name, p->name, NULL, cs.open_seqs); break;
			case 2: metric(f, m[i].name, p->name, NULL, (double)cs.lookup_tokens); break;
			case 3: metric(f, m[i].name, p->name, NULL, (double)cs.hit_tokens); break;
			case 4: metric(f, m[i].name, p->name, NULL, p->n_clients); break;
			case 5: metric(f, m[i].name, p->name, NULL, (double)pool_counter(&p->attends)); break;
			case 6: metric(f, m[i].name, p->name, NULL, (double)pool_counter(&p->batches)); break;
			case 7: metric(f, m[i].name, p->name, NULL, (double)cs.evictions); break;
			case 8: metric(f, m[i].name, p->name, NULL, (double)cs.cow_copies); break;
			case 9: metric(f, m[i].name, p->name, NULL, (double)pool_counter(&p->row_pieces)); break;
			case 10: metric(f, m[i].name, p->name, NULL, (double)pool_counter(&p->layer_copies)); break;
			}
		}
	}
}

int ctl_run(struct pkv_daemon *d, const struct session *who, uint32_t cmd, uint32_t format, char **out,
	    size_t *len)
{
	FILE *f;
	int status = 0;

	*out = NULL;
	*len = 0;
	f = open_memstream(out, len);
	if (!f)
		return -ENOMEM;
	if ((cmd == PKV_CTL_AUDIT || cmd == PKV_CTL_FLUSH || cmd == PKV_CTL_FLUSH_DISK) && !who->admin) {
		fprintf(f, "%s needs an admin: root, the daemon's uid (%u)%s%s; uid %u is none of these\n",
			cmd == PKV_CTL_AUDIT ? "audit" : cmd == PKV_CTL_FLUSH ? "flush" : "flush --disk",
			(unsigned)geteuid(),
			d->have_admin_gid ? " or a member of group " : "",
			d->have_admin_gid ? d->cfg.admin_group : "", (unsigned)who->uid);
		fclose(f);
		return -EPERM;
	}
	switch (cmd) {
	case PKV_CTL_STATUS:
		do_status(d, who, f, format);
		break;
	case PKV_CTL_AUDIT:
		status = do_audit(d, f, format);
		break;
	case PKV_CTL_FLUSH:
		do_flush(d, f, format);
		break;
	case PKV_CTL_FLUSH_DISK:
		tier_glue_flush(d, f, format == PKV_FMT_JSON);
		break;
	case PKV_CTL_METRICS:
		if (format == PKV_FMT_JSON)
			do_status(d, who, f, format);
		else
			do_metrics(d, who, f);
		break;
	default:
		status = -EINVAL;
	}
	if (fclose(f) != 0 || !*out) {
		free(*out);
		*out = NULL;
		*len = 0;
		return -ENOMEM;
	}
	return status;
}
