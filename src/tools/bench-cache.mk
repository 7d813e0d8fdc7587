# SPDX-License-Identifier: MIT
# pkv-bench-cache: build rules (filled in by its issue).
