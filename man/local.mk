# SPDX-License-Identifier: MIT
# man/: a page for every installed program, the config file and the client library
# (pagedkvd.8 is listed by src/daemon/local.mk; tests/service/man-flags checks them against --help).
dist_man_MANS += man/pagedkvctl.8 man/pkv-bench.1 man/pkv-generate.1 man/pkv-chat.1 man/pkv-demo.1 \
	man/pagedkv.conf.5 man/libpagedkv.3
