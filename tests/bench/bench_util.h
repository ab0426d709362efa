/*
 * bench_util: what the C benchmarks share: deterministic filler data and a
 * strict parse of their whole-number arguments.
 */
#ifndef MODTRAIN_BENCH_UTIL_H
#define MODTRAIN_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* n floats in [-1, 1) from a linear congruential sequence seeded by seed. */
static inline void bench_fill(float *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 8) & 0xffff) / 32768.f - 1.f;
    }
}

/* s as a whole number in [lo, hi], or one line naming prog and what, and
 * exit 2. */
static inline int bench_parse(const char *prog, const char *s, int lo, int hi, const char *what) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "%s: %s = '%s' is not a whole number in [%d, %d]\n", prog, what, s, lo, hi);
        exit(2);
    }
    return (int)v;
}

#endif
