# SPDX-License-Identifier: MIT
# tests/daemon: build rules (filled in by the issue that builds this part).
