#!/bin/sh
# SPDX-License-Identifier: MIT
# One-shot GPU check: builds the kernels, the CUDA plugin (pkv_cuda.so: varlen and decode), pkv-conformance,
# the hostile-batch test and the bench with nvcc and cc alone (no autotools, no liburing), runs them, and
# prints a short table last.
#
# Usage (from the repository root):  tests/cuda/gpu-check.sh
# Env: OUT (logs and results go there; default a temporary directory), NVCC, CC,
#      NVCCFLAGS (default sm_90 SASS + compute_90 PTX), PKV_CONFORMANCE_FULL=1 (the exhaustive matrix).
# Exit: 0 all passed, 1 a build or a check failed, 77 no GPU here (everything was still compiled).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 1
start=$(date +%s)

nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cc=${CC:-$(command -v cc || command -v gcc)}
if [ ! -x "$nvcc" ] || [ -z "$cc" ]; then
	echo "gpu-check: needs nvcc (looked in PATH and /usr/local/cuda/bin) and a C compiler" >&2
	exit 1
fi
cuda=$(dirname "$(dirname "$nvcc")")
culib=$cuda/lib64
[ -d "$culib" ] || culib=$cuda/lib
nvccflags=${NVCCFLAGS:--O3 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90}
out=${OUT:-$(mktemp -d /tmp/pkv-gpu-check.XXXXXX)}
b=$out/build
mkdir -p "$b"
log=$out/gpu-check.log
: > "$log"
results=$out/results.txt
: > "$results"
status=0

say() { echo "$*" | tee -a "$log"; }
# Time left of the 8-minute budget (420 s of checks, leaving room for the final table and the transfer).
left() { echo $(( 420 - ($(date +%s) - start) )); }
cap() { # cap N: N, or what is left of the budget if less (at least 10)
	l=$(left)
	[ "$l" -lt "$1" ] && { [ "$l" -lt 10 ] && echo 10 || echo "$l"; } || echo "$1"
}
step() { # step NAME CMD...: runs CMD with output to the log, records PASS/FAIL/SKIP
	name=$1; shift
	t0=$(date +%s)
	echo "== $name: $*" >> "$log"
	"$@" >> "$log" 2>&1
	rc=$?
	t=$(( $(date +%s) - t0 ))
	case $rc in
	0) r=PASS ;;
	77) r=SKIP ;;
	*) r="FAIL (exit $rc)"; status=1 ;;
	esac
	printf '%-34s %-16s %4ss\n' "$name" "$r" "$t" | tee -a "$results"
	return $rc
}

say "gpu-check: $(date -u '+%Y-%m-%d %H:%M UTC'), nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), cc $("$cc" -dumpversion), out $out"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >> "$log" 2>&1

cflags="-std=gnu11 -O2 -g -Wall -Wextra -Wno-unused-parameter -I$top/include -I$top/src -I$top/kernels -I$top/plugins/cuda -isystem $cuda/include"
objs=
build_cu() {
	for f in attn_f16 attn_bf16 util; do
		# -Xptxas -v: registers, shared memory and spills go to the log for every kernel.
		"$nvcc" -c -Xcompiler -fPIC $nvccflags -Xptxas -v -I"$top/include" -I"$top/kernels" \
			-o "$b/$f.o" "$top/kernels/$f.cu" || return 1
	done
}
step "build kernels (nvcc)" build_cu || { cat "$results"; exit 1; }
objs="$b/attn_f16.o $b/attn_bf16.o $b/util.o"

printf '{ global: pkv_backend_enum; local: *; };\n' > "$b/export.map"
build_plugin() {
	"$cc" $cflags -fPIC -shared -fvisibility=hidden -o "$b/pkv_cuda.so" "$top/plugins/cuda/host.c" \
		"$top/plugins/cuda/backends.c" "$top/plugins/cuda/splits.c" $objs \
		-Wl,--version-script="$b/export.map" -L"$culib" -lcudart -lstdc++ -Wl,-rpath,"$culib"
}
step "build plugin pkv_cuda.so" build_plugin || status=1
step "build hostile-batch test" "$cc" $cflags -o "$b/hostile_batches" "$top/tests/cuda/hostile_batches.c" -ldl
# The runner every backend is held to: plain C, the loader sources, libdl, pthread, libm.
step "build pkv-conformance" "$cc" $cflags -o "$b/pkv-conformance" "$top/src/conformance/conformance.c" \
	"$top/src/conformance/ref.c" "$top/src/loader/host.c" "$top/src/loader/plugin.c" "$top/src/loader/options.c" \
	"$top/src/loader/dispatch.c" \
	-ldl -lpthread -lm || status=1
