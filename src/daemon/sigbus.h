/* SPDX-License-Identifier: MIT */
/* Surviving SIGBUS in client memory: a fault inside a watched mapping costs that client its connection. */
#ifndef PKV_DAEMON_SIGBUS_H
#define PKV_DAEMON_SIGBUS_H

#include <stddef.h>

/*
 * Installs the process-wide SIGBUS handler. wake_fd (an eventfd, or -1) is
 * written when a watched mapping faults, so a sleeping loop notices at once.
 * A fault outside every watched mapping goes to the handler that was there
 * before (or the default action: the process dies, as it should).
 */
int pkv_sigbus_install(int wake_fd);

/*
 * Watches [addr, addr + len) (page-aligned, the whole client mapping).
 * Returns a slot >= 0 or -ENOMEM. Only one thread (the loop) may call
 * watch/unwatch; the handler reads the table from any thread.
 */
int pkv_sigbus_watch(void *addr, size_t len);

/* Stops watching; call before munmap (the address range may be reused after). */
void pkv_sigbus_unwatch(int slot);

/*
 * Whether the slot's mapping faulted. The handler has then replaced the
 * whole mapping with private zero pages: reads see zeros, writes go
 * nowhere, and the client's memory is no longer touched.
 */
int pkv_sigbus_faulted(int slot);

#endif
