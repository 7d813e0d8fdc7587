/* SPDX-License-Identifier: MIT */
/* Logging: one line per message, prefixed with the level, to stderr or syslog. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include "common/log.h"

static int g_level = PKV_LOG_INFO;
static int g_syslog;
static const char *g_ident = "pagedkv";

static const char *const names[] = { "error", "warn", "info", "debug" };

void pkv_log_setup(const char *ident, int level, int use_syslog)
{
	g_ident = ident;
	g_level = level;
	g_syslog = use_syslog;
	if (use_syslog)
		openlog(ident, LOG_PID, LOG_DAEMON);
}

int pkv_log_level(void)
{
	return g_level;
}

int pkv_log_parse_level(const char *s)
{
	for (int i = 0; i < 4; i++)
		if (!strcmp(s, names[i]))
			return i;
	if (s[0] >= '0' && s[0] <= '3' && !s[1])
		return s[0] - '0';
	return -EINVAL;
}

void pkv_vlog(int level, const char *fmt, va_list ap)
{
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	char line[1024];

	if (level > g_level)
		return;
	if (level < 0)
		level = 0;
	if (level > 3)
		level = 3;
	vsnprintf(line, sizeof(line), fmt, ap);
	if (g_syslog)
		syslog(prio[level], "%s", line);
	else
		fprintf(stderr, "%s: %s: %s\n", g_ident, names[level], line);
}

void pkv_log(int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	pkv_vlog(level, fmt, ap);
	va_end(ap);
}
