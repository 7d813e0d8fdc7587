# SPDX-License-Identifier: MIT
# Shared by scripts/check and scripts/demo: install build dependencies, configure and build a tree.

top=$(cd "$(dirname "$0")/.." && pwd)
jobs=${PKV_JOBS:-$(nproc 2>/dev/null || echo 2)}

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

# Regenerates configure only when it is missing or older than its inputs. autoreconf -fi installs
# build-aux/tap-driver.sh itself (configure.ac requires it), so a plain clone needs nothing else.
ensure_configure() {
	if [ ! -x "$top/configure" ] || [ "$top/configure.ac" -nt "$top/configure" ] ||
	   [ ! -f "$top/build-aux/tap-driver.sh" ]; then
		(cd "$top" && autoreconf -fi >/dev/null 2>&1) || { echo "pagedkv: autoreconf failed" >&2; exit 1; }
	fi
}

# True when someone ran ./configure inside the source tree: automake then refuses out-of-tree builds.
configured_in_tree() {
	[ -f "$top/config.status" ]
}

# build_tree DIR [configure args...]: configures DIR when it is new, when configure changed, or when it
# was configured with other arguments (scripts/demo's build has no -Werror; scripts/check's must),
# then makes. The arguments of the last configure are kept in DIR/.pkv-configure-args.
build_tree() {
	dir=$1; shift
	mkdir -p "$dir"
	want=$(printf '%s\n' "$@")
	have=$(cat "$dir/.pkv-configure-args" 2>/dev/null)
	if [ ! -f "$dir/Makefile" ] || [ "$top/configure" -nt "$dir/config.status" ] || [ "$want" != "$have" ]; then
		[ -f "$dir/Makefile" ] && [ "$want" != "$have" ] && echo "pagedkv: reconfiguring $dir with: $*"
		(cd "$dir" && "$top/configure" -q "$@") || { echo "pagedkv: configure failed in $dir (see $dir/config.log)" >&2; exit 1; }
		printf '%s\n' "$@" >"$dir/.pkv-configure-args"
	fi
	make_tree "$dir"
}

# make_tree DIR: builds an already configured tree quietly; on failure shows the errors (serial make).
make_tree() {
	make -C "$1" -s -j"$jobs" >/dev/null || make -C "$1" -j1 || exit 1
}

# phase TEXT: one line per phase, so a log (stdout not a terminal) shows what is going on.
phase() {
	echo "pagedkv: $*"
}
