/* SPDX-License-Identifier: MIT */
/* The disk backend of the tier: per-fingerprint record and entry files, moved through io_uring. */
#include "config.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <liburing.h>
#include "common/log.h"
#include "tier/tier_int.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/*
 * Per class (fingerprint) two files, named by the fingerprint's hash:
 *   HASH.dat  records, slot i at i * rec_size (O_DIRECT when the filesystem allows)
 *   HASH.idx  a 64-byte header, then a 64-byte entry per slot at 64 * (i + 1)
 * An entry is written (pwrite, buffered) only after its record's write
 * completed, so a scan never finds an entry whose record was not written
 * first; a delete zeroes the entry first and only then frees the slot.
 * Neither file is fsync'ed: a killed daemon loses nothing the kernel took,
 * and after a power loss a torn record or entry fails its checksum.
 */
#define IDX_MAGIC 0x49564b50u   /* "PKVI" */
#define ENT_MAGIC 0x45564b50u   /* "PKVE" */
#define IDX_VERSION 1u
#define ENT_SIZE 64u

struct idx_hdr {
	uint32_t magic, version, rec_size, pad;
	struct pkv_tier_fp fp;
	uint64_t fp_hash;
	uint64_t check;
};

struct idx_ent {
	uint32_t magic, uid;
	struct pkv_key key, parent;
	uint64_t stamp, sum;
	uint64_t check;               /* XXH3-64 of the 56 bytes before it */
};

_Static_assert(sizeof(struct idx_hdr) == ENT_SIZE, "idx header is one entry");
_Static_assert(sizeof(struct idx_ent) == ENT_SIZE, "idx entry is 64 bytes");

struct dcls {
	int used;
	int dat, idx;
	uint32_t rec_size;
	uint32_t n_slots;             /* slots the files cover */
	uint32_t *free;               /* free slots below n_slots */
	uint32_t n_free, cap_free;
};

struct disk {
	int dirfd;
	struct io_uring ring;
	unsigned qd, queued, inflight;
	int direct, fixed;
	uint8_t *arena;
	size_t arena_len;
	struct dcls cls[TIER_MAX_CLASSES];
};

static uint64_t ent_check(const void *e)
{
	return XXH3_64bits(e, ENT_SIZE - 8);
}

static int safe_file(int fd, const char *name)
{
	struct stat st;

	if (fstat(fd, &st))
		return -errno;
	/* Records are other users' KV: only the daemon's user may read or change them. */
	if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
		pkv_warn("disk tier: ignoring %s: not a regular 0600 file of uid %u", name,
			 (unsigned)geteuid());
		return -EPERM;
	}
	return 0;
}

