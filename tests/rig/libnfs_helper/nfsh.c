/*
 * nfsh - tiny libnfs (sync API) client used by the nasd test rig.
 *
 *   nfsh URL COMMAND ARGS...
 *
 * URL is an nfs:// URL of an EXPORT (not of a file), e.g.
 *   nfs://127.0.0.1/srv/export?nfsport=2049&mountport=2049&version=3
 * All PATH/DIR arguments are relative to the export root ("/" = root).
 *
 * Every command prints JSON on stdout (one object per line).  On failure the
 * program prints {"ok":false,"op":...,"path":...,"errno":N,"error":"..."} on
 * stdout, a human-readable line on stderr, and exits 1.  Usage errors exit 2,
 * pattern/uniqueness check failures exit 3.
 *
 * Environment:
 *   NFSH_TIMEOUT_MS   per-RPC timeout for sync calls (default 60000, -1 = none)
 *   NFSH_DEBUG        libnfs debug level (default 0)
 *   NFSH_DIRCACHE     1 to keep libnfs' directory cache (default off: we test
 *                     the server, not the client cache)
 *   NFSH_START_ON_EOF set: once mounted print {"ready":true}, then wait for the
 *                     end of standard input before running the command
 *
 * Built by tests/rig/nfsh.py (cc nfsh.c $(pkg-config --cflags --libs libnfs)).
 * Written against libnfs 4.0 (Debian 12); uses only long-standing API.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw-nfs.h>

#include "exerciser.h"

static struct nfs_context *nfs;
static const char *g_url;

/* ------------------------------------------------------------------ util */

static double wall(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *errmsg(void)
{
	const char *e = nfs ? nfs_get_error(nfs) : NULL;
	return e ? e : "";
}

/* Report an error as JSON (stdout) + text (stderr). Does not exit. */
static void report_err(const char *op, const char *path, int rc)
{
	int e = rc < 0 ? -rc : rc;
	printf("{\"ok\":false,\"op\":");
	json_str(stdout, op);
	printf(",\"path\":");
	json_str(stdout, path ? path : "");
	printf(",\"errno\":%d,\"strerror\":", e);
	json_str(stdout, strerror(e));
	printf(",\"error\":");
	json_str(stdout, errmsg());
	printf("}\n");
	fflush(stdout);
	fprintf(stderr, "nfsh: %s %s failed: errno=%d (%s): %s\n", op,
		path ? path : "", e, strerror(e), errmsg());
}

static void die(const char *op, const char *path, int rc)
{
	report_err(op, path, rc);
	exit(1);
}

/* A failed system call on a local path (put-tree's source): errno e. */
static void die_local(const char *op, const char *path, int e)
{
	printf("{\"ok\":false,\"op\":");
	json_str(stdout, op);
	printf(",\"path\":");
	json_str(stdout, path);
	printf(",\"local\":true,\"errno\":%d,\"strerror\":", e);
	json_str(stdout, strerror(e));
	printf(",\"error\":");
	json_str(stdout, strerror(e));
	printf("}\n");
	fflush(stdout);
	fprintf(stderr, "nfsh: local %s %s failed: %s\n", op, path, strerror(e));
	exit(1);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: nfsh URL COMMAND ARGS...\n"
		"  stat PATH | lstat PATH          attributes as JSON\n"
		"  statvfs PATH\n"
		"  create-loop DIR N               create+close DIR/f00000000..N-1\n"
		"  stat-loop DIR N                 stat DIR/f00000000..N-1\n"
		"  getattr-loop PATH N             N GETATTRs of one open file\n"
		"  rename-loop DIR N [FROM TO]     rename DIR/f00000000 -> DIR/r00000000 ...\n"
		"                                  (name prefixes FROM, TO; default f r)\n"
		"  remove-loop DIR N [PREFIX]      unlink DIR/f00000000..N-1 (PREFIX default f)\n"
		"  readdir DIR [--names] [--times N]  count entries, check names unique;\n"
		"                                  --times: list N times (each must agree)\n"
		"  mkdir-tree DIR DIRS FILES       DIR/dNNNNN/fNNNNNNNN\n"
		"  put-tree LOCALDIR DIR           recreate a local tree under DIR (\"untar\")\n"
		"  copy-tree SRC DST               copy a tree inside the export (\"cp -r\")\n"
		"  remove-tree DIR                 remove a tree (\"rm -rf\")\n"
		"  hold-and-read PATH SECONDS      re-read through one open handle\n"
		"  write-pattern PATH SIZE SEED    deterministic content (SIZE: 4k, 1m...)\n"
		"  verify-pattern PATH SIZE SEED\n"
		"  durable-writer DIR N SEED       N puts/renames/truncates/removes in DIR,\n"
		"                                  each logged when sent and when done\n"
		"  cat PATH                        file content to stdout (raw)\n"
		"  mkdir PATH | rmdir PATH | unlink PATH | readlink PATH\n"
		"  rename OLD NEW | link OLD NEW | symlink TARGET PATH\n"
		"  chmod PATH OCTAL | truncate PATH SIZE\n"
		"  fsx PATH OPS SEED MAXLEN [MODEL_OUT|- [STRIPE]]\n"
		"                                  random I/O on one file through two\n"
		"                                  connections, checked against a model\n"
		"                                  (STRIPE K: its K-th stretch of a shared file)\n"
		"  nsx DIR OPS SEED                random namespace changes and listings in a\n"
		"                                  tree under DIR, checked against a model\n");
	exit(2);
}

static uint64_t parse_size(const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s) {
		fprintf(stderr, "nfsh: bad size '%s'\n", s);
		exit(2);
	}
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	case '\0': break;
	default:
		fprintf(stderr, "nfsh: bad size '%s'\n", s);
		exit(2);
	}
	if (*end == 'i' || *end == 'b' || *end == 'B')
		end++;
	if (*end == 'B')
		end++;
	if (*end) {
		fprintf(stderr, "nfsh: bad size '%s'\n", s);
		exit(2);
	}
	return v;
}

static long parse_long(const char *s)
{
	char *end;
	long v = strtol(s, &end, 0);
	if (end == s || *end || v < 0) {
		fprintf(stderr, "nfsh: bad number '%s'\n", s);
		exit(2);
	}
	return v;
}

/* libnfs paths are absolute from the export root. */
static char *abspath(const char *p)
{
	char *r;
	if (p[0] == '/')
		r = strdup(p);
	else if (asprintf(&r, "/%s", p) < 0)
		r = NULL;
	if (!r) {
		perror("nfsh");
		exit(1);
	}
	/* strip trailing slashes (but keep "/") */
	size_t n = strlen(r);
	while (n > 1 && r[n - 1] == '/')
		r[--n] = 0;
	return r;
}

static char *join(const char *dir, const char *name)
{
	char *r;
	if (asprintf(&r, "%s%s%s", dir, strcmp(dir, "/") ? "/" : "", name) < 0) {
		perror("nfsh");
		exit(1);
	}
	return r;
}

static char *loop_name_p(const char *dir, const char *prefix, long i)
{
	char buf[64];
	snprintf(buf, sizeof buf, "%s%08ld", prefix, i);
	return join(dir, buf);
}

static char *loop_name(const char *dir, long i)
{
	return loop_name_p(dir, "f", i);
}

/* A name prefix for the loops: short, no '/'. */
static const char *loop_prefix(const char *s)
{
	if (!*s || strlen(s) > 32 || strchr(s, '/')) {
		fprintf(stderr, "nfsh: bad name prefix '%s'\n", s);
		exit(2);
	}
	return s;
}

static size_t io_chunk(int writing)
{
	uint64_t m = writing ? nfs_get_writemax(nfs) : nfs_get_readmax(nfs);
	if (m == 0 || m > (1 << 20))
		m = 1 << 20;
	return (size_t)m;
}

/* --------------------------------------------------------------- stat */

static const char *type_name(uint64_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG: return "file";
	case S_IFDIR: return "dir";
	case S_IFLNK: return "symlink";
	case S_IFCHR: return "char";
	case S_IFBLK: return "block";
	case S_IFIFO: return "fifo";
	case S_IFSOCK: return "socket";
	}
	return "unknown";
}

