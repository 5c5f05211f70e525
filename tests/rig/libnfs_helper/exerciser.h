/*
 * exerciser.h - the parts of the test rig's C clients that do not depend on how
 * they reach the server: JSON strings, the deterministic content pattern, the log
 * of the last operations, the fsx engine (random I/O on one file checked against an
 * in-memory model) and the nsx engine (random namespace changes checked against a
 * model of a tree).  Included by nfsh.c (libnfs: two connections to the server) and
 * by fsx-guest.c (system calls on kernel NFS mounts inside the test VM), each of
 * which supplies two sides as a `struct fsx_io` and a `struct nsx_io`.
 */
#ifndef NASD_EXERCISER_H
#define NASD_EXERCISER_H

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;
		switch (c) {
		case '"': fputs("\\\"", f); break;
		case '\\': fputs("\\\\", f); break;
		case '\n': fputs("\\n", f); break;
		case '\r': fputs("\\r", f); break;
		case '\t': fputs("\\t", f); break;
		default:
			if (c < 0x20 || c == 0x7f)
				fprintf(f, "\\u%04x", c);
			else
				fputc(c, f);
		}
	}
	fputc('"', f);
}

/* ------------------------------------------------------------- pattern */

/* Content byte at offset `off` depends only on (seed, off): any range of the
 * file can be verified independently.  Each aligned 8-byte word w at offset
 * 8*k holds splitmix64(seed ^ k) little-endian.  tests/rig/nfsh.py has the
 * same function in Python (pattern_bytes). */
static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static void pattern_fill(uint8_t *buf, uint64_t off, size_t len, uint64_t seed)
{
	for (size_t i = 0; i < len;) {
		uint64_t pos = off + i;
		uint64_t w = splitmix64(seed ^ (pos >> 3));
		unsigned b = pos & 7;
		for (; b < 8 && i < len; b++, i++)
			buf[i] = (uint8_t)(w >> (8 * b));
	}
}

/* --------------------------------------------------------------- oplog */

#define OPLOG_LINES 48

/* The last operations of an exerciser, shown when a check fails. */
struct oplog {
	const char *cmd;
	long op;
	char line[OPLOG_LINES][160];
};

static void note(struct oplog *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(struct oplog *l, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->line[l->op % OPLOG_LINES], sizeof(l->line[0]), fmt, ap);
	va_end(ap);
}

static void dump_oplog(const struct oplog *l)
{
	long first = l->op >= OPLOG_LINES ? l->op - OPLOG_LINES + 1 : 0;
	fprintf(stderr, "%s: the last operations:\n", l->cmd);
	for (long i = first; i <= l->op; i++)
		fprintf(stderr, "  %6ld %s\n", i, l->line[i % OPLOG_LINES]);
}

