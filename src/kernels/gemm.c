/*
 * gemm: the products (mm, mm1, mm_colsum) on our own packing and split
 * between the threads or on bli_sgemm_ex, BLIS's level-2 products, the
 * linear layer on them, the reference product and the peak measured.
 */
#include "src/kernels/kernels.h"

#include <blis.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/base/util.h"
#include "src/kernels/gemm_impl.h"
#include "src/kernels/kernels_impl.h"

static void blis_gemm(int nt, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                      int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    inc_t rsa = ta ? 1 : lda, csa = ta ? lda : 1;
    inc_t rsb = tb ? 1 : ldb, csb = tb ? ldb : 1;
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(nt, &rntm);
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, M, N, K, &alpha, (float *)A, rsa, csa,
                 (float *)B, rsb, csb, &beta, C, ldc, 1, NULL, &rntm);
}

static int g_gemm_own = 1; /* config gemm: 1 = own_gemm, 0 = bli_sgemm_ex */

void kernels_set_gemm(int own) { g_gemm_own = own; }

static void own_gemm(int nt, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc, float *sum_b);

/* The product on own_gemm or BLIS, timed; with sum_b (own_gemm only), also
 * op(B)'s column sums into it (see mm_colsum). */
static void gemm_timed(int own, int nt, int ta, int tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc, float *sum_b) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        /* BLIS treats k = 0 as C = beta * C; keep that explicit. */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] = beta == 0.f ? 0.f : beta * C[(size_t)i * ldc + j];
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (own) own_gemm(nt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, sum_b);
    else blis_gemm(nt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    count_ns(t0, t1);
}

