# SPDX-License-Identifier: MIT
# Shared by scripts/check and scripts/demo: install build dependencies, configure and build a tree.

top=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)

# Debian packages the build and the tests need. Installed only when missing, only as root.
deps="autoconf automake libtool pkg-config make gcc liburing-dev check libxxhash-dev python3"

ensure_deps() {
	missing=
	for p in $deps; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
	done
	[ -z "$missing" ] && return 0
	if [ "$(id -u)" -ne 0 ]; then
		echo "pagedkv: missing Debian packages:$missing" >&2
		echo "pagedkv: run as root, or: sudo apt-get install$missing" >&2
		exit 1
	fi
	echo "pagedkv: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -q $missing >/dev/null 2>&1 || {
		apt-get update -q >/dev/null && apt-get install -y -q $missing >/dev/null
	} || { echo "pagedkv: apt-get install$missing failed" >&2; exit 1; }
}

# Regenerates configure only when it is missing or older than its inputs.
ensure_configure() {
	if [ ! -x "$top/configure" ] || [ "$top/configure.ac" -nt "$top/configure" ]; then
		(cd "$top" && autoreconf -fi >/dev/null) || { echo "pagedkv: autoreconf failed" >&2; exit 1; }
	fi
	# automake ships the TAP driver but does not install it by itself.
	if [ ! -f "$top/build-aux/tap-driver.sh" ]; then
		cp "$(ls -d /usr/share/automake-*/tap-driver.sh | tail -n 1)" "$top/build-aux/" ||
			{ echo "pagedkv: automake's tap-driver.sh not found" >&2; exit 1; }
	fi
}

# build_tree DIR [configure args...]: configures DIR once (again if configure changed), then makes.
build_tree() {
	dir=$1; shift
	mkdir -p "$dir"
	if [ ! -f "$dir/Makefile" ] || [ "$top/configure" -nt "$dir/config.status" ]; then
		(cd "$dir" && "$top/configure" -q "$@") || { echo "pagedkv: configure failed in $dir (see $dir/config.log)" >&2; exit 1; }
	fi
	make -C "$dir" -s -j"$jobs" >/dev/null || make -C "$dir" -j1 || exit 1
}
