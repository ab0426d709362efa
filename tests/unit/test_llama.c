/*
 * test_llama: the Llama-style block's kernels (RMSNorm, rotary positions,
 * SwiGLU, grouped-query attention's heads): each backward against central finite differences of
 * sum(out * r), each vectorised kernel against its plain reference in
 * double, and the properties that make rotary positions what they are.
 * Runs once for each build of the vector loops this CPU runs.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "src/base/util.h"
#include "src/kernels/kernels.h"
#include "testutil.h"

#define FD_TOL 2e-3

/* The largest relative difference of a against b over n. */
static double max_rel(const float *a, const float *b, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) e = worse(e, fabs((double)a[i] - b[i]) / (1 + fabs(b[i])));
    return e;
}

/* ---------------------------------------------------------------- RMSNorm */

typedef struct {
    Probe p;
    float *inp, *w, *rstd;
    int N, C;
} RmsCtx;

static void rms_fwd(void *ctx) {
    RmsCtx *c = ctx;
    rmsnorm_forward(c->p.out, c->rstd, c->inp, c->w, c->N, c->C, 1e-5f);
}

static void test_rmsnorm_backward(void) {
    RmsCtx c = {.N = 6, .C = 19};
    const size_t n = 6 * 19;
    c.inp = xmalloc(n * 4), c.w = xmalloc(19 * 4), c.rstd = xmalloc(6 * 4);
    c.p = (Probe){rms_fwd, xmalloc(n * 4), xmalloc(n * 4), n};
    fill_normal(c.inp, n, 1, 1), fill_normal(c.w, 19, 2, 1), fill_normal(c.p.r, n, 3, 1);
    rms_fwd(&c);
    float *di = xcalloc(n, 4), *dw = xcalloc(19, 4);
    rmsnorm_backward(di, dw, c.p.r, c.inp, c.w, c.rstd, c.N, c.C);
    CU_ASSERT(fd_error(&c.p, c.inp, n, di, 1e-2f) < FD_TOL);
    CU_ASSERT(fd_error(&c.p, c.w, 19, dw, 1e-2f) < FD_TOL);
    free(c.inp), free(c.w), free(c.rstd), free(c.p.out), free(c.p.r), free(di), free(dw);
}

/* The kernels = the references in double at a width with a vector tail
 * (C 771) and more rows than a block (N 150); the backward adds into what
 * is there; dw is the same bits on 1 thread as on 2. */
static void test_rmsnorm_matches_reference(void) {
    const int N = 150, C = 771;
    const size_t n = (size_t)N * C;
    float *x = xmalloc(n * 4), *w = xmalloc(C * 4), *dy = xmalloc(n * 4);
    float *o1 = xmalloc(n * 4), *o2 = xmalloc(n * 4), *r1 = xmalloc(N * 4), *r2 = xmalloc(N * 4);
    float *dx1 = xmalloc(n * 4), *dx2 = xmalloc(n * 4), *g1 = xcalloc(C, 4), *g2 = xcalloc(C, 4),
          *g3 = xcalloc(C, 4);
    fill_normal(x, n, 4, 2), fill_normal(w, C, 5, 1), fill_normal(dy, n, 6, 1);
    fill_normal(dx1, n, 7, 1), memcpy(dx2, dx1, n * 4);
    rmsnorm_forward(o1, r1, x, w, N, C, 1e-6f);
    rmsnorm_forward_ref(o2, r2, x, w, N, C, 1e-6f);
    CU_ASSERT(max_rel(o1, o2, n) < 1e-5);
    CU_ASSERT(max_rel(r1, r2, N) < 1e-5);
    rmsnorm_backward(dx1, g1, dy, x, w, r2, N, C);
    rmsnorm_backward_ref(dx2, g2, dy, x, w, r2, N, C);
    CU_ASSERT(max_rel(dx1, dx2, n) < 1e-5);
    CU_ASSERT(max_rel(g1, g2, C) < 1e-4); /* 150 rows summed in float */
    const int threads = kernels_threads();
    kernels_set_threads(threads == 1 ? 2 : 1);
    rmsnorm_backward(dx2, g3, dy, x, w, r2, N, C);
    kernels_set_threads(threads);
    CU_ASSERT(memcmp(g1, g3, C * 4) == 0);
    free(x), free(w), free(dy), free(o1), free(o2), free(r1), free(r2);
    free(dx1), free(dx2), free(g1), free(g2), free(g3);
}

