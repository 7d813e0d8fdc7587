# SPDX-License-Identifier: MIT
# src/tools/ctl.mk: build rules (filled in by its issue).
