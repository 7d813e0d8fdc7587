# SPDX-License-Identifier: MIT
# plugins/cpu: build rules (filled in by the issue that builds this part).
