# SPDX-License-Identifier: MIT
# Shared test infrastructure; each tests/<area>/local.mk adds its own suites.
EXTRA_DIST += tests/tap-wrap
# The main() of every Check suite (run it, or skip one that needs root).
noinst_HEADERS += tests/suite_main.h