static void print_stat(const char *path, const struct nfs_stat_64 *st)
{
	printf("{\"ok\":true,\"path\":");
	json_str(stdout, path);
	printf(",\"type\":\"%s\",\"mode\":%" PRIu64 ",\"perm\":\"%04" PRIo64 "\""
	       ",\"nlink\":%" PRIu64 ",\"uid\":%" PRIu64 ",\"gid\":%" PRIu64
	       ",\"size\":%" PRIu64 ",\"used\":%" PRIu64 ",\"blocks\":%" PRIu64
	       ",\"blksize\":%" PRIu64 ",\"ino\":%" PRIu64 ",\"dev\":%" PRIu64
	       ",\"rdev\":%" PRIu64
	       ",\"atime\":%" PRIu64 ",\"atime_nsec\":%" PRIu64
	       ",\"mtime\":%" PRIu64 ",\"mtime_nsec\":%" PRIu64
	       ",\"ctime\":%" PRIu64 ",\"ctime_nsec\":%" PRIu64 "}\n",
	       type_name(st->nfs_mode), st->nfs_mode, st->nfs_mode & 07777,
	       st->nfs_nlink, st->nfs_uid, st->nfs_gid, st->nfs_size,
	       st->nfs_used, st->nfs_blocks, st->nfs_blksize, st->nfs_ino,
	       st->nfs_dev, st->nfs_rdev, st->nfs_atime, st->nfs_atime_nsec,
	       st->nfs_mtime, st->nfs_mtime_nsec, st->nfs_ctime,
	       st->nfs_ctime_nsec);
}

static int cmd_stat(char **a, int lstat)
{
	char *p = abspath(a[0]);
	struct nfs_stat_64 st;
	int rc = lstat ? nfs_lstat64(nfs, p, &st) : nfs_stat64(nfs, p, &st);
	if (rc < 0)
		die(lstat ? "lstat" : "stat", p, rc);
	print_stat(p, &st);
	return 0;
}

static int cmd_statvfs(char **a)
{
	char *p = abspath(a[0]);
	struct nfs_statvfs_64 sv;
	int rc = nfs_statvfs64(nfs, p, &sv);
	if (rc < 0)
		die("statvfs", p, rc);
	printf("{\"ok\":true,\"bsize\":%" PRIu64 ",\"frsize\":%" PRIu64
	       ",\"blocks\":%" PRIu64 ",\"bfree\":%" PRIu64 ",\"bavail\":%" PRIu64
	       ",\"files\":%" PRIu64 ",\"ffree\":%" PRIu64 ",\"favail\":%" PRIu64
	       ",\"namemax\":%" PRIu64 "}\n",
	       sv.f_bsize, sv.f_frsize, sv.f_blocks, sv.f_bfree, sv.f_bavail,
	       sv.f_files, sv.f_ffree, sv.f_favail, sv.f_namemax);
	return 0;
}

/* --------------------------------------------------------------- loops */

/* started/ended are CLOCK_MONOTONIC seconds, one clock for every process on the
 * machine: loops run at once can be laid side by side. */
static void print_loop(const char *op, long n, double t0)
{
	double t1 = now(), secs = t1 - t0;
	printf("{\"ok\":true,\"op\":\"%s\",\"ops\":%ld,\"seconds\":%.6f,"
	       "\"ops_per_sec\":%.1f,\"started\":%.6f,\"ended\":%.6f}\n",
	       op, n, secs, secs > 0 ? n / secs : 0.0, t0, t1);
}

static int cmd_create_loop(char **a)
{
	char *d = abspath(a[0]);
	long n = parse_long(a[1]);
	double t0 = now();
	for (long i = 0; i < n; i++) {
		char *p = loop_name(d, i);
		struct nfsfh *fh;
		int rc = nfs_creat(nfs, p, 0644, &fh);
		if (rc < 0)
			die("creat", p, rc);
		rc = nfs_close(nfs, fh);
		if (rc < 0)
			die("close", p, rc);
		free(p);
	}
	print_loop("create", n, t0);
	return 0;
}

static int cmd_stat_loop(char **a)
{
	char *d = abspath(a[0]);
	long n = parse_long(a[1]);
	double t0 = now();
	for (long i = 0; i < n; i++) {
		char *p = loop_name(d, i);
		struct nfs_stat_64 st;
		int rc = nfs_stat64(nfs, p, &st);
		if (rc < 0)
			die("stat", p, rc);
		free(p);
	}
	print_loop("stat", n, t0);
	return 0;
}

/* One round trip per call (GETATTR of the same path, whose handle libnfs keeps):
 * the client's floor for any metadata operation. */
static int cmd_getattr_loop(char **a)
{
	char *p = abspath(a[0]);
	long n = parse_long(a[1]);
	struct nfsfh *fh;
	int rc = nfs_open(nfs, p, O_RDONLY, &fh);
	if (rc < 0)
		die("open", p, rc);
	double t0 = now();
	for (long i = 0; i < n; i++) {
		struct nfs_stat_64 st;
		rc = nfs_fstat64(nfs, fh, &st);
		if (rc < 0)
			die("fstat", p, rc);
	}
	print_loop("getattr", n, t0);
	nfs_close(nfs, fh);
	return 0;
}

static int cmd_rename_loop(char **a, int argc)
{
	char *d = abspath(a[0]);
	long n = parse_long(a[1]);
	if (argc == 3)
		usage(); /* FROM without TO */
	const char *from = loop_prefix(argc > 3 ? a[2] : "f");
	const char *to = loop_prefix(argc > 3 ? a[3] : "r");
	double t0 = now();
	for (long i = 0; i < n; i++) {
		char *o = loop_name_p(d, from, i), *p = loop_name_p(d, to, i);
		int rc = nfs_rename(nfs, o, p);
		if (rc < 0)
			die("rename", o, rc);
		free(o);
		free(p);
	}
	print_loop("rename", n, t0);
	return 0;
}

static int cmd_remove_loop(char **a, int argc)
{
	char *d = abspath(a[0]);
	long n = parse_long(a[1]);
	const char *prefix = loop_prefix(argc > 2 ? a[2] : "f");
	double t0 = now();
	for (long i = 0; i < n; i++) {
		char *p = loop_name_p(d, prefix, i);
		int rc = nfs_unlink(nfs, p);
		if (rc < 0)
			die("unlink", p, rc);
		free(p);
	}
	print_loop("remove", n, t0);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* One listing of d: the number of entries other than . and .., those counted in *dots;
 * the names into *v (grown as needed) when v is not NULL. */
static size_t list_once(char *d, char ***v, size_t *cap, size_t *dots)
{
	struct nfsdir *dir;
	int rc = nfs_opendir(nfs, d, &dir);
	if (rc < 0)
		die("opendir", d, rc);
	size_t n = 0;
	struct nfsdirent *e;
	while ((e = nfs_readdir(nfs, dir)) != NULL) {
		if (!strcmp(e->name, ".") || !strcmp(e->name, "..")) {
			(*dots)++;
			continue;
		}
		if (v) {
			if (n == *cap)
				*v = realloc(*v, (*cap *= 2) * sizeof **v);
			(*v)[n] = strdup(e->name);
		}
		n++;
	}
	nfs_closedir(nfs, dir);
	return n;
}

static int cmd_readdir(char **a, int argc)
{
	char *d = abspath(a[0]);
	int names = 0;
	long times = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(a[i], "--names"))
			names = 1;
		else if (!strcmp(a[i], "--times") && i + 1 < argc)
			times = parse_long(a[++i]);
		else
			usage();
	}
	if (times < 1)
		usage();
	double t0 = now();
	size_t cap = 1024, dots = 0;
	char **v = malloc(cap * sizeof *v);
	size_t n = list_once(d, &v, &cap, &dots);
	/* Listed again (--times): every listing must find as many entries as the first. */
	for (long t = 1; t < times; t++) {
		size_t again_dots = 0, again = list_once(d, NULL, NULL, &again_dots);
		if (again != n || again_dots != dots) {
			fprintf(stderr, "nfsh: readdir %s: listing %ld found %zu entries, the first %zu\n", d, t + 1, again, n);
			exit(1);
		}
	}
	double secs = now() - t0;
	qsort(v, n, sizeof *v, cmp_str);
	size_t dups = 0;
	printf("{\"ok\":true,\"dir\":");
	json_str(stdout, d);
	/* started/ended: CLOCK_MONOTONIC, as the loops' (print_loop) */
	/* count: entries per listing; seconds: all the listings' */
	printf(",\"count\":%zu,\"listings\":%ld,\"dot_entries\":%zu,\"seconds\":%.6f,"
	       "\"started\":%.6f,\"ended\":%.6f,\"duplicates\":[",
	       n, times, dots, secs, t0, t0 + secs);
	for (size_t i = 1; i < n; i++) {
		if (!strcmp(v[i], v[i - 1]) && (i < 2 || strcmp(v[i], v[i - 2]))) {
			if (dups < 100) {
				if (dups)
					putchar(',');
				json_str(stdout, v[i]);
			}
			dups++;
		}
	}
	printf("],\"unique\":%s", dups ? "false" : "true");
	if (names) {
		printf(",\"names\":[");
		for (size_t i = 0; i < n; i++) {
			if (i)
				putchar(',');
			json_str(stdout, v[i]);
		}
		putchar(']');
	}
	printf("}\n");
	if (dups)
		fprintf(stderr, "nfsh: readdir %s: %zu duplicate name(s)\n", d, dups);
	return dups ? 3 : 0;
}

