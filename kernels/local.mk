# SPDX-License-Identifier: MIT
# kernels: build rules (filled in by the issue that builds this part).
