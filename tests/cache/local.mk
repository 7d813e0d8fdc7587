# SPDX-License-Identifier: MIT
# tests/cache: build rules (filled in by the issue that builds this part).
