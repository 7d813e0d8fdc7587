/* SPDX-License-Identifier: MIT */
/* Backend options as the daemon's configuration names them ("cpu.isa=avx2"), sorted out per backend. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "loader/loader.h"

int pkv_option_parse(const char *text, char *buf, size_t buf_len, struct pkv_option_setting *out)
{
	char *dot, *eq;
	size_t n = strlen(text);

	if (n >= buf_len)
		return -ENAMETOOLONG;
	memcpy(buf, text, n + 1);
	dot = strchr(buf, '.');
	eq = strchr(buf, '=');
	/* The prefix and the key are both non-empty and the '.' comes before the '='. */
	if (!dot || !eq || dot > eq || dot == buf || eq == dot + 1)
		return -EINVAL;
	*dot = '\0';
	*eq = '\0';
	out->prefix = buf;
	out->item.key = dot + 1;
	out->item.value = eq + 1;
	return 0;
}

void pkv_spec_short_name(const char *spec, char *out, size_t len)
{
	const char *base = strrchr(spec, '/');
	size_t n;

	base = base ? base + 1 : spec;
	if (!strncmp(base, "pkv_", 4) && strchr(spec, '/'))
		base += 4;
	n = strcspn(base, ":");
	if (n > 3 && !strncmp(base + n - 3, ".so", 3))
		n -= 3;
	snprintf(out, len, "%.*s", (int)n, base);
}

int pkv_options_select(struct pkv_option_setting *all, uint32_t n, const char *lib, const char *backend,
		       struct pkv_dict_item *items, uint32_t max, struct pkv_dict *out)
{
	uint32_t i, k = 0;

	for (i = 0; i < n; i++) {
		if (strcmp(all[i].prefix, lib) && (!backend || strcmp(all[i].prefix, backend)))
			continue;
		if (k == max)
			return -E2BIG;
		items[k++] = all[i].item;
		all[i].used = 1;
	}
	*out = (struct pkv_dict){ .n_items = k, .items = items };
	return 0;
}
