# SPDX-License-Identifier: MIT
# pkv-bench-e2e: build rules (filled in by its issue).
