/* SPDX-License-Identifier: MIT */
/* pkv-bench e2e's llama-bench peer: its JSON is read by test shape, strings and nesting cannot fool
 * the reader, and a peer that fails or prints nothing usable is an error, not a zero figure. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../src/tools/bench_peer.h"
#include "../suite_main.h"

static const char out[] =
	"[\n {\"build_commit\": \"0c1e570\", \"model_filename\": \"a \\\"n_gen\\\": 5, {x}\", \"n_prompt\": 512, "
	"\"n_gen\": 0, \"n_depth\": 0, \"avg_ts\": 306.25, \"samples_ts\": [ 306.25 ]},\n"
	" {\"n_prompt\": 0, \"n_gen\": 128, \"n_depth\": 512, \"avg_ts\": 63.5, \"samples_ts\": [ 63.5 ]}\n]\n";

START_TEST(reads_each_test_by_shape)
{
	double ts = 0;
	ck_assert_int_eq(peer_parse_json(out, 512, 0, &ts), 0);
	ck_assert(ts == 306.25);
	ck_assert_int_eq(peer_parse_json(out, 0, 128, &ts), 0);
	ck_assert(ts == 63.5);
	ck_assert_int_eq(peer_parse_json(out, 0, 64, &ts), -ENOENT);
	ck_assert_int_eq(peer_parse_json("", 512, 0, &ts), -ENOENT);
	ck_assert_int_eq(peer_parse_json("[{\"n_prompt\": 512, \"n_gen\": 0, \"avg_ts\": ", 512, 0, &ts), -ENOENT);
	ck_assert_int_eq(peer_parse_json("[{\"n_prompt\": 512, \"n_gen\": 0, \"avg_ts\": 0}]", 512, 0, &ts), -ENOENT);
}
END_TEST

/* A stand-in peer: a shell script answering the two invocations pkv-bench makes. */
static void write_peer(const char *path, const char *body)
{
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "#!/bin/sh\n%s\n", body);
	fclose(f);
	ck_assert_int_eq(chmod(path, 0700), 0);
}

START_TEST(runs_the_peer_and_rejects_failures)
{
	char path[] = "/tmp/pkv-test-peer-XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	struct peer_result r;
	write_peer(path, "case \"$*\" in *'-n 0 '*) echo '[{\"n_prompt\": 512, \"n_gen\": 0, \"avg_ts\": 300}]';;\n"
			 "*) echo '[{\"n_prompt\": 0, \"n_gen\": 128, \"avg_ts\": 60}]';; esac; echo log >&2");
	ck_assert_int_eq(peer_llama_bench(path, "model.gguf", 2, 512, 128, &r), 0);
	ck_assert(r.pp_tok_s == 300 && r.tg_tok_s == 60);
	write_peer(path, "echo '[{\"n_prompt\": 512, \"n_gen\": 0, \"avg_ts\": 300}]'; exit 3");
	ck_assert_int_eq(peer_llama_bench(path, "model.gguf", 2, 512, 128, &r), -EIO);
	write_peer(path, "echo nothing");
	ck_assert_int_eq(peer_llama_bench(path, "model.gguf", 2, 512, 128, &r), -EIO);
	unlink(path);
	ck_assert_int_eq(peer_llama_bench(path, "model.gguf", 2, 512, 128, &r), -EIO); /* exec fails */
}
END_TEST

int main(void)
{
	Suite *su = suite_create("peer");
	TCase *tc = tcase_create("llama-bench");
	tcase_add_test(tc, reads_each_test_by_shape);
	tcase_add_test(tc, runs_the_peer_and_rejects_failures);
	suite_add_tcase(su, tc);
	return suite_main(su);
}
