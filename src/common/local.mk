# SPDX-License-Identifier: MIT
# src/common: rings, barriers, shared-region layout, protocol, logging (linked into the daemon, client and tools).
noinst_LTLIBRARIES += src/common/libpkvcommon.la
src_common_libpkvcommon_la_SOURCES = src/common/region.c src/common/log.c src/common/msg.c src/common/spin.c
noinst_HEADERS += src/common/barrier.h src/common/proto.h src/common/ring.h src/common/region.h \
	src/common/log.h src/common/msg.h src/common/clock.h src/common/spin.h \
	src/common/keyed_hash.h
