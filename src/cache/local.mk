# SPDX-License-Identifier: MIT
# src/cache: build rules (filled in by the issue that builds this part).
