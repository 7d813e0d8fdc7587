# SPDX-License-Identifier: MIT
# pkv-bench-ipc: build rules (filled in by its issue).