/* What the file or server answered differs from the model's: exit 3. */
static void mismatch(const struct oplog *l, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void mismatch(const struct oplog *l, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	dump_oplog(l);
	fprintf(stderr, "%s op %ld: %s\n", l->cmd, l->op, msg);
	printf("{\"ok\":false,\"op\":\"%s\",\"at\":%ld,\"error\":", l->cmd, l->op);
	json_str(stdout, msg);
	printf("}\n");
	fflush(stdout);
	exit(3);
}

/* ----------------------------------------------------------------- fsx */

/*
 * The fsx engine: OPS random operations on one file through two handles, each
 * checked against an in-memory model of what the file must hold: writes (small,
 * page-aligned, appending, and multi-MiB ones), reads at and past the end,
 * truncations up and down, syncs, size checks, reopenings, and the caller's own
 * kind (`special`, if any).  Beyond the file's size the model is kept zero, so
 * growing by truncation or by a write past the end must read back as zeroes.  Offsets
 * in the model and the log are the file's less `base` (0 unless shared).
 */
#define FSX_BIG (3u << 20)

struct fsx;

/* One file, two handles (side 0 and 1).  Each returns bytes done (I/O) or 0, or a
 * negative errno. */
struct fsx_io {
	int (*pwrite)(int side, uint64_t off, size_t len, const uint8_t *buf);
	int (*pread)(int side, uint64_t off, size_t len, uint8_t *buf);
	int (*truncate)(int side, uint64_t size);
	int (*sync)(int side);
	int (*size)(int side, uint64_t *size);
	int (*reopen)(int side);
	/* A failed call: report it and exit. */
	void (*fail)(const struct oplog *l, int side, const char *what, int rc) __attribute__((noreturn));
	/* Optional: one operation of the caller's own, given two random words. */
	void (*special)(struct fsx *f, int side, uint64_t r, uint64_t r2);
	const char *special_name;
};

struct fsx {
	const struct fsx_io *io;
	uint8_t *model, *buf;
	uint64_t size, maxlen, seed;
	/* Shared: other writers own the rest of the file, this one the bytes from `base`
	 * for maxlen + FSX_BIG; it neither truncates nor appends, `size` is the end of what
	 * it wrote, and the file may end anywhere beyond that. */
	int shared;
	uint64_t base;
	struct oplog log;
	long counts[9];
	double secs[9];
	/* Calls the backend sent again on a new connection after theirs was lost. */
	long retries;
};

/* Reads [off, off+len) through side s; the first byte that differs from the model,
 * or -1 (short reads at the end of the file included: `got` says how many came). */
static int64_t fsx_read_diff(struct fsx *f, int s, uint64_t off, size_t len, size_t *got)
{
	*got = 0;
	while (*got < len) {
		int rc = f->io->pread(s, f->base + off + *got, len - *got, f->buf + *got);
		if (rc < 0)
			f->io->fail(&f->log, s, "pread", rc);
		if (rc == 0)
			break;
		*got += rc;
	}
	for (size_t i = 0; i < *got; i++)
		if (f->buf[i] != f->model[off + i])
			return (int64_t)i;
	return -1;
}

/* Reads [off, off+len) through side s and checks it against the model, short
 * reads at the end of the file included. */
static void fsx_check_read(struct fsx *f, int s, uint64_t off, size_t len)
{
	size_t want = off >= f->size ? 0 : (f->size - off < len ? (size_t)(f->size - off) : len);
	size_t got;
	int64_t bad = fsx_read_diff(f, s, off, len, &got);
	/* Shared, the file may go on past what this writer wrote: holes, read as zeros. */
	if (f->shared ? got < want : got != want)
		mismatch(&f->log, "read of %zu at %" PRIu64 " through handle %d returned %zu bytes, "
			 "the file holds %s%zu there", len, f->base + off, s, got, f->shared ? "at least " : "", want);
	if (bad >= 0)
		mismatch(&f->log, "read of %zu at %" PRIu64 " through handle %d: byte at %" PRIu64
			 " is 0x%02x, expected 0x%02x", len, f->base + off, s, f->base + off + bad, f->buf[bad],
			 f->model[off + bad]);
}

/* New bytes for [off, off+len) in the model, unlike whatever an earlier write left
 * there; the caller writes them to the file. */
static uint8_t *fsx_new_bytes(struct fsx *f, uint64_t off, size_t len)
{
	pattern_fill(f->model + off, off, len, f->seed ^ ((uint64_t)f->log.op << 24));
	if (off + len > f->size)
		f->size = off + len;
	return f->model + off;
}

static void fsx_write(struct fsx *f, int s, uint64_t off, size_t len)
{
	const uint8_t *data = fsx_new_bytes(f, off, len);
	for (size_t done = 0; done < len;) {
		int rc = f->io->pwrite(s, f->base + off + done, len - done, data + done);
		if (rc < 0)
			f->io->fail(&f->log, s, "pwrite", rc);
		if (rc == 0)
			f->io->fail(&f->log, s, "pwrite(short)", -EIO);
		done += rc;
	}
}

static void fsx_model_truncate(struct fsx *f, uint64_t to)
{
	if (to < f->size)
		memset(f->model + to, 0, f->size - to);
	f->size = to;
}

static void fsx_check_size(struct fsx *f, int s)
{
	uint64_t size;
	int rc = f->io->size(s, &size);
	if (rc < 0)
		f->io->fail(&f->log, s, "fstat", rc);
	if (f->shared ? f->size > 0 && size < f->base + f->size : size != f->size)
		mismatch(&f->log, "size is %" PRIu64 " through handle %d, expected %s%" PRIu64, size, s,
			 f->shared ? "at least " : "", f->base + f->size);
}

/* Runs `ops` operations, then syncs both handles, checks the size through both and
 * reads the whole file back.  Prints the summary line; the model stays in f. */
static void fsx_run(struct fsx *f, long ops)
{
	enum { W, R, T, C, S, O, A, BIG, SPECIAL };
	static const char *names[] = { "write", "read", "truncate", "commit", "stat", "reopen",
				       "append", "big_write", "special" };
	const uint64_t cap = f->maxlen + FSX_BIG;
	uint64_t rng = splitmix64(f->seed ^ 0x6673785f73656564ull); /* seeds give unrelated runs */
	double t0 = now();
	int rc;
	for (f->log.op = 0; f->log.op < ops; f->log.op++) {
		uint64_t r = splitmix64(rng++), r2 = splitmix64(rng++);
		int s = r & 1;
		unsigned pick = (r >> 1) % 100;
		uint64_t off = r2 % f->maxlen;
		size_t len;
		int kind = pick < 28 ? W : pick < 56 ? R : pick < 64 ? T : pick < 69 ? C
			 : pick < 79 ? S : pick < 83 ? O : pick < 91 ? A : pick < 96 ? BIG : SPECIAL;
		if ((kind == SPECIAL && !f->io->special) || (f->shared && (kind == T || kind == A)))
			kind = W;
		f->counts[kind]++;
		double op_t0 = now();
		switch (kind) {
		case W:
			if ((r >> 8) & 1) { /* page-aligned, 4k..64k */
				off &= ~4095ull;
				len = 4096 * (1 + (r >> 9) % 16);
			} else {
				len = 1 + (r >> 9) % 65536;
			}
			note(&f->log, "write    h%d %8" PRIu64 " +%-7zu (size %" PRIu64 ")", s, off, len, f->size);
			fsx_write(f, s, off, len);
			break;
		case A:
			len = 1 + (r >> 9) % 20000;
			off = f->size;
			if (off + len > cap)
				len = cap - off;
			if (len == 0)
				break;
			note(&f->log, "append   h%d %8" PRIu64 " +%-7zu (size %" PRIu64 ")", s, off, len, f->size);
			fsx_write(f, s, off, len);
			break;
		case BIG: /* spans several WRITE calls of the negotiated size */
			len = (1u << 20) + (r >> 9) % (2u << 20);
			note(&f->log, "bigwrite h%d %8" PRIu64 " +%-7zu (size %" PRIu64 ")", s, off, len, f->size);
			fsx_write(f, s, off, len);
			break;
		case R:
			len = (r >> 8) & 1 ? 1 + (r >> 9) % 65536 : 1 + (r >> 9) % (2u << 20);
			if ((r >> 30) % 4 == 0 && f->size > 0) /* often right at the end */
				off = f->size - 1 - (r2 >> 20) % (f->size < 8192 ? f->size : 8192);
			if (off + len > cap)
				len = cap - off;
			note(&f->log, "read     h%d %8" PRIu64 " +%-7zu (size %" PRIu64 ")", s, off, len, f->size);
			fsx_check_read(f, s, off, len);
			break;
		case T: {
			uint64_t to = (r >> 8) % 4 == 0 ? r2 % 8192 : r2 % f->maxlen;
			note(&f->log, "truncate h%d %8" PRIu64 "          (size %" PRIu64 ")", s, to, f->size);
			if ((rc = f->io->truncate(s, to)) < 0)
				f->io->fail(&f->log, s, "truncate", rc);
			fsx_model_truncate(f, to);
			break;
		}
		case C:
			note(&f->log, "sync     h%d                   (size %" PRIu64 ")", s, f->size);
			if ((rc = f->io->sync(s)) < 0)
				f->io->fail(&f->log, s, "sync", rc);
			break;
		case S:
			note(&f->log, "stat     h%d                   (size %" PRIu64 ")", s, f->size);
			fsx_check_size(f, s);
			break;
		case O:
			note(&f->log, "reopen   h%d                   (size %" PRIu64 ")", s, f->size);
			if ((rc = f->io->reopen(s)) < 0)
				f->io->fail(&f->log, s, "reopen", rc);
			break;
		case SPECIAL:
			f->io->special(f, s, r, r2);
			break;
		}
		f->secs[kind] += now() - op_t0;
	}
	note(&f->log, "final read of the whole file (size %" PRIu64 ")", f->size);
	for (int s = 0; s < 2; s++) {
		if ((rc = f->io->sync(s)) < 0)
			f->io->fail(&f->log, s, "sync", rc);
		fsx_check_size(f, s);
	}
	fsx_check_read(f, 1, 0, f->size + 4096 < cap ? f->size + 4096 : cap);
	double secs = now() - t0;
	printf("{\"ok\":true,\"op\":\"%s\",\"ops\":%ld,\"size\":%" PRIu64, f->log.cmd, ops, f->size);
	for (int k = 0; k <= SPECIAL; k++) {
		const char *name = k == SPECIAL && f->io->special_name ? f->io->special_name : names[k];
		printf(",\"%s\":%ld,\"%s_seconds\":%.6f", name, f->counts[k], name, f->secs[k]);
	}
	printf(",\"retries\":%ld,\"seconds\":%.6f}\n", f->retries, secs);
	fflush(stdout);
}

/* A model of a file of up to maxlen bytes (plus room for one big write past it). */
static struct fsx *fsx_new(const char *cmd, const struct fsx_io *io, uint64_t seed, uint64_t maxlen)
{
	struct fsx *f = calloc(1, sizeof(*f));
	f->log.cmd = cmd;
	f->io = io;
	f->seed = seed;
	f->maxlen = maxlen;
	f->model = calloc(maxlen + FSX_BIG, 1);
	f->buf = malloc(maxlen + FSX_BIG);
	if (!f->model || !f->buf) {
		fprintf(stderr, "%s: out of memory\n", cmd);
		exit(2);
	}
	return f;
}

/* Writes the model (the file's expected content) to a local file. */
static int fsx_save_model(const struct fsx *f, const char *path)
{
	FILE *m = fopen(path, "wb");
	if (!m)
		return -errno;
	if (fwrite(f->model, 1, f->size, m) != f->size) {
		fclose(m);
		return -EIO;
	}
	return fclose(m) ? -errno : 0;
}

/* ----------------------------------------------------------------- nsx */

/*
 * The nsx engine: random creates, mkdirs, symlinks, unlinks, rmdirs, renames and
 * links in a small tree (a few directories, a pool of names per directory, so names
 * collide and renames replace) and chmods, with listings, lookups and readlinks, each through
 * one of two sides (`struct nsx_io`) at random and each checked against a model of
 * the tree: success or the POSIX error (EEXIST, ENOENT, ENOTEMPTY, EISDIR, ENOTDIR,
 * EINVAL for a directory moved into itself), names listed exactly once, types, link
 * counts, permissions, and one file id per object whatever name or side it is
 * reached by.
 * nsx_run prints the final tree (one JSON line per entry) and a summary line.
 */
#define NSX_NAMES 24
#define NSX_DIRS 16
#define NSX_INODES 1024

enum { NSX_FREE, NSX_FILE, NSX_DIR, NSX_LINK };

struct nsx_ino {
	int kind, nlink;
	int parent, name;        /* directories: where they are */
	int ents[NSX_NAMES];     /* directories: inode per name, -1 for none */
	uint64_t fileid;         /* 0 until the server told it */
	unsigned mode;           /* permission bits, but of symlinks */
	char target[32];         /* symlinks */
};

/* What a side says about an object. */
struct nsx_attr {
	int kind; /* NSX_FILE, NSX_DIR, NSX_LINK, or -1 for anything else */
	uint64_t fileid;
	uint32_t nlink;
	unsigned mode; /* permission bits */
};

/* The tree's two sides; paths are absolute for the side.  Each returns 0 or a
 * negative errno (readlink: the target's length). */
struct nsx_io {
	int (*create)(int side, const char *path); /* exclusive */
	int (*mkdir)(int side, const char *path);
	int (*symlink)(int side, const char *target, const char *path);
	int (*unlink)(int side, const char *path);
	int (*rmdir)(int side, const char *path);
	int (*rename)(int side, const char *from, const char *to);
	int (*link)(int side, const char *from, const char *to);
	int (*chmod)(int side, const char *path, unsigned mode);
	int (*lstat)(int side, const char *path, struct nsx_attr *a);
	int (*readlink)(int side, const char *path, char *buf, size_t cap);
	/* Every entry but . and .., with its attributes, to `each`. */
	int (*list)(int side, const char *path, void (*each)(void *ctx, const char *name, const struct nsx_attr *a),
		    void *ctx);
	/* A failed call that the model says must succeed: report it and exit. */
	void (*fail)(const struct oplog *l, int side, const char *what, const char *path, int rc)
		__attribute__((noreturn));
	/* link() of a symlink follows it (libnfs resolves the whole path): not tried. */
	int link_follows_symlinks;
};

struct nsx {
	const struct nsx_io *io;
	const char *base;
	struct nsx_ino ino[NSX_INODES];
	int dirs;
	struct oplog log;
};

/* Set while paths are made for the operation log: "n05~" for a padded name. */
static int nsx_short_names;

/* Names of a few lengths, up to 200 bytes, so a listing spans several replies. */
static void nsx_name(int n, char *out, size_t cap)
{
	if (nsx_short_names) {
		snprintf(out, cap, "n%02d%s", n, (n * 37) % 5 < 2 ? "~" : "");
		return;
	}
	int pad = (n * 37) % 5 == 0 ? 180 : (n * 37) % 5 == 1 ? 40 : 0;
	snprintf(out, cap, "n%02d%.*s", n, pad,
		 "________________________________________________________________________"
		 "________________________________________________________________________"
		 "____________________________________");
}

/* out = a/b; the tree is shallow enough that it always fits. */
static void nsx_join(char *out, size_t cap, const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la + 1 + lb + 1 > cap) {
		fprintf(stderr, "nsx: path too long\n");
		exit(2);
	}
	memmove(out, a, la);
	out[la] = '/';
	memcpy(out + la + 1, b, lb + 1);
}