# A bench that does not build (no cuBLAS here) must not stop the correctness checks.
have_bench=no
pre_bench=$status
step "build bench" "$cc" $cflags -o "$b/cuda_bench" "$top/tests/cuda/cuda_bench.c" "$top/plugins/cuda/splits.c" \
	$objs -L"$culib" -lcublas -lcudart -lstdc++ -lm -Wl,-rpath,"$culib" && have_bench=yes
bench_status=$status
status=$pre_bench

if [ $status -ne 0 ]; then
	say "gpu-check: a build failed; see $log"
	cat "$results"
	exit 1
fi

conf_run() { # conf_run BACKEND [OPTIONS]: besides the exit status, the TAP must show passes and no failure.
	timeout "$(cap 80)" env PKV_CONFORMANCE_OPTIONS="${2:-}" "$b/pkv-conformance" "$b/pkv_cuda.so" "$1" \
		> "$out/conformance-$1$2.tap" 2>&1
	rc=$?
	cat "$out/conformance-$1$2.tap"
	[ $rc -eq 77 ] && return 77
	grep -qE '^(not ok|Bail out)' "$out/conformance-$1$2.tap" && return 1
	grep -qE '^ok ' "$out/conformance-$1$2.tap" || return 1
	return $rc
}
# No GPU: everything compiled, nothing can run (the runner exits 77 when init finds no device).
PKV_CONFORMANCE_MAX_CASES=1 "$b/pkv-conformance" "$b/pkv_cuda.so" varlen > "$out/probe.txt" 2>&1
if [ $? -eq 77 ]; then
	say "gpu-check: no usable CUDA device here ($(grep -m1 'no CUDA device' "$out/probe.txt" || tail -n 1 "$out/probe.txt")); built everything, ran nothing"
	cat "$results"
	exit 77
fi
step "conformance varlen" conf_run varlen
step "conformance decode" conf_run decode
# The same without split-KV: tells a kernel bug from a merge bug.
step "conformance decode, splits=1" conf_run decode splits=1
grep -hE '^(not ok|Bail out)' "$out"/conformance-*.tap | head -n 10 >> "$results"

if command -v cuobjdump >/dev/null 2>&1; then
	cuobjdump --dump-sass "$b/attn_bf16.o" > "$out/attn_bf16.sass" 2>&1
	say "sass attn_bf16: $(grep -c HMMA "$out/attn_bf16.sass") HMMA, $(grep -c LDSM "$out/attn_bf16.sass") LDSM, $(grep -c LDGSTS "$out/attn_bf16.sass") LDGSTS, $(grep -cE 'LDL|STL' "$out/attn_bf16.sass") local-memory ops"
fi

step "hostile batches refused" timeout "$(cap 30)" "$b/hostile_batches" "$b/pkv_cuda.so"

# The other kernel variants (64-row varlen CTAs, 3-stage decode; the bench decides which become the
# defaults), then a short run under compute-sanitizer.
step "conformance, alt variants" timeout "$(cap 60)" env PKV_CUDA_VARLEN_WM=1 PKV_CUDA_DECODE_VARIANT=2 \
	PKV_CONFORMANCE_MAX_CASES=20 "$b/pkv-conformance" "$b/pkv_cuda.so" varlen
# Optional, only while the budget allows: the bench must still fit.
if command -v compute-sanitizer >/dev/null 2>&1 && [ "$(left)" -gt 200 ]; then
	step "compute-sanitizer memcheck" timeout "$(cap 60)" env PKV_CONFORMANCE_MAX_CASES=3 compute-sanitizer \
		--error-exitcode 9 "$b/pkv-conformance" "$b/pkv_cuda.so" varlen
	[ "$(left)" -gt 160 ] && step "compute-sanitizer racecheck" timeout "$(cap 60)" env PKV_CONFORMANCE_MAX_CASES=2 \
		compute-sanitizer --tool racecheck --error-exitcode 9 "$b/pkv-conformance" "$b/pkv_cuda.so" decode
fi

if [ $have_bench = yes ]; then
	step "bench" timeout "$(( $(left) > 100 ? 150 : 100 ))" sh -c "'$b/cuda_bench' > '$out/bench.txt' 2>&1"
	cat "$out/bench.txt" >> "$log"
else
	echo "bench not built (see the log)" > "$out/bench.txt"
fi
[ $bench_status -ne 0 ] && status=1

say ""
say "== gpu-check results ($(( $(date +%s) - start ))s; full log $log)"
cat "$results"
sed -n '/== summary/,$p' "$out/bench.txt"
grep -q '== summary' "$out/bench.txt" || tail -n 5 "$out/bench.txt"
exit $status
