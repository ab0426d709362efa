/*
 * pack: operands into the micro-kernel's panels (transposed in AVX
 * registers where their rows are contiguous along K), with column sums on
 * the way, or under a causal mask over only the k its calls read.
 */
#include "src/kernels/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <string.h>

#include "src/kernels/gemm_impl.h"
#include "src/kernels/kernels_impl.h"

/* out[k R + i] = x[i rs + k] for i < r, k < K: r rows, each contiguous
 * along k, into one panel (a transpose). */
static void pack_rows_base(int r, int K, const float *x, size_t rs, int R, float *o) {
    for (int i = 0; i < r; i++)
        for (int k = 0; k < K; k++) o[(size_t)k * R + i] = x[i * rs + k];
}

#if defined(__x86_64__) && defined(__GNUC__)
/* The same in 8 x 8 blocks transposed in AVX registers (a scalar
 * transpose was a third of attention's time at heads of 32). */
VEC_TARGET static void pack_rows_avx2(int r, int K, const float *x, size_t rs, int R, float *o) {
    int i = 0;
    for (; i + 8 <= r; i += 8) {
        const float *xi = x + i * rs;
        int k = 0;
        for (; k + 8 <= K; k += 8) {
            __m256 a[8], t[8], u[8];
            for (int j = 0; j < 8; j++) a[j] = _mm256_loadu_ps(xi + j * rs + k);
            for (int j = 0; j < 8; j += 2) {
                t[j] = _mm256_unpacklo_ps(a[j], a[j + 1]);
                t[j + 1] = _mm256_unpackhi_ps(a[j], a[j + 1]);
            }
            for (int j = 0; j < 8; j += 4) {
                u[j] = _mm256_shuffle_ps(t[j], t[j + 2], _MM_SHUFFLE(1, 0, 1, 0));
                u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], _MM_SHUFFLE(3, 2, 3, 2));
                u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], _MM_SHUFFLE(1, 0, 1, 0));
                u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            for (int j = 0; j < 4; j++) {
                _mm256_storeu_ps(o + (size_t)(k + j) * R + i,
                                 _mm256_permute2f128_ps(u[j], u[j + 4], 0x20));
                _mm256_storeu_ps(o + (size_t)(k + j + 4) * R + i,
                                 _mm256_permute2f128_ps(u[j], u[j + 4], 0x31));
            }
        }
        for (; k < K; k++)
            for (int j = 0; j < 8; j++) o[(size_t)k * R + i + j] = xi[j * rs + k];
    }
    /* 4 rows (skx's panels of 12 are 8 + 4) in 4 x 4 blocks */
    for (; i + 4 <= r; i += 4) {
        const float *xi = x + i * rs;
        int k = 0;
        for (; k + 4 <= K; k += 4) {
            __m128 a0 = _mm_loadu_ps(xi + k), a1 = _mm_loadu_ps(xi + rs + k);
            __m128 a2 = _mm_loadu_ps(xi + 2 * rs + k), a3 = _mm_loadu_ps(xi + 3 * rs + k);
            _MM_TRANSPOSE4_PS(a0, a1, a2, a3);
            _mm_storeu_ps(o + (size_t)k * R + i, a0);
            _mm_storeu_ps(o + (size_t)(k + 1) * R + i, a1);
            _mm_storeu_ps(o + (size_t)(k + 2) * R + i, a2);
            _mm_storeu_ps(o + (size_t)(k + 3) * R + i, a3);
        }
        for (; k < K; k++)
            for (int j = 0; j < 4; j++) o[(size_t)k * R + i + j] = xi[j * rs + k];
    }
    /* 2 rows (haswell's panels of 6 are 4 + 2; scalar, they took as long
     * as the 4) as pairs, 4 k at a time */
    for (; i + 2 <= r; i += 2) {
        const float *x0 = x + i * rs, *x1 = x0 + rs;
        int k = 0;
        for (; k + 4 <= K; k += 4) {
            const __m128 a0 = _mm_loadu_ps(x0 + k), a1 = _mm_loadu_ps(x1 + k);
            const __m128 lo = _mm_unpacklo_ps(a0, a1), hi = _mm_unpackhi_ps(a0, a1);
            _mm_storel_pi((__m64 *)(o + (size_t)k * R + i), lo);
            _mm_storeh_pi((__m64 *)(o + (size_t)(k + 1) * R + i), lo);
            _mm_storel_pi((__m64 *)(o + (size_t)(k + 2) * R + i), hi);
            _mm_storeh_pi((__m64 *)(o + (size_t)(k + 3) * R + i), hi);
        }
        for (; k < K; k++) {
            o[(size_t)k * R + i] = x0[k];
            o[(size_t)k * R + i + 1] = x1[k];
        }
    }
    if (i < r) pack_rows_base(r - i, K, x + i * rs, rs, R, o + i);
}

