# SPDX-License-Identifier: MIT
# src/client: build rules (filled in by the issue that builds this part).
