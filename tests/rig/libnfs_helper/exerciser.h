/*
 * exerciser.h - the parts of the test rig's C clients that do not depend on how
 * they reach the file: JSON strings, the deterministic content pattern, the log of
 * the last operations, and the fsx engine (random I/O on one file checked against
 * an in-memory model).  Included by nfsh.c (libnfs: two connections to the server)
 * and by fsx-guest.c (system calls on a kernel NFS mount inside the test VM), each
 * of which supplies the file's two handles as a `struct fsx_io`.
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
};

/* Reads [off, off+len) through side s and checks it against the model, short
 * reads at the end of the file included. */
static void fsx_check_read(struct fsx *f, int s, uint64_t off, size_t len)
{
	size_t want = off >= f->size ? 0 : (f->size - off < len ? (size_t)(f->size - off) : len);
	size_t got = 0;
	while (got < len) {
		int rc = f->io->pread(s, f->base + off + got, len - got, f->buf + got);
		if (rc < 0)
			f->io->fail(&f->log, s, "pread", rc);
		if (rc == 0)
			break;
		got += rc;
	}
	/* Shared, the file may go on past what this writer wrote: holes, read as zeros. */
	if (f->shared ? got < want : got != want)
		mismatch(&f->log, "read of %zu at %" PRIu64 " through handle %d returned %zu bytes, "
			 "the file holds %s%zu there", len, f->base + off, s, got, f->shared ? "at least " : "", want);
	for (size_t i = 0; i < got; i++)
		if (f->buf[i] != f->model[off + i])
			mismatch(&f->log, "read of %zu at %" PRIu64 " through handle %d: byte at %" PRIu64
				 " is 0x%02x, expected 0x%02x", len, f->base + off, s, f->base + off + i, f->buf[i],
				 f->model[off + i]);
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
	printf(",\"seconds\":%.6f}\n", secs);
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

#endif