/* The same with AVX-512 in 16 x 16 blocks (skx's panels of 32 are two),
 * the rest of the rows by pack_rows_avx2. */
VEC_TARGET512 static void pack_rows_avx512(int r, int K, const float *x, size_t rs, int R,
                                           float *o) {
    int i = 0;
    for (; i + 16 <= r; i += 16) {
        const float *xi = x + i * rs;
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            __m512 a[16], t[16], u[16];
            for (int j = 0; j < 16; j++) a[j] = _mm512_loadu_ps(xi + j * rs + k);
            for (int j = 0; j < 16; j += 2) { /* pairs of rows, 32-bit interleaved */
                t[j] = _mm512_unpacklo_ps(a[j], a[j + 1]);
                t[j + 1] = _mm512_unpackhi_ps(a[j], a[j + 1]);
            }
            /* u[4g + c], lane L: rows 4g .. 4g + 3 of column 4L + c */
            for (int g = 0; g < 4; g++) {
                u[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
                u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
                u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
                u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
            }
            for (int c = 0; c < 4; c++) { /* column 4L + c gathers lane L of u[c + 4g] */
                const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
                const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
                const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
                const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
                _mm512_storeu_ps(o + (size_t)(k + c) * R + i, _mm512_shuffle_f32x4(v0, v2, 0x88));
                _mm512_storeu_ps(o + (size_t)(k + 4 + c) * R + i,
                                 _mm512_shuffle_f32x4(v1, v3, 0x88));
                _mm512_storeu_ps(o + (size_t)(k + 8 + c) * R + i,
                                 _mm512_shuffle_f32x4(v0, v2, 0xDD));
                _mm512_storeu_ps(o + (size_t)(k + 12 + c) * R + i,
                                 _mm512_shuffle_f32x4(v1, v3, 0xDD));
            }
        }
        if (k < K) pack_rows_avx2(16, K - k, xi + k, rs, R, o + (size_t)k * R + i);
    }
    if (i < r) pack_rows_avx2(r - i, K, x + i * rs, rs, R, o + i);
}
#endif

/* X (P,K) at strides (rsx, csx) into panels of R rows, each K columns of R
 * floats, the last panel's missing rows zero. */
static void pack_panels(int P, int K, const float *X, size_t rsx, size_t csx, int R, float *out) {
    for (int p0 = 0; p0 < P; p0 += R) {
        const int r = P - p0 < R ? P - p0 : R;
        float *o = out + (size_t)p0 * K;
        const float *x = X + (size_t)p0 * rsx;
        if (csx == 1) {
#if defined(__x86_64__) && defined(__GNUC__)
            if (kernels_avx512) pack_rows_avx512(r, K, x, rsx, R, o);
            else if (kernels_avx2) pack_rows_avx2(r, K, x, rsx, R, o);
            else
#endif
                pack_rows_base(r, K, x, rsx, R, o);
        } else {
            for (int k = 0; k < K; k++)
                for (int i = 0; i < r; i++) o[(size_t)k * R + i] = x[i * rsx + k * csx];
        }
        if (r < R)
            for (int k = 0; k < K; k++)
                for (int i = r; i < R; i++) o[(size_t)k * R + i] = 0.f;
    }
}

/* Whole panels' rows, R floats each, as copies of a constant size (a loop
 * of a variable count packed a 480-float row from memory at 1.4 cycles a
 * float, the copies at 0.64) */
#define COPY_PANEL_ROWS(RR)                                                  \
    case RR:                                                                 \
        for (; p0 + RR <= P; p0 += RR)                                       \
            memcpy(out + (size_t)p0 * K, x + p0, RR * sizeof(float));        \
        break

/* Row k of X (contiguous along P) into every panel: the P floats of a row
 * are read in order, R at a time into panel p's row k. */
VEC_IMPL pack_row_split_impl(int P, int K, const float *x, int R, float *out) {
    int p0 = 0;
    switch (R) {
        COPY_PANEL_ROWS(32);
        COPY_PANEL_ROWS(16);
        COPY_PANEL_ROWS(12);
        COPY_PANEL_ROWS(8);
        COPY_PANEL_ROWS(6);
    }
    for (; p0 < P; p0 += R) {
        const int r = P - p0 < R ? P - p0 : R;
        float *o = out + (size_t)p0 * K;
#pragma omp simd
        for (int i = 0; i < r; i++) o[i] = x[p0 + i];
        for (int i = r; i < R; i++) o[i] = 0.f;
    }
}
VEC_DISPATCH(pack_row_split, (int P, int K, const float *x, int R, float *out), (P, K, x, R, out))

