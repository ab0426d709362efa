/*
 * util: the few helpers every module shares: checked allocation, rank-0
 * printing, a monotonic clock, durable file writes.
 */
#ifndef MODTRAIN_UTIL_H
#define MODTRAIN_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Set once by the program after MPI_Init; 0 before that and in unit tests. */
extern int util_rank;
/* While set, errorf prints on rank 0 only: for errors every rank finds alike
 * (config, layout), which one line should report. */
extern int util_quiet;

/* Aligned (64-byte) zeroed allocation; exits with a message when out of memory. */
void *xcalloc(size_t count, size_t size);
void *xmalloc(size_t size);
char *xstrdup(const char *s);

/* printf to stdout from rank 0 only, flushed. */
void log0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One-line error to stderr prefixed "modtrain: " (every rank). */
void errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Seconds since an arbitrary fixed point. */
double now_s(void);

/* Writes len bytes to path durably: temp file, fsync, rename, fsync dir.
 * Returns 0, or -1 with a message printed. */
int write_file_atomic(const char *path, const void *data, size_t len);
/* Reads a whole file into a malloc'd buffer (NUL-terminated); NULL on error
 * with errno set. */
char *read_file(const char *path, size_t *len);
/* mkdir -p; returns 0 or -1 with errno. */
int mkdirs(const char *path);
/* fsync a directory; returns 0 or -1. */
int fsync_dir(const char *path);

/* Formats seconds as "1h02m", "3m05s" or "12s". */
void format_duration(char *buf, size_t n, double seconds);

#endif
