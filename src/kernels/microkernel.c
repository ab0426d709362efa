/*
 * microkernel: BLIS's micro-kernel for the configuration in use and the
 * view of C it prefers, and micro-kernels of our own that read the
 * broadcast side where it lies (skx's 32 x 12, haswell's 6 x 16).
 */
#include "src/kernels/kernels.h"

#include <blis.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <pthread.h>

#include "src/kernels/gemm_impl.h"
#include "src/kernels/kernels_impl.h"

Ukr g_ukr;
pthread_once_t g_ukr_once = PTHREAD_ONCE_INIT;
int g_orient = -1; /* the tests' choice of storage for C, -1 the kernel's */

void mm_tile_orientation(int row_pref) { g_orient = row_pref; }

void ukr_init(void) {
    g_ukr.cntx = bli_gks_query_cntx();
    g_ukr.f = (SgemmUkr)bli_cntx_get_l3_nat_ukr_dt(BLIS_FLOAT, BLIS_GEMM_UKR, g_ukr.cntx);
    g_ukr.mr = (int)bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_MR, g_ukr.cntx);
    g_ukr.nr = (int)bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_NR, g_ukr.cntx);
    g_ukr.row_pref = bli_cntx_get_l3_nat_ukr_prefs_dt(BLIS_FLOAT, BLIS_GEMM_UKR, g_ukr.cntx);
#if defined(__x86_64__) && defined(__GNUC__)
    const arch_t arch = bli_arch_query_id();
    if (arch == BLIS_ARCH_SKX && g_ukr.mr == 32 && g_ukr.nr == 12 && !g_ukr.row_pref)
        g_ukr.inplace = KERNELS_INPLACE_TILE | KERNELS_INPLACE_GEMM;
    else if (arch == BLIS_ARCH_HASWELL && g_ukr.mr == 6 && g_ukr.nr == 16 && g_ukr.row_pref)
        g_ukr.inplace = KERNELS_INPLACE_TILE;
#endif
}

static int g_inplace_on = 1;

/* where this CPU runs the configuration's in-place kernel */
static int inplace_fits(void) {
    return (g_ukr.row_pref ? kernels_avx2 : kernels_avx512) ? g_ukr.inplace : 0;
}

int kernels_inplace(void) {
    pthread_once(&g_ukr_once, ukr_init);
    return inplace_fits();
}

/* whether mm and mm_tile read the broadcast side in place now */
int inplace_on(void) { return g_inplace_on ? inplace_fits() : 0; }

void kernels_set_inplace(int on) { g_inplace_on = on; }

/* skx's 32 x 12 product with B read where it lies: C (32,12, by columns at
 * stride ldc) = alpha A B + beta C for A a packed panel of 32 rows and B's
 * element (j, k) at b + j sj + k sk. The broadcast side of skx's
 * micro-kernel is its 12, so its panel need not be packed: an activation
 * contiguous along k (the forward's input, the input gradient's dout: the
 * rows kernel, sj = ldb) is read as it is instead of transposed into a
 * panel (0.7 cycles a float, a third of the packing), and one contiguous
 * along j (attention's P and dS read transposed: the columns kernel, sk =
 * ldb) instead of copied. The
 * arithmetic is BLIS's kernel's, in its order: each element's FMAs in k
 * from zero, then times alpha, then beta C added by one FMA (or stored as
 * it is where beta is 0), so the bits are the same. */
#if defined(__x86_64__) && defined(__GNUC__)
/* the twelve columns' accumulators by name, so that they stay in registers
 * (as arrays GCC kept them on the stack) */
#define UKR_EACH_COLUMN(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define UKR_ZERO(j) __m512 lo##j = _mm512_setzero_ps(), hi##j = _mm512_setzero_ps();
#define UKR_FMA(j)                                                            \
    {                                                                         \
        const __m512 bj = _mm512_set1_ps(b[(size_t)j * sj + (size_t)p * sk]); \
        lo##j = _mm512_fmadd_ps(a0, bj, lo##j);                               \
        hi##j = _mm512_fmadd_ps(a1, bj, hi##j);                               \
    }