static int cmd_mkdir_tree(char **a)
{
	char *root = abspath(a[0]);
	long dirs = parse_long(a[1]), files = parse_long(a[2]);
	double t0 = now();
	long ops = 0;
	if (strcmp(root, "/")) {
		int rc = nfs_mkdir(nfs, root);
		if (rc < 0 && rc != -EEXIST)
			die("mkdir", root, rc);
		ops++;
	}
	for (long i = 0; i < dirs; i++) {
		char name[32];
		snprintf(name, sizeof name, "d%05ld", i);
		char *dp = join(root, name);
		int rc = nfs_mkdir(nfs, dp);
		if (rc < 0)
			die("mkdir", dp, rc);
		ops++;
		for (long j = 0; j < files; j++) {
			char *p = loop_name(dp, j);
			struct nfsfh *fh;
			rc = nfs_creat(nfs, p, 0644, &fh);
			if (rc < 0)
				die("creat", p, rc);
			rc = nfs_close(nfs, fh);
			if (rc < 0)
				die("close", p, rc);
			ops++;
			free(p);
		}
		free(dp);
	}
	double secs = now() - t0;
	printf("{\"ok\":true,\"op\":\"mkdir-tree\",\"dirs\":%ld,\"files\":%ld,"
	       "\"ops\":%ld,\"seconds\":%.6f}\n",
	       dirs, dirs * files, ops, secs);
	return 0;
}

/* -------------------------------------------------------------- trees */

/* put-tree / copy-tree / remove-tree: what `tar x`, `cp -r` and `rm -rf` do on
 * an NFS mount, one RPC after the other.  Regular files are created,
 * written (UNSTABLE) and closed, and libnfs commits a written file on close
 * (a kernel client flushes and commits on close too); their mode is kept
 * (plus u+rw), times and owners are not.
 * Directories, regular files and symlinks are handled; anything else is
 * counted as "skipped".  libnfs resolves every path from the export root, so
 * each call also LOOKUPs the path's directories (there is no client cache). */

struct tree_count {
	long files, dirs, links, skipped;
	uint64_t bytes;
};

static char *io_buf;
static size_t io_len;

static void io_buf_init(void)
{
	if (io_buf)
		return;
	size_t r = io_chunk(0), w = io_chunk(1);
	io_len = r < w ? r : w;
	io_buf = malloc(io_len);
	if (!io_buf) {
		perror("nfsh");
		exit(1);
	}
}

static void print_tree(const char *op, const struct tree_count *c, double secs, int bytes)
{
	long ops = c->files + c->dirs + c->links;
	printf("{\"ok\":true,\"op\":\"%s\",\"files\":%ld,\"dirs\":%ld,\"links\":%ld,"
	       "\"skipped\":%ld,\"ops\":%ld,",
	       op, c->files, c->dirs, c->links, c->skipped, ops);
	if (bytes)
		printf("\"bytes\":%" PRIu64 ",", c->bytes);
	printf("\"seconds\":%.6f,\"ops_per_sec\":%.1f}\n", secs, secs > 0 ? ops / secs : 0.0);
}

static void pwrite_all(struct nfsfh *fh, const char *p, uint64_t off, const char *buf, size_t len)
{
	while (len > 0) {
		int rc = nfs_pwrite(nfs, fh, off, len, buf);
		if (rc < 0)
			die("pwrite", p, rc);
		if (rc == 0)
			die("pwrite(short)", p, -EIO);
		off += rc;
		buf += rc;
		len -= rc;
	}
}

/* Close a file written through fh.  libnfs (4.0) sends a COMMIT on close
 * when the handle was written to (as a kernel client flushes and commits on
 * close), so no nfs_fsync here: that would COMMIT twice. */
static void finish_file(struct nfsfh *fh, const char *p)
{
	int rc = nfs_close(nfs, fh);
	if (rc < 0)
		die("close", p, rc);
}

static void mkdir_mode(const char *p, int mode, int allow_exist)
{
	int rc = nfs_mkdir2(nfs, p, mode);
	if (rc < 0 && !(allow_exist && rc == -EEXIST))
		die("mkdir", p, rc);
}

static void put_file(const char *lp, const char *rp, mode_t mode, struct tree_count *c)
{
	int fd = open(lp, O_RDONLY);
	if (fd < 0)
		die_local("open", lp, errno);
	struct nfsfh *fh;
	int rc = nfs_creat(nfs, rp, (mode & 0777) | 0600, &fh);
	if (rc < 0)
		die("creat", rp, rc);
	uint64_t off = 0;
	for (;;) {
		ssize_t n = read(fd, io_buf, io_len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die_local("read", lp, errno);
		}
		if (n == 0)
			break;
		pwrite_all(fh, rp, off, io_buf, n);
		off += n;
	}
	close(fd);
	finish_file(fh, rp);
	c->files++;
	c->bytes += off;
}

static void put_tree_rec(const char *local, const char *remote, struct tree_count *c)
{
	DIR *d = opendir(local);
	if (!d)
		die_local("opendir", local, errno);
	struct dirent *e;
	errno = 0;
	while ((e = readdir(d)) != NULL) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char *lp = join(local, e->d_name), *rp = join(remote, e->d_name);
		struct stat st;
		if (lstat(lp, &st) < 0)
			die_local("lstat", lp, errno);
		if (S_ISDIR(st.st_mode)) {
			mkdir_mode(rp, (st.st_mode & 0777) | 0700, 0);
			c->dirs++;
			put_tree_rec(lp, rp, c);
		} else if (S_ISREG(st.st_mode)) {
			put_file(lp, rp, st.st_mode, c);
		} else if (S_ISLNK(st.st_mode)) {
			char target[PATH_MAX + 1];
			ssize_t n = readlink(lp, target, PATH_MAX);
			if (n < 0)
				die_local("readlink", lp, errno);
			target[n] = 0;
			int rc = nfs_symlink(nfs, target, rp);
			if (rc < 0)
				die("symlink", rp, rc);
			c->links++;
		} else {
			c->skipped++;
		}
		free(lp);
		free(rp);
		errno = 0;
	}
	if (errno)
		die_local("readdir", local, errno);
	closedir(d);
}

static int cmd_put_tree(char **a)
{
	const char *local = a[0];
	char *root = abspath(a[1]);
	struct stat st;
	if (stat(local, &st) < 0)
		die_local("stat", local, errno);
	if (!S_ISDIR(st.st_mode))
		die_local("stat", local, ENOTDIR);
	io_buf_init();
	struct tree_count c = { 0 };
	double t0 = now();
	mkdir_mode(root, (st.st_mode & 0777) | 0700, 1);
	c.dirs++;
	put_tree_rec(local, root, &c);
	print_tree("put-tree", &c, now() - t0, 1);
	return 0;
}

struct ent {
	char *name;
	uint32_t mode; /* S_IFMT bits + permissions */
	uint64_t size;
};

/* File type and permissions of a directory entry.  `type` is the ftype3
 * (NFSv3) or nfs_ftype4 (NFSv4) of READDIRPLUS: both number REG 1, DIR 2,
 * BLK 3, CHR 4, LNK 5, SOCK 6, FIFO 7.  0 when the server sent no attributes. */
static uint32_t ent_mode(uint32_t type, uint32_t mode)
{
	static const uint32_t fmt[8] = { 0, S_IFREG, S_IFDIR, S_IFBLK, S_IFCHR,
					 S_IFLNK, S_IFSOCK, S_IFIFO };
	if (type >= 1 && type <= 7)
		return fmt[type] | (mode & 07777);
	return (mode & S_IFMT) ? mode : 0;
}

/* All entries of an NFS directory except . and .. (READDIRPLUS; the
 * directory is read completely by nfs_opendir and closed before we change
 * it).  An entry without attributes is looked up. */
static struct ent *list_dir(const char *dir, size_t *count)
{
	struct nfsdir *d;
	int rc = nfs_opendir(nfs, dir, &d);
	if (rc < 0)
		die("opendir", dir, rc);
	size_t cap = 64, n = 0;
	struct ent *v = malloc(cap * sizeof *v);
	struct nfsdirent *e;
	while ((e = nfs_readdir(nfs, d)) != NULL) {
		if (!strcmp(e->name, ".") || !strcmp(e->name, ".."))
			continue;
		if (n == cap)
			v = realloc(v, (cap *= 2) * sizeof *v);
		v[n].name = strdup(e->name);
		v[n].mode = ent_mode(e->type, e->mode);
		v[n].size = e->size;
		n++;
	}
	nfs_closedir(nfs, d);
	for (size_t i = 0; i < n; i++) {
		if (v[i].mode & S_IFMT)
			continue;
		char *p = join(dir, v[i].name);
		struct nfs_stat_64 st;
		if ((rc = nfs_lstat64(nfs, p, &st)) < 0)
			die("lstat", p, rc);
		v[i].mode = st.nfs_mode;
		v[i].size = st.nfs_size;
		free(p);
	}
	*count = n;
	return v;
}

