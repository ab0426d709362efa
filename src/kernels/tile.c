/*
 * tile: attention's tile products (mm_tile) on BLIS's micro-kernel, with
 * both operands packed here and the blocks and k ranges a causal mask
 * makes zero skipped.
 */
#include "src/kernels/kernels.h"

#include <blis.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "src/kernels/gemm_impl.h"
#include "src/kernels/kernels_impl.h"

/* ------------------------------------- tile products on BLIS's micro-kernel
 *
 * Attention's tiles are small (a head of 32 makes K = 32) and many: a
 * bli_sgemm_ex call spends more on its control tree, its pack buffers and
 * its edge logic than on such a product. mm_tile packs both operands into
 * BLIS's micro-panels itself and calls BLIS's own micro-kernel for the
 * configuration in use (skx's 32 x 12, haswell's 6 x 16, ...) on each
 * MR x NR block of C, skipping the blocks and the k ranges a causal mask
 * makes zero. */

int mm_tile_granule(void) {
    pthread_once(&g_ukr_once, ukr_init);
    int a = g_ukr.mr, b = g_ukr.nr;
    while (b) {
        const int t = a % b;
        a = b, b = t;
    }
    return g_ukr.mr / a * g_ukr.nr;
}

/* op(A)'s panels of R rows and op(B)'s of S over K, each at 64 bytes */
static size_t tile_pack_floats(int M, int N, int K, int R, int S) {
    return ((size_t)(M + R - 1) / R * R * K + 15) / 16 * 16 +
           ((size_t)(N + S - 1) / S * S * K + 15) / 16 * 16;
}

size_t mm_tile_pack_floats(int M, int N, int K) {
    pthread_once(&g_ukr_once, ukr_init);
    const size_t a = tile_pack_floats(M, N, K, g_ukr.mr, g_ukr.nr),
                 b = tile_pack_floats(M, N, K, g_ukr.nr, g_ukr.mr);
    return a > b ? a : b;
}

void mm_tile(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc, int mask, int d) {
    if (M <= 0 || N <= 0) return;
    /* A's skipped entries next to the diagonal hold zeros */
    const int zeroed = mask == MASK_K_UPTO0 || mask == MASK_K_FROM0;
    if (zeroed) mask = mask == MASK_K_UPTO0 ? MASK_K_UPTO : MASK_K_FROM;
    pthread_once(&g_ukr_once, ukr_init);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* The micro-kernel's view of C: C itself (op(A)'s rows in panels of
     * MR, op(B)'s in panels of NR) for a kernel preferring rows; C^T = op(B)
     * op(A)^T (op(A) in panels of NR) for one preferring columns. */
    const int rp = g_orient >= 0 ? g_orient : g_ukr.row_pref;
    const int RA = rp ? g_ukr.mr : g_ukr.nr, RB = rp ? g_ukr.nr : g_ukr.mr;
    /* op(A) (M,K) and op(B) (N,K)^T: each one's strides along its rows and along K */
    const size_t rsa = ta ? 1 : (size_t)lda, csa = ta ? (size_t)lda : 1;
    const size_t rsb = tb ? (size_t)ldb : 1, csb = tb ? 1 : (size_t)ldb;
    /* each side's panels at 64 bytes (BLIS's kernels load the vector side
     * aligned) */
    const size_t nb = ((size_t)(N + RB - 1) / RB * RB * K + 15) / 16 * 16;
    float *bp = kernels_scratch(SCRATCH_PACK, tile_pack_floats(M, N, K, RA, RB)), *ap = bp + nb;
    pack_block(N, K, B, rsb, csb, RB, bp);
    /* op(A), the kernel's broadcast side in its preferred view: read in
     * place where unmasked or its skipped entries zeros (see blocked_part),
     * by rows where contiguous along K, else by columns; or packed, under
     * K_UPTO or K_FROM by the mask */
    const int masked = mask == MASK_K_UPTO || mask == MASK_K_FROM;
    const int inplace = (inplace_on() & KERNELS_INPLACE_TILE) && rp == g_ukr.row_pref &&
                        (!masked || zeroed) && K <= INPLACE_KC_MAX && RA <= MASK_ZERO_TAIL;
    if (!inplace && masked) pack_masked(M, K, A, rsa, csa, RA, ap, mask, d);
    else if (!inplace) pack_block(M, K, A, rsa, csa, RA, ap);
    auxinfo_t aux;
    memset(&aux, 0, sizeof aux);
    for (int i0 = 0; i0 < M; i0 += RA) {
        const int m = M - i0 < RA ? M - i0 : RA;
        const float *ar = A + (size_t)i0 * rsa;
        int packed = !inplace; /* ap's panel i0 holds op(A)'s rows */
        for (int j0 = 0; j0 < N; j0 += RB) {
            const int n = N - j0 < RB ? N - j0 : RB;
            int klo, khi;
            if (!mask_range(mask, d, K, i0, i0 + m, j0, &klo, &khi)) continue;
            float *c = C + (size_t)i0 * ldc + j0;
            if (khi <= klo) {
                for (int a = 0; a < m; a++)
                    for (int b = 0; b < n; b++) {
                        float *e = c + (size_t)a * ldc + b;
                        *e = beta == 0.f ? 0.f : beta * *e;
                    }
                continue;
            }
            const float *b = bp + (size_t)j0 * K + (size_t)klo * RB;
            if (inplace && m == RA && n == RB) {
                ukr_inplace(khi - klo, alpha, b, ar + klo * csa, rsa, csa, beta, c, (size_t)ldc,
                            NULL);
                continue;
            }
            if (!packed) { /* an edge: BLIS's kernel on a packed panel, over the
                            * k its rows read (the zeros end there) */
                int plo, phi;
                mask_range(mask, d, K, i0, i0 + m, 0, &plo, &phi);
                pack_block(m, phi - plo, ar + plo * csa, rsa, csa, RA,
                           ap + (size_t)i0 * K + (size_t)plo * RA);
                packed = 1;
            }
            float *a = ap + (size_t)i0 * K + (size_t)klo * RA;
            aux.a_next = rp ? a : (float *)b;
            aux.b_next = rp ? (float *)b : a;
            if (rp)
                g_ukr.f(m, n, khi - klo, &alpha, a, (float *)b, &beta, c, ldc, 1, &aux, g_ukr.cntx);
            else
                g_ukr.f(n, m, khi - klo, &alpha, (float *)b, a, &beta, c, 1, ldc, &aux, g_ukr.cntx);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    count_ns(t0, t1);
}
