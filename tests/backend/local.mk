# SPDX-License-Identifier: MIT
# tests/backend: build rules (filled in by the issue that builds this part).