/* ------------------------------------------------------------------ RoPE */

typedef struct {
    Probe p;
    float *inp, *cos_t, *sin_t;
    int *pos, N, H, hs;
} RopeCtx;

static void rope_fwd(void *ctx) {
    RopeCtx *c = ctx;
    memcpy(c->p.out, c->inp, c->p.nout * 4);
    rope_apply(c->p.out, c->pos, c->N, c->H, c->hs, c->H * c->hs, c->cos_t, c->sin_t, 1);
}

/* The backward (turning the gradient back) = finite differences, with
 * positions out of order and repeated, as routed tokens have. */
static void test_rope_backward(void) {
    int pos[5] = {7, 0, 3, 3, 12};
    RopeCtx c = {.N = 5, .H = 3, .hs = 8, .pos = pos};
    const size_t n = 5 * 3 * 8;
    c.inp = xmalloc(n * 4), c.cos_t = xmalloc(16 * 4 * 4), c.sin_t = xmalloc(16 * 4 * 4);
    rope_tables(c.cos_t, c.sin_t, 16, 8, 10000.0);
    c.p = (Probe){rope_fwd, xmalloc(n * 4), xmalloc(n * 4), n};
    fill_normal(c.inp, n, 8, 1), fill_normal(c.p.r, n, 9, 1);
    float *di = xmalloc(n * 4);
    memcpy(di, c.p.r, n * 4);
    rope_apply(di, pos, c.N, c.H, c.hs, c.H * c.hs, c.cos_t, c.sin_t, -1);
    CU_ASSERT(fd_error(&c.p, c.inp, n, di, 1e-2f) < FD_TOL);
    free(c.inp), free(c.cos_t), free(c.sin_t), free(c.p.out), free(c.p.r), free(di);
}

/* The tables' kernel = the reference, which computes each angle in double
 * from theta, at Llama 3's theta (500000) and head size (128) over 2048
 * positions, with heads inside a wider row (stride: q then k); and turning
 * back undoes it. */
static void test_rope_matches_reference(void) {
    const int T = 2048, hs = 128, H = 2, N = 64, stride = 5 * hs;
    float *cs = xmalloc((size_t)T * hs / 2 * 4), *sn = xmalloc((size_t)T * hs / 2 * 4);
    rope_tables(cs, sn, T, hs, 500000.0);
    int pos[64];
    for (int i = 0; i < N; i++) pos[i] = (i * 977) % T;
    const size_t n = (size_t)N * stride;
    float *x = xmalloc(n * 4), *a = xmalloc(n * 4), *b = xmalloc(n * 4);
    fill_normal(x, n, 10, 1), memcpy(a, x, n * 4), memcpy(b, x, n * 4);
    rope_apply(a, pos, N, H, hs, stride, cs, sn, 1);
    rope_apply_ref(b, pos, N, H, hs, stride, 500000.0, 1);
    CU_ASSERT(max_rel(a, b, n) < 1e-5);
    int untouched = 1; /* the row's floats past its H heads */
    for (int i = 0; i < N; i++)
        untouched &= memcmp(a + (size_t)i * stride + H * hs, x + (size_t)i * stride + H * hs,
                            (size_t)(stride - H * hs) * 4) == 0;
    CU_ASSERT(untouched);
    rope_apply(a, pos, N, H, hs, stride, cs, sn, -1);
    CU_ASSERT(max_rel(a, x, n) < 1e-5);
    free(cs), free(sn), free(x), free(a), free(b);
}