static void free_ents(struct ent *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i].name);
	free(v);
}

/* Copy a regular file of `size` bytes (from READDIRPLUS): read up to the
 * size, as a client that knows the size from the attributes does. */
static void copy_file(const char *sp, const char *dp, const struct ent *en, struct tree_count *c)
{
	struct nfsfh *in, *out;
	int rc = nfs_open(nfs, sp, O_RDONLY, &in);
	if (rc < 0)
		die("open", sp, rc);
	rc = nfs_creat(nfs, dp, (en->mode & 0777) | 0600, &out);
	if (rc < 0)
		die("creat", dp, rc);
	uint64_t off = 0;
	while (off < en->size) {
		uint64_t want = en->size - off < io_len ? en->size - off : io_len;
		rc = nfs_pread(nfs, in, off, want, io_buf);
		if (rc < 0)
			die("pread", sp, rc);
		if (rc == 0)
			break; /* shrank meanwhile */
		pwrite_all(out, dp, off, io_buf, rc);
		off += rc;
	}
	if ((rc = nfs_close(nfs, in)) < 0)
		die("close", sp, rc);
	finish_file(out, dp);
	c->files++;
	c->bytes += off;
}

static void copy_tree_rec(const char *src, const char *dst, struct tree_count *c)
{
	size_t n;
	struct ent *v = list_dir(src, &n);
	for (size_t i = 0; i < n; i++) {
		char *sp = join(src, v[i].name), *dp = join(dst, v[i].name);
		switch (v[i].mode & S_IFMT) {
		case S_IFDIR:
			mkdir_mode(dp, (v[i].mode & 0777) | 0700, 0);
			c->dirs++;
			copy_tree_rec(sp, dp, c);
			break;
		case S_IFREG:
			copy_file(sp, dp, &v[i], c);
			break;
		case S_IFLNK: {
			char target[PATH_MAX + 1];
			memset(target, 0, sizeof target);
			int rc = nfs_readlink(nfs, sp, target, PATH_MAX);
			if (rc < 0)
				die("readlink", sp, rc);
			if ((rc = nfs_symlink(nfs, target, dp)) < 0)
				die("symlink", dp, rc);
			c->links++;
			break;
		}
		default:
			c->skipped++;
		}
		free(sp);
		free(dp);
	}
	free_ents(v, n);
}

static int cmd_copy_tree(char **a)
{
	char *src = abspath(a[0]), *dst = abspath(a[1]);
	io_buf_init();
	struct tree_count c = { 0 };
	double t0 = now();
	struct nfs_stat_64 st;
	int rc = nfs_stat64(nfs, src, &st);
	if (rc < 0)
		die("stat", src, rc);
	if ((st.nfs_mode & S_IFMT) != S_IFDIR)
		die("stat", src, -ENOTDIR);
	mkdir_mode(dst, (st.nfs_mode & 0777) | 0700, 0);
	c.dirs++;
	copy_tree_rec(src, dst, &c);
	print_tree("copy-tree", &c, now() - t0, 1);
	return 0;
}

/* Depth first: the entries (subdirectories recursively), then the directory. */
static void remove_tree_rec(const char *dir, struct tree_count *c)
{
	size_t n;
	struct ent *v = list_dir(dir, &n);
	for (size_t i = 0; i < n; i++) {
		char *p = join(dir, v[i].name);
		uint32_t fmt = v[i].mode & S_IFMT;
		if (fmt == S_IFDIR) {
			remove_tree_rec(p, c);
		} else {
			int rc = nfs_unlink(nfs, p);
			if (rc < 0)
				die("unlink", p, rc);
			if (fmt == S_IFLNK)
				c->links++;
			else if (fmt == S_IFREG)
				c->files++;
			else
				c->skipped++;
		}
		free(p);
	}
	free_ents(v, n);
	int rc = nfs_rmdir(nfs, dir);
	if (rc < 0)
		die("rmdir", dir, rc);
	c->dirs++;
}

static int cmd_remove_tree(char **a)
{
	char *root = abspath(a[0]);
	if (!strcmp(root, "/")) {
		fprintf(stderr, "nfsh: remove-tree: will not remove the export root\n");
		exit(2);
	}
	struct tree_count c = { 0 };
	double t0 = now();
	remove_tree_rec(root, &c);
	print_tree("remove-tree", &c, now() - t0, 0);
	return 0;
}

/* ------------------------------------------------------- hold-and-read */

/* Read up to the whole file from offset 0 through fh. Returns bytes or -errno. */
static int64_t read_all(struct nfsfh *fh, uint64_t *sum)
{
	size_t chunk = io_chunk(0);
	char *buf = malloc(chunk);
	uint64_t off = 0, h = 1469598103934665603ULL; /* FNV-1a */
	for (;;) {
		int rc = nfs_pread(nfs, fh, off, chunk, buf);
		if (rc < 0) {
			free(buf);
			return rc;
		}
		for (int i = 0; i < rc; i++)
			h = (h ^ (uint8_t)buf[i]) * 1099511628211ULL;
		off += rc;
		if (rc == 0 || off >= (64ULL << 20))
			break;
	}
	free(buf);
	*sum = h;
	return (int64_t)off;
}

static int cmd_hold_and_read(char **a)
{
	char *p = abspath(a[0]);
	double secs = atof(a[1]);
	struct nfsfh *fh;
	int rc = nfs_open(nfs, p, O_RDONLY, &fh);
	if (rc < 0)
		die("open", p, rc);
	double t0 = now();
	long attempt = 0, ok = 0, fail = 0;
	for (;;) {
		double ts = now();
		uint64_t sum = 0;
		int64_t n = read_all(fh, &sum);
		double lat = now() - ts;
		/* wall to the microsecond: rounded to the millisecond it could read later
		 * than a clock the caller reads just after the line arrives */
		printf("{\"attempt\":%ld,\"t\":%.3f,\"wall\":%.6f,\"latency\":%.4f,",
		       attempt, ts - t0, wall(), lat);
		if (n >= 0) {
			ok++;
			printf("\"ok\":true,\"bytes\":%" PRId64 ",\"fnv1a\":\"%016" PRIx64 "\"}\n",
			       n, sum);
		} else {
			fail++;
			printf("\"ok\":false,\"errno\":%d,\"err\":", (int)-n);
			json_str(stdout, errmsg());
			printf("}\n");
		}
		fflush(stdout);
		attempt++;
		if (now() - t0 >= secs)
			break;
		/* next attempt 0.5 s after the previous one started */
		double next = ts + 0.5, cur = now();
		if (next > cur) {
			double d = next - cur;
			struct timespec sl = { (time_t)d, (long)((d - (time_t)d) * 1e9) };
			nanosleep(&sl, NULL);
		}
	}
	nfs_close(nfs, fh);
	printf("{\"summary\":true,\"attempts\":%ld,\"ok_count\":%ld,\"failed\":%ld}\n",
	       attempt, ok, fail);
	return 0;
}

/* ------------------------------------------------------ write/verify */

static int cmd_write_pattern(char **a)
{
	char *p = abspath(a[0]);
	uint64_t size = parse_size(a[1]);
	uint64_t seed = strtoull(a[2], NULL, 0);
	struct nfsfh *fh;
	double t0 = now();
	int rc = nfs_create(nfs, p, O_TRUNC, 0644, &fh);
	if (rc < 0)
		die("create", p, rc);
	size_t chunk = io_chunk(1);
	uint8_t *buf = malloc(chunk);
	for (uint64_t off = 0; off < size;) {
		size_t len = size - off < chunk ? (size_t)(size - off) : chunk;
		pattern_fill(buf, off, len, seed);
		rc = nfs_pwrite(nfs, fh, off, len, (char *)buf);
		if (rc < 0)
			die("pwrite", p, rc);
		if (rc == 0)
			die("pwrite(short)", p, -EIO);
		off += rc;
	}
	rc = nfs_ftruncate(nfs, fh, size);
	if (rc < 0)
		die("ftruncate", p, rc);
	rc = nfs_fsync(nfs, fh);
	if (rc < 0)
		die("fsync", p, rc);
	rc = nfs_close(nfs, fh);
	if (rc < 0)
		die("close", p, rc);
	double secs = now() - t0;
	printf("{\"ok\":true,\"op\":\"write-pattern\",\"bytes\":%" PRIu64
	       ",\"seed\":%" PRIu64 ",\"seconds\":%.6f,\"mib_per_sec\":%.2f}\n",
	       size, seed, secs, secs > 0 ? size / 1048576.0 / secs : 0.0);
	free(buf);
	return 0;
}

