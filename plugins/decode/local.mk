# SPDX-License-Identifier: MIT
# plugins/decode: build rules (filled in by the issue that builds this part).
