# SPDX-License-Identifier: MIT
# examples/model.mk: build rules (filled in by its issue).
