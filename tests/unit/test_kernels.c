/*
 * test_kernels: BLIS products against the naive reference, and every layer's
 * backward against central finite differences of sum(out * r) for a random r.
 */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "src/kernels/kernels.h"
#include "src/base/util.h"
#include "testutil.h"

/* float32 forward passes give FD noise near 1e-4 relative; a wrong backward
 * is off by O(1). */
#define FD_TOL 2e-3

/* The largest relative difference between C1 (M,N at ldc) and the
 * reference C2; padding columns must be untouched (1 if not), and under
 * MASK_BELOW entries above the diagonal (j > i + d) are not compared. */
static double worst_product_error(const float *C1, const float *C2, int M, int N, int ldc,
                                  int mask, int d) {
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            size_t k = (size_t)i * ldc + j;
            double e = fabs(C1[k] - C2[k]) / (1 + fabs(C2[k]));
            if (j >= N) e = C1[k] == C2[k] ? 0 : 1; /* padding columns untouched */
            else if (mask == MASK_BELOW && j > i + d) e = 0;
            if (isnan(e)) e = INFINITY; /* a NaN read where the mask counts zero */
            if (e > worst) worst = e;
        }
    return worst;
}

/* Whether check_mm_size compares one thread's bits with two's: not for
 * gemm = blis, whose small-matrix path on haswell's kernels splits the
 * product otherwise on two threads (at 37 x 53 x 29, ta 0, tb 1, other
 * bits; with that path off, the same). */
static int g_same_bits_threads = 1;

/* mm (mm1 when single) of (M,N,K) against the reference, with padded
 * leading dimensions: beta 0 never reads C (it holds NaN), the padding is
 * never written, and one thread gives the same bits as two (own gemm). */
static void check_mm_size(int ta, int tb, float beta, int M, int N, int K, int single) {
    const int pad = 2, lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = xmalloc(na * 4), *B = xmalloc(nb * 4), *C1 = xmalloc(nc * 4), *C2 = xmalloc(nc * 4),
          *C3 = xmalloc(nc * 4);
    fill_normal(A, na, 1, 1.f), fill_normal(B, nb, 2, 1.f), fill_normal(C1, nc, 3, 1.f);
    for (size_t i = 0; beta == 0.f && i < nc; i++)
        if (i % ldc < (size_t)N) C1[i] = NAN; /* beta 0 never reads C */
    memcpy(C2, C1, nc * 4), memcpy(C3, C1, nc * 4);
    if (single) mm1(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C1, ldc);
    else mm(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C1, ldc);
    mm_ref(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C2, ldc);
    /* a float sum's rounding grows as the root of its length */
    const double tol = 1e-5 * fmax(1.0, sqrt(K / 100.0));
    double worst = worst_product_error(C1, C2, M, N, ldc, MASK_NONE, 0);
    CU_ASSERT(worst < tol);
    if (worst >= tol)
        printf("\n  mm %dx%dx%d ta=%d tb=%d beta=%g single=%d: worst %g\n", M, N, K, ta, tb, beta,
               single, worst);
    const int nt = kernels_threads();
    kernels_set_threads(1);
    if (single) mm1(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C3, ldc);
    else mm(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C3, ldc);
    kernels_set_threads(nt);
    if (g_same_bits_threads) CU_ASSERT(!memcmp(C1, C3, nc * 4));
    free(A), free(B), free(C1), free(C2), free(C3);
}

/* BLIS's sgemm (gemm = blis, and mm1 always) against the reference. */
static void test_mm_matches_reference(void) {
    kernels_set_gemm(0);
    g_same_bits_threads = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int single = 0; single < 2; single++) {
                check_mm_size(ta, tb, 0.f, 37, 53, 29, single);
                check_mm_size(ta, tb, 1.3f, 37, 53, 29, single);
            }
    g_same_bits_threads = 1;
    kernels_set_gemm(1);
}

/* mm on modtrain's own packing (the default) at sizes that cross the
 * micro-kernel's and the cache blocks' edges (MC, KC, NC: 480, 384, 3072
 * for skx's sgemm), with the threads splitting either side, C stored both
 * ways, every transpose, beta 0 and 1.3; with skx's kernels, bli_sgemm_ex's
 * bits. */
static void test_own_gemm_matches_reference(void) {
    const int sizes[][3] = {{37, 53, 29},   {3100, 7, 5},  {7, 3100, 5}, {33, 1000, 20},
                            {1000, 33, 20}, {35, 40, 800}, {1, 1, 1}};
    for (int orient = -1; orient <= 1; orient++) {
        mm_tile_orientation(orient);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    check_mm_size(ta, tb, 0.f, sizes[k][0], sizes[k][1], sizes[k][2], 0);
                    check_mm_size(ta, tb, 1.3f, sizes[k][0], sizes[k][1], sizes[k][2], 0);
                }
    }
    mm_tile_orientation(-1);
    /* with skx's kernels (no small-matrix path) the same bits as
     * bli_sgemm_ex: the same micro-kernel on the same K blocks */
    if (strcmp(kernels_blis_arch(), "skx") != 0) return;
    const int ks[] = {29, 450, 481, 800, 1000};
    for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++)
        for (int ta = 0; ta < 2; ta++) {
            const int M = 67, N = 45, K = ks[k], lda = ta ? M : K;
            float *A = xmalloc((size_t)M * K * 4), *B = xmalloc((size_t)K * N * 4),
                  *C1 = xmalloc((size_t)M * N * 4), *C2 = xmalloc((size_t)M * N * 4);
            fill_normal(A, (size_t)M * K, 4, 1.f), fill_normal(B, (size_t)K * N, 5, 1.f);
            fill_normal(C1, (size_t)M * N, 6, 1.f);
            memcpy(C2, C1, (size_t)M * N * 4);
            mm(ta, 0, M, N, K, 0.7f, A, lda, B, N, 1.3f, C1, N);
            kernels_set_gemm(0);
            mm(ta, 0, M, N, K, 0.7f, A, lda, B, N, 1.3f, C2, N);
            kernels_set_gemm(1);
            CU_ASSERT(!memcmp(C1, C2, (size_t)M * N * 4));
            free(A), free(B), free(C1), free(C2);
        }
}

/* Where mm_tile (skx, haswell) and mm (skx) read the micro-kernel's
 * broadcast side in place (kernels_inplace), the same bits as when they
 * pack it: whole blocks and edges on both sides, K past KC (two K blocks),
 * beta 0 and 1.3, every transpose (mm reads in place at ta 0, mm_tile at
 * both), mm_tile under MASK_K_UPTO0, MASK_K_FROM0 and MASK_BELOW. */
