# SPDX-License-Identifier: MIT
# Examples: the prefix-sharing demo over the cache manager, and the real model client.
include $(srcdir)/examples/prefix-demo.mk
include $(srcdir)/examples/llama/local.mk
