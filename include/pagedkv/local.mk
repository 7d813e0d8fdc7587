# SPDX-License-Identifier: MIT
# Public headers: the client API, the backend plugin ABI and the shared types.
pkginclude_HEADERS += include/pagedkv/types.h include/pagedkv/backend.h include/pagedkv/pagedkv.h \
	include/pagedkv/dtype.h