static void test_inplace_same_bits(void) {
    if (!kernels_inplace()) return; /* another configuration, or a narrower build */
    const int sizes[][3] = {{67, 45, 29}, {24, 96, 1000}, {130, 64, 256}, {11, 31, 7}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (int t = 0; t < 8; t++) {
            const int ta = t & 1, tb = t >> 1 & 1, tile = t >> 2, M = sizes[k][0], N = sizes[k][1],
                      K = sizes[k][2];
            const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
            const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb,
                         nc = (size_t)M * ldc;
            float *A = xmalloc(na * 4), *Az = xmalloc(na * 4), *B = xmalloc(nb * 4), *C[2][2];
            fill_normal(A, na, 7, 1.f), fill_normal(B, nb, 8, 1.f);
            memcpy(Az, A, na * 4);
            /* op(A): K_UPTO0's zeros past k = i + 5 (ta 0), K_FROM0's before
             * k = i - 5 (ta 1), then NaN */
            for (int i = 0; i < M; i++)
                for (int kk = 0; kk < K; kk++) {
                    const int past = ta ? i - 5 - kk : kk - i - 5; /* > 0: masked */
                    if (past > 0)
                        Az[ta ? (size_t)kk * lda + i : (size_t)i * lda + kk] =
                            past <= MASK_ZERO_TAIL ? 0.f : NAN;
                }
            for (int in = 0; in < 2; in++)
                for (int bz = 0; bz < 2; bz++) {
                    C[in][bz] = xmalloc(nc * 4);
                    fill_normal(C[in][bz], nc, 9, 1.f);
                    kernels_set_inplace(in);
                    const float beta = bz ? 0.f : 1.3f;
                    const int z = tile && !bz, zmask = ta ? MASK_K_FROM0 : MASK_K_UPTO0;
                    if (tile)
                        mm_tile(ta, tb, M, N, K, 0.7f, z ? Az : A, lda, B, ldb, beta, C[in][bz],
                                ldc, z ? zmask : MASK_BELOW, 5);
                    else mm(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C[in][bz], ldc);
                }
            kernels_set_inplace(1);
            for (int bz = 0; bz < 2; bz++) {
                CU_ASSERT(!memcmp(C[0][bz], C[1][bz], nc * 4));
                free(C[0][bz]), free(C[1][bz]);
            }
            free(A), free(Az), free(B);
        }
}

/* mv and rank1 (BLIS's level 2) against mm_ref on the same data as a
 * one-column product: every transpose, beta 0 over NaN, strides, and
 * zero sizes that touch nothing */
static void test_mv_rank1_match_reference(void) {
    const int M = 41, N = 23, lda = N + 5;
    float *A = xmalloc((size_t)M * lda * 4), *A2 = xmalloc((size_t)M * lda * 4);
    float x[41], y1[41], y2[41], u[23];
    fill_normal(A, (size_t)M * lda, 5, 1.f);
    fill_normal(x, 41, 6, 1.f);
    fill_normal(u, 23, 7, 1.f);
    for (int ta = 0; ta < 2; ta++)
        for (int b = 0; b < 2; b++) {
            const int ny = ta ? N : M, nx = ta ? M : N;
            const float beta = b ? 0.6f : 0.f;
            fill_normal(y2, (size_t)ny, 8, 1.f);
            memcpy(y1, y2, sizeof y1);
            if (!b) y1[0] = NAN; /* beta 0 overwrites */
            mv(ta, M, N, 0.7f, A, lda, ta ? x : u, beta, y1);
            /* y = op(A) x as a (ny x 1) product */
            mm_ref(ta, 0, ny, 1, nx, 0.7f, A, lda, ta ? x : u, 1, beta, y2, 1);
            double worst = 0;
            for (int i = 0; i < ny; i++)
                worst = worse(worst, fabs(y1[i] - y2[i]) / (1 + fabs(y2[i])));
            CU_ASSERT(worst < 1e-5);
        }
    memcpy(A2, A, (size_t)M * lda * 4);
    rank1(M, N, 0.7f, x, u, A, lda);
    mm_ref(0, 0, M, N, 1, 0.7f, x, 1, u, N, 1.f, A2, lda);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < lda; j++) {
            size_t k = (size_t)i * lda + j;
            double d = fabs(A[k] - A2[k]) / (1 + fabs(A2[k]));
            if (j >= N) d = A[k] == A2[k] ? 0 : 1; /* padding untouched */
            worst = worse(worst, d);
        }
    CU_ASSERT(worst < 1e-5);
    /* zero sizes: an empty inner size scales y by beta; nothing else moves */
    y1[0] = 2.f;
    mv(0, 1, 0, 1.f, A, lda, x, 0.5f, y1);
    CU_ASSERT_EQUAL(y1[0], 1.f);
    memcpy(A2, A, (size_t)M * lda * 4);
    rank1(0, N, 1.f, x, u, A, lda);
    rank1(M, 0, 1.f, x, u, A, lda);
    CU_ASSERT(memcmp(A, A2, (size_t)M * lda * 4) == 0);
    free(A);
    free(A2);
}

/* mm_tile (BLIS's micro-kernel on panels packed here) against the
 * reference at sizes around the micro-kernel's MR x NR, every transpose,
 * both storages of C, and each causal mask: K_UPTO and K_FROM count op(A)
 * zero where they skip it and never read it there (mm_tile's A holds NaN
 * there, the reference's zeros; K_UPTO0's and K_FROM0's A holds zeros in
 * the entries they promise, NaN past them), and BELOW
 * leaves entries no one reads (those above the diagonal are not
 * compared). */
static double check_tile(int ta, int tb, int M, int N, int K, float beta, int mask, int d) {
    const int pad = 2;
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = xmalloc(na * 4), *A0 = xmalloc(na * 4), *B = xmalloc(nb * 4);
    float *C1 = xmalloc(nc * 4), *C2 = xmalloc(nc * 4);
    fill_normal(A, na, 1, 1.f), fill_normal(B, nb, 2, 1.f), fill_normal(C1, nc, 3, 1.f);
    memcpy(A0, A, na * 4);
    /* op(A)(i,k) where the mask skips it: NaN for mm_tile, zero for the reference */
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            int upto = mask == MASK_K_UPTO || mask == MASK_K_UPTO0;
            int from = mask == MASK_K_FROM || mask == MASK_K_FROM0;
            int zero = (upto && k > i + d) || (from && k < i - d);
            size_t e = ta ? (size_t)k * lda + i : (size_t)i * lda + k;
            /* K_UPTO0, K_FROM0: zeros in the MASK_ZERO_TAIL entries next to the edge */
            int tail = (mask == MASK_K_UPTO0 && k <= i + d + MASK_ZERO_TAIL) ||
                       (mask == MASK_K_FROM0 && k >= i - d - MASK_ZERO_TAIL);
            if (zero) A[e] = tail ? 0.f : NAN, A0[e] = 0.f;
        }
    memcpy(C2, C1, nc * 4);
    mm_tile(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C1, ldc, mask, d);
    mm_ref(ta, tb, M, N, K, 0.7f, A0, lda, B, ldb, beta, C2, ldc);
    double worst = worst_product_error(C1, C2, M, N, ldc, mask, d);
    free(A), free(A0), free(B), free(C1), free(C2);
    return worst;
}

