# SPDX-License-Identifier: MIT
# pagedkvctl: status, audit, flush and metrics of a running pagedkvd.
bin_PROGRAMS += src/tools/pagedkvctl
src_tools_pagedkvctl_SOURCES = src/tools/pagedkvctl.c
src_tools_pagedkvctl_LDADD = src/common/libpkvcommon.la
