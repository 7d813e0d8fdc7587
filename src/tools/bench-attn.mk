# SPDX-License-Identifier: MIT
# pkv-bench-attn: build rules (filled in by its issue).