/* The same, adding row k into sum: sum[p] += x[p] (the row is in L1). */
VEC_IMPL pack_row_split_sum_impl(int P, int K, const float *x, int R, float *out, float *sum) {
    pack_row_split_impl(P, K, x, R, out);
#pragma omp simd
    for (int p = 0; p < P; p++) sum[p] += x[p];
}
VEC_DISPATCH(pack_row_split_sum, (int P, int K, const float *x, int R, float *out, float *sum),
             (P, K, x, R, out, sum))

/* X (P,K) at strides (rsx, csx) into panels of R rows of K: as pack_panels,
 * row by row where X is contiguous along P; then with sum, also sum[p] +=
 * X[p][k] over k in order (sum only where rsx is 1). */
void pack_block_sum(int P, int K, const float *X, size_t rsx, size_t csx, int R, float *out,
                    float *sum) {
    if (rsx != 1) {
        pack_panels(P, K, X, rsx, csx, R, out);
        return;
    }
    for (int k = 0; k < K; k++) {
        if (sum) pack_row_split_sum(P, K, X + (size_t)k * csx, R, out + (size_t)k * R, sum);
        else pack_row_split(P, K, X + (size_t)k * csx, R, out + (size_t)k * R);
    }
}
void pack_block(int P, int K, const float *X, size_t rsx, size_t csx, int R, float *out) {
    pack_block_sum(P, K, X, rsx, csx, R, out, NULL);
}

/* Which k of C's block [i0, i1) x [j0, j1) the mask needs: [*klo, *khi);
 * returns 0 when the block is skipped whole (left as it is). */
int mask_range(int mask, int d, int K, int i0, int i1, int j0, int *klo, int *khi) {
    *klo = 0;
    *khi = K;
    switch (mask) {
    case MASK_BELOW: return j0 <= i1 - 1 + d;
    case MASK_K_UPTO: *khi = i1 + d < K ? i1 + d : K; break;
    case MASK_K_FROM: *klo = i0 - d > 0 ? i0 - d : 0; break;
    }
    return 1;
}

/* op(A) (M,K), along M at stride rs and along K at cs, into panels of R
 * rows as pack_block, under a K_UPTO or K_FROM mask: each panel only over
 * the k its micro-kernel calls read (mask_range on the panel's rows), and
 * the entries the mask makes zero written as zeros, never read (a causal
 * tile's upper triangle holds whatever the buffer held). */
void pack_masked(int M, int K, const float *A, size_t rs, size_t cs, int R, float *out, int mask,
                 int d) {
    if (cs == 1) { /* contiguous along K: each panel over its own k range */
        for (int i0 = 0; i0 < M; i0 += R) {
            const int r = M - i0 < R ? M - i0 : R;
            int klo, khi;
            mask_range(mask, d, K, i0, i0 + r, 0, &klo, &khi);
            if (khi > klo)
                pack_panels(r, khi - klo, A + (size_t)i0 * rs + klo, rs, 1, R,
                            out + (size_t)i0 * K + (size_t)klo * R);
        }
    } else { /* contiguous along M: row k of op(A) into the panels that read it */
        const int np = (M + R - 1) / R;
        for (int k = 0; k < K; k++) {
            /* K_UPTO: panel [i0, i1) reads k < i1 + d; K_FROM: k >= i0 - d */
            int pa = 0, pb = np;
            if (mask == MASK_K_UPTO) pa = k - d < 0 ? 0 : (k - d) / R;
            else pb = k + d < 0 ? 0 : (k + d) / R + 1 < np ? (k + d) / R + 1 : np;
            if (pa >= pb) continue;
            const int hi = pb * R < M ? pb * R : M;
            pack_row_split(hi - pa * R, K, A + (size_t)k * cs + (size_t)pa * R * rs, R,
                           out + (size_t)pa * R * K + (size_t)k * R);
        }
    }
    /* the zeros: row i's k > i + d (K_UPTO) or k < i - d (K_FROM) in its
     * panel's range */
    for (int i = 0; i < M; i++) {
        const int i0 = i / R * R, r = M - i0 < R ? M - i0 : R;
        int klo, khi;
        mask_range(mask, d, K, i0, i0 + r, 0, &klo, &khi);
        int zlo = klo, zhi = khi; /* [zlo, zhi) zeroed */
        if (mask == MASK_K_UPTO) zlo = i + d + 1 > klo ? i + d + 1 : klo;
        else zhi = i - d < khi ? i - d : khi;
        float *o = out + (size_t)i0 * K + (i - i0);
        for (int k = zlo; k < zhi; k++) o[(size_t)k * R] = 0.f;
    }
}