static void nsx_dir_path(const struct nsx *x, int d, char *out, size_t cap)
{
	if (d == 0) {
		snprintf(out, cap, "%s", x->base);
		return;
	}
	char parent[4096], name[256];
	nsx_dir_path(x, x->ino[d].parent, parent, sizeof(parent));
	nsx_name(x->ino[d].name, name, sizeof(name));
	nsx_join(out, cap, parent, name);
}

static void nsx_path(const struct nsx *x, int d, int n, char *out, size_t cap)
{
	char dir[4096], name[256];
	nsx_dir_path(x, d, dir, sizeof(dir));
	nsx_name(n, name, sizeof(name));
	nsx_join(out, cap, dir, name);
}

static int nsx_alloc(struct nsx *x, int kind)
{
	for (int i = 1; i < NSX_INODES; i++)
		if (x->ino[i].kind == NSX_FREE) {
			memset(&x->ino[i], 0, sizeof(x->ino[i]));
			x->ino[i].kind = kind;
			x->ino[i].nlink = kind == NSX_DIR ? 2 : 1;
			x->ino[i].mode = kind == NSX_DIR ? 0755 : 0644;
			for (int k = 0; k < NSX_NAMES; k++)
				x->ino[i].ents[k] = -1;
			return i;
		}
	return -1;
}