/* What makes them rotary positions: a turn keeps a head's length, and the
 * dot product of a query at position p with a key at q depends on p - q
 * alone (here 5 - 2 = 40 - 37 = 1003 - 1000), where a table indexed by
 * anything but the true position would break it. */
static void test_rope_relative(void) {
    const int T = 1024, hs = 64;
    float *cs = xmalloc((size_t)T * hs / 2 * 4), *sn = xmalloc((size_t)T * hs / 2 * 4);
    rope_tables(cs, sn, T, hs, 10000.0);
    float q[64], k[64], qr[3][64], kr[3][64];
    fill_normal(q, hs, 11, 1), fill_normal(k, hs, 12, 1);
    const int pq[3] = {5, 40, 1003}, pk[3] = {2, 37, 1000};
    double dots[3], len_q = 0, len_r = 0;
    for (int t = 0; t < 3; t++) {
        memcpy(qr[t], q, sizeof q), memcpy(kr[t], k, sizeof k);
        rope_apply(qr[t], &pq[t], 1, 1, hs, hs, cs, sn, 1);
        rope_apply(kr[t], &pk[t], 1, 1, hs, hs, cs, sn, 1);
        dots[t] = 0;
        for (int i = 0; i < hs; i++) dots[t] += (double)qr[t][i] * kr[t][i];
    }
    for (int i = 0; i < hs; i++) len_q += (double)q[i] * q[i], len_r += (double)qr[2][i] * qr[2][i];
    CU_ASSERT(fabs(dots[1] - dots[0]) < 1e-4 * (1 + fabs(dots[0])));
    CU_ASSERT(fabs(dots[2] - dots[0]) < 1e-3 * (1 + fabs(dots[0]))); /* float tables at 1000 */
    CU_ASSERT(fabs(len_r - len_q) < 1e-4 * len_q);
    /* and position 0 turns nothing */
    float z[64];
    memcpy(z, q, sizeof q);
    const int zero = 0;
    rope_apply(z, &zero, 1, 1, hs, hs, cs, sn, 1);
    CU_ASSERT(memcmp(z, q, sizeof q) == 0);
    free(cs), free(sn);
}

/* ---------------------------------------------------------------- SwiGLU */

typedef struct {
    Probe p;
    float *gu;
    int N, F;
} SwiCtx;

static void swi_fwd(void *ctx) {
    SwiCtx *c = ctx;
    swiglu_forward(c->p.out, c->gu, c->N, c->F);
}

static void test_swiglu_backward(void) {
    SwiCtx c = {.N = 4, .F = 11};
    const size_t no = 44, ni = 88;
    c.gu = xmalloc(ni * 4);
    c.p = (Probe){swi_fwd, xmalloc(no * 4), xmalloc(no * 4), no};
    fill_normal(c.gu, ni, 13, 2), fill_normal(c.p.r, no, 14, 1);
    float *dg = xmalloc(ni * 4);
    swiglu_backward(dg, c.p.r, c.gu, c.N, c.F);
    CU_ASSERT(fd_error(&c.p, c.gu, ni, dg, 1e-2f) < FD_TOL);
    free(c.gu), free(c.p.out), free(c.p.r), free(dg);
}

/* The kernels = silu(g) * u and its derivatives in double, over gates
 * from -20 to 20 (the sigmoid's saturated ends), a vector tail too. */
static void test_swiglu_matches_reference(void) {
    const int N = 3, F = 1001;
    const size_t n = (size_t)N * F;
    float *gu = xmalloc(2 * n * 4), *dy = xmalloc(n * 4), *o1 = xmalloc(n * 4),
          *o2 = xmalloc(n * 4), *d1 = xmalloc(2 * n * 4), *d2 = xmalloc(2 * n * 4);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < F; j++) {
            gu[(size_t)i * 2 * F + j] = -20.f + 40.f * (float)j / (float)(F - 1);
            gu[(size_t)i * 2 * F + F + j] = (float)(i + 1) * 0.5f;
        }
    fill_normal(dy, n, 15, 1);
    swiglu_forward(o1, gu, N, F), swiglu_forward_ref(o2, gu, N, F);
    swiglu_backward(d1, dy, gu, N, F), swiglu_backward_ref(d2, dy, gu, N, F);
    const double eo = max_rel(o1, o2, n), ed = max_rel(d1, d2, 2 * n);
    if (eo >= 1e-5 || ed >= 1e-5) printf("\n  swiglu: value off by %g, derivative by %g", eo, ed);
    CU_ASSERT(eo < 1e-5 && ed < 1e-5);
    free(gu), free(dy), free(o1), free(o2), free(d1), free(d2);
}

