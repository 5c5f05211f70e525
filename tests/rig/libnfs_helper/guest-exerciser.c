/*
 * guest-exerciser - the fsx and nsx engines (exerciser.h) on kernel NFS mounts, run
 * inside the test VM.
 *
 *   guest-exerciser fsx FILE OPS SEED MAXLEN [MODEL_OUT]
 *   guest-exerciser nsx MOUNT_A MOUNT_B DIR OPS SEED
 *
 * fsx: handle 0 is a buffered descriptor (the client's page cache, written back in the
 * client's own WRITE/COMMIT pattern), handle 1 an O_DIRECT one (each call a READ or
 * a stable WRITE of its own), so what one wrote through the cache is read past it
 * and the other way round.  Syncs are fsync (0) and fdatasync (1).  The operation of
 * its own is either a check or a write of a stretch through a shared mmap of the
 * file (msync'd), or, one time in four, dropping the client's caches, so the next
 * reads come from the server.
 *
 * nsx: the tree DIR seen through two mounts of one export (side 0 under MOUNT_A,
 * side 1 under MOUNT_B), which the caller mounts with nosharecache, so that they
 * are two clients with caches of their own, and with noac,lookupcache=none, so that
 * each asks the server rather than its cache whether a name exists.
 *
 * Built statically by tests/rig/nfsh.py; the guest has only a minimal Debian.  Exit 3
 * on a mismatch, with the last operations on stderr.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exerciser.h"

static struct {
	int fd[2];
	const char *path;
} g;

static const int open_flags[2] = { O_RDWR, O_RDWR | O_DIRECT };

static int neg_errno(ssize_t rc)
{
	return rc < 0 ? -errno : (int)rc;
}

static int g_pwrite(int s, uint64_t off, size_t len, const uint8_t *buf)
{
	return neg_errno(pwrite(g.fd[s], buf, len, (off_t)off));
}

static int g_pread(int s, uint64_t off, size_t len, uint8_t *buf)
{
	return neg_errno(pread(g.fd[s], buf, len, (off_t)off));
}

static int g_truncate(int s, uint64_t size)
{
	return neg_errno(ftruncate(g.fd[s], (off_t)size));
}

static int g_sync(int s)
{
	return neg_errno(s == 0 ? fsync(g.fd[s]) : fdatasync(g.fd[s]));
}

static int g_size(int s, uint64_t *size)
{
	struct stat st;
	int rc = neg_errno(fstat(g.fd[s], &st));
	if (rc == 0)
		*size = (uint64_t)st.st_size;
	return rc;
}

static int g_open(int s)
{
	g.fd[s] = open(g.path, open_flags[s]);
	return g.fd[s] < 0 ? -errno : 0;
}

static int g_reopen(int s)
{
	return close(g.fd[s]) < 0 ? -errno : g_open(s);
}

static void g_fail(const struct oplog *l, int s, const char *what, int rc) __attribute__((noreturn));
static void g_fail(const struct oplog *l, int s, const char *what, int rc)
{
	dump_oplog(l);
	fprintf(stderr, "%s op %ld: %s through handle %d: %s\n", l->cmd, l->op, what, s, strerror(-rc));
	printf("{\"ok\":false,\"op\":\"%s\",\"at\":%ld,\"errno\":%d,\"error\":", what, l->op, -rc);
	json_str(stdout, strerror(-rc));
	printf("}\n");
	exit(1);
}

static void drop_caches(struct fsx *f)
{
	int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
	if (fd < 0 || write(fd, "3", 1) != 1)
		g_fail(&f->log, 0, "drop_caches", -errno);
	close(fd);
}

/* A stretch of the file through a shared mapping: checked or written (and msync'd). */
static void g_mmap(struct fsx *f, int s, uint64_t r, uint64_t r2)
{
	(void)s;
	if (r >> 40 & 3) {
		note(&f->log, "dropcaches                    (size %" PRIu64 ")", f->size);
		drop_caches(f);
		return;
	}
	if (f->size == 0) {
		note(&f->log, "mmap     (empty file)");
		return;
	}
	uint64_t off = r2 % f->size;
	size_t len = 1 + (r >> 9) % 65536;
	if (off + len > f->size)
		len = f->size - off;
	uint64_t map_off = off & ~(uint64_t)4095;
	size_t map_len = len + (off - map_off);
	int writing = r >> 42 & 1;
	note(&f->log, "mmap%s h0 %8" PRIu64 " +%-7zu (size %" PRIu64 ")", writing ? "wr " : "rd ", off, len,
	     f->size);
	uint8_t *m = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd[0], (off_t)map_off);
	if (m == MAP_FAILED)
		g_fail(&f->log, 0, "mmap", -errno);
	uint8_t *p = m + (off - map_off);
	if (writing) {
		memcpy(p, fsx_new_bytes(f, off, len), len);
		if (msync(m, map_len, MS_SYNC) < 0)
			g_fail(&f->log, 0, "msync", -errno);
	} else {
		for (size_t i = 0; i < len; i++)
			if (p[i] != f->model[off + i])
				mismatch(&f->log, "mapped byte at %" PRIu64 " is 0x%02x, expected 0x%02x", off + i,
					 p[i], f->model[off + i]);
	}
	munmap(m, map_len);
}

static const struct fsx_io g_io = {
	.pwrite = g_pwrite, .pread = g_pread, .truncate = g_truncate, .sync = g_sync,
	.size = g_size, .reopen = g_reopen, .fail = g_fail, .special = g_mmap,
	.special_name = "mmap_or_dropcaches",
};