static void test_mm_tile_matches_reference(void) {
    const int sizes[][3] = {{1, 1, 1},   {37, 53, 29},   {32, 12, 32}, {64, 24, 7},
                            {5, 70, 33}, {128, 32, 128}, {13, 13, 64}};
    const int masks[] = {MASK_NONE,   MASK_BELOW,   MASK_K_UPTO,
                         MASK_K_FROM, MASK_K_UPTO0, MASK_K_FROM0};
    const int ds[] = {0, 5, -3, 100};
    double worst = 0;
    for (int orient = 0; orient < 2; orient++) {
        mm_tile_orientation(orient);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    for (int m = 0; m < 6; m++)
                        for (int di = 0; di < 4; di++) {
                            const int *z = sizes[s];
                            double w = check_tile(ta, tb, z[0], z[1], z[2], di & 1 ? 1.f : 0.f,
                                                  masks[m], ds[di]);
                            if (w >= 1e-5)
                                printf(
                                    "\n  mm_tile %dx%dx%d ta=%d tb=%d mask %d d %d C by %s: %g\n",
                                    z[0], z[1], z[2], ta, tb, masks[m], ds[di],
                                    orient ? "rows" : "columns", w);
                            if (w > worst) worst = w;
                        }
    }
    mm_tile_orientation(-1);
    CU_ASSERT(worst < 1e-5);
}

static void test_mm_reference_is_a_product(void) {
    /* the reference itself, on a product known by hand */
    float A[] = {1, 2, 3, 4, 5, 6}; /* 2x3 */
    float B[] = {1, 0, 0, 1, 1, 1}; /* 3x2 */
    float C[4] = {0};
    mm_ref(0, 0, 2, 2, 3, 1.f, A, 3, B, 2, 0.f, C, 2);
    CU_ASSERT_EQUAL(C[0], 4);
    CU_ASSERT_EQUAL(C[1], 5);
    CU_ASSERT_EQUAL(C[2], 10);
    CU_ASSERT_EQUAL(C[3], 11);
}

/* linear */
typedef struct {
    Probe p;
    float *inp, *w, *b;
    int N, C, OC;
} LinCtx;

static void lin_fwd(void *ctx) {
    LinCtx *c = ctx;
    linear_forward(c->p.out, c->inp, c->w, c->b, c->N, c->C, c->OC);
}

static void test_linear_backward(void) {
    LinCtx c = {.N = 7, .C = 5, .OC = 6};
    size_t ni = 35, nw = 30, no = 42;
    c.inp = xmalloc(ni * 4), c.w = xmalloc(nw * 4), c.b = xmalloc(6 * 4);
    c.p = (Probe){lin_fwd, xmalloc(no * 4), xmalloc(no * 4), no};
    fill_normal(c.inp, ni, 1, 1), fill_normal(c.w, nw, 2, 1), fill_normal(c.b, 6, 3, 1);
    fill_normal(c.p.r, no, 4, 1);
    float *di = xcalloc(ni, 4), *dw = xcalloc(nw, 4), *db = xcalloc(6, 4);
    linear_backward(di, dw, db, c.p.r, c.inp, c.w, c.N, c.C, c.OC);
    CU_ASSERT(fd_error(&c.p, c.inp, ni, di, 1e-2f) < FD_TOL);
    CU_ASSERT(fd_error(&c.p, c.w, nw, dw, 1e-2f) < FD_TOL);
    CU_ASSERT(fd_error(&c.p, c.b, 6, db, 1e-2f) < FD_TOL);
    /* backward adds: a second call doubles the gradients */
    float w0 = dw[3];
    linear_backward(di, dw, db, c.p.r, c.inp, c.w, c.N, c.C, c.OC);
    CU_ASSERT(fabsf(dw[3] - 2 * w0) <= 1e-5f * (1 + fabsf(w0)));
    free(c.inp), free(c.w), free(c.b), free(c.p.out), free(c.p.r), free(di), free(dw), free(db);
}

/* layernorm */
typedef struct {
    Probe p;
    float *inp, *w, *b, *mean, *rstd;
    int N, C;
} LnCtx;