/* ------------------------------------------------- grouped-query attention */

/* Expanding = Hugging Face's repeat_kv (each kv head repeated NH/KV times
 * in a row, written here as that repetition), for KV = 2 of 6, multi-query
 * (1) and plain attention (6); reducing is its adjoint:
 * sum(expand(x) * y) = sum(x * reduce(y)). */
static void test_gqa(void) {
    const int N = 5, NH = 6, hs = 7, kvs[3] = {2, 1, 6};
    for (int t = 0; t < 3; t++) {
        const int KV = kvs[t], rep = NH / KV;
        const size_t ng = (size_t)N * (NH + 2 * KV) * hs, nf = (size_t)N * 3 * NH * hs;
        float *g = xmalloc(ng * 4), *f = xmalloc(nf * 4), *y = xmalloc(nf * 4),
              *dg = xmalloc(ng * 4);
        fill_normal(g, ng, 16, 1), fill_normal(y, nf, 17, 1);
        gqa_expand(f, g, N, NH, KV, hs);
        int same = 1;
        for (int n = 0; n < N; n++) {
            const float *src = g + (size_t)n * (NH + 2 * KV) * hs;
            const float *dst = f + (size_t)n * 3 * NH * hs;
            same &= memcmp(dst, src, (size_t)NH * hs * 4) == 0;
            for (int kv = 0; kv < KV; kv++)
                for (int r = 0; r < rep; r++)
                    for (int part = 1; part <= 2; part++) /* k, then v */
                        same &= memcmp(dst + (size_t)part * NH * hs + (size_t)(kv * rep + r) * hs,
                                       src + (size_t)NH * hs + (size_t)((part - 1) * KV + kv) * hs,
                                       (size_t)hs * 4) == 0;
        }
        CU_ASSERT(same);
        gqa_reduce(dg, y, N, NH, KV, hs);
        double lhs = 0, rhs = 0;
        for (size_t i = 0; i < nf; i++) lhs += (double)f[i] * y[i];
        for (size_t i = 0; i < ng; i++) rhs += (double)g[i] * dg[i];
        CU_ASSERT(fabs(lhs - rhs) < 1e-4 * (1 + fabs(lhs)));
        free(g), free(f), free(y), free(dg);
    }
}

int main(void) {
    test_threads_lock();
    kernels_init(2, "auto");
    CU_TestInfo tests[] = {
        {"rmsnorm backward = finite differences", test_rmsnorm_backward},
        {"rmsnorm = its reference in double; dw the same bits on 1 and 2 threads",
         test_rmsnorm_matches_reference},
        {"rope backward = finite differences (positions out of order)", test_rope_backward},
        {"rope from tables = angles in double (theta 500000, hs 128); turning back undoes it",
         test_rope_matches_reference},
        {"rope keeps lengths and makes q.k depend on the positions' difference",
         test_rope_relative},
        {"swiglu backward = finite differences", test_swiglu_backward},
        {"swiglu = silu(g) * u and its derivatives in double", test_swiglu_matches_reference},
        {"gqa: expand = repeat_kv (2 of 6, 1, 6 kv heads); reduce is its adjoint", test_gqa},
        CU_TEST_INFO_NULL,
    };
    return run_suite_each_vec("llama kernels", tests, kernels_vec_level(), kernels_set_vec_level,
                              kernels_threads(), kernels_set_threads);
}
