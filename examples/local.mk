# SPDX-License-Identifier: MIT
# examples: build rules (filled in by the issue that builds this part).
