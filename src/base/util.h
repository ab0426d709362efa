/*
 * util: the base layer every module shares: the error value, checked
 * allocation, printing for the command layer, strict parsing, a monotonic
 * clock (files.h: the files modtrain reads and writes). It includes
 * nothing else of modtrain.
 *
 * The error convention: library code (src/, mpi/, checkpoint/) returns 0 or
 * -1 and fills an Err; only the command layer (src/cmd/) prints and chooses
 * the exit code. Two failures stay fatal where they happen: running out of
 * memory (xmalloc, xcalloc, xrealloc) and a failed MPI call (MPI_CHECK in
 * mpi/check.h), each with one clear line.
 */
#ifndef MODTRAIN_UTIL_H
#define MODTRAIN_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The largest vocabulary a model, a shard or a tokenizer may have: 2^24
 * ids (today's largest are about 262,000; an id is an int everywhere). */
#define MODTRAIN_MAX_VOCAB (1 << 24)

/* A failure: one line naming what is wrong and what would be right. */
typedef struct {
    char msg[1024];
} Err;

/* Formats the message into *e (when e is not NULL) and returns -1, so that a
 * failing function can `return err_set(e, ...)`. */
int err_set(Err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Set once by the program after MPI_Init; 0 before that and in unit tests. */
extern int util_rank;
/* When set, errorf prints nothing: the ranks above the lowest while every
 * rank parses the same arguments alike, so that an error shows once. */
extern int util_quiet;

/* 64-byte aligned allocation (zeroed by xcalloc); out of memory ends the
 * process with a message naming the size. count * size is checked. */
void *xcalloc(size_t count, size_t size);
void *xmalloc(size_t size);
/* realloc that ends the process when out of memory (not aligned). */
void *xrealloc(void *p, size_t size);
char *xstrdup(const char *s);

/* For the command layer only. printf to stdout from rank 0 only, flushed. */
void log0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* For the command layer only. One-line error to stderr prefixed "modtrain: ". */
void errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* errorf("%s", e->msg). */
void err_print(const Err *e);

/* Strict number parsing for every value read from a file or the command
 * line: the whole of s is the number (no leading or trailing space, no
 * empty string), it does not overflow, and it lies in [min, max] (a float
 * must also be finite). Return 0 and set *out, or -1 leaving it alone. */
int parse_i64(const char *s, long long min, long long max, long long *out);
int parse_f64(const char *s, double *out);

/* Checked size arithmetic for every size, count or offset that comes from
 * input: size_mul/size_add return -1 on overflow (leaving *out alone), the
 * sat_ forms saturate at SIZE_MAX ("more than can exist") for accounting
 * that is compared against a bound afterwards. */
static inline int size_mul(size_t a, size_t b, size_t *out) {
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) return -1;
    *out = r;
    return 0;
}
static inline int size_add(size_t a, size_t b, size_t *out) {
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) return -1;
    *out = r;
    return 0;
}
static inline size_t sat_mul(size_t a, size_t b) {
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}
static inline size_t sat_add(size_t a, size_t b) {
    size_t r;
    return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

/* Bytes of memory this process's node offers: the physical memory, or the
 * control group's limit (a SLURM --mem, a container) when that is lower. */
size_t machine_memory(void);
/* This process's peak resident set size so far (VmHWM), or 0 where the
 * system does not say. */
size_t peak_rss(void);
/* Formats bytes as "512 B", "3.2 MiB", "1.50 GiB" ("too much" at SIZE_MAX). */
void format_bytes(char *buf, size_t n, size_t bytes);

/* Seconds since an arbitrary fixed point. */
double now_s(void);


/* Formats seconds as "1h02m", "3m05s" or "12s". */
void format_duration(char *buf, size_t n, double seconds);

#endif