static void ln_fwd(void *ctx) {
    LnCtx *c = ctx;
    layernorm_forward(c->p.out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
}

static void test_layernorm_backward(void) {
    LnCtx c = {.N = 6, .C = 9};
    size_t n = 54;
    c.inp = xmalloc(n * 4), c.w = xmalloc(9 * 4), c.b = xmalloc(9 * 4);
    c.mean = xmalloc(6 * 4), c.rstd = xmalloc(6 * 4);
    c.p = (Probe){ln_fwd, xmalloc(n * 4), xmalloc(n * 4), n};
    fill_normal(c.inp, n, 1, 1), fill_normal(c.w, 9, 2, 1), fill_normal(c.b, 9, 3, 1);
    fill_normal(c.p.r, n, 4, 1);
    ln_fwd(&c);
    float *di = xcalloc(n, 4), *dw = xcalloc(9, 4), *db = xcalloc(9, 4);
    layernorm_backward(di, dw, db, c.p.r, c.inp, c.w, c.mean, c.rstd, c.N, c.C);
    CU_ASSERT(fd_error(&c.p, c.inp, n, di, 1e-2f) < FD_TOL);
    CU_ASSERT(fd_error(&c.p, c.w, 9, dw, 1e-2f) < FD_TOL);
    CU_ASSERT(fd_error(&c.p, c.b, 9, db, 1e-2f) < FD_TOL);
    free(c.inp), free(c.w), free(c.b), free(c.mean), free(c.rstd), free(c.p.out), free(c.p.r);
    free(di), free(dw), free(db);
}

/* gelu */
typedef struct {
    Probe p;
    float *inp;
} GeluCtx;

static void gelu_fwd(void *ctx) {
    GeluCtx *c = ctx;
    gelu_forward(c->p.out, c->inp, c->p.nout);
}

static void test_gelu_backward(void) {
    size_t n = 40;
    GeluCtx c = {{gelu_fwd, xmalloc(n * 4), xmalloc(n * 4), n}, xmalloc(n * 4)};
    fill_normal(c.inp, n, 1, 2), fill_normal(c.p.r, n, 2, 1);
    float *di = xcalloc(n, 4);
    gelu_backward(di, c.inp, c.p.r, n);
    CU_ASSERT(fd_error(&c.p, c.inp, n, di, 1e-2f) < FD_TOL);
    /* a known value: gelu(1) = 0.8411920 (tanh form) */
    float one = 1.f, g;
    gelu_forward(&g, &one, 1);
    CU_ASSERT(fabsf(g - 0.841192f) < 1e-5f);
    free(c.p.out), free(c.p.r), free(c.inp), free(di);
}

/* The GELU (tanh form) and its derivative against the plain formula in
 * double, at 1001 elements (the vector loops and a tail) over [-8, 8]. */
static void test_gelu_matches_formula(void) {
    const size_t n = 1001;
    float *x = xmalloc(n * 4), *y = xmalloc(n * 4), *dy = xmalloc(n * 4), *dx = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = -8.f + 16.f * (float)i / (float)(n - 1), dy[i] = 1.f;
    gelu_forward(y, x, n);
    gelu_backward_set(dx, x, dy, n);
    const double k = sqrt(2.0 / M_PI);
    double ey = 0, ed = 0;
    for (size_t i = 0; i < n; i++) {
        const double v = x[i], u = k * (v + 0.044715 * v * v * v), t = tanh(u);
        const double g = 0.5 * v * (1 + t);
        const double dg = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
        ey = worse(ey, fabs(y[i] - g) / (1 + fabs(g)));
        ed = worse(ed, fabs(dx[i] - dg) / (1 + fabs(dg)));
    }
    if (ey >= 1e-5 || ed >= 1e-5) printf("\n  gelu: value off by %g, derivative by %g", ey, ed);
    CU_ASSERT(ey < 1e-5 && ed < 1e-5);
    free(x), free(y), free(dy), free(dx);
}

/* attention */
typedef struct {
    Probe p;
    float *qkv, *lse;
    int B, T, NH, hs;
    int off[8];
} AttCtx;

static void att_fwd(void *ctx) {
    AttCtx *c = ctx;
    attention_forward(c->p.out, c->lse, c->qkv, c->B, c->off, c->NH, c->hs);
}

static void uniform_off(int *off, int B, int T) {
    for (int b = 0; b <= B; b++) off[b] = b * T;
}

/* With raise_from > 0, the keys from that row on are three times larger,
 * so that a later key tile raises most rows' maximum well above the first
 * tile's (and the online softmax's rescaling carries weight). The finite
 * differences perturb the last sequence's rows from fd_from on (all of
 * them at 0): two forwards an input. */
static void check_attention_backward(int B, int T, int NH, int hs, int raise_from, int fd_from) {
    AttCtx c = {.B = B, .T = T, .NH = NH, .hs = hs};
    uniform_off(c.off, B, T);
    size_t nq = (size_t)B * T * 3 * NH * hs, no = (size_t)B * T * NH * hs;
    c.qkv = xmalloc(nq * 4), c.lse = xmalloc((size_t)B * NH * T * 4);
    c.p = (Probe){att_fwd, xmalloc(no * 4), xmalloc(no * 4), no};
    fill_normal(c.qkv, nq, 1, 1), fill_normal(c.p.r, no, 2, 1);
    const int C = NH * hs;
    for (int b = 0; raise_from > 0 && b < B; b++)
        for (int t = raise_from; t < T; t++)
            for (int i = 0; i < C; i++) c.qkv[((size_t)b * T + t) * 3 * C + C + i] *= 3.f;
    att_fwd(&c);
    float *dq = xcalloc(nq, 4);
    attention_backward(dq, c.p.r, c.qkv, c.p.out, c.lse, c.B, c.off, c.NH, c.hs);
    const size_t from = ((size_t)(B - 1) * T + fd_from) * 3 * C;
    double e = fd_error(&c.p, c.qkv + from, nq - from, dq + from, 1e-2f);
    if (e >= FD_TOL) printf("\n  attention B=%d T=%d: relative error %g\n", B, T, e);
    CU_ASSERT(e < FD_TOL);
    free(c.qkv), free(c.lse), free(c.p.out), free(c.p.r), free(dq);
}

/* Tiles (attention.c's tile_shape): 128 queries x 256 keys up to T 256,
 * 256 x 512 beyond. */
static void test_attention_backward(void) {
    check_attention_backward(2, 5, 2, 3, 0, 0);   /* one partial tile of queries and keys */
    check_attention_backward(1, 70, 2, 2, 0, 0);  /* one query tile of 128, partial */
    check_attention_backward(1, 260, 1, 1, 0, 0); /* two query tiles (256 and 4), one key tile */
    /* three query tiles and two key tiles: the online softmax rescales the
     * output as the second key tile raises a row's maximum, and dK, dV
     * gather over the query tiles (rows 400 on: the second query tile's
     * last and the third, keys in both key tiles) */
    check_attention_backward(1, 600, 1, 1, 512, 400);
}

/* max |a - b| over max |b|: the error relative to the reference's scale */
static double scaled_err(const float *a, const float *b, size_t n) {
    double worst = 0, big = 1e-30;
    for (size_t i = 0; i < n; i++) {
        worst = worse(worst, fabs((double)a[i] - b[i]));
        big = fmax(big, fabs((double)b[i]));
    }
    return worst / big;
}

/* The O(T) kernels against the kept ones that store the probabilities
 * (whose forward is checked against the double reference): outputs and
 * every gradient, on sequences of unequal lengths as routed blocks gather
 * them. */
static void check_attention_vs_full(int B, const int *off, int NH, int hs, uint64_t seed) {
    const int C = NH * hs, N = off[B];
    size_t nq = (size_t)N * 3 * C, no = (size_t)N * C, na = 0;
    for (int b = 0; b < B; b++) na += (size_t)NH * (off[b + 1] - off[b]) * (off[b + 1] - off[b]);
    float *qkv = xmalloc(nq * 4), *dy = xmalloc(no * 4), *lse = xmalloc((size_t)N * NH * 4);
    float *o1 = xmalloc(no * 4), *o2 = xmalloc(no * 4), *att = xmalloc(na * 4);
    float *d1 = xmalloc(nq * 4), *d2 = xmalloc(nq * 4);
    fill_normal(qkv, nq, seed, 1), fill_normal(dy, no, seed + 1, 1);
    attention_forward(o1, lse, qkv, B, off, NH, hs);
    attention_forward_full(o2, att, qkv, B, off, NH, hs);
    attention_backward(d1, dy, qkv, o1, lse, B, off, NH, hs);
    attention_backward_full(d2, dy, qkv, att, B, off, NH, hs);
    double eo = scaled_err(o1, o2, no), ed = scaled_err(d1, d2, nq);
    if (eo > 1e-5 || ed > 1e-4)
        printf("\n  attention vs full, N=%d hs=%d: output %g, gradient %g\n", N, hs, eo, ed);
    CU_ASSERT(eo < 1e-5);
    CU_ASSERT(ed < 1e-4);
    /* the same bits on 1 thread as on 2 (which cut a single head into parts),
     * NaNs where nothing writes */
    const size_t nl = (size_t)N * NH;
    float *o3 = xmalloc(no * 4), *d3 = xmalloc(nq * 4), *l2 = xmalloc(nl * 4),
          *l3 = xmalloc(nl * 4);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(nt == 1 ? 2 : 1);
    memset(o2, 0xff, no * 4), memset(d2, 0xff, nq * 4), memset(l2, 0xff, nl * 4);
    attention_forward(o2, l2, qkv, B, off, NH, hs);
    attention_backward(d2, dy, qkv, o2, l2, B, off, NH, hs);
    omp_set_num_threads(nt);
    CU_ASSERT(memcmp(o1, o2, no * 4) == 0 && memcmp(d1, d2, nq * 4) == 0 &&
              memcmp(lse, l2, nl * 4) == 0);
    /* heads cut into parts of rows (the backward in two passes) or whole,
     * whatever the threads would choose: the same bits, with the
     * micro-kernel storing C either way (its blocks fall otherwise) */
    for (int orient = -1; orient <= 1; orient++) {
        mm_tile_orientation(orient);
        for (int parts = 0; parts < 2; parts++) {
            float *o = parts ? o3 : o2, *d = parts ? d3 : d2, *l = parts ? l3 : l2;
            attention_set_parts(parts);
            /* NaNs where nothing writes */
            memset(o, 0xff, no * 4), memset(d, 0xff, nq * 4), memset(l, 0xff, nl * 4);
            attention_forward(o, l, qkv, B, off, NH, hs);
            attention_backward(d, dy, qkv, o, l, B, off, NH, hs);
        }
        CU_ASSERT(memcmp(o2, o3, no * 4) == 0 && memcmp(d2, d3, nq * 4) == 0);
        CU_ASSERT(memcmp(l2, l3, nl * 4) == 0);
        if (orient < 0)
            CU_ASSERT(memcmp(o1, o3, no * 4) == 0 && memcmp(d1, d3, nq * 4) == 0 &&
                      memcmp(lse, l3, nl * 4) == 0);
    }
    mm_tile_orientation(-1);
    attention_set_parts(-1);
    free(o3), free(d3), free(l2), free(l3);
    /* the log-sum-exp is that of the scaled scores: check a row directly */
    const int last = off[B] - 1, b = B - 1, T = off[b + 1] - off[b];
    if (T > 0) {
        double mx = -INFINITY, sum = 0, sc = 1.0 / sqrt((double)hs);
        const float *q = qkv + (size_t)last * 3 * C, *base = qkv + (size_t)off[b] * 3 * C + C;
        for (int pass = 0; pass < 2; pass++)
            for (int j = 0; j < T; j++) {
                double sj = 0;
                for (int i = 0; i < hs; i++) sj += (double)q[i] * base[(size_t)j * 3 * C + i];
                if (pass == 0) mx = fmax(mx, sj * sc);
                else sum += exp(sj * sc - mx);
            }
        CU_ASSERT(fabs(lse[(size_t)off[b] * NH + T - 1] - (mx + log(sum))) < 1e-4);
    }
    free(qkv), free(dy), free(lse), free(o1), free(o2), free(att), free(d1), free(d2);
}

static void test_attention_matches_full(void) {
    /* T from 1 to 2048, odd sizes around the tiles (128 x 256 up to T 256,
     * 256 x 512 beyond) and the small tiles' loops (T 17 and 32), head
     * sizes 32 to 128 */
    const int lens[][3] = {{1, 32, 1},   {17, 64, 2},   {32, 32, 1},  {63, 32, 2}, {65, 64, 1},
                           {257, 64, 2}, {300, 128, 1}, {513, 96, 1}, {2048, 64, 1}};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        const int off[] = {0, lens[i][0]};
        check_attention_vs_full(1, off, lens[i][2], lens[i][1], 10 + i);
    }
    /* unequal lengths, one empty, one of a single row, one of 20 */
    const int off[] = {0, 150, 150, 187, 188, 700, 720};
    check_attention_vs_full(6, off, 2, 32, 20);
}