static int cmd_verify_pattern(char **a)
{
	char *p = abspath(a[0]);
	uint64_t size = parse_size(a[1]);
	uint64_t seed = strtoull(a[2], NULL, 0);
	struct nfsfh *fh;
	struct nfs_stat_64 st;
	double t0 = now();
	int rc = nfs_open(nfs, p, O_RDONLY, &fh);
	if (rc < 0)
		die("open", p, rc);
	rc = nfs_fstat64(nfs, fh, &st);
	if (rc < 0)
		die("fstat", p, rc);
	size_t chunk = io_chunk(0);
	uint8_t *buf = malloc(chunk), *exp = malloc(chunk);
	uint64_t off = 0;
	int64_t bad = -1;
	while (off < size) {
		size_t want = size - off < chunk ? (size_t)(size - off) : chunk;
		rc = nfs_pread(nfs, fh, off, want, (char *)buf);
		if (rc < 0)
			die("pread", p, rc);
		if (rc == 0)
			break; /* short file */
		pattern_fill(exp, off, rc, seed);
		if (memcmp(buf, exp, rc)) {
			for (int i = 0; i < rc; i++)
				if (buf[i] != exp[i]) {
					bad = off + i;
					break;
				}
			break;
		}
		off += rc;
	}
	nfs_close(nfs, fh);
	int size_ok = st.nfs_size == size;
	int ok = bad < 0 && off == size && size_ok;
	printf("{\"ok\":%s,\"op\":\"verify-pattern\",\"bytes_checked\":%" PRIu64
	       ",\"expected_size\":%" PRIu64 ",\"size\":%" PRIu64
	       ",\"first_mismatch\":%" PRId64 ",\"seconds\":%.6f}\n",
	       ok ? "true" : "false", off, size, st.nfs_size, bad, now() - t0);
	if (!ok)
		fprintf(stderr, "nfsh: verify-pattern %s: mismatch (size %" PRIu64
			" expected %" PRIu64 ", first bad offset %" PRId64 ")\n",
			p, st.nfs_size, size, bad);
	free(buf);
	free(exp);
	return ok ? 0 : 3;
}

static int cmd_cat(char **a)
{
	char *p = abspath(a[0]);
	struct nfsfh *fh;
	int rc = nfs_open(nfs, p, O_RDONLY, &fh);
	if (rc < 0)
		die("open", p, rc);
	size_t chunk = io_chunk(0);
	char *buf = malloc(chunk);
	uint64_t off = 0;
	for (;;) {
		rc = nfs_pread(nfs, fh, off, chunk, buf);
		if (rc < 0)
			die("pread", p, rc);
		if (rc == 0)
			break;
		fwrite(buf, 1, rc, stdout);
		off += rc;
	}
	nfs_close(nfs, fh);
	free(buf);
	return 0;
}

/* ---------------------------------------------------------- one-shots */

static int ok_line(const char *op, const char *path)
{
	printf("{\"ok\":true,\"op\":\"%s\",\"path\":", op);
	json_str(stdout, path);
	printf("}\n");
	return 0;
}

static int cmd_simple(const char *cmd, char **a, int argc)
{
	int rc;
	if (!strcmp(cmd, "mkdir")) {
		char *p = abspath(a[0]);
		if ((rc = nfs_mkdir(nfs, p)) < 0)
			die(cmd, p, rc);
		return ok_line(cmd, p);
	}
	if (!strcmp(cmd, "rmdir")) {
		char *p = abspath(a[0]);
		if ((rc = nfs_rmdir(nfs, p)) < 0)
			die(cmd, p, rc);
		return ok_line(cmd, p);
	}
	if (!strcmp(cmd, "unlink")) {
		char *p = abspath(a[0]);
		if ((rc = nfs_unlink(nfs, p)) < 0)
			die(cmd, p, rc);
		return ok_line(cmd, p);
	}
	if (!strcmp(cmd, "readlink")) {
		char *p = abspath(a[0]);
		char buf[4097];
		memset(buf, 0, sizeof buf);
		if ((rc = nfs_readlink(nfs, p, buf, sizeof buf - 1)) < 0)
			die(cmd, p, rc);
		printf("{\"ok\":true,\"path\":");
		json_str(stdout, p);
		printf(",\"target\":");
		json_str(stdout, buf);
		printf("}\n");
		return 0;
	}
	if (argc < 2)
		usage();
	if (!strcmp(cmd, "rename") || !strcmp(cmd, "link")) {
		char *o = abspath(a[0]), *n = abspath(a[1]);
		rc = !strcmp(cmd, "rename") ? nfs_rename(nfs, o, n) : nfs_link(nfs, o, n);
		if (rc < 0)
			die(cmd, o, rc);
		return ok_line(cmd, n);
	}
	if (!strcmp(cmd, "symlink")) {
		char *p = abspath(a[1]);
		if ((rc = nfs_symlink(nfs, a[0], p)) < 0)
			die(cmd, p, rc);
		return ok_line(cmd, p);
	}
	if (!strcmp(cmd, "chmod")) {
		char *p = abspath(a[0]);
		if ((rc = nfs_chmod(nfs, p, (int)strtol(a[1], NULL, 8))) < 0)
			die(cmd, p, rc);
		return ok_line(cmd, p);
	}
	if (!strcmp(cmd, "truncate")) {
		char *p = abspath(a[0]);
		if ((rc = nfs_truncate(nfs, p, parse_size(a[1]))) < 0)
			die(cmd, p, rc);
		return ok_line(cmd, p);
	}
	usage();
	return 2;
}

/* ------------------------------------------------------ durable-writer */

/*
 * The libnfs side of the crash test: N operations in DIR, one at a time, each
 * printed (and flushed) as {"i":I,"state":"sent",...} before it starts and
 * {"i":I,"state":"done"} once libnfs reports it complete, so a checker knows what
 * the server acknowledged when it was killed. Operations, chosen by SEED:
 *   put       create fI (O_EXCL), write SIZE bytes of pattern SEED^I and close;
 *             with "how":"file_sync" the file is opened O_SYNC (FILE_SYNC
 *             WRITEs), with "how":"commit" the writes are UNSTABLE and fsync
 *             sends COMMIT before close
 *   rename    a live file to rI
 *   truncate  a live file to half its size
 *   remove    a live file
 * Stops at the first failure (the server went away): the checker treats the
 * last "sent" without "done" as in flight.
 */
struct live_file {
	char name[32];
	uint64_t size, seed;
};

static void sent(long i, const char *op, const char *name, const char *extra)
{
	printf("{\"i\":%ld,\"state\":\"sent\",\"op\":\"%s\",\"name\":\"%s\"%s}\n", i, op, name,
	       extra);
	fflush(stdout);
}

static void done(long i)
{
	printf("{\"i\":%ld,\"state\":\"done\"}\n", i);
	fflush(stdout);
}