static int nsx_entries(const struct nsx *x, int d)
{
	int n = 0;
	for (int k = 0; k < NSX_NAMES; k++)
		n += x->ino[d].ents[k] >= 0;
	return n;
}

/* Whether directory a is d or below it. */
static int nsx_within(const struct nsx *x, int a, int d)
{
	for (; a != 0; a = x->ino[a].parent)
		if (a == d)
			return 1;
	return d == 0;
}

/* Drops the entry (d, n); the object goes when its last name does. */
static void nsx_unname(struct nsx *x, int d, int n)
{
	int i = x->ino[d].ents[n];
	x->ino[d].ents[n] = -1;
	if (x->ino[i].kind == NSX_DIR) {
		x->ino[d].nlink--;
		x->ino[i].kind = NSX_FREE;
		x->dirs--;
		return;
	}
	if (--x->ino[i].nlink == 0)
		x->ino[i].kind = NSX_FREE;
}

static void nsx_name_it(struct nsx *x, int d, int n, int i)
{
	x->ino[d].ents[n] = i;
	if (x->ino[i].kind == NSX_DIR) {
		x->ino[i].parent = d;
		x->ino[i].name = n;
		x->ino[d].nlink++;
	}
}

/* Checks a call's result: 0 where `errs` is NULL, else one of the errnos it lists. */
static void nsx_expect(struct nsx *x, int s, const char *what, const char *path, int rc, const int *errs)
{
	if (!errs) {
		if (rc < 0)
			x->io->fail(&x->log, s, what, path, rc);
		return;
	}
	for (const int *e = errs; *e; e++)
		if (rc == -*e)
			return;
	mismatch(&x->log, "%s %s through side %d: got %s, expected the error %s", what, path, s,
		 rc < 0 ? strerror(-rc) : "success", strerror(errs[0]));
}