/* kernels_thread_bytes, which plan and train count for each thread, is what
 * a thread's buffers reach: attention at its largest tiles (T 2048), then
 * an own_gemm product, on a thread of its own (the suite's have run
 * everything). */
static void *thread_buffers(void *arg) {
    size_t *got = arg;
    const int T = 2048, hs = 128, N = T, C = hs, off[] = {0, T};
    const size_t nq = (size_t)N * 3 * C, no = (size_t)N * C;
    float *qkv = xmalloc(nq * 4), *dy = xmalloc(no * 4), *o = xmalloc(no * 4);
    float *dq = xmalloc(nq * 4), *lse = xmalloc((size_t)N * 4);
    fill_normal(qkv, nq, 91, 1), fill_normal(dy, no, 92, 1);
    omp_set_num_threads(1); /* this thread's own: no team of its own to leak */
    got[0] = kernels_scratch_bytes();
    attention_forward(o, lse, qkv, 1, off, 1, hs);
    attention_backward(dq, dy, qkv, o, lse, 1, off, 1, hs);
    got[1] = kernels_scratch_bytes();
    mm(0, 0, 300, 300, 300, 1.f, dq, 300, dq + 90000, 300, 0.f, qkv, 300);
    got[2] = kernels_scratch_bytes();
    free(qkv), free(dy), free(o), free(dq), free(lse);
    return NULL;
}

static void test_thread_bytes(void) {
    size_t got[3];
    pthread_t t;
    const int nt = kernels_threads();
    kernels_set_threads(1); /* own_gemm's product on the calling thread alone */
    CU_ASSERT_FATAL(pthread_create(&t, NULL, thread_buffers, got) == 0);
    pthread_join(t, NULL);
    kernels_set_threads(nt);
    const size_t att = attention_thread_bytes(128), bound = kernels_thread_bytes(128);
    CU_ASSERT_EQUAL(got[0], 0);
    /* attention's largest tile products pack within the micro-panels'
     * rounding of the bound (which takes either storage of C) */
    CU_ASSERT(got[1] <= att && got[1] >= att - att / 20);
    CU_ASSERT_EQUAL(got[2], bound); /* both slots at their largest */
    if (got[1] > att || got[1] < att - att / 20 || got[2] != bound)
        printf("\n  thread buffers: %zu bytes after attention (bound %zu), %zu with a product "
               "(bound %zu)\n",
               got[1], att, got[2], bound);
}