static int main_fsx(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: guest-exerciser fsx FILE OPS SEED MAXLEN [MODEL_OUT]\n");
		return 2;
	}
	g.path = argv[0];
	long ops = strtol(argv[1], NULL, 0);
	uint64_t seed = strtoull(argv[2], NULL, 0), maxlen = strtoull(argv[3], NULL, 0);
	if (maxlen < 4096 || maxlen > (1ull << 30)) {
		fprintf(stderr, "guest-exerciser: MAXLEN must be 4096..2^30 bytes\n");
		return 2;
	}
	struct fsx *f = fsx_new("fsx-guest", &g_io, seed, maxlen);
	int fd = open(g.path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || close(fd) < 0)
		g_fail(&f->log, 0, "create", -errno);
	for (int s = 0; s < 2; s++) {
		int rc = g_open(s);
		if (rc < 0)
			g_fail(&f->log, s, "open", rc);
	}
	fsx_run(f, ops);
	for (int s = 0; s < 2; s++)
		close(g.fd[s]);
	if (argc > 4) {
		int rc = fsx_save_model(f, argv[4]);
		if (rc < 0)
			g_fail(&f->log, 0, "save model", rc);
	}
	return 0;
}

/* ----------------------------------------------------------------- nsx */

static const char *mounts[2];

/* The path of the tree's `p` under side s's mount. */
static const char *on(int s, const char *p, char *buf)
{
	snprintf(buf, PATH_MAX, "%s%s", mounts[s], p);
	return buf;
}

#define ON(s, p) on(s, p, (char[PATH_MAX]){ 0 })

static int n_create(int s, const char *p)
{
	int fd = open(ON(s, p), O_CREAT | O_EXCL | O_WRONLY, 0644);
	return fd < 0 ? -errno : neg_errno(close(fd));
}

static int n_mkdir(int s, const char *p) { return neg_errno(mkdir(ON(s, p), 0755)); }
static int n_symlink(int s, const char *t, const char *p) { return neg_errno(symlink(t, ON(s, p))); }
static int n_unlink(int s, const char *p) { return neg_errno(unlink(ON(s, p))); }
static int n_rmdir(int s, const char *p) { return neg_errno(rmdir(ON(s, p))); }
static int n_rename(int s, const char *a, const char *b) { return neg_errno(rename(ON(s, a), ON(s, b))); }
static int n_link(int s, const char *a, const char *b) { return neg_errno(link(ON(s, a), ON(s, b))); }
static int n_chmod(int s, const char *p, unsigned mode) { return neg_errno(chmod(ON(s, p), mode)); }

static void attr_of(const struct stat *st, struct nsx_attr *a)
{
	a->kind = S_ISREG(st->st_mode) ? NSX_FILE : S_ISDIR(st->st_mode) ? NSX_DIR
		: S_ISLNK(st->st_mode) ? NSX_LINK : -1;
	a->fileid = st->st_ino;
	a->nlink = st->st_nlink;
	a->mode = st->st_mode & 07777;
}

static int n_lstat(int s, const char *p, struct nsx_attr *a)
{
	struct stat st;
	if (lstat(ON(s, p), &st) < 0)
		return -errno;
	attr_of(&st, a);
	return 0;
}

static int n_readlink(int s, const char *p, char *buf, size_t cap)
{
	ssize_t n = readlink(ON(s, p), buf, cap);
	if (n >= 0 && (size_t)n < cap)
		buf[n] = 0;
	return neg_errno(n);
}

/* readdir, then the attributes of each name (the client's READDIRPLUS answers, or a
 * LOOKUP/GETATTR where it asks again). */
static int n_list(int s, const char *p, void (*each)(void *, const char *, const struct nsx_attr *), void *ctx)
{
	DIR *d = opendir(ON(s, p));
	if (!d)
		return -errno;
	struct dirent *e;
	errno = 0;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			int rc = -errno;
			closedir(d);
			return rc;
		}
		struct nsx_attr a;
		attr_of(&st, &a);
		if (e->d_ino != st.st_ino)
			a.kind = -1; /* reported as a strange type: the listing and the lookup differ */
		each(ctx, e->d_name, &a);
		errno = 0;
	}
	int rc = -errno;
	closedir(d);
	return rc;
}

static void n_fail(const struct oplog *l, int s, const char *what, const char *path, int rc)
	__attribute__((noreturn));
static void n_fail(const struct oplog *l, int s, const char *what, const char *path, int rc)
{
	fprintf(stderr, "nsx-guest: %s%s\n", mounts[s], path);
	g_fail(l, s, what, rc);
}

static const struct nsx_io n_io = {
	.create = n_create, .mkdir = n_mkdir, .symlink = n_symlink, .unlink = n_unlink,
	.rmdir = n_rmdir, .rename = n_rename, .link = n_link, .chmod = n_chmod, .lstat = n_lstat,
	.readlink = n_readlink, .list = n_list, .fail = n_fail,
};

static int main_nsx(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: guest-exerciser nsx MOUNT_A MOUNT_B DIR OPS SEED\n");
		return 2;
	}
	mounts[0] = argv[0];
	mounts[1] = argv[1];
	nsx_run(&n_io, "nsx-guest", argv[2], strtol(argv[3], NULL, 0), strtoull(argv[4], NULL, 0));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "fsx"))
		return main_fsx(argc - 2, argv + 2);
	if (argc > 1 && !strcmp(argv[1], "nsx"))
		return main_nsx(argc - 2, argv + 2);
	fprintf(stderr, "usage: guest-exerciser fsx|nsx ...\n");
	return 2;
}