void mm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
        int ldb, float beta, float *C, int ldc) {
    gemm_timed(g_gemm_own, g_threads, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

void mm_colsum(int ta, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
               int ldb, float beta, float *C, int ldc, float *sum_b) {
    if (!g_gemm_own || M <= 0 || N <= 0 || K <= 0) {
        mm(ta, 0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        bias_backward(sum_b, B, K, N);
        return;
    }
    gemm_timed(1, g_threads, ta, 0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, sum_b);
}

void mm1(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
         int ldb, float beta, float *C, int ldc) {
    gemm_timed(0, 1, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

/* Matrix-vector products and rank-1 updates go to BLIS's level-2
 * operations: sgemm would pack the whole matrix to multiply it by one
 * column, reading it twice and writing it once for 2 flops an element. */
void mv(int ta, int M, int N, float alpha, const float *A, int lda, const float *x, float beta,
        float *y) {
    const int ny = ta ? N : M, nx = ta ? M : N;
    if (ny <= 0) return;
    if (nx <= 0) {
        for (int i = 0; i < ny; i++) y[i] = beta == 0.f ? 0.f : beta * y[i];
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bli_sgemv(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, BLIS_NO_CONJUGATE, M, N, &alpha, (float *)A,
              lda, 1, (float *)x, 1, &beta, y, 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    count_ns(t0, t1);
}

void rank1(int M, int N, float alpha, const float *x, const float *y, float *A, int lda) {
    if (M <= 0 || N <= 0) return;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bli_sger(BLIS_NO_CONJUGATE, BLIS_NO_CONJUGATE, M, N, &alpha, (float *)x, 1, (float *)y, 1, A,
             lda, 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    count_ns(t0, t1);
}

/* ------------------------------------------ large products, packed here
 *
 * C = alpha A B + beta C on BLIS's micro-kernel with our own packing and
 * our own split between the threads: each thread takes a fixed share of
 * the larger of C's two dimensions and packs its share of that operand
 * and all of the other (the smaller), so the threads never wait for each
 * other. */
static struct { int mc, kc, kc_max, nc; } g_blk;

static void blk_init(void) {
    pthread_once(&g_ukr_once, ukr_init);
    g_blk.mc = (int)bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_MC, g_ukr.cntx);
    g_blk.kc = (int)bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_KC, g_ukr.cntx);
    g_blk.kc_max = (int)bli_cntx_get_blksz_max_dt(BLIS_FLOAT, BLIS_KC, g_ukr.cntx);
    g_blk.nc = (int)bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_NC, g_ukr.cntx);
}
static pthread_once_t g_blk_once = PTHREAD_ONCE_INIT;

size_t gemm_pack_floats(void) {
    pthread_once(&g_blk_once, blk_init);
    return (size_t)(g_blk.nc + g_ukr.nr + g_blk.mc + g_ukr.mr) * (size_t)g_blk.kc_max;
}

/* The operands of one thread's part of a product, and where the column
 * sums of op(B) go (see mm_colsum): xsum[p] += X[p][k] over all k (NULL:
 * none), likewise ysum[q] += Y[k][q]; the thread that owns them packs that
 * side contiguous along it. */
typedef struct {
    const float *X, *Y;
    size_t rsx, csx, rsy, csy;
    float *xsum, *ysum;
} PartOps;

/* One thread's part: C' (P,Q) = X (P,K) Y (K,Q) for p in [p0, p1), q in
 * [q0, q1), C' at strides (rsz, csz). */
static void blocked_part(int p0, int p1, int q0, int q1, int K, float alpha, const PartOps *o,
                         float beta, float *C, size_t rsz, size_t csz) {
    const float *X = o->X, *Y = o->Y;
    const size_t rsx = o->rsx, csx = o->csx, rsy = o->rsy, csy = o->csy;
    const int MR = g_ukr.mr, NR = g_ukr.nr, MC = g_blk.mc, KC = g_blk.kc, NC = g_blk.nc;
    const int KM = g_blk.kc_max;
    float *yp = kernels_scratch(SCRATCH_PACK, gemm_pack_floats());
    float *xp = yp + (size_t)(NC + NR) * KM;
    /* Y contiguous along K, into C by columns: read in place on skx (not
     * by columns where Y is contiguous along Q: one cache line a k, and the
     * weights' gradient ran 1.3 times slower). haswell's broadcast side is
     * X, whose panels stream from L2 here: read in place, gemm_bench's
     * shapes ran 1% faster to 4% slower than packed, so they stay packed. */
    const int can_rows =
        (inplace_on() & KERNELS_INPLACE_GEMM) && rsy == 1 && csy != 1 && rsz == 1 && !o->ysum;
    auxinfo_t aux;
    memset(&aux, 0, sizeof aux);
    for (int jc = q0; jc < q1; jc += NC) {
        const int nq = q1 - jc < NC ? q1 - jc : NC;
        /* K in blocks of KC, the rest whole once it is at most KC's maximum:
         * BLIS's own partition, so each C element sums as bli_sgemm_ex does */
        for (int pc = 0, kc; pc < K; pc += kc) {
            kc = K - pc <= KM ? K - pc : KC;
            float b = pc == 0 ? beta : 1.f;
            /* Y (K,Q) packs as Y^T (Q,K), or is read in place */
            const float *yk = Y + (size_t)jc * csy + (size_t)pc * rsy;
            const int inplace = can_rows && kc <= INPLACE_KC_MAX;
            if (!inplace)
                pack_block_sum(nq, kc, yk, csy, rsy, NR, yp, o->ysum ? o->ysum + jc : NULL);
            for (int ic = p0; ic < p1; ic += MC) {
                const int mp = p1 - ic < MC ? p1 - ic : MC;
                /* X is packed again for each block of Q: summed on the first */
                float *xs = o->xsum && jc == q0 ? o->xsum + ic : NULL;
                pack_block_sum(mp, kc, X + (size_t)ic * rsx + (size_t)pc * csx, rsx, csx, MR, xp,
                               xs);
                for (int jr = 0; jr < nq; jr += NR) {
                    const int n = nq - jr < NR ? nq - jr : NR;
                    const float *yr = yk + (size_t)jr * csy;
                    int packed = !inplace; /* yp's panel jr holds Y's rows */
                    for (int ir = 0; ir < mp; ir += MR) {
                        const int m = mp - ir < MR ? mp - ir : MR;
                        float *a = xp + (size_t)ir * kc, *bb = yp + (size_t)jr * kc;
                        float *c = C + (size_t)(ic + ir) * rsz + (size_t)(jc + jr) * csz;
                        /* the tile the next call updates, while this one computes:
                         * C is read once per KC block, too rarely to be cached
                         * (the weights' gradient at 128 rows: 5.9 → 5.3 ms) */
                        if (ir + MR < mp) {
                            const float *cn = c + MR * rsz; /* runs of 32 floats at most */
                            const int runs = rsz == 1 ? n : MR;
                            const size_t step = rsz == 1 ? csz : rsz;
                            for (int j = 0; j < runs; j++) {
                                __builtin_prefetch(cn + (size_t)j * step, 0, 3);
                                __builtin_prefetch(cn + (size_t)j * step + 16, 0, 3);
                            }
                        }
                        if (inplace && m == MR && n == NR) {
                            /* the last block of a panel fetches the next panel's rows */
                            const float *next =
                                ir + MR >= mp && jr + NR < nq ? yr + NR * csy : NULL;
                            ukr_inplace(kc, alpha, a, yr, csy, 1, b, c, csz, next);
                            continue;
                        }
                        if (!packed) { /* an edge: BLIS's kernel on a packed panel */
                            pack_block(n, kc, yr, csy, rsy, NR, bb);
                            packed = 1;
                        }
                        aux.a_next = a;
                        aux.b_next = bb;
                        g_ukr.f(m, n, kc, &alpha, a, bb, &b, c, (inc_t)rsz, (inc_t)csz, &aux,
                                g_ukr.cntx);
                    }
                }
            }
        }
    }
}

static void own_gemm(int nt, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc,
                     float *sum_b) {
    pthread_once(&g_blk_once, blk_init);
    /* C' = X (P,K) Y (K,Q) in the micro-kernel's preferred storage, as in
     * mm_tile */
    const int rp = g_orient >= 0 ? g_orient : g_ukr.row_pref, MR = g_ukr.mr, NR = g_ukr.nr;
    const int P = rp ? M : N, Q = rp ? N : M;
    const float *X = rp ? A : B, *Y = rp ? B : A;
    const int tx = rp ? ta : !tb, ty = rp ? tb : !ta, ldx = rp ? lda : ldb, ldy = rp ? ldb : lda;
    const size_t rsz = rp ? (size_t)ldc : 1, csz = rp ? 1 : (size_t)ldc;
    const size_t rsx = tx ? 1 : (size_t)ldx, csx = tx ? (size_t)ldx : 1;
    const size_t rsy = ty ? 1 : (size_t)ldy, csy = ty ? (size_t)ldy : 1;
    /* the threads split the larger side, in whole micro-panels */
    const int split_p = P >= Q;
    /* op(B)'s column sums: B is X when C' is C^T, else Y, either way
     * contiguous along N (tb 0); each column sums its K rows in order from
     * zero, then joins sum_b, as bias_backward does */
    const int b_is_x = !rp, nsum = sum_b ? N : 0;
    float *acc = sum_b ? xcalloc((size_t)nsum, sizeof(float)) : NULL;
#pragma omp parallel num_threads(nt)
    {
        const int n = omp_get_num_threads(), t = omp_get_thread_num();
        const int u = split_p ? MR : NR, len = split_p ? P : Q, units = (len + u - 1) / u;
        const int lo = u * (int)((long)units * t / n);
        int hi = u * (int)((long)units * (t + 1) / n);
        hi = hi < len ? hi : len;
        if (lo < hi) {
            /* the sums are the split side's owners', else the first part's */
            float *mine = acc && (split_p == b_is_x || lo == 0) ? acc : NULL;
            PartOps o = {X, Y, rsx, csx, rsy, csy, b_is_x ? mine : NULL, b_is_x ? NULL : mine};
            if (split_p) blocked_part(lo, hi, 0, Q, K, alpha, &o, beta, C, rsz, csz);
            else blocked_part(0, P, lo, hi, K, alpha, &o, beta, C, rsz, csz);
        }
    }
    for (int j = 0; j < nsum; j++) sum_b[j] += acc[j];
    free(acc);
}

void mm_ref(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
            const float *B, int ldb, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                s += a * b;
            }
            float *c = &C[(size_t)i * ldc + j];
            *c = (float)(alpha * s + (beta == 0.f ? 0.0 : (double)beta * *c));
        }
}

double kernels_measure_peak_gflops(void) {
    const int n = 1024, k = 512;
    float *a = xmalloc((size_t)n * k * sizeof(float));
    float *b = xmalloc((size_t)k * n * sizeof(float));
    float *c = xmalloc((size_t)n * n * sizeof(float));
    for (size_t i = 0; i < (size_t)n * k; i++) a[i] = b[i] = (float)((i % 17) - 8) * 0.01f;
    mm(0, 0, n, n, k, 1.f, a, k, b, n, 0.f, c, n); /* warm-up: packs buffers, spins threads */
    /* the best of many short products spread over at least a fifth of a second,
     * with naps between rounds: a burst of outside load slows some of them,
     * rarely all */
    double best = 0;
    const double start = now_s();
    for (int rep = 0; rep < 400 && (rep < 6 || now_s() - start < 0.2); rep++) {
        if (rep % 4 == 3) {
            struct timespec nap = {0, 10 * 1000 * 1000};
            nanosleep(&nap, NULL);
        }
        double t0 = now_s();
        mm(0, 0, n, n, k, 1.f, a, k, b, n, 0.f, c, n);
        double dt = now_s() - t0;
        double g = 2.0 * n * n * k / dt * 1e-9;
        if (g > best) best = g;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

void linear_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                    int OC) {
    mm(0, 0, N, OC, C, 1.f, inp, C, w, OC, 0.f, out, OC);
    if (bias) bias_add(out, bias, N, OC);
}

static void linear_backward_beta(float *dinp, float beta, float *dw, float *dbias,
                                 const float *dout, const float *inp, const float *w, int N, int C,
                                 int OC) {
    if (dinp) mm(0, 1, N, C, OC, 1.f, dout, OC, w, OC, beta, dinp, C);
    /* the bias's gradient as dout is packed for the weights' */
    if (dw && dbias) mm_colsum(1, C, OC, N, 1.f, inp, C, dout, OC, 1.f, dw, OC, dbias);
    else if (dw) mm(1, 0, C, OC, N, 1.f, inp, C, dout, OC, 1.f, dw, OC);
}

void linear_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                     const float *w, int N, int C, int OC) {
    linear_backward_beta(dinp, 1.f, dw, dbias, dout, inp, w, N, C, OC);
}

void linear_backward_set(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, int N, int C, int OC) {
    linear_backward_beta(dinp, 0.f, dw, dbias, dout, inp, w, N, C, OC);
}
