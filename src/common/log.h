/* SPDX-License-Identifier: MIT */
/* Logging for the daemon and tools: a level threshold, to stderr or syslog. */
#ifndef PKV_LOG_H
#define PKV_LOG_H

#include <stdarg.h>
#include <pagedkv/backend.h> /* enum pkv_log_level */

void pkv_log_setup(const char *ident, int level, int use_syslog);
int pkv_log_level(void);
/* Parses "error", "warn", "info", "debug" or a digit; -EINVAL otherwise. */
int pkv_log_parse_level(const char *s);
void pkv_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pkv_vlog(int level, const char *fmt, va_list ap);

#define pkv_err(...) pkv_log(PKV_LOG_ERROR, __VA_ARGS__)
#define pkv_warn(...) pkv_log(PKV_LOG_WARN, __VA_ARGS__)
#define pkv_info(...) pkv_log(PKV_LOG_INFO, __VA_ARGS__)
#define pkv_dbg(...) do { if (pkv_log_level() >= PKV_LOG_DEBUG) pkv_log(PKV_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