static int disk_open(const struct pkv_tier_config *cfg, void **out, char *why, size_t why_len)
{
	struct disk *d = calloc(1, sizeof(*d));
	struct stat st;
	int r;

	if (!d)
		return -ENOMEM;
	d->qd = cfg->queue_depth;
	d->direct = !cfg->buffered;
	if (mkdir(cfg->dir, 0700) && errno != EEXIST) {
		r = -errno;
		snprintf(why, why_len, "disk tier: cannot create %s: %s", cfg->dir, strerror(errno));
		goto err_free;
	}
	d->dirfd = open(cfg->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (d->dirfd < 0) {
		r = -errno;
		snprintf(why, why_len, "disk tier: cannot open %s: %s", cfg->dir, strerror(errno));
		goto err_free;
	}
	if (fstat(d->dirfd, &st) || st.st_uid != geteuid() || (st.st_mode & 022)) {
		r = -EPERM;
		snprintf(why, why_len, "disk tier: %s must belong to uid %u and be writable by it alone",
			 cfg->dir, (unsigned)geteuid());
		goto err_dir;
	}
	/* Two daemons on one directory would hand out the same slots: the second one stops here. */
	if (flock(d->dirfd, LOCK_EX | LOCK_NB)) {
		r = -EBUSY;
		snprintf(why, why_len, "disk tier: %s is in use by another process", cfg->dir);
		goto err_dir;
	}
	r = io_uring_queue_init(2 * d->qd, &d->ring, 0);
	if (r) {
		snprintf(why, why_len, "disk tier: io_uring: %s", strerror(-r));
		goto err_dir;
	}
	*out = d;
	return 0;
err_dir:
	close(d->dirfd);
err_free:
	free(d);
	return r;
}

static void disk_close(void *impl)
{
	struct disk *d = impl;

	for (int i = 0; i < TIER_MAX_CLASSES; i++)
		if (d->cls[i].used) {
			close(d->cls[i].dat);
			close(d->cls[i].idx);
			free(d->cls[i].free);
		}
	if (d->fixed)
		io_uring_unregister_buffers(&d->ring);
	io_uring_queue_exit(&d->ring);
	close(d->dirfd);
	free(d);
}

static void disk_arena(void *impl, void *base, size_t len)
{
	struct disk *d = impl;
	struct iovec iov = { base, len };

	d->arena = base;
	d->arena_len = len;
	/* Registered once: the kernel pins the pages and skips the per-I/O page lookups. */
	d->fixed = !io_uring_register_buffers(&d->ring, &iov, 1);
	if (!d->fixed)
		pkv_info("disk tier: staging buffers not registered; plain reads and writes");
}

static int disk_direct(void *impl)
{
	return ((struct disk *)impl)->direct;
}

static void name_of(char *buf, size_t len, uint64_t h, const char *ext)
{
	snprintf(buf, len, "%016" PRIx64 ".%s", h, ext);
}

/* Opens HASH.dat, O_DIRECT when the backend still uses it and the filesystem takes it. */
static int open_dat(struct disk *d, uint64_t h, int flags)
{
	char name[64];
	int fd = -1;

	name_of(name, sizeof(name), h, "dat");
	if (d->direct) {
		fd = openat(d->dirfd, name, flags | O_RDWR | O_DIRECT | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0 && errno == EINVAL) {
			pkv_info("disk tier: the filesystem refuses O_DIRECT; buffered I/O");
			d->direct = 0;
		}
	}
	if (fd < 0 && !d->direct)
		fd = openat(d->dirfd, name, flags | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (safe_file(fd, name)) {
		close(fd);
		return -EPERM;
	}
	return fd;
}

static int free_push(struct dcls *c, uint32_t slot)
{
	if (c->n_free == c->cap_free) {
		uint32_t cap = c->cap_free ? 2 * c->cap_free : 256;
		uint32_t *f = realloc(c->free, cap * sizeof(*f));

		if (!f)
			return -ENOMEM;
		c->free = f;
		c->cap_free = cap;
	}
	c->free[c->n_free++] = slot;
	return 0;
}

static int disk_class_open(void *impl, int cls, const struct pkv_tier_fp *fp, uint32_t rec_size)
{
	struct disk *d = impl;
	struct dcls *c = &d->cls[cls];
	struct idx_hdr h = { IDX_MAGIC, IDX_VERSION, rec_size, 0, *fp, pkv_tier_fp_hash(fp), 0 };
	char name[64];
	int r;

	if (c->used)
		return 0;
	name_of(name, sizeof(name), h.fp_hash, "idx");
	/* A fresh class: files left over without a valid header (a crash at creation) start over. */
	c->idx = openat(d->dirfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (c->idx < 0)
		return -errno;
	r = safe_file(c->idx, name);
	if (r)
		goto err_idx;
	c->dat = open_dat(d, h.fp_hash, O_CREAT);
	if (c->dat < 0) {
		r = c->dat;
		goto err_idx;
	}
	h.check = ent_check(&h);
	if (ftruncate(c->idx, 0) || ftruncate(c->dat, 0) ||
	    pwrite(c->idx, &h, sizeof(h), 0) != (ssize_t)sizeof(h)) {
		r = errno ? -errno : -EIO;
		goto err_dat;
	}
	c->rec_size = rec_size;
	c->used = 1;
	return 0;
err_dat:
	close(c->dat);
err_idx:
	close(c->idx);
	return r;
}

/* Reads one HASH.idx and reports its class and entries. */
static int scan_file(struct disk *d, const char *name, const struct tier_scan_cb *cb)
{
	struct tier_layout l;
	struct idx_hdr h;
	struct stat st;
	uint8_t *buf = NULL;
	uint32_t n, i;
	struct dcls *c;
	int fd, cls, r = 0;
	size_t got = 0;

	fd = openat(d->dirfd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return 0;
	if (safe_file(fd, name) || fstat(fd, &st) || st.st_size < (off_t)sizeof(h) ||
	    pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) || h.magic != IDX_MAGIC ||
	    h.version != IDX_VERSION || h.check != ent_check(&h) ||
	    h.fp_hash != pkv_tier_fp_hash(&h.fp) || pkv_tier_layout(&h.fp, &l) || l.rec_size != h.rec_size) {
		pkv_warn("disk tier: ignoring %s: not a tier index", name);
		goto out_close;
	}
	cls = cb->cls(cb->ud, &h.fp);
	if (cls < 0 || d->cls[cls].used)
		goto out_close;
	c = &d->cls[cls];
	c->idx = fd;
	c->rec_size = h.rec_size;
	c->dat = open_dat(d, h.fp_hash, 0);
	if (c->dat < 0) {
		pkv_warn("disk tier: %s has no records file; its entries are dropped", name);
		c->dat = open_dat(d, h.fp_hash, O_CREAT);
		if (c->dat < 0)
			goto out_close;
		if (ftruncate(fd, sizeof(h)))
			pkv_warn("disk tier: cannot reset %s: %s", name, strerror(errno));
		st.st_size = sizeof(h);
	}
	c->used = 1;
	/* An index of more entries than slots can be numbered is not ours: its entries are ignored. */
	if ((uint64_t)(st.st_size - (off_t)sizeof(h)) / ENT_SIZE > INT32_MAX / 4) {
		pkv_warn("disk tier: %s is too large to be a tier index; its entries are ignored", name);
		goto out;
	}
	n = (uint32_t)((uint64_t)(st.st_size - (off_t)sizeof(h)) / ENT_SIZE);
	if (n) {
		/* One read for the whole index: start-up reads 64 bytes per block, never a record. */
		buf = malloc((size_t)n * ENT_SIZE);
		if (!buf) {
			pkv_warn("disk tier: no memory to read %s; its entries are ignored", name);
			goto out;
		}
		while (got < (size_t)n * ENT_SIZE) {
			ssize_t k = pread(fd, buf + got, (size_t)n * ENT_SIZE - got, (off_t)(sizeof(h) + got));

			if (k <= 0)
				break;
			got += (size_t)k;
		}
		n = (uint32_t)(got / ENT_SIZE);
	}
	r = n ? cb->reserve(cb->ud, n) : 0;
	if (r) {
		/* Slots stay unnumbered: new records start at 0, stale entries fail verification later. */
		pkv_warn("disk tier: cannot index %s (%s); its entries are ignored", name, strerror(-r));
		r = 0;
		goto out;
	}
	c->n_slots = n;
	for (i = n; i-- > 0;) {
		const struct idx_ent *e = (const struct idx_ent *)(buf + (size_t)i * ENT_SIZE);
		struct tier_entry te;

		if (e->magic == ENT_MAGIC && e->check == ent_check(e)) {
			te = (struct tier_entry){ e->key, e->parent, e->uid, e->stamp, e->sum };
			if (!cb->entry(cb->ud, cls, i, &te))
				continue;
		}
		/* A free, torn or refused slot: reusable (a zeroed entry there is harmless). */
		r = free_push(c, i);
		if (r)
			goto out;
	}
out:
	free(buf);
	return r;
out_close:
	close(fd);
	return 0;
}

static int disk_scan(void *impl, const struct tier_scan_cb *cb)
{
	struct disk *d = impl;
	struct dirent *de;
	DIR *dir;
	int fd, r = 0;

	fd = dup(d->dirfd);
	if (fd < 0)
		return -errno;
	dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return -errno;
	}
	while (!r && (de = readdir(dir))) {
		size_t len = strlen(de->d_name);

		if (len == 20 && !strcmp(de->d_name + 16, ".idx") &&
		    strspn(de->d_name, "0123456789abcdef") == 16)
			r = scan_file(d, de->d_name, cb);
	}
	closedir(dir);
	return r;
}

static int disk_submit(void *impl, struct tier_io *io)
{
	struct disk *d = impl;
	struct dcls *c = &d->cls[io->cls];
	struct io_uring_sqe *sqe;
	int fixed;

	if (!c->used)
		return -ENOENT;
	if (io->op == TIO_PUT) {
		if (c->n_free)
			io->loc = c->free[--c->n_free];
		else if (c->n_slots < UINT32_MAX)
			io->loc = c->n_slots++;
		else
			return -ENOSPC;
	}
	sqe = io_uring_get_sqe(&d->ring);
	if (!sqe) {
		io_uring_submit(&d->ring);
		sqe = io_uring_get_sqe(&d->ring);
	}
	if (!sqe) {
		if (io->op == TIO_PUT)
			free_push(c, (uint32_t)io->loc);
		return -EBUSY;
	}
	fixed = d->fixed && (uint8_t *)io->buf >= d->arena &&
		(uint8_t *)io->buf + io->len <= d->arena + d->arena_len;
	if (io->op == TIO_PUT) {
		if (fixed)
			io_uring_prep_write_fixed(sqe, c->dat, io->buf, io->len, io->loc * c->rec_size, 0);
		else
			io_uring_prep_write(sqe, c->dat, io->buf, io->len, io->loc * c->rec_size);
	} else {
		if (fixed)
			io_uring_prep_read_fixed(sqe, c->dat, io->buf, io->len, io->loc * c->rec_size, 0);
		else
			io_uring_prep_read(sqe, c->dat, io->buf, io->len, io->loc * c->rec_size);
	}
	io_uring_sqe_set_data(sqe, io);
	d->queued++;
	return 0;
}

/* After the record is on the file: its entry makes it findable by the next scan. */
static int put_entry(struct disk *d, struct dcls *c, const struct tier_io *io)
{
	struct idx_ent e = { ENT_MAGIC, io->ent.uid, io->ent.key, io->ent.parent, io->ent.stamp,
			     io->ent.sum, 0 };

	e.check = ent_check(&e);
	if (pwrite(c->idx, &e, sizeof(e), (off_t)(ENT_SIZE * (io->loc + 1))) != (ssize_t)sizeof(e))
		return errno ? -errno : -ENOSPC;
	return 0;
}

static int disk_reap(void *impl, int64_t wait_ns, void (*done)(void *ud, struct tier_io *io), void *ud)
{
	struct __kernel_timespec ts = { .tv_sec = wait_ns / 1000000000, .tv_nsec = wait_ns % 1000000000 };
	struct disk *d = impl;
	struct io_uring_cqe *cqe;
	int n = 0;

	if (d->queued) {
		d->inflight += d->queued;
		d->queued = 0;
		if (wait_ns < 0)
			io_uring_submit_and_wait(&d->ring, 1);
		else if (wait_ns > 0)
			io_uring_submit_and_wait_timeout(&d->ring, &cqe, 1, &ts, NULL);
		else
			io_uring_submit(&d->ring);
	} else if (wait_ns && d->inflight) {
		if (wait_ns < 0)
			io_uring_wait_cqe(&d->ring, &cqe);
		else
			io_uring_wait_cqe_timeout(&d->ring, &cqe, &ts);
	}
	while (!io_uring_peek_cqe(&d->ring, &cqe)) {
		struct tier_io *io = io_uring_cqe_get_data(cqe);
		struct dcls *c = &d->cls[io->cls];
		int res = cqe->res;

		io_uring_cqe_seen(&d->ring, cqe);
		d->inflight--;
		if (res >= 0 && (uint32_t)res != io->len)
			res = io->op == TIO_PUT ? -ENOSPC : -EIO;   /* short: the file ended, or the disk did */
		else if (res > 0)
			res = 0;
		if (io->op == TIO_PUT) {
			if (!res)
				res = put_entry(d, c, io);
			if (res)
				free_push(c, (uint32_t)io->loc);
		}
		io->res = res;
		done(ud, io);
		n++;
	}
	return n;
}

static void disk_del(void *impl, int cls, uint64_t loc)
{
	struct disk *d = impl;
	struct dcls *c = &d->cls[cls];
	struct idx_ent z;

	memset(&z, 0, sizeof(z));
	/* The entry goes first: a slot is reused only once no entry names its old record. */
	if (pwrite(c->idx, &z, sizeof(z), (off_t)(ENT_SIZE * (loc + 1))) != (ssize_t)sizeof(z))
		pkv_dbg("disk tier: clearing entry %" PRIu64 ": %s", loc, strerror(errno));
	/* Give the blocks back to the filesystem; a filesystem without hole punching keeps them. */
	(void)fallocate(c->dat, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(loc * c->rec_size),
			c->rec_size);
	free_push(c, (uint32_t)loc);
}

static int disk_wipe(void *impl)
{
	struct disk *d = impl;
	int r = 0;

	for (int i = 0; i < TIER_MAX_CLASSES; i++) {
		struct dcls *c = &d->cls[i];

		if (!c->used)
			continue;
		if (ftruncate(c->idx, ENT_SIZE) || ftruncate(c->dat, 0))
			r = -errno;
		c->n_slots = 0;
		c->n_free = 0;
	}
	return r;
}

const struct tier_backend pkv_tier_disk = {
	.name = "disk",
	.open = disk_open,
	.close = disk_close,
	.arena = disk_arena,
	.scan = disk_scan,
	.class_open = disk_class_open,
	.submit = disk_submit,
	.reap = disk_reap,
	.del = disk_del,
	.wipe = disk_wipe,
	.direct = disk_direct,
};