static const char *nsx_kind_name(int k)
{
	return k == NSX_FILE ? "file" : k == NSX_DIR ? "dir" : k == NSX_LINK ? "symlink" : "none";
}

/* What a side says about object i, against the model. */
static void nsx_check_attrs(struct nsx *x, int i, const char *path, const struct nsx_attr *a)
{
	if (a->kind != x->ino[i].kind)
		mismatch(&x->log, "%s is a %s, expected a %s", path, a->kind < 0 ? "strange type" :
			 nsx_kind_name(a->kind), nsx_kind_name(x->ino[i].kind));
	if (x->ino[i].fileid == 0)
		x->ino[i].fileid = a->fileid;
	else if (x->ino[i].fileid != a->fileid)
		mismatch(&x->log, "%s has file id %" PRIu64 ", the same object had %" PRIu64, path, a->fileid,
			 x->ino[i].fileid);
	if ((int)a->nlink != x->ino[i].nlink)
		mismatch(&x->log, "%s has %u links, expected %d", path, a->nlink, x->ino[i].nlink);
	if (a->kind != NSX_LINK && a->mode != x->ino[i].mode)
		mismatch(&x->log, "%s has mode %04o, expected %04o", path, a->mode, x->ino[i].mode);
}

struct nsx_listing {
	struct nsx *x;
	int side, dir, seen[NSX_NAMES];
	const char *label;
};

static void nsx_listed(void *ctx, const char *entry, const struct nsx_attr *a)
{
	struct nsx_listing *l = ctx;
	struct nsx *x = l->x;
	char name[256];
	int n = -1;
	for (int k = 0; k < NSX_NAMES && n < 0; k++) {
		nsx_name(k, name, sizeof(name));
		if (!strcmp(name, entry))
			n = k;
	}
	if (n < 0 || x->ino[l->dir].ents[n] < 0)
		mismatch(&x->log, "listing of %s through side %d has %s, which is not there", l->label,
			 l->side, entry);
	nsx_short_names = 1;
	nsx_name(n, name, sizeof(name));
	nsx_short_names = 0;
	if (l->seen[n]++)
		mismatch(&x->log, "listing of %s through side %d has %s twice", l->label, l->side, name);
	char child[1024];
	nsx_join(child, sizeof(child), l->label, name);
	nsx_check_attrs(x, x->ino[l->dir].ents[n], child, a);
}

