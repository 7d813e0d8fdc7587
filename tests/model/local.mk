# SPDX-License-Identifier: MIT
# tests/model: build rules (filled in by the issue that builds this part).
