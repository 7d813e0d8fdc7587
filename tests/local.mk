# SPDX-License-Identifier: MIT
# Shared test infrastructure; each tests/<area>/local.mk adds its own suites.
EXTRA_DIST += tests/tap-wrap
