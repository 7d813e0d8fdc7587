# SPDX-License-Identifier: MIT
# examples/prefix-demo.mk: build rules (filled in by its issue).