static int cmd_durable_writer(char **a)
{
	const char *dir = a[0];
	long n = strtol(a[1], NULL, 0);
	uint64_t seed = strtoull(a[2], NULL, 0), rng = seed;
	struct live_file *live = calloc(n > 0 ? n : 1, sizeof(*live));
	size_t nlive = 0;
	char *d = abspath(dir);
	int rc = nfs_mkdir(nfs, d);
	if (rc < 0 && rc != -EEXIST)
		die("mkdir", d, rc);
	uint8_t *buf = malloc(1 << 20);
	char extra[128];
	for (long i = 0; i < n; i++) {
		uint64_t r = splitmix64(rng++);
		unsigned kind = nlive < 2 ? 0 : r % 10;
		if (kind < 6) { /* put */
			struct live_file *f = &live[nlive];
			snprintf(f->name, sizeof(f->name), "f%ld", i);
			f->size = 4096 * (1 + (r >> 8) % 48) + (r >> 16) % 4096;
			f->seed = seed ^ (uint64_t)i;
			int sync = (r >> 32) & 1;
			snprintf(extra, sizeof(extra), ",\"size\":%" PRIu64 ",\"seed\":%" PRIu64
				 ",\"how\":\"%s\"", f->size, f->seed, sync ? "file_sync" : "commit");
			sent(i, "put", f->name, extra);
			char *p = join(d, f->name);
			struct nfsfh *fh;
			rc = nfs_create(nfs, p, O_EXCL | (sync ? O_SYNC : 0), 0644, &fh);
			if (rc < 0)
				die("create", p, rc);
			for (uint64_t off = 0; off < f->size;) {
				size_t len = f->size - off < (1 << 20) ? (size_t)(f->size - off) : (1 << 20);
				pattern_fill(buf, off, len, f->seed);
				rc = nfs_pwrite(nfs, fh, off, len, (char *)buf);
				if (rc <= 0)
					die("pwrite", p, rc < 0 ? rc : -EIO);
				off += rc;
			}
			if (!sync && (rc = nfs_fsync(nfs, fh)) < 0)
				die("fsync", p, rc);
			if ((rc = nfs_close(nfs, fh)) < 0)
				die("close", p, rc);
			free(p);
			nlive++;
		} else {
			size_t k = (r >> 8) % nlive;
			struct live_file *f = &live[k];
			char *p = join(d, f->name);
			if (kind < 8) { /* rename */
				char to[32];
				snprintf(to, sizeof(to), "r%ld", i);
				snprintf(extra, sizeof(extra), ",\"to\":\"%s\"", to);
				sent(i, "rename", f->name, extra);
				char *q = join(d, to);
				if ((rc = nfs_rename(nfs, p, q)) < 0)
					die("rename", p, rc);
				snprintf(f->name, sizeof(f->name), "%s", to);
				free(q);
			} else if (kind < 9) { /* truncate */
				snprintf(extra, sizeof(extra), ",\"size\":%" PRIu64, f->size / 2);
				sent(i, "truncate", f->name, extra);
				if ((rc = nfs_truncate(nfs, p, f->size / 2)) < 0)
					die("truncate", p, rc);
				f->size /= 2;
			} else { /* remove */
				sent(i, "remove", f->name, "");
				if ((rc = nfs_unlink(nfs, p)) < 0)
					die("unlink", p, rc);
				live[k] = live[--nlive];
			}
			free(p);
		}
		done(i);
	}
	free(buf);
	free(live);
	printf("{\"summary\":true,\"ops\":%ld}\n", n);
	return 0;
}

/* ---------------------------------------------------------------- fsx */

/*
 * fsx PATH OPS SEED MAXLEN [MODEL_OUT|- [STRIPE]]: the fsx engine (exerciser.h) on one file
 * through two handles on two connections (two libnfs contexts, so two TCP
 * connections to the server): handle 0 writes FILE_SYNC (opened O_SYNC), handle 1
 * UNSTABLE, and each operation goes to either at random, so what one connection
 * wrote is read back through the other.  Syncs are COMMITs, truncations SETATTRs.
 * libnfs caches no file data here, so every check is a check of the server.
 * MODEL_OUT (a local path), if given, receives the model at the end, for the caller
 * to compare with the file on the server's disk.  With STRIPE K, several of them
 * share one existing file: this one owns the K-th stretch of MAXLEN + 3 MiB bytes and
 * neither truncates nor appends (its model is of that stretch).  Exit 3 on a
 * mismatch, with the last operations on stderr.
 */
static struct nfs_context *mount_export(struct nfs_url **urlp);
static struct nfs_context *mount_export_or(struct nfs_url **urlp, int *rc);
static struct nfs_context *mount_export_until(struct nfs_url **urlp, int *rc);
/* Contexts are made with libnfs's own reconnecting turned off (fsx: see fsx_nfs_renew). */
static int g_no_autoreconnect;

/* A call that failed where the model says it must succeed: exit 1. */
static void oplog_fail_nfs(const struct oplog *l, struct nfs_context *ctx, int s, const char *what,
			   const char *path, int rc) __attribute__((noreturn));
static void oplog_fail_nfs(const struct oplog *l, struct nfs_context *ctx, int s, const char *what,
			   const char *path, int rc)
{
	dump_oplog(l);
	const char *e = nfs_get_error(ctx);
	nfs = ctx; /* report_err's message comes from the failing context */
	fprintf(stderr, "nfsh: %s op %ld: %s through connection %d: %s\n", l->cmd, l->op, what, s,
		e ? e : "");
	report_err(what, path, rc);
	exit(1);
}

static struct {
	struct nfs_context *ctx[2];
	struct nfsfh *fh[2];
	int flags[2];
	const char *path;
	struct fsx *f;
} fsx_nfs;

static int fsx_nfs_open(int s);

/* A side never lets libnfs reconnect by itself (g_no_autoreconnect).  libnfs 4.0
 * keeps the part of a reply it had read when its connection broke and fills the rest
 * from the new connection, record mark first: a READ cut off mid-reply (a server
 * killed while sending it) came back with another reply's bytes in its data, and the
 * stream after it was out of step (docs/reliability.md, "A reply cut off mid-send").
 * With auto-reconnect off, a lost connection fails the call; the side then gets a new
 * context (a new connection and mount) and opens the file again by name, and the call
 * is sent again: they are sent one at a time, and each leaves the same state whether
 * it ran before or not.  Counted, so that runs without crashes can require none. */
static void fsx_nfs_renew(int s)
{
	struct nfs_context *old = fsx_nfs.ctx[s], *ctx;
	int rc;
	if (!(ctx = mount_export_until(NULL, &rc)))
		oplog_fail_nfs(&fsx_nfs.f->log, old, s, "mount again", g_url, rc);
	fsx_nfs.ctx[s] = ctx;
	if (s == 0)
		nfs = fsx_nfs.ctx[0]; /* main unmounts it at the end */
	/* The old context is closed, not destroyed (its memory is given up): destroying
	 * it would call back the calls the failed one left queued, and libnfs's sync calls
	 * keep their callback data on the stack of the call that has returned (a crash in
	 * libnfs 4.0). */
	close(nfs_get_fd(old));
	rc = fsx_nfs_open(s);
	if (rc < 0)
		oplog_fail_nfs(&fsx_nfs.f->log, fsx_nfs.ctx[s], s, "open again", fsx_nfs.path, rc);
}

/* The call failed because its connection did: given up (EINTR: cancelled or timed
 * out), or the sync loop's service of the socket failed (EIO, "nfs_service failed"),
 * as opposed to an NFS error in a reply, which is the server's answer. */
static int fsx_nfs_connection_lost(int s, int rc)
{
	const char *e = nfs_get_error(fsx_nfs.ctx[s]);
	return rc == -EINTR || (rc == -EIO && e && strstr(e, "nfs_service failed"));
}

#define FSX_NFS_CALL(s, call)                                                          \
	({                                                                             \
		int rc_, tries_ = 0;                                                   \
		while ((rc_ = (call)) < 0 && fsx_nfs_connection_lost(s, rc_) && tries_++ < 3) { \
			fsx_nfs.f->retries++;                                          \
			fsx_nfs_renew(s);                                              \
		}                                                                      \
		rc_;                                                                   \
	})

static int fsx_nfs_pwrite(int s, uint64_t off, size_t len, const uint8_t *buf)
{
	return FSX_NFS_CALL(s, nfs_pwrite(fsx_nfs.ctx[s], fsx_nfs.fh[s], off, len, (const void *)buf));
}

static int fsx_nfs_pread(int s, uint64_t off, size_t len, uint8_t *buf)
{
	return FSX_NFS_CALL(s, nfs_pread(fsx_nfs.ctx[s], fsx_nfs.fh[s], off, len, (void *)buf));
}

static int fsx_nfs_truncate(int s, uint64_t size)
{
	return FSX_NFS_CALL(s, nfs_ftruncate(fsx_nfs.ctx[s], fsx_nfs.fh[s], size));
}

static int fsx_nfs_sync(int s)
{
	return FSX_NFS_CALL(s, nfs_fsync(fsx_nfs.ctx[s], fsx_nfs.fh[s]));
}

static int fsx_nfs_size(int s, uint64_t *size)
{
	struct nfs_stat_64 st;
	int rc = FSX_NFS_CALL(s, nfs_fstat64(fsx_nfs.ctx[s], fsx_nfs.fh[s], &st));
	if (rc == 0)
		*size = st.nfs_size;
	return rc;
}

static int fsx_nfs_open(int s)
{
	return nfs_open(fsx_nfs.ctx[s], fsx_nfs.path, fsx_nfs.flags[s], &fsx_nfs.fh[s]);
}

static int fsx_nfs_reopen(int s)
{
	/* A close is not sent again: libnfs frees the handle whatever the outcome. */
	int rc = nfs_close(fsx_nfs.ctx[s], fsx_nfs.fh[s]);
	if (rc < 0 && fsx_nfs_connection_lost(s, rc)) {
		fsx_nfs.f->retries++;
		fsx_nfs_renew(s); /* opens it again */
		return 0;
	}
	return rc < 0 ? rc : FSX_NFS_CALL(s, fsx_nfs_open(s));
}

