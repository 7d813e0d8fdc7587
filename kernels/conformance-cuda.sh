#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs the conformance suite on one CUDA plugin of this build tree (varlen or decode); skips without a GPU.
top=${PKV_TOP_BUILDDIR:-.}
which=${1:?usage: conformance-cuda.sh varlen|decode}
plugin=$top/plugins/$which/.libs/pkv_cuda_$which.so
runner=$top/tests/backend/pkv-conformance
# The runner reports a plugin that cannot start as "Bail out!"; no GPU is a skip, not a failure.
if [ ! -e /dev/nvidia0 ] && [ ! -e /dev/nvidiactl ]; then
	echo "conformance-cuda: no NVIDIA device node here" >&2
	exit 77
fi
if [ ! -x "$runner" ] || [ ! -f "$plugin" ]; then
	echo "conformance-cuda: $runner or $plugin not built" >&2
	exit 77
fi
exec "$runner" "$plugin" "cuda_$which"