static void test_attention_matches_reference(void) {
    /* the kept blocked kernel against the slow, obvious one: sequences of
     * unequal lengths (as routed blocks gather them), one empty, one over 2
     * blocks */
    const int B = 4, NH = 2, hs = 8, C = NH * hs;
    const int off[] = {0, 150, 150, 187, 188};
    const int N = off[B];
    size_t nq = (size_t)N * 3 * C, no = (size_t)N * C, na = 0;
    for (int b = 0; b < B; b++) na += (size_t)NH * (off[b + 1] - off[b]) * (off[b + 1] - off[b]);
    float *qkv = xmalloc(nq * 4), *o1 = xmalloc(no * 4), *o2 = xmalloc(no * 4);
    float *a1 = xmalloc(na * 4), *a2 = xmalloc(na * 4), *lse = xmalloc((size_t)N * NH * 4);
    fill_normal(qkv, nq, 3, 1);
    attention_forward_full(o1, a1, qkv, B, off, NH, hs);
    attention_forward_ref(o2, a2, qkv, B, off, NH, hs);
    double worst = 0;
    for (size_t i = 0; i < no; i++) worst = worse(worst, fabs(o1[i] - o2[i]));
    for (size_t i = 0; i < na; i++) worst = worse(worst, fabs(a1[i] - a2[i]));
    CU_ASSERT(worst < 1e-5);
    /* a sequence alone gives what it gives among the others */
    attention_forward(o1, lse, qkv, B, off, NH, hs);
    float *o3 = xmalloc(37 * C * 4), *l3 = xmalloc((size_t)NH * 37 * 4);
    const int one[] = {0, 37};
    attention_forward(o3, l3, qkv + (size_t)150 * 3 * C, 1, one, NH, hs);
    CU_ASSERT(memcmp(o3, o1 + (size_t)150 * C, 37 * C * 4) == 0);
    free(qkv), free(o1), free(o2), free(a1), free(a2), free(o3), free(l3), free(lse);
}

static void test_attention_decode_matches_full(void) {
    /* one query against a cache equals the last row of the full forward */
    const int T = 70, NH = 2, hs = 4, C = NH * hs;
    float *qkv = xmalloc((size_t)T * 3 * C * 4), *full = xmalloc((size_t)T * C * 4);
    float *lse = xmalloc((size_t)NH * T * 4), *kc = xmalloc((size_t)T * C * 4);
    float *vc = xmalloc((size_t)T * C * 4), *y = xmalloc(C * 4), *p = xmalloc(T * 4);
    fill_normal(qkv, (size_t)T * 3 * C, 4, 1);
    const int off[] = {0, T};
    attention_forward(full, lse, qkv, 1, off, NH, hs);
    for (int t = 0; t < T; t++) {
        memcpy(kc + (size_t)t * C, qkv + (size_t)t * 3 * C + C, C * 4);
        memcpy(vc + (size_t)t * C, qkv + (size_t)t * 3 * C + 2 * C, C * 4);
    }
    double worst = 0;
    for (int t = 0; t < T; t++) {
        attention_decode(y, p, qkv + (size_t)t * 3 * C, kc, vc, t + 1, NH, NH, hs, C);
        for (int i = 0; i < C; i++) worst = worse(worst, fabs(y[i] - full[(size_t)t * C + i]));
    }
    CU_ASSERT(worst < 1e-5);
    free(qkv), free(full), free(lse), free(kc), free(vc), free(y), free(p);
}

static void test_attention_is_causal(void) {
    /* changing position t's q, k and v leaves outputs before t unchanged,
     * also across tiles: position 290 of 300 against the rows before it */
    const int B = 1, T = 300, NH = 2, hs = 4, C3 = 3 * NH * hs, t = 290;
    float *qkv = xmalloc(T * C3 * 4), *lse = xmalloc(NH * T * 4);
    float *o1 = xmalloc(T * NH * hs * 4), *o2 = xmalloc(T * NH * hs * 4);
    fill_normal(qkv, (size_t)T * C3, 5, 1);
    const int off[] = {0, T};
    attention_forward(o1, lse, qkv, B, off, NH, hs);
    for (int j = 0; j < C3; j++) qkv[t * C3 + j] += 1.f;
    attention_forward(o2, lse, qkv, B, off, NH, hs);
    CU_ASSERT(memcmp(o1, o2, (size_t)t * NH * hs * 4) == 0);
    CU_ASSERT(memcmp(o1 + t * NH * hs, o2 + t * NH * hs, NH * hs * 4) != 0);
    free(qkv), free(lse), free(o1), free(o2);
}

/* embeddings */
static void test_embedding_backward(void) {
    const int N = 6, C = 3, V = 5, T = 3, B = 2;
    int tok[] = {1, 4, 1, 0, 3, 1};
    float wte[15], wpe[9], out[18], r[18], dwte[15] = {0}, dwpe[9] = {0};
    fill_normal(wte, 15, 1, 1), fill_normal(wpe, 9, 2, 1), fill_normal(r, 18, 3, 1);
    embed_forward(out, tok, wte, 0, V, N, C);
    pos_forward(out, wpe, B, T, C);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++)
            CU_ASSERT_DOUBLE_EQUAL(out[i * C + c], wte[tok[i] * C + c] + wpe[(i % T) * C + c],
                                   1e-6);
    embed_backward(dwte, r, tok, 0, V, N, C);
    pos_backward(dwpe, r, B, T, C);
    /* token 1 appears at rows 0, 2, 5 */
    for (int c = 0; c < C; c++) {
        CU_ASSERT_DOUBLE_EQUAL(dwte[1 * C + c], r[0 * C + c] + r[2 * C + c] + r[5 * C + c], 1e-6);
        CU_ASSERT_DOUBLE_EQUAL(dwte[2 * C + c], 0, 0);
        CU_ASSERT_DOUBLE_EQUAL(dwpe[1 * C + c], r[1 * C + c] + r[4 * C + c], 1e-6);
    }
    /* vocab-parallel slice [3, 5): only tokens 3 and 4 are looked up */
    float part[18];
    embed_forward(part, tok, wte + 3 * C, 3, 2, N, C);
    CU_ASSERT_EQUAL(part[0], 0.f);
    CU_ASSERT_EQUAL(part[1 * C], wte[4 * C]);
}