static void fsx_nfs_fail(const struct oplog *l, int s, const char *what, int rc) __attribute__((noreturn));
static void fsx_nfs_fail(const struct oplog *l, int s, const char *what, int rc)
{
	oplog_fail_nfs(l, fsx_nfs.ctx[s], s, what, fsx_nfs.path, rc);
}

static struct fsx_io fsx_nfs_io = {
	.pwrite = fsx_nfs_pwrite, .pread = fsx_nfs_pread, .truncate = fsx_nfs_truncate,
	.sync = fsx_nfs_sync, .size = fsx_nfs_size, .reopen = fsx_nfs_reopen, .fail = fsx_nfs_fail,
};

static int cmd_fsx(char **a, int argc)
{
	fsx_nfs.path = abspath(a[0]);
	long ops = parse_long(a[1]);
	uint64_t seed = strtoull(a[2], NULL, 0), maxlen = parse_size(a[3]);
	const char *model_out = argc > 4 && strcmp(a[4], "-") ? a[4] : NULL;
	long stripe = argc > 5 ? parse_long(a[5]) : -1;
	if (maxlen < 4096 || maxlen > (1ull << 30)) {
		fprintf(stderr, "nfsh: fsx MAXLEN must be 4k..1g\n");
		exit(2);
	}
	struct fsx *f = fsx_new("fsx", &fsx_nfs_io, seed, maxlen);
	fsx_nfs.f = f;
	f->shared = stripe >= 0;
	f->base = f->shared ? (uint64_t)stripe * (maxlen + FSX_BIG) : 0;
	fsx_nfs.ctx[0] = nfs;
	fsx_nfs.flags[0] = O_RDWR | O_SYNC;
	fsx_nfs.ctx[1] = mount_export(NULL);
	fsx_nfs.flags[1] = O_RDWR;
	struct nfsfh *fh;
	/* Shared, the file is the caller's to make, and others are writing it already. */
	int rc = f->shared ? 0 : nfs_create(nfs, fsx_nfs.path, O_TRUNC, 0644, &fh);
	if (rc < 0)
		die("create", fsx_nfs.path, rc);
	if (!f->shared)
		nfs_close(nfs, fh);
	for (int s = 0; s < 2; s++)
		if ((rc = fsx_nfs_open(s)) < 0)
			fsx_nfs_fail(&f->log, s, "open", rc);
	fsx_run(f, ops);
	for (int s = 0; s < 2; s++)
		if ((rc = nfs_close(fsx_nfs.ctx[s], fsx_nfs.fh[s])) < 0)
			fsx_nfs_fail(&f->log, s, "close", rc);
	nfs_umount(fsx_nfs.ctx[1]);
	nfs_destroy_context(fsx_nfs.ctx[1]);
	if (model_out && (rc = fsx_save_model(f, model_out)) < 0)
		die_local("write", model_out, -rc);
	free(f->model);
	free(f->buf);
	free(f);
	return 0;
}

/* ---------------------------------------------------------------- nsx */

/*
 * nsx DIR OPS SEED: the nsx engine (exerciser.h) in a tree under DIR, through two
 * connections (two libnfs contexts): CREATE, MKDIR, SYMLINK, REMOVE, RMDIR, RENAME,
 * LINK, READDIRPLUS, LOOKUP/GETATTR and READLINK, each sent through either at random.
 * Exit 3 on a mismatch.
 */
static struct nfs_context *nsx_ctx[2];

static int nsx_nfs_create(int s, const char *p)
{
	struct nfsfh *fh;
	int rc = nfs_create(nsx_ctx[s], p, O_EXCL, 0644, &fh);
	return rc < 0 ? rc : nfs_close(nsx_ctx[s], fh);
}

static int nsx_nfs_mkdir(int s, const char *p) { return nfs_mkdir(nsx_ctx[s], p); }
static int nsx_nfs_symlink(int s, const char *t, const char *p) { return nfs_symlink(nsx_ctx[s], t, p); }
static int nsx_nfs_unlink(int s, const char *p) { return nfs_unlink(nsx_ctx[s], p); }
static int nsx_nfs_rmdir(int s, const char *p) { return nfs_rmdir(nsx_ctx[s], p); }
static int nsx_nfs_rename(int s, const char *a, const char *b) { return nfs_rename(nsx_ctx[s], a, b); }
static int nsx_nfs_link(int s, const char *a, const char *b) { return nfs_link(nsx_ctx[s], a, b); }
static int nsx_nfs_chmod(int s, const char *p, unsigned mode) { return nfs_chmod(nsx_ctx[s], p, (int)mode); }

static int nsx_kind_of_type(uint32_t type)
{
	return type == NF3REG ? NSX_FILE : type == NF3DIR ? NSX_DIR : type == NF3LNK ? NSX_LINK : -1;
}

static int nsx_nfs_lstat(int s, const char *p, struct nsx_attr *a)
{
	struct nfs_stat_64 st;
	int rc = nfs_lstat64(nsx_ctx[s], p, &st);
	if (rc < 0)
		return rc;
	a->kind = S_ISREG(st.nfs_mode) ? NSX_FILE : S_ISDIR(st.nfs_mode) ? NSX_DIR
		: S_ISLNK(st.nfs_mode) ? NSX_LINK : -1;
	a->fileid = st.nfs_ino;
	a->nlink = st.nfs_nlink;
	a->mode = st.nfs_mode & 07777;
	return 0;
}

static int nsx_nfs_readlink(int s, const char *p, char *buf, size_t cap)
{
	int rc = nfs_readlink(nsx_ctx[s], p, buf, cap);
	return rc < 0 ? rc : (int)strlen(buf);
}

/* libnfs lists with READDIRPLUS: the attributes come with the names. */
static int nsx_nfs_list(int s, const char *p, void (*each)(void *, const char *, const struct nsx_attr *), void *ctx)
{
	struct nfsdir *dir;
	int rc = nfs_opendir(nsx_ctx[s], p, &dir);
	if (rc < 0)
		return rc;
	struct nfsdirent *e;
	while ((e = nfs_readdir(nsx_ctx[s], dir))) {
		if (!strcmp(e->name, ".") || !strcmp(e->name, ".."))
			continue;
		struct nsx_attr a = { nsx_kind_of_type(e->type), e->inode, e->nlink, e->mode & 07777 };
		each(ctx, e->name, &a);
	}
	nfs_closedir(nsx_ctx[s], dir);
	return 0;
}

static void nsx_nfs_fail(const struct oplog *l, int s, const char *what, const char *path, int rc)
	__attribute__((noreturn));
static void nsx_nfs_fail(const struct oplog *l, int s, const char *what, const char *path, int rc)
{
	oplog_fail_nfs(l, nsx_ctx[s], s, what, path, rc);
}

static const struct nsx_io nsx_nfs_io = {
	.create = nsx_nfs_create, .mkdir = nsx_nfs_mkdir, .symlink = nsx_nfs_symlink,
	.unlink = nsx_nfs_unlink, .rmdir = nsx_nfs_rmdir, .rename = nsx_nfs_rename,
	.link = nsx_nfs_link, .chmod = nsx_nfs_chmod, .lstat = nsx_nfs_lstat, .readlink = nsx_nfs_readlink,
	.list = nsx_nfs_list, .fail = nsx_nfs_fail, .link_follows_symlinks = 1,
};

static int cmd_nsx(char **a)
{
	nsx_ctx[0] = nfs;
	nsx_ctx[1] = mount_export(NULL);
	nsx_run(&nsx_nfs_io, "nsx", abspath(a[0]), parse_long(a[1]), strtoull(a[2], NULL, 0));
	nfs_umount(nsx_ctx[1]);
	nfs_destroy_context(nsx_ctx[1]);
	return 0;
}

struct mount_wait {
	int finished, status;
};

static void mount_done(int status, struct nfs_context *ctx, void *data, void *private_data)
{
	struct mount_wait *w = private_data;
	(void)ctx;
	w->finished = 1;
	w->status = status;
	if (status < 0)
		fprintf(stderr, "nfsh: mount failed: %s\n", data ? (const char *)data : "");
}

/* nfs_mount with its wait written out here: libnfs's own loop replaces the error of a
 * connection that failed with "nfs_service failed", and this one first says on stderr
 * how it failed (the poll events, the socket's error) and when. */
