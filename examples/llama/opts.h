/* SPDX-License-Identifier: MIT */
/* Numeric command-line options of the model programs: parsed whole, range-checked, and refused with a
 * message that names the program, the flag and the valid range. */
#ifndef PKV_EX_OPTS_H
#define PKV_EX_OPTS_H

#include <stdint.h>

/* Each returns 0, or prints "PROG: FLAG: 'ARG' is not ... from LO to HI" to stderr and returns -1. */
int opt_u32(const char *prog, const char *flag, const char *arg, uint32_t lo, uint32_t hi, uint32_t *out);
int opt_int(const char *prog, const char *flag, const char *arg, int lo, int hi, int *out);
int opt_u64(const char *prog, const char *flag, const char *arg, uint64_t *out);
int opt_float(const char *prog, const char *flag, const char *arg, float lo, float hi, float *out);
/* "f32", "f16" or "bf16" to its PKV_DTYPE_*, else a message naming the three and -1. */
int opt_kv_dtype(const char *prog, const char *flag, const char *arg, uint32_t *out);

/* After getopt refused a flag (it said which): where the list is. Returns the exit status, 2. */
int opt_refused(const char *prog);
/* No -m: what to pass. Returns the exit status, 2. */
int opt_need_model(const char *prog);

/* The sampling flags every program shares, for --help. */
#define OPT_SAMPLING_HELP \
	"      --temp T           sampling temperature, 0 to 10 (0: greedy)\n" \
	"      --top-k K          keep the K most likely tokens, 0 to 1000000 (0: all)\n" \
	"      --top-p P          keep the likeliest tokens up to probability P, 0 to 1\n" \
	"      --seed S           random seed (a whole number)\n"
/* Pool sizing, shared by the programs that attach to pagedkvd. */
#define OPT_POOL_HELP \
	"      --ctx N            tokens one conversation may hold, 16 to 1048576 (pool sizing)\n" \
	"      --max-seqs N       conversations the pool holds at once, 1 to 4096 (pool sizing)\n" \
	"      --kv-dtype T       KV cache dtype: f32 (default), f16 or bf16 (half the memory and the\n" \
	"                         attention's reads; keys and values rounded to it)\n"

/* Who attends through pagedkvd (session.h, enum session_attention), for --help. */
#define OPT_ATTENTION_HELP \
	"      --daemon-attention the daemon runs every attention call (by default this process\n" \
	"                         runs them over the pool's memory where it can: one round trip\n" \
	"                         per step instead of one per layer)\n" \
	"      --client-attention as the default, but warn when the daemon has to attend after all\n" \
	"                         (no backend in $PAGEDKV_PLUGIN_DIR or the installed plugins)\n"

#endif
