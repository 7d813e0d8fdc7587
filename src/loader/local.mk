# SPDX-License-Identifier: MIT
# src/loader: build rules (filled in by the issue that builds this part).
