# SPDX-License-Identifier: MIT
# src/common: build rules (filled in by the issue that builds this part).
