# SPDX-License-Identifier: MIT
# src/daemon: build rules (filled in by the issue that builds this part).
