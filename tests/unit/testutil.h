/*
 * testutil: the CUnit runner every unit test binary shares, plus random
 * fills and a central finite-difference helper.
 */
#ifndef MODTRAIN_TESTUTIL_H
#define MODTRAIN_TESTUTIL_H

#include <CUnit/Basic.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>

#include "src/base/rng.h"

/* Takes, until the process exits, the lock the suite's tests of two threads
 * share: `make -j` would otherwise run two of them at once, four threads on
 * two cores, and BLIS's threads spin at their barriers while the thread they
 * wait for is off its core (test_kernels took 29 s beside test_model, 1.5 s
 * alone). A test whose lock cannot be opened runs anyway. */
static inline void test_threads_lock(void) {
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/modtrain-threads-test.lock", dir && *dir ? dir : "/tmp");
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0) (void)flock(fd, LOCK_EX); /* held until exit: the fd stays open */
}

/* Runs one suite; the failure count is read before the registry is freed.
 * Returns EXIT_FAILURE when anything failed (automake: 99 for a hard error). */
static inline int run_suite(const char *name, CU_TestInfo *tests) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 99;
    CU_SuiteInfo suites[] = {{(char *)name, NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
    if (CU_register_suites(suites) != CUE_SUCCESS) {
        CU_cleanup_registry();
        return 99;
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    CU_cleanup_registry();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* Runs the suite once for each build of the elementwise loops this CPU
 * runs (kernels_set_vec_level): the widest on the threads the kernels were
 * initialised with, the narrower ones on one thread (the builds differ in
 * their loops, not their threading, and one thread keeps the extra runs
 * quick beside other tests on a busy machine). */
#define VEC_NAMES {"baseline", "AVX2", "AVX-512"}
static inline int run_suite_each_vec(const char *name, CU_TestInfo *tests, int top,
                                     int (*set_level)(int), int threads,
                                     void (*set_threads)(int)) {
    static const char *names[] = VEC_NAMES;
    int rc = EXIT_SUCCESS;
    for (int level = top; level >= 0; level--) {
        set_level(level);
        set_threads(level == top ? threads : 1);
        printf("\n--- %s, %s loops, %d thread(s) ---\n", name, names[level],
               level == top ? threads : 1);
        int r = run_suite(name, tests);
        if (r != EXIT_SUCCESS && rc != 99) rc = r; /* a hard error stays one */
    }
    set_level(top);
    set_threads(threads);
    return rc;
}

/* Fills x with N(0, scale) from a counter stream. */
static inline void fill_normal(float *x, size_t n, uint64_t seed, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)rng_normal(seed, 7, i);
}

/* The worse of two errors, where a NaN in either is the worst of all:
 * fmax() would skip it, and a kernel that returned NaN would pass. */
static inline double worse(double a, double b) {
    return isnan(a) || isnan(b) ? INFINITY : a > b ? a : b;
}

/* Relative error of two vectors: ||a - b|| / max(||b||, tiny). */
static inline double rel_err(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-12);
}

/* Central differences of loss() with respect to x[0..n): out[i]. */
static inline void finite_diff(double (*loss)(void *), void *ctx, float *x, size_t n, float eps,
                               double *out) {
    for (size_t i = 0; i < n; i++) {
        float saved = x[i];
        x[i] = saved + eps;
        double lp = loss(ctx);
        x[i] = saved - eps;
        double lm = loss(ctx);
        x[i] = saved;
        out[i] = (lp - lm) / (2.0 * (double)eps);
    }
}

/* A generic harness for finite differences: forward writes out, and the
 * loss is sum(out * r) for a fixed random r; fd_error is the relative
 * error of an analytic gradient against central differences. */
typedef struct {
    void (*forward)(void *);
    float *out, *r;
    size_t nout;
} Probe;

static inline double probe_loss(void *ctx) {
    Probe *p = ctx;
    p->forward(ctx);
    double s = 0;
    for (size_t i = 0; i < p->nout; i++) s += (double)p->out[i] * p->r[i];
    return s;
}

static inline double fd_error(Probe *p, float *x, size_t n, const float *analytic, float eps) {
    double *num = malloc(n * sizeof(double));
    if (!num) abort();
    finite_diff(probe_loss, p, x, n, eps, num);
    double e = rel_err(analytic, num, n);
    free(num);
    return e;
}

#endif
