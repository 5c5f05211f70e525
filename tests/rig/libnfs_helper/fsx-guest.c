/*
 * fsx-guest - the fsx engine (exerciser.h) on a file of a kernel NFS mount, run
 * inside the test VM.
 *
 *   fsx-guest FILE OPS SEED MAXLEN [MODEL_OUT]
 *
 * Handle 0 is a buffered descriptor (the client's page cache, written back in the
 * client's own WRITE/COMMIT pattern), handle 1 an O_DIRECT one (each call a READ or
 * a stable WRITE of its own), so what one wrote through the cache is read past it
 * and the other way round.  Syncs are fsync (0) and fdatasync (1).  The operation of
 * its own is either a check or a write of a stretch through a shared mmap of the
 * file (msync'd), or, one time in four, dropping the client's caches, so the next
 * reads come from the server.  Built statically by tests/rig/nfsh.py; the guest has
 * only a minimal Debian.  Exit 3 on a mismatch, with the last operations on stderr.
 */
#define _GNU_SOURCE
#include <fcntl.h>
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
	fprintf(stderr, "fsx-guest op %ld: %s through handle %d: %s\n", l->op, what, s, strerror(-rc));
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

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: fsx-guest FILE OPS SEED MAXLEN [MODEL_OUT]\n");
		return 2;
	}
	g.path = argv[1];
	long ops = strtol(argv[2], NULL, 0);
	uint64_t seed = strtoull(argv[3], NULL, 0), maxlen = strtoull(argv[4], NULL, 0);
	if (maxlen < 4096 || maxlen > (1ull << 30)) {
		fprintf(stderr, "fsx-guest: MAXLEN must be 4096..2^30 bytes\n");
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
	if (argc > 5) {
		int rc = fsx_save_model(f, argv[5]);
		if (rc < 0)
			g_fail(&f->log, 0, "save model", rc);
	}
	return 0;
}
