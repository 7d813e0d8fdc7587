/* SPDX-License-Identifier: MIT */
/* The main() of a Check test program: run the suite, or skip (77) one that needs root to switch uids. */
#ifndef PKV_TEST_SUITE_MAIN_H
#define PKV_TEST_SUITE_MAIN_H

#include <check.h>
#include <unistd.h>

/*
 * Runs every test of s (fork mode as CK_FORK says, output as CK_VERBOSITY
 * says, normal when unset); 0 when all passed, 1 otherwise.
 */
static inline int suite_main(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_ENV);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

/*
 * For suites whose clients run as other uids (fork + setresuid): without
 * root, 77 before any output, so automake reports the program skipped.
 */
static inline int suite_main_as_root(Suite *(*make)(void))
{
	if (geteuid() != 0)
		return 77;
	return suite_main(make());
}

#endif