/* The fused elementwise kernels against the plain ones and the plain loops
 * (in double) kept as references: layer norm forward and backward (N = 130
 * rows, not a multiple of the backward's blocks of 64; C = 77), the same
 * bits on 1 and 2 threads; the _set variants equal zeroing then adding (the
 * GELU's within rounding); the
 * fused bias + residual + layer norm and bias + GELU equal their parts (the
 * GELU within a float's rounding). */
static int same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof *a); }

static float max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = worse(d, fabsf(a[i] - b[i]));
    return (float)d;
}

static void test_fused_elementwise(void) {
    const int N = 130, C = 77, F = 4 * 77;
    const size_t NC = (size_t)N * C, NF = (size_t)N * F;
    float *x = xmalloc(NC * 4), *a = xmalloc(NC * 4), *dy = xmalloc(NC * 4), *w = xmalloc(C * 4),
          *b = xmalloc(C * 4), *bias = xmalloc(F * 4);
    fill_normal(x, NC, 1, 1.f), fill_normal(a, NC, 2, 1.f), fill_normal(dy, NC, 3, 1.f);
    fill_normal(w, C, 4, 1.f), fill_normal(b, C, 5, 1.f), fill_normal(bias, F, 6, 1.f);
    float *o1 = xmalloc(NC * 4), *o2 = xmalloc(NC * 4), m1[130], m2[130], r1[130], r2[130];
    /* forward: the reference in double */
    layernorm_forward(o1, m1, r1, x, w, b, N, C);
    layernorm_forward_ref(o2, m2, r2, x, w, b, N, C);
    CU_ASSERT(max_diff(o1, o2, NC) < 1e-5f && max_diff(r1, r2, N) < 1e-5f);
    /* backward: the reference, and 1 thread against 2 */
    float *dx1 = xcalloc(NC, 4), *dx2 = xcalloc(NC, 4), *dx3 = xcalloc(NC, 4);
    float *g1 = xcalloc(2 * C, 4), *g2 = xcalloc(2 * C, 4), *g3 = xcalloc(2 * C, 4);
    fill_normal(dx1, NC, 7, 1.f);
    memcpy(dx2, dx1, NC * 4), memcpy(dx3, dx1, NC * 4);
    const int nt = omp_get_max_threads(); /* 2 threads against 1, then the suite's */
    omp_set_num_threads(2);
    layernorm_backward(dx1, g1, g1 + C, dy, x, w, m1, r1, N, C);
    layernorm_backward_ref(dx2, g2, g2 + C, dy, x, w, m1, r1, N, C);
    CU_ASSERT(max_diff(dx1, dx2, NC) < 1e-4f && max_diff(g1, g2, 2 * (size_t)C) < 1e-3f);
    omp_set_num_threads(1);
    layernorm_backward(dx3, g3, g3 + C, dy, x, w, m1, r1, N, C);
    omp_set_num_threads(nt);
    CU_ASSERT(same(dx1, dx3, NC) && same(g1, g3, 2 * (size_t)C));
    /* _set = zero, then add */
    memset(dx2, 0, NC * 4), memset(g2, 0, 2 * C * 4), memset(g3, 0, 2 * C * 4);
    fill_normal(dx3, NC, 8, 1.f); /* overwritten */
    layernorm_backward(dx2, g2, g2 + C, dy, x, w, m1, r1, N, C);
    layernorm_backward_set(dx3, g3, g3 + C, dy, x, w, m1, r1, N, C);
    CU_ASSERT(same(dx2, dx3, NC) && same(g2, g3, 2 * (size_t)C));
    /* bias + residual + layer norm = its three parts */
    float *a1 = xmalloc(NC * 4), *a2 = xmalloc(NC * 4), *res1 = xmalloc(NC * 4),
          *res2 = xmalloc(NC * 4);
    memcpy(a1, a, NC * 4), memcpy(a2, a, NC * 4);
    bias_residual_layernorm_forward(a1, res1, o1, m1, r1, x, bias, w, b, N, C);
    bias_add(a2, bias, N, C);
    residual_forward(res2, x, a2, NC);
    layernorm_forward(o2, m2, r2, res2, w, b, N, C);
    CU_ASSERT(same(a1, a2, NC) && same(res1, res2, NC) && same(o1, o2, NC) && same(m1, m2, N) &&
              same(r1, r2, N));
    /* bias + GELU = its parts; gelu_backward_set = zero, then add */
    float *p1 = xmalloc(NF * 4), *p2 = xmalloc(NF * 4), *q1 = xmalloc(NF * 4),
          *q2 = xmalloc(NF * 4), *dg = xmalloc(NF * 4);
    fill_normal(p1, NF, 9, 2.f), fill_normal(dg, NF, 10, 1.f);
    memcpy(p2, p1, NF * 4);
    bias_gelu_forward(p1, q1, bias, N, F);
    bias_add(p2, bias, N, F);
    gelu_forward(q2, p2, NF);
    /* (within rounding: the compiler may contract a row's tail into FMAs
     * differently from a flat loop's) */
    CU_ASSERT(same(p1, p2, NF) && max_diff(q1, q2, NF) < 1e-6f);
    memset(q1, 0, NF * 4);
    gelu_backward(q1, p1, dg, NF);
    gelu_backward_set(q2, p1, dg, NF);
    CU_ASSERT(max_diff(q1, q2, NF) < 1e-6f);
    /* the GELU's output again and its backward in one pass = gelu_forward
     * and gelu_backward_set, bit for bit (as gelu_with_grad then a multiply) */
    float *o3 = xmalloc(NF * 4), *d3 = xmalloc(NF * 4), *o4 = xmalloc(NF * 4),
          *d4 = xmalloc(NF * 4);
    gelu_with_backward(o3, d3, p1, dg, NF);
    gelu_forward(o4, p1, NF);
    CU_ASSERT(same(o3, o4, NF) && same(d3, q2, NF));
    gelu_with_grad(o4, d4, p1, NF);
    mul_inplace(d4, dg, NF);
    CU_ASSERT(same(o3, o4, NF) && same(d3, d4, NF));
    free(o3), free(d3), free(o4), free(d4);
    free(x), free(a), free(dy), free(w), free(b), free(bias), free(o1), free(o2);
    free(dx1), free(dx2), free(dx3), free(g1), free(g2), free(g3);
    free(a1), free(a2), free(res1), free(res2), free(p1), free(p2), free(q1), free(q2), free(dg);
}

