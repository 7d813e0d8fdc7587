/* SPDX-License-Identifier: MIT */
/* Test-only LD_PRELOAD shim: reports hugetlbfs as tmpfs, to let a hugetlbfs region past the daemon's check. */
#include "config.h"
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>

/*
 * check_isolation_mem preloads this into a pagedkvd to prove the second line
 * of defence: were a faulting region ever accepted, the SIGBUS handler must
 * still keep the daemon alive. Never built into anything installed.
 */
int fstatfs(int fd, struct statfs *buf)
{
	long r = syscall(SYS_fstatfs, fd, buf);

	if (r == 0 && (unsigned long)buf->f_type == (unsigned long)HUGETLBFS_MAGIC)
		buf->f_type = TMPFS_MAGIC;
	return (int)r;
}

/* Same layout on 64-bit targets; the kernel fills whichever the caller passed. */
int fstatfs64(int fd, struct statfs64 *buf)
{
	long r = syscall(SYS_fstatfs, fd, buf);

	if (r == 0 && (unsigned long)buf->f_type == (unsigned long)HUGETLBFS_MAGIC)
		buf->f_type = TMPFS_MAGIC;
	return (int)r;
}
