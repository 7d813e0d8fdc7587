# SPDX-License-Identifier: MIT
# plugins/varlen: build rules (filled in by the issue that builds this part).