#define UKR_STORE(j)                                                       \
    {                                                                      \
        float *cj = c + (size_t)j * ldc;                                   \
        __m512 l = _mm512_mul_ps(lo##j, va), h = _mm512_mul_ps(hi##j, va); \
        if (beta != 0.f) {                                                 \
            l = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cj), l);               \
            h = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cj + 16), h);          \
        }                                                                  \
        _mm512_storeu_ps(cj, l);                                           \
        _mm512_storeu_ps(cj + 16, h);                                      \
    }
#define UKR_STEP                                                             \
    {                                                                        \
        const __m512 a0 = _mm512_load_ps(a + (size_t)p * 32),                \
                     a1 = _mm512_load_ps(a + (size_t)p * 32 + 16);           \
        _mm_prefetch((const char *)(a + (size_t)p * 32 + 256), _MM_HINT_T0); \
        _mm_prefetch((const char *)(a + (size_t)p * 32 + 272), _MM_HINT_T0); \
        UKR_EACH_COLUMN(UKR_FMA)                                             \
    }
/* bn: the rows kernel's next 12 rows (at the same sj), prefetched a line of
 * each every 16 k (NULL: none) */
VEC_TARGET512 static inline __attribute__((always_inline)) void
ukr_32x12_body(int k, float alpha, const float *a, const float *b, size_t sj, size_t sk, float beta,
               float *c, size_t ldc, const float *bn) {
    UKR_EACH_COLUMN(UKR_ZERO)
    for (int j = 0; j < 12; j++) {
        _mm_prefetch((const char *)(c + (size_t)j * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + (size_t)j * ldc + 16), _MM_HINT_T0);
    }
    int p = 0;
    for (; p + 16 <= k; p += 16) {
        if (bn)
            for (int j = 0; j < 12; j++)
                _mm_prefetch((const char *)(bn + (size_t)j * sj + p), _MM_HINT_T0);
        const int e = p + 16;
#pragma GCC unroll 4
        for (; p < e; p++) UKR_STEP
        p -= 16;
    }
    if (bn && k > 0)
        for (int j = 0; j < 12; j++)
            _mm_prefetch((const char *)(bn + (size_t)j * sj + k - 1), _MM_HINT_T0);
    for (; p < k; p++) UKR_STEP
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    UKR_EACH_COLUMN(UKR_STORE)
}
/* B's row j at b + j ldb, contiguous along k */
VEC_TARGET512 static void ukr_32x12_rows(int k, float alpha, const float *a, const float *b,
                                         size_t ldb, float beta, float *c, size_t ldc,
                                         const float *bn) {
    ukr_32x12_body(k, alpha, a, b, ldb, 1, beta, c, ldc, bn);
}
/* B's k-th 12 at b + k ldb, contiguous along j */
VEC_TARGET512 static void ukr_32x12_cols(int k, float alpha, const float *a, const float *b,
                                         size_t ldb, float beta, float *c, size_t ldc) {
    ukr_32x12_body(k, alpha, a, b, 1, ldb, beta, c, ldc, NULL);
}
#endif

/* haswell's 6 x 16 product with A read where it lies: C (6,16, by rows at
 * stride ldc) = alpha A B + beta C for B a packed panel of 16 columns and
 * A's element (i, k) at a + i si + k sk. haswell's kernel prefers C by
 * rows and broadcasts its 6, op(A)'s rows (as skx's 12 above are op(A)'s
 * in its view of C by columns), so attention's tiles (mm_tile) read A in
 * place the same way: the rows kernel where each row is contiguous along k
 * (si = lda), the columns kernel where the six are (sk = lda). BLIS's
 * arithmetic in its order, as above: the same bits. (own_gemm packs them:
 * see blocked_part.) */