/* linear_backward_set = zeroing dinp, then linear_backward. */
static void test_linear_backward_set(void) {
    const int N = 33, C = 19, OC = 27;
    float *inp = xmalloc((size_t)N * C * 4), *w = xmalloc((size_t)C * OC * 4),
          *dout = xmalloc((size_t)N * OC * 4);
    fill_normal(inp, (size_t)N * C, 1, 1.f), fill_normal(w, (size_t)C * OC, 2, 1.f);
    fill_normal(dout, (size_t)N * OC, 3, 1.f);
    float *d1 = xcalloc((size_t)N * C, 4), *d2 = xmalloc((size_t)N * C * 4);
    float *w1 = xcalloc((size_t)C * OC + OC, 4), *w2 = xcalloc((size_t)C * OC + OC, 4);
    fill_normal(d2, (size_t)N * C, 4, 1.f);
    linear_backward(d1, w1, w1 + C * OC, dout, inp, w, N, C, OC);
    linear_backward_set(d2, w2, w2 + C * OC, dout, inp, w, N, C, OC);
    CU_ASSERT(same(d1, d2, (size_t)N * C) && same(w1, w2, (size_t)C * OC + OC));
    free(inp), free(w), free(dout), free(d1), free(d2), free(w1), free(w2);
}

/* mm_colsum: the product mm makes and bias_backward's column sums, bit
 * for bit, with C stored both ways and the threads splitting either side,
 * K past KC's blocks, and B's side packed in more than one block of NC
 * (6300 rows: 3150 a thread, NC 3072 for skx). */
static void test_mm_colsum(void) {
    const int sizes[][3] = {{37, 53, 29}, {33, 1000, 20}, {1000, 33, 20}, {35, 40, 800},
                            {6300, 9, 3}, {9, 6300, 3},   {1, 1, 1}};
    for (int orient = -1; orient <= 1; orient++) {
        mm_tile_orientation(orient);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
            for (int ta = 0; ta < 2; ta++) {
                const int M = sizes[k][0], N = sizes[k][1], K = sizes[k][2], lda = ta ? M : K;
                float *A = xmalloc((size_t)M * K * 4), *B = xmalloc((size_t)K * N * 4),
                      *C1 = xmalloc((size_t)M * N * 4), *C2 = xmalloc((size_t)M * N * 4),
                      *s1 = xmalloc((size_t)N * 4), *s2 = xmalloc((size_t)N * 4);
                fill_normal(A, (size_t)M * K, 21, 1.f), fill_normal(B, (size_t)K * N, 22, 1.f);
                fill_normal(C1, (size_t)M * N, 23, 1.f), fill_normal(s1, (size_t)N, 24, 1.f);
                memcpy(C2, C1, (size_t)M * N * 4), memcpy(s2, s1, (size_t)N * 4);
                mm_colsum(ta, M, N, K, 0.7f, A, lda, B, N, 1.3f, C1, N, s1);
                mm(ta, 0, M, N, K, 0.7f, A, lda, B, N, 1.3f, C2, N);
                bias_backward(s2, B, K, N);
                CU_ASSERT(same(C1, C2, (size_t)M * N));
                CU_ASSERT(same(s1, s2, (size_t)N));
                if (!same(s1, s2, (size_t)N))
                    printf("\n  mm_colsum %dx%dx%d ta=%d orient=%d: sums differ\n", M, N, K, ta,
                           orient);
                free(A), free(B), free(C1), free(C2), free(s1), free(s2);
            }
    }
    mm_tile_orientation(-1);
}

/* The bias gradient: column sums within rounding of the double reference,
 * added to what was there, and the same bits on one thread as on two. */
static void test_bias_backward(void) {
    const int sizes[][2] = {{1, 1}, {7, 5}, {300, 37}, {64, 1000}, {2048, 272}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const int N = sizes[k][0], OC = sizes[k][1];
        float *dout = xmalloc((size_t)N * OC * 4), *d1 = xmalloc((size_t)OC * 4),
              *d2 = xmalloc((size_t)OC * 4), *ref = xmalloc((size_t)OC * 4);
        fill_normal(dout, (size_t)N * OC, 11 + k, 1.f), fill_normal(ref, (size_t)OC, 12 + k, 1.f);
        memcpy(d1, ref, (size_t)OC * 4), memcpy(d2, ref, (size_t)OC * 4);
        bias_backward_ref(ref, dout, N, OC);
        const int nt = omp_get_max_threads(); /* 2 threads against 1, then the suite's */
        omp_set_num_threads(2);
        bias_backward(d1, dout, N, OC);
        double worst = 0;
        for (int c = 0; c < OC; c++) {
            const double e = fabs((double)d1[c] - ref[c]) / (1 + sqrt((double)N));
            worst = worse(worst, e);
        }
        CU_ASSERT(worst < 1e-5);
        omp_set_num_threads(1);
        bias_backward(d2, dout, N, OC);
        omp_set_num_threads(nt);
        CU_ASSERT(same(d1, d2, (size_t)OC));
        free(dout), free(d1), free(d2), free(ref);
    }
}

int main(void) {
    test_threads_lock();
    kernels_init(2, "auto");
    CU_TestInfo tests[] = {
        {"BLIS sgemm matches the naive reference (all transposes, beta, strides)",
         test_mm_matches_reference},
        {"the reference is a matrix product", test_mm_reference_is_a_product},
        {"own packing on BLIS's micro-kernel matches the reference across cache blocks",
         test_own_gemm_matches_reference},
        {"mm_colsum: mm's product and bias_backward's column sums, bit for bit", test_mm_colsum},
        {"skx, haswell: products read in place = packed, bit for bit", test_inplace_same_bits},
        {"tile products on BLIS's micro-kernel match the reference (masks, storages)",
         test_mm_tile_matches_reference},
        {"BLIS matrix-vector products and rank-1 updates match the reference",
         test_mv_rank1_match_reference},
        {"linear backward = finite differences", test_linear_backward},
        {"layernorm backward = finite differences", test_layernorm_backward},
        {"gelu backward = finite differences", test_gelu_backward},
        {"gelu and its derivative = the formula in double", test_gelu_matches_formula},
        {"attention backward = finite differences", test_attention_backward},
        {"attention in O(T) = the kept full kernels", test_attention_matches_full},
        {"blocked attention matches the reference kernel, unequal lengths",
         test_attention_matches_reference},
        {"one-query attention on a cache = the full forward", test_attention_decode_matches_full},
        {"attention is causal", test_attention_is_causal},
        {"a thread's buffers reach kernels_thread_bytes", test_thread_bytes},
        {"embedding lookup and backward", test_embedding_backward},
        {"fused layer norm, residual, bias and GELU = the plain kernels and loops",
         test_fused_elementwise},
        {"linear backward overwriting = zeroing, then adding", test_linear_backward_set},
        {"bias gradient = the double reference, the same bits on 1 and 2 threads",
         test_bias_backward},
        CU_TEST_INFO_NULL};
    return run_suite_each_vec("kernels", tests, kernels_vec_level(), kernels_set_vec_level,
                              kernels_threads(), kernels_set_threads);
}
