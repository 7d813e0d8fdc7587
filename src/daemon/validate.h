/* SPDX-License-Identifier: MIT */
/* Pure checks of hostile input: control messages and SQEs (copied out of shared memory first). */
#ifndef PKV_VALIDATE_H
#define PKV_VALIDATE_H

#include <stddef.h>
#include <stdint.h>
#include "common/proto.h"

#include "cache/bounds.h"   /* every limit on a client-controlled size */

/* What an SQE is checked against: the session's arena and pool, its open step. */
struct sqe_limits {
	uint64_t arena_size;
	const struct pkv_geometry *geo; /* NULL: not attached */
	uint32_t act_size;              /* bytes per activation element */
	uint32_t step_total_q;          /* 0: no open step */
};

/* Returns 0 or -errno with the reason; on success every arena range the SQE names is in bounds. */
int pkv_sqe_check(const struct pkv_sqe *e, const struct sqe_limits *l, char *why, size_t why_len);

/*
 * Checks a received control message of len bytes for a connection in `role`
 * (0 = before hello). Returns its type or -errno with the reason.
 */
int pkv_msg_check(const void *buf, size_t len, int role, char *why, size_t why_len);

#endif