#if defined(__x86_64__) && defined(__GNUC__)
#define UKR6_EACH_ROW(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define UKR6_ZERO(i) __m256 lo##i = _mm256_setzero_ps(), hi##i = _mm256_setzero_ps();
#define UKR6_FMA(i)                                                                 \
    {                                                                               \
        const __m256 ai = _mm256_broadcast_ss(a + (size_t)i * si + (size_t)p * sk); \
        lo##i = _mm256_fmadd_ps(b0, ai, lo##i);                                     \
        hi##i = _mm256_fmadd_ps(b1, ai, hi##i);                                     \
    }
#define UKR6_STORE(i)                                                      \
    {                                                                      \
        float *ci = c + (size_t)i * ldc;                                   \
        __m256 l = _mm256_mul_ps(lo##i, va), h = _mm256_mul_ps(hi##i, va); \
        if (beta != 0.f) {                                                 \
            l = _mm256_fmadd_ps(vb, _mm256_loadu_ps(ci), l);               \
            h = _mm256_fmadd_ps(vb, _mm256_loadu_ps(ci + 8), h);           \
        }                                                                  \
        _mm256_storeu_ps(ci, l);                                           \
        _mm256_storeu_ps(ci + 8, h);                                       \
    }
#define UKR6_STEP                                                           \
    {                                                                       \
        const __m256 b0 = _mm256_loadu_ps(b + (size_t)p * 16),              \
                     b1 = _mm256_loadu_ps(b + (size_t)p * 16 + 8);          \
        _mm_prefetch((const char *)(b + (size_t)p * 16 + 64), _MM_HINT_T0); \
        UKR6_EACH_ROW(UKR6_FMA)                                             \
    }
VEC_TARGET static inline __attribute__((always_inline)) void
ukr_6x16_body(int k, float alpha, const float *b, const float *a, size_t si, size_t sk, float beta,
              float *c, size_t ldc) {
    UKR6_EACH_ROW(UKR6_ZERO)
    for (int i = 0; i < 6; i++) {
        _mm_prefetch((const char *)(c + (size_t)i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + (size_t)i * ldc + 15), _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int p = 0; p < k; p++) UKR6_STEP
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    UKR6_EACH_ROW(UKR6_STORE)
}
VEC_TARGET static void ukr_6x16_rows(int k, float alpha, const float *b, const float *a, size_t lda,
                                     float beta, float *c, size_t ldc) {
    ukr_6x16_body(k, alpha, b, a, lda, 1, beta, c, ldc);
}
VEC_TARGET static void ukr_6x16_cols(int k, float alpha, const float *b, const float *a, size_t lda,
                                     float beta, float *c, size_t ldc) {
    ukr_6x16_body(k, alpha, b, a, 1, lda, beta, c, ldc);
}
#endif

/* The configuration's in-place kernel on a whole MR x NR block: v the
 * packed panel of op(B); op(A)'s element (r, k) at s + r sr + k sk (sk 1:
 * the rows kernel, with next the following block's rows to prefetch on
 * skx, or NULL; else sr is 1: the columns kernel); the block's line r
 * (op(A)'s row r: a row of C on haswell, a column of C' = C^T on skx) at
 * c + r ldc. */
void ukr_inplace(int k, float alpha, const float *v, const float *s, size_t sr, size_t sk,
                 float beta, float *c, size_t ldc, const float *next) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (g_ukr.row_pref && sk == 1) ukr_6x16_rows(k, alpha, v, s, sr, beta, c, ldc);
    else if (g_ukr.row_pref) ukr_6x16_cols(k, alpha, v, s, sk, beta, c, ldc);
    else if (sk == 1) ukr_32x12_rows(k, alpha, v, s, sr, beta, c, ldc, next);
    else ukr_32x12_cols(k, alpha, v, s, sk, beta, c, ldc);
#else
    (void)k, (void)alpha, (void)v, (void)s, (void)sr, (void)sk, (void)beta, (void)c, (void)ldc,
        (void)next;
#endif
}