static void nsx_list(struct nsx *x, int s, int d)
{
	char path[4096], name[256], label[512];
	nsx_short_names = 1;
	nsx_dir_path(x, d, label, sizeof(label));
	nsx_short_names = 0;
	nsx_dir_path(x, d, path, sizeof(path));
	struct nsx_listing l = { .x = x, .side = s, .dir = d, .label = label };
	int rc = x->io->list(s, path, nsx_listed, &l);
	nsx_expect(x, s, "list", label, rc, NULL);
	for (int k = 0; k < NSX_NAMES; k++)
		if (x->ino[d].ents[k] >= 0 && !l.seen[k]) {
			nsx_short_names = 1;
			nsx_name(k, name, sizeof(name));
			nsx_short_names = 0;
			mismatch(&x->log, "listing of %s through side %d lacks %s", label, s, name);
		}
}

static void nsx_print_tree(const struct nsx *x, int d, const char *rel)
{
	char name[256], path[4096];
	for (int k = 0; k < NSX_NAMES; k++) {
		int i = x->ino[d].ents[k];
		if (i < 0)
			continue;
		nsx_name(k, name, sizeof(name));
		snprintf(path, sizeof(path), "%s%s%s", rel, *rel ? "/" : "", name);
		printf("{\"entry\":");
		json_str(stdout, path);
		printf(",\"kind\":\"%s\",\"nlink\":%d,\"fileid\":%" PRIu64 ",\"mode\":%u",
		       nsx_kind_name(x->ino[i].kind), x->ino[i].nlink, x->ino[i].fileid, x->ino[i].mode);
		if (x->ino[i].kind == NSX_LINK) {
			printf(",\"target\":");
			json_str(stdout, x->ino[i].target);
		}
		printf("}\n");
		if (x->ino[i].kind == NSX_DIR)
			nsx_print_tree(x, i, path);
	}
}