static int mount_sync(struct nfs_context *ctx, const char *server, const char *path)
{
	struct mount_wait w = { 0, 0 };
	double start = now();
	if (nfs_mount_async(ctx, server, path, mount_done, &w) != 0)
		return -EIO;
	while (!w.finished) {
		struct pollfd p = { .fd = nfs_get_fd(ctx), .events = nfs_which_events(ctx) };
		/* Woken at least every 100 ms so that libnfs can time its calls out. */
		if (poll(&p, 1, 100) < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (nfs_service(ctx, p.revents) < 0) {
			fprintf(stderr, "nfsh: mount: the connection failed %.3f s in (poll events %#x): %s\n",
				now() - start, (unsigned)p.revents, errmsg());
			return -EIO;
		}
	}
	return w.status;
}

/* A context with the export of g_url mounted (a TCP connection of its own), set up
 * from the environment.  If the mount fails: with rc, NULL and *rc set; without,
 * exits with the failure reported.  *urlp, if asked for, keeps the parsed URL (for
 * nfs_destroy_url). */
static struct nfs_context *mount_export_or(struct nfs_url **urlp, int *rc)
{
	struct nfs_context *ctx = nfs_init_context();
	if (!ctx) {
		fprintf(stderr, "nfsh: nfs_init_context failed\n");
		exit(1);
	}
	struct nfs_context *saved = nfs;
	nfs = ctx; /* errmsg() reads this context's error */
	const char *e;
	int tmo = (e = getenv("NFSH_TIMEOUT_MS")) ? atoi(e) : 60000;
	nfs_set_timeout(ctx, tmo);
	if ((e = getenv("NFSH_DEBUG")))
		nfs_set_debug(ctx, atoi(e));
	nfs_set_dircache(ctx, (e = getenv("NFSH_DIRCACHE")) && atoi(e));
	if (g_no_autoreconnect)
		nfs_set_autoreconnect(ctx, 0); /* taken up by nfs_mount, not after it */

	/* Parses server/export and applies ?nfsport=&mountport=&version=... */
	struct nfs_url *url = nfs_parse_url_dir(ctx, g_url);
	if (!url) {
		fprintf(stderr, "nfsh: bad URL '%s': %s\n", g_url, errmsg());
		printf("{\"ok\":false,\"op\":\"parse-url\",\"path\":\"\",\"errno\":%d,"
		       "\"error\":", EINVAL);
		json_str(stdout, errmsg());
		printf("}\n");
		exit(1);
	}
	int mrc = mount_sync(ctx, url->server, url->path);
	if (mrc < 0 && !rc)
		die("mount", url->path, mrc); /* reports this context's error */
	if (mrc < 0) {
		/* Closed, not destroyed: see fsx_nfs_renew. */
		*rc = mrc;
		nfs_destroy_url(url);
		close(nfs_get_fd(ctx));
		nfs = saved;
		return NULL;
	}
	nfs = saved ? saved : ctx;
	if (urlp)
		*urlp = url;
	else
		nfs_destroy_url(url);
	return ctx;
}

/* mount_export_or, tried again every 50 ms for as long as a call may wait
 * (NFSH_TIMEOUT_MS): the server may be on its way back up.  NULL, with *rc set, if
 * no attempt succeeded. */
static struct nfs_context *mount_export_until(struct nfs_url **urlp, int *rc)
{
	const char *e = getenv("NFSH_TIMEOUT_MS");
	double give_up = now() + (e ? atoi(e) : 60000) / 1000.0;
	struct nfs_context *ctx;
	while (!(ctx = mount_export_or(urlp, rc)) && now() <= give_up)
		usleep(50 * 1000);
	return ctx;
}

/* Exits if the export cannot be mounted.  Where fsx's connections are broken on
 * purpose (a server killed, a relay that cuts them: NFSH_RETRY_FIRST_MOUNT set), its
 * first mounts are tried again as its later ones are (fsx_nfs_renew); each failed one
 * is a JSON line on stdout and its cause on stderr, for the test to weigh. */
static struct nfs_context *mount_export(struct nfs_url **urlp)
{
	if (!g_no_autoreconnect || !getenv("NFSH_RETRY_FIRST_MOUNT"))
		return mount_export_or(urlp, NULL);
	int rc;
	struct nfs_context *ctx = mount_export_or(urlp, &rc);
	if (!ctx) {
		printf("{\"ok\":false,\"op\":\"first-mount\",\"errno\":%d,\"again\":true}\n", -rc);
		fflush(stdout);
		if (!(ctx = mount_export_until(urlp, &rc)))
			die("mount", g_url, rc);
	}
	return ctx;
}

/* ---------------------------------------------------------------- main */

struct cmd {
	const char *name;
	int nargs; /* minimum */
};

static const struct cmd cmds[] = {
	{ "stat", 1 }, { "lstat", 1 }, { "statvfs", 1 },
	{ "create-loop", 2 }, { "stat-loop", 2 }, { "remove-loop", 2 },
	{ "rename-loop", 2 }, { "put-tree", 2 }, { "copy-tree", 2 },
	{ "remove-tree", 1 },
	{ "readdir", 1 }, { "mkdir-tree", 3 }, { "hold-and-read", 2 },
	{ "write-pattern", 3 }, { "verify-pattern", 3 }, { "cat", 1 },
	{ "durable-writer", 3 }, { "getattr-loop", 2 },
	{ "mkdir", 1 }, { "rmdir", 1 }, { "unlink", 1 }, { "readlink", 1 },
	{ "rename", 2 }, { "link", 2 }, { "symlink", 2 }, { "chmod", 2 },
	{ "truncate", 2 }, { "fsx", 4 }, { "nsx", 3 }, { NULL, 0 },
};

int main(int argc, char **argv)
{
	if (argc < 3)
		usage();
	g_url = argv[1];
	const char *cmd = argv[2];
	char **a = argv + 3;
	int na = argc - 3;
	const struct cmd *c;
	for (c = cmds; c->name; c++)
		if (!strcmp(c->name, cmd))
			break;
	if (!c->name) {
		fprintf(stderr, "nfsh: unknown command '%s'\n", cmd);
		usage();
	}
	if (na < c->nargs)
		usage();

	struct nfs_url *url;
	g_no_autoreconnect = !strcmp(cmd, "fsx");
	nfs = mount_export(&url);
	/* With NFSH_START_ON_EOF set, say so once mounted and begin only when standard
	 * input ends: processes started together then begin their work together, whatever
	 * their mounts took (the bench's parallel clients). */
	if (getenv("NFSH_START_ON_EOF")) {
		printf("{\"ready\":true}\n");
		fflush(stdout);
		char sink[64];
		for (;;) {
			ssize_t got = read(STDIN_FILENO, sink, sizeof sink);
			if (got > 0 || (got < 0 && errno == EINTR))
				continue;
			break;
		}
	}
	int rc;

	if (!strcmp(cmd, "stat"))
		rc = cmd_stat(a, 0);
	else if (!strcmp(cmd, "lstat"))
		rc = cmd_stat(a, 1);
	else if (!strcmp(cmd, "statvfs"))
		rc = cmd_statvfs(a);
	else if (!strcmp(cmd, "create-loop"))
		rc = cmd_create_loop(a);
	else if (!strcmp(cmd, "stat-loop"))
		rc = cmd_stat_loop(a);
	else if (!strcmp(cmd, "remove-loop"))
		rc = cmd_remove_loop(a, na);
	else if (!strcmp(cmd, "rename-loop"))
		rc = cmd_rename_loop(a, na);
	else if (!strcmp(cmd, "put-tree"))
		rc = cmd_put_tree(a);
	else if (!strcmp(cmd, "copy-tree"))
		rc = cmd_copy_tree(a);
	else if (!strcmp(cmd, "remove-tree"))
		rc = cmd_remove_tree(a);
	else if (!strcmp(cmd, "readdir"))
		rc = cmd_readdir(a, na);
	else if (!strcmp(cmd, "mkdir-tree"))
		rc = cmd_mkdir_tree(a);
	else if (!strcmp(cmd, "hold-and-read"))
		rc = cmd_hold_and_read(a);
	else if (!strcmp(cmd, "write-pattern"))
		rc = cmd_write_pattern(a);
	else if (!strcmp(cmd, "verify-pattern"))
		rc = cmd_verify_pattern(a);
	else if (!strcmp(cmd, "getattr-loop"))
		rc = cmd_getattr_loop(a);
	else if (!strcmp(cmd, "durable-writer"))
		rc = cmd_durable_writer(a);
	else if (!strcmp(cmd, "nsx"))
		rc = cmd_nsx(a);
	else if (!strcmp(cmd, "fsx"))
		rc = cmd_fsx(a, na);
	else if (!strcmp(cmd, "cat"))
		rc = cmd_cat(a);
	else
		rc = cmd_simple(cmd, a, na);

	fflush(stdout);
	/* nfs_umount: tell the MOUNT daemon (v3) we are gone; ignore errors. */
	nfs_umount(nfs);
	nfs_destroy_url(url);
	nfs_destroy_context(nfs);
	return rc;
}
