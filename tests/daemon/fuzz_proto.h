/* SPDX-License-Identifier: MIT */
/* The libFuzzer entry point of the protocol fuzz target, shared with its standalone driver. */
#ifndef PKV_FUZZ_PROTO_H
#define PKV_FUZZ_PROTO_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