/* Makes `base` through side 0, then runs `ops` operations in a tree under it. */
static void nsx_run(const struct nsx_io *io, const char *cmd, const char *base, long ops, uint64_t seed)
{
	static const int eexist[] = { EEXIST, 0 }, enoent[] = { ENOENT, 0 },
		enotempty[] = { ENOTEMPTY, EEXIST, 0 }, enotdir[] = { ENOTDIR, 0 },
		eisdir[] = { EISDIR, EPERM, EACCES, 0 }, einval[] = { EINVAL, 0 },
		eisdir_link[] = { EPERM, EISDIR, EACCES, EINVAL, 0 },
		/* knfsd and nasd look at the source first, the Linux VFS at the new name */
		eisdir_link_over[] = { EPERM, EISDIR, EACCES, EINVAL, EEXIST, 0 }, eisdir_rename[] = { EISDIR, 0 },
		enotdir_rmdir[] = { ENOTDIR, 0 };
	struct nsx *x = calloc(1, sizeof(*x));
	x->io = io;
	x->log.cmd = cmd;
	x->base = base;
	int rc = io->mkdir(0, base);
	if (rc < 0)
		io->fail(&x->log, 0, "mkdir", base, rc);
	x->ino[0].kind = NSX_DIR;
	x->ino[0].nlink = 2;
	for (int k = 0; k < NSX_NAMES; k++)
		x->ino[0].ents[k] = -1;
	x->dirs = 1;

	enum { CREATE, MKDIR, SYMLINK, UNLINK, RMDIR, RENAME, LINK, LIST, STAT, CHMOD, KINDS };
	static const char *names[] = { "create", "mkdir", "symlink", "unlink", "rmdir", "rename",
				       "link", "list", "stat", "chmod" };
	long counts[KINDS] = { 0 }, failures[KINDS] = { 0 };
	uint64_t rng = splitmix64(seed ^ 0x6e73785f73656564ull);
	char p1[4096], p2[4096], s1[512], s2[512], sd[512];
	double t0 = now();
	for (x->log.op = 0; x->log.op < ops; x->log.op++) {
		uint64_t r = splitmix64(rng++), r2 = splitmix64(rng++);
		int s = r & 1;
		unsigned pick = (r >> 1) % 100;
		int kind = pick < 18 ? CREATE : pick < 24 ? MKDIR : pick < 29 ? SYMLINK : pick < 40 ? UNLINK
			 : pick < 45 ? RMDIR : pick < 63 ? RENAME : pick < 70 ? LINK : pick < 85 ? LIST
			 : pick < 95 ? STAT : CHMOD;
		/* Directories to act in, and names in them. */
		int live[NSX_INODES], nlive = 0;
		for (int i = 0; i < NSX_INODES; i++)
			if (x->ino[i].kind == NSX_DIR)
				live[nlive++] = i;
		int d1 = live[(r >> 8) % nlive], d2 = live[(r2 >> 8) % nlive];
		int n1 = (r >> 16) % NSX_NAMES, n2 = (r2 >> 16) % NSX_NAMES;
		/* Half of the removals aim at something they can remove (an empty directory
		 * anywhere, a non-directory in d1), or nearly all would fail. */
		if ((kind == RMDIR || kind == UNLINK) && (r >> 24) & 1) {
			int want_dir = kind == RMDIR, found = 0;
			for (int k = 0; k < nlive && !found; k++) {
				int c = live[(k + (r2 >> 24)) % nlive];
				if (want_dir) {
					if (c != 0 && nsx_entries(x, c) == 0) {
						d1 = x->ino[c].parent, n1 = x->ino[c].name;
						found = 1;
					}
					continue;
				}
				if (c != d1)
					continue;
				for (int j = 0; j < NSX_NAMES && !found; j++) {
					int e = x->ino[c].ents[(j + n1) % NSX_NAMES];
					if (e >= 0 && x->ino[e].kind != NSX_DIR)
						n1 = (j + n1) % NSX_NAMES, found = 1;
				}
			}
		}
		int i1 = x->ino[d1].ents[n1], i2 = x->ino[d2].ents[n2];
		nsx_short_names = 1;
		nsx_path(x, d1, n1, s1, sizeof(s1));
		nsx_path(x, d2, n2, s2, sizeof(s2));
		nsx_dir_path(x, d1, sd, sizeof(sd));
		nsx_short_names = 0;
		nsx_path(x, d1, n1, p1, sizeof(p1));
		nsx_path(x, d2, n2, p2, sizeof(p2));
		counts[kind]++;
		const int *errs = NULL;
		switch (kind) {
		case CREATE: {
			note(&x->log, "c%d create  %s", s, s1);
			errs = i1 >= 0 ? eexist : NULL;
			rc = io->create(s, p1);
			nsx_expect(x, s, "create", s1, rc, errs);
			if (rc == 0)
				nsx_name_it(x, d1, n1, nsx_alloc(x, NSX_FILE));
			break;
		}
		case MKDIR:
			if (i1 < 0 && x->dirs >= NSX_DIRS) {
				counts[kind]--;
				continue;
			}
			note(&x->log, "c%d mkdir   %s", s, s1);
			errs = i1 >= 0 ? eexist : NULL;
			rc = io->mkdir(s, p1);
			nsx_expect(x, s, "mkdir", s1, rc, errs);
			if (rc == 0) {
				nsx_name_it(x, d1, n1, nsx_alloc(x, NSX_DIR));
				x->dirs++;
			}
			break;
		case SYMLINK: {
			char target[32];
			snprintf(target, sizeof(target), "t%ld", x->log.op);
			note(&x->log, "c%d symlink %s -> %s", s, s1, target);
			errs = i1 >= 0 ? eexist : NULL;
			rc = io->symlink(s, target, p1);
			nsx_expect(x, s, "symlink", s1, rc, errs);
			if (rc == 0) {
				int i = nsx_alloc(x, NSX_LINK);
				snprintf(x->ino[i].target, sizeof(x->ino[i].target), "%s", target);
				nsx_name_it(x, d1, n1, i);
			}
			break;
		}
		case UNLINK:
			note(&x->log, "c%d unlink  %s", s, s1);
			errs = i1 < 0 ? enoent : x->ino[i1].kind == NSX_DIR ? eisdir : NULL;
			rc = io->unlink(s, p1);
			nsx_expect(x, s, "unlink", s1, rc, errs);
			if (rc == 0)
				nsx_unname(x, d1, n1);
			break;
		case RMDIR:
			note(&x->log, "c%d rmdir   %s", s, s1);
			errs = i1 < 0 ? enoent : x->ino[i1].kind != NSX_DIR ? enotdir_rmdir
			     : nsx_entries(x, i1) ? enotempty : NULL;
			rc = io->rmdir(s, p1);
			nsx_expect(x, s, "rmdir", s1, rc, errs);
			if (rc == 0)
				nsx_unname(x, d1, n1);
			break;
		case RENAME:
			note(&x->log, "c%d rename  %s -> %s (%s over %s)", s, s1, s2,
			     nsx_kind_name(i1 < 0 ? NSX_FREE : x->ino[i1].kind), nsx_kind_name(i2 < 0 ? NSX_FREE : x->ino[i2].kind));
			if (i1 < 0)
				errs = enoent;
			else if (i1 == i2)
				errs = NULL; /* the same object under both names: nothing to do */
			else if (x->ino[i1].kind == NSX_DIR && nsx_within(x, d2, i1))
				errs = einval;
			else if (i2 >= 0 && x->ino[i2].kind == NSX_DIR && nsx_within(x, d1, i2))
				errs = enotempty; /* onto a directory above it: Linux's answer */
			else if (i2 >= 0 && x->ino[i1].kind == NSX_DIR && x->ino[i2].kind != NSX_DIR)
				errs = enotdir;
			else if (i2 >= 0 && x->ino[i1].kind != NSX_DIR && x->ino[i2].kind == NSX_DIR)
				errs = eisdir_rename;
			else if (i2 >= 0 && x->ino[i2].kind == NSX_DIR && nsx_entries(x, i2))
				errs = enotempty;
			rc = io->rename(s, p1, p2);
			nsx_expect(x, s, "rename", s1, rc, errs);
			if (rc == 0 && i1 != i2) {
				if (i2 >= 0)
					nsx_unname(x, d2, n2);
				x->ino[d1].ents[n1] = -1;
				if (x->ino[i1].kind == NSX_DIR)
					x->ino[d1].nlink--;
				nsx_name_it(x, d2, n2, i1);
			}
			break;
		case LINK:
			if (i1 >= 0 && x->ino[i1].kind == NSX_LINK && io->link_follows_symlinks) {
				counts[kind]--;
				continue;
			}
			note(&x->log, "c%d link    %s -> %s", s, s1, s2);
			errs = i1 < 0 ? enoent : x->ino[i1].kind == NSX_DIR ? (i2 >= 0 ? eisdir_link_over : eisdir_link)
			     : i2 >= 0 ? eexist : NULL;
			rc = io->link(s, p1, p2);
			nsx_expect(x, s, "link", s1, rc, errs);
			if (rc == 0) {
				x->ino[i1].nlink++;
				nsx_name_it(x, d2, n2, i1);
			}
			break;
		case LIST:
			note(&x->log, "c%d list    %s/", s, sd);
			nsx_list(x, s, d1);
			break;
		case CHMOD: {
			/* Not of symlinks: chmod follows them, to targets that do not exist. */
			if (i1 >= 0 && x->ino[i1].kind == NSX_LINK) {
				counts[kind]--;
				continue;
			}
			static const unsigned file_modes[] = { 0644, 0600, 0640, 0444, 0755 },
				dir_modes[] = { 0755, 0700, 0775, 0750, 0711 };
			unsigned mode = i1 >= 0 && x->ino[i1].kind == NSX_DIR ? dir_modes[(r2 >> 32) % 5]
				      : file_modes[(r2 >> 32) % 5];
			note(&x->log, "c%d chmod   %s %04o", s, s1, mode);
			errs = i1 < 0 ? enoent : NULL;
			rc = io->chmod(s, p1, mode);
			nsx_expect(x, s, "chmod", s1, rc, errs);
			if (rc == 0)
				x->ino[i1].mode = mode;
			break;
		}
		case STAT: {
			note(&x->log, "c%d stat    %s", s, s1);
			struct nsx_attr attr;
			errs = i1 < 0 ? enoent : NULL;
			rc = io->lstat(s, p1, &attr);
			nsx_expect(x, s, "lstat", s1, rc, errs);
			if (rc == 0)
				nsx_check_attrs(x, i1, s1, &attr);
			if (rc == 0 && x->ino[i1].kind == NSX_LINK) {
				char buf[64] = { 0 };
				rc = io->readlink(s, p1, buf, sizeof(buf) - 1);
				nsx_expect(x, s, "readlink", s1, rc < 0 ? rc : 0, NULL);
				if (strcmp(buf, x->ino[i1].target))
					mismatch(&x->log, "%s reads %s, expected %s", s1, buf, x->ino[i1].target);
			}
			break;
		}
		}
		failures[kind] += errs != NULL;
	}
	x->log.op--;
	for (int i = 0; i < NSX_INODES; i++)
		if (x->ino[i].kind == NSX_DIR)
			for (int s = 0; s < 2; s++)
				nsx_list(x, s, i);
	double secs = now() - t0;
	nsx_print_tree(x, 0, "");
	printf("{\"ok\":true,\"op\":\"%s\",\"ops\":%ld", cmd, ops);
	for (int k = 0; k < KINDS; k++)
		printf(",\"%s\":%ld,\"%s_errors\":%ld", names[k], counts[k], names[k], failures[k]);
	printf(",\"seconds\":%.6f}\n", secs);
	fflush(stdout);
	free(x);
}

#endif
