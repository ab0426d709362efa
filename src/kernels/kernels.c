/*
 * kernels: layer math on float32. Large products use BLIS's own threads;
 * the many small per-head products of attention run one per OpenMP thread,
 * each on BLIS's micro-kernel (mm_tile). Every reduction has a fixed order
 * for a fixed thread count, so runs are bitwise repeatable.
 */
#include "src/kernels/kernels.h"

#include <blis.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/base/util.h"
#include "src/kernels/kernels_impl.h"

static int g_threads = 1;
int kernels_avx2 = 0;
int kernels_avx512 = 0;
static int g_vec_max = 0; /* the widest build this CPU runs */

static inline float fast_tanhf(float u) { return 1.f - 2.f / (1.f + fast_expf(2.f * u)); }

int kernels_check_arch(const char *blis_arch, Err *err) {
    if (strcmp(blis_arch, "auto") == 0) return 0;
    char names[512] = "auto";
    for (int id = 0; id < BLIS_NUM_ARCHS; id++) {
        const char *name = bli_arch_string((arch_t)id);
        if (strcmp(name, blis_arch) == 0) return 0;
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, ", %s", name);
    }
    return err_set(err, "config: blis_arch = '%s' is not a BLIS configuration (expected one of %s)",
                   blis_arch, names);
}

void kernels_init(int threads, const char *blis_arch) {
    g_threads = threads > 0 ? threads : 1;
    /* BLIS reads BLIS_ARCH_TYPE (a numeric arch id) once, at its first call. */
    if (blis_arch && strcmp(blis_arch, "auto") != 0) {
        for (int id = 0; id < BLIS_NUM_ARCHS; id++) {
            if (strcmp(bli_arch_string((arch_t)id), blis_arch) == 0) {
                char v[16];
                snprintf(v, sizeof v, "%d", id);
                setenv("BLIS_ARCH_TYPE", v, 1);
                break;
            }
        }
    } else if (!getenv("BLIS_ARCH_TYPE")) {
        __builtin_cpu_init();
        /* BLIS 0.9 falls back to haswell on AVX-512 CPUs whose FMA unit count
         * it cannot read (common under VMs); skx measured ~1.5x faster. */
        int arch = -1;
        if (__builtin_cpu_supports("avx512f")) arch = BLIS_ARCH_SKX;
        /* On AVX2 CPUs without AVX-512 (AMD EPYC here) BLIS picks its zen
         * kernels; haswell's measured 1.0-1.5x faster on every model shape
         * there (74 against 50 GFLOP/s on the MLP's product). */
        else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            arch = BLIS_ARCH_HASWELL;
        if (arch >= 0) {
            char v[16];
            snprintf(v, sizeof v, "%d", arch);
            setenv("BLIS_ARCH_TYPE", v, 1);
        }
    }
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    kernels_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    kernels_avx512 = kernels_avx2 && __builtin_cpu_supports("avx512f") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                     __builtin_cpu_supports("avx512bw");
#endif
    g_vec_max = kernels_vec_level();
    kernels_set_threads(g_threads);
}

int kernels_vec_level(void) { return kernels_avx512 ? 2 : kernels_avx2 ? 1 : 0; }

int kernels_set_vec_level(int level) {
    level = level < 0 ? 0 : level > g_vec_max ? g_vec_max : level;
    kernels_avx2 = level >= 1;
    kernels_avx512 = level >= 2;
    return level;
}

int kernels_threads(void) { return g_threads; }

void kernels_set_threads(int threads) {
    g_threads = threads > 0 ? threads : 1;
    bli_thread_set_num_threads(g_threads);
    omp_set_num_threads(g_threads);
}

const char *kernels_blis_arch(void) { return bli_arch_string(bli_arch_query_id()); }

int kernels_blis_arch_id(void) { return (int)bli_arch_query_id(); }

static void blis_gemm(int nt, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                      int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    inc_t rsa = ta ? 1 : lda, csa = ta ? lda : 1;
    inc_t rsb = tb ? 1 : ldb, csb = tb ? ldb : 1;
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(nt, &rntm);
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, M, N, K, &alpha, (float *)A, rsa, csa,
                 (float *)B, rsb, csb, &beta, C, ldc, 1, NULL, &rntm);
}

/* The kernel timer: nanoseconds spent in sgemm calls, as wall time. A call
 * inside a parallel region of n threads counts a nth of its time (the
 * threads' products overlap); one outside counts all of it. */
static atomic_llong g_gemm_ns;

static void count_ns(struct timespec t0, struct timespec t1) {
    long long ns = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    if (omp_in_parallel()) ns /= omp_get_num_threads();
    atomic_fetch_add_explicit(&g_gemm_ns, ns, memory_order_relaxed);
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

double kernels_gemm_seconds(void) {
    return (double)atomic_load_explicit(&g_gemm_ns, memory_order_relaxed) * 1e-9;
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

/* ------------------------------------- tile products on BLIS's micro-kernel
 *
 * Attention's tiles are small (a head of 32 makes K = 32) and many: a
 * bli_sgemm_ex call spends more on its control tree, its pack buffers and
 * its edge logic than on such a product. mm_tile packs both operands into
 * BLIS's micro-panels itself and calls BLIS's own micro-kernel for the
 * configuration in use (skx's 32 x 12, haswell's 6 x 16, ...) on each
 * MR x NR block of C, skipping the blocks and the k ranges a causal mask
 * makes zero. */
typedef void (*SgemmUkr)(dim_t m, dim_t n, dim_t k, float *alpha, float *a, float *b, float *beta,
                         float *c, inc_t rs_c, inc_t cs_c, auxinfo_t *data, cntx_t *cntx);
static struct {
    SgemmUkr f;
    cntx_t *cntx;
    int mr, nr, row_pref;
    /* where a micro-kernel of our own reads op(A) in place, on whole blocks
     * (KERNELS_INPLACE_*): ukr_32x12_rows and _cols on skx (AVX-512), in
     * mm_tile and own_gemm; ukr_6x16_rows and _cols on haswell (AVX2), in
     * mm_tile only; 0: nowhere */
    int inplace;
} g_ukr;
static pthread_once_t g_ukr_once = PTHREAD_ONCE_INIT;
static int g_orient = -1; /* the tests' choice of storage for C, -1 the kernel's */

void mm_tile_orientation(int row_pref) { g_orient = row_pref; }

static void ukr_init(void);
int mm_tile_granule(void) {
    pthread_once(&g_ukr_once, ukr_init);
    int a = g_ukr.mr, b = g_ukr.nr;
    while (b) {
        const int t = a % b;
        a = b, b = t;
    }
    return g_ukr.mr / a * g_ukr.nr;
}

static void ukr_init(void) {
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

/* The longest K block read in place: on skx the micro-kernel's packed
 * panel and its 12 rows of op(A) then fit in L1 together (kc 256: 32 + 12
 * KB), so each row's lines are fetched once for all the packed panels. At
 * kc 384 (GPT-2 small's K of 768 or more) the rows came from L2 again for
 * every block, twelve streams at once: gemm_bench's GPT-2 shapes ran 2-4%
 * slower than with them packed. */
enum { INPLACE_KC_MAX = 256 };

/* whether mm and mm_tile read the broadcast side in place now */
static int inplace_on(void) { return g_inplace_on ? inplace_fits() : 0; }

void kernels_set_inplace(int on) { g_inplace_on = on; }

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
static void ukr_inplace(int k, float alpha, const float *v, const float *s, size_t sr, size_t sk,
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
static void pack_block_sum(int P, int K, const float *X, size_t rsx, size_t csx, int R, float *out,
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
static void pack_block(int P, int K, const float *X, size_t rsx, size_t csx, int R, float *out) {
    pack_block_sum(P, K, X, rsx, csx, R, out, NULL);
}

/* A thread's buffers, freed when the thread ends (an OpenMP team that a
 * thread other than the main one started goes with it). */
typedef struct {
    float *buf[SCRATCH_SLOTS];
    size_t cap[SCRATCH_SLOTS];
} Scratch;
static _Thread_local Scratch *g_scratch;
static pthread_key_t g_scratch_key;
static int g_scratch_keyed; /* 0: no key to be had, the buffers outlive their thread */
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p) {
    Scratch *s = p;
    for (int i = 0; i < SCRATCH_SLOTS; i++) free(s->buf[i]);
    free(s);
}
static void scratch_key(void) {
    g_scratch_keyed = pthread_key_create(&g_scratch_key, scratch_free) == 0;
}

size_t kernels_scratch_bytes(void) {
    size_t n = 0;
    for (int i = 0; g_scratch && i < SCRATCH_SLOTS; i++) n += g_scratch->cap[i];
    return n * sizeof(float);
}

float *kernels_scratch(int slot, size_t n) {
    Scratch *s = g_scratch;
    if (!s) {
        pthread_once(&g_scratch_once, scratch_key);
        s = g_scratch = xcalloc(1, sizeof *s);
        if (g_scratch_keyed) pthread_setspecific(g_scratch_key, s);
    }
    if (n > s->cap[slot]) {
        free(s->buf[slot]);
        s->buf[slot] = xmalloc(n * sizeof(float)); /* 64-byte aligned, as BLIS packs */
        s->cap[slot] = n;
    }
    return s->buf[slot];
}

/* Which k of C's block [i0, i1) x [j0, j1) the mask needs: [*klo, *khi);
 * returns 0 when the block is skipped whole (left as it is). */
static int mask_range(int mask, int d, int K, int i0, int i1, int j0, int *klo, int *khi) {
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
static void pack_masked(int M, int K, const float *A, size_t rs, size_t cs, int R, float *out,
                        int mask, int d) {
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

VEC_IMPL bias_row_impl(float *o, const float *bias, int C) {
#pragma omp simd
    for (int j = 0; j < C; j++) o[j] += bias[j];
}
VEC_DISPATCH(bias_row, (float *o, const float *bias, int C), (o, bias, C))

void bias_add(float *out, const float *bias, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) bias_row(out + (size_t)i * C, bias, C);
}

/* Column sums of dout's columns [c0, c1), over its N rows in order, added
 * into db: a lane a column, 256 columns at a time in registers and L1. */
enum { COLSUM_W = 256 };
VEC_IMPL colsum_impl(float *db, const float *dout, int N, int OC, int c0, int c1) {
    float acc[COLSUM_W];
    for (int cb = c0; cb < c1; cb += COLSUM_W) {
        const int w = c1 - cb < COLSUM_W ? c1 - cb : COLSUM_W;
        for (int c = 0; c < w; c++) acc[c] = 0.f;
        for (int i = 0; i < N; i++) {
            const float *row = dout + (size_t)i * OC + cb;
#pragma omp simd
            for (int c = 0; c < w; c++) acc[c] += row[c];
        }
        for (int c = 0; c < w; c++) db[cb + c] += acc[c];
    }
}
VEC_DISPATCH(colsum, (float *db, const float *dout, int N, int OC, int c0, int c1),
             (db, dout, N, OC, c0, c1))

void bias_backward(float *dbias, const float *dout, int N, int OC) {
    /* the threads split the columns (on 16 floats, a cache line), and
     * each column is one sum over the rows in order, with additions only:
     * the same bits on any thread count and any vector width */
#pragma omp parallel
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int lines = (OC + 15) / 16;
        const int c0 = 16 * (int)((long)lines * t / nt);
        const int c1 = 16 * (int)((long)lines * (t + 1) / nt);
        if (c0 < OC) colsum(dbias, dout, N, OC, c0, c1 < OC ? c1 : OC);
    }
}

void bias_backward_ref(float *dbias, const float *dout, int N, int OC) {
    for (int c = 0; c < OC; c++) {
        double s = 0;
        for (int i = 0; i < N; i++) s += dout[(size_t)i * OC + c];
        dbias[c] += (float)s;
    }
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

/* One row of layer norm: out = (x - mean) * rstd * w + b, and the row's
 * mean and rstd. */
VEC_IMPL ln_row_impl(float *o, float *mean, float *rstd, const float *x, const float *w,
                     const float *b, int C) {
    const int C16 = C / LANES * LANES;
    float acc[LANES] = {0};
    for (int c0 = 0; c0 < C16; c0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) acc[l] += x[c0 + l];
    for (int c = C16; c < C; c++) acc[c - C16] += x[c];
    const float m = lanes_sum(acc) / C;
    float acc2[LANES] = {0};
    for (int c0 = 0; c0 < C16; c0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const float d = x[c0 + l] - m;
            acc2[l] += d * d;
        }
    for (int c = C16; c < C; c++) {
        const float d = x[c] - m;
        acc2[c - C16] += d * d;
    }
    const float v = lanes_sum(acc2) / C;
    const float s = 1.f / sqrtf(v + 1e-5f);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
    *mean = m;
    *rstd = s;
}
VEC_DISPATCH(ln_row,
             (float *o, float *mean, float *rstd, const float *x, const float *w, const float *b,
              int C),
             (o, mean, rstd, x, w, b, C))

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                       const float *b, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        ln_row(out + (size_t)i * C, &mean[i], &rstd[i], inp + (size_t)i * C, w, b, C);
}

/* One row of the fused residual: a += bias, res = x + a, then ln_row on
 * res (which is still in cache). */
VEC_IMPL bias_residual_row_impl(float *a, float *res, const float *x, const float *bias, int C) {
#pragma omp simd
    for (int c = 0; c < C; c++) {
        a[c] += bias[c];
        res[c] = x[c] + a[c];
    }
}
VEC_DISPATCH(bias_residual_row, (float *a, float *res, const float *x, const float *bias, int C),
             (a, res, x, bias, C))

void bias_residual_layernorm_forward(float *a, float *res, float *ln, float *mean, float *rstd,
                                     const float *x, const float *bias, const float *w,
                                     const float *b, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const size_t o = (size_t)i * C;
        bias_residual_row(a + o, res + o, x + o, bias, C);
        ln_row(ln + o, &mean[i], &rstd[i], res + o, w, b, C);
    }
}

void layernorm_forward_ref(float *out, float *mean, float *rstd, const float *inp, const float *w,
                           const float *b, int N, int C) {
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        const double s = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] = (float)((x[c] - m) * s * w[c] + b[c]);
        mean[i] = (float)m;
        rstd[i] = (float)s;
    }
}

/* Rows of layer norm's backward in blocks of LN_ROWS: dinp (+=, or = when
 * set) on every thread, and each block's partial dw and db; the blocks'
 * partials are then added in block order, so the sums depend on N alone,
 * never on the thread count, and x and dy are read once. */
#define LN_ROWS 64

/* The blocks' partial dw and db: one buffer, grown as needed (layer norm's
 * backward is called from the training thread alone, outside any parallel
 * region). */
static float *ln_partials(size_t n) {
    static float *buf = NULL;
    static size_t cap = 0;
    if (n > cap) {
        free(buf);
        buf = xmalloc(n * sizeof(float));
        cap = n;
    }
    return buf;
}
VEC_IMPL ln_back_row_impl(float *dx, float *pw, float *pb, const float *x, const float *dy,
                          const float *w, float m, float s, int C, int set) {
    const int C16 = C / LANES * LANES;
    float a1[LANES] = {0}, a2[LANES] = {0};
    for (int c0 = 0; c0 < C16; c0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const int c = c0 + l;
            const float dnorm = w[c] * dy[c];
            a1[l] += dnorm;
            a2[l] += dnorm * (x[c] - m) * s;
        }
    for (int c = C16; c < C; c++) {
        const float dnorm = w[c] * dy[c];
        a1[c - C16] += dnorm;
        a2[c - C16] += dnorm * (x[c] - m) * s;
    }
    const float dnorm_mean = lanes_sum(a1) / C, dnorm_norm_mean = lanes_sum(a2) / C;
    if (set) {
#pragma omp simd
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            dx[c] = (w[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
            pw[c] += dy[c] * norm;
            pb[c] += dy[c];
        }
    } else {
#pragma omp simd
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            dx[c] += (w[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
            pw[c] += dy[c] * norm;
            pb[c] += dy[c];
        }
    }
}
VEC_DISPATCH(ln_back_row,
             (float *dx, float *pw, float *pb, const float *x, const float *dy, const float *w,
              float m, float s, int C, int set),
             (dx, pw, pb, x, dy, w, m, s, C, set))

static void ln_backward(float *dinp, int set, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean, const float *rstd,
                        int N, int C) {
    const int nb = (N + LN_ROWS - 1) / LN_ROWS;
    float *part = ln_partials((size_t)nb * 2 * C);
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int k = 0; k < nb; k++) {
            float *pw = part + (size_t)k * 2 * C, *pb = pw + C;
            memset(pw, 0, 2 * (size_t)C * sizeof(float));
            const int i1 = (k + 1) * LN_ROWS < N ? (k + 1) * LN_ROWS : N;
            for (int i = k * LN_ROWS; i < i1; i++) {
                const size_t o = (size_t)i * C;
                ln_back_row(dinp + o, pw, pb, inp + o, dout + o, w, mean[i], rstd[i], C, set);
            }
        }
        /* each thread adds the blocks' partials of its channels, in order */
        size_t lo, hi;
        thread_range((size_t)C, &lo, &hi);
        for (int k = 0; k < nb; k++) {
            const float *pw = part + (size_t)k * 2 * C, *pb = pw + C;
            for (size_t c = lo; c < hi; c++) dw[c] += pw[c], db[c] += pb[c];
        }
    }
}

void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C) {
    ln_backward(dinp, 0, dw, db, dout, inp, w, mean, rstd, N, C);
}

void layernorm_backward_set(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C) {
    ln_backward(dinp, 1, dw, db, dout, inp, w, mean, rstd, N, C);
}

void layernorm_backward_ref(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C) {
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        const double m = mean[i], s = rstd[i];
        double dm = 0, dnm = 0;
        for (int c = 0; c < C; c++) {
            dm += (double)w[c] * dy[c];
            dnm += (double)w[c] * dy[c] * (x[c] - m) * s;
        }
        dm /= C;
        dnm /= C;
        for (int c = 0; c < C; c++) {
            const double norm = (x[c] - m) * s;
            dinp[(size_t)i * C + c] += (float)((w[c] * dy[c] - dm - norm * dnm) * s);
            dw[c] += (float)(dy[c] * norm);
            db[c] += dy[c];
        }
    }
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* GELU (tanh form) and its derivative: one definition for every kernel. */
static inline float gelu(float x) {
    return 0.5f * x * (1.f + fast_tanhf(GELU_K * (x + 0.044715f * x * x * x)));
}
static inline float gelu_grad(float x) {
    float th = fast_tanhf(GELU_K * (x + 0.044715f * x * x * x));
    float sech2 = 1.f - th * th;
    return 0.5f * (1.f + th) + 0.5f * x * sech2 * GELU_K * (1.f + 3.f * 0.044715f * x * x);
}

VEC_IMPL gelu_forward_range_impl(float *out, const float *inp, size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        out[i] = gelu(inp[i]);
    }
}
VEC_DISPATCH(gelu_forward_range, (float *out, const float *inp, size_t lo, size_t hi),
             (out, inp, lo, hi))

void gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        thread_range(n, &lo, &hi);
        gelu_forward_range(out, inp, lo, hi);
    }
}

VEC_IMPL gelu_backward_range_impl(float *dinp, const float *inp, const float *dout, size_t lo,
                                  size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        dinp[i] += gelu_grad(inp[i]) * dout[i];
    }
}
VEC_DISPATCH(gelu_backward_range,
             (float *dinp, const float *inp, const float *dout, size_t lo, size_t hi),
             (dinp, inp, dout, lo, hi))

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        thread_range(n, &lo, &hi);
        gelu_backward_range(dinp, inp, dout, lo, hi);
    }
}

VEC_IMPL gelu_backward_set_range_impl(float *dinp, const float *inp, const float *dout, size_t lo,
                                      size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        dinp[i] = gelu_grad(inp[i]) * dout[i];
    }
}
VEC_DISPATCH(gelu_backward_set_range,
             (float *dinp, const float *inp, const float *dout, size_t lo, size_t hi),
             (dinp, inp, dout, lo, hi))

void gelu_backward_set(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        thread_range(n, &lo, &hi);
        gelu_backward_set_range(dinp, inp, dout, lo, hi);
    }
}

/* out = gelu(inp) and grad = gelu'(inp) on one tanh an element: the same
 * floats as gelu_forward and gelu_backward_set's factor. */
VEC_IMPL gelu_with_grad_range_impl(float *out, float *grad, const float *inp, size_t lo,
                                   size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        const float x = inp[i]; /* read once: the two share their tanh */
        out[i] = gelu(x);
        grad[i] = gelu_grad(x);
    }
}
VEC_DISPATCH(gelu_with_grad_range,
             (float *out, float *grad, const float *inp, size_t lo, size_t hi),
             (out, grad, inp, lo, hi))

void gelu_with_grad(float *out, float *grad, const float *inp, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        thread_range(n, &lo, &hi);
        gelu_with_grad_range(out, grad, inp, lo, hi);
    }
}

/* out = gelu(inp) and dinp = gelu'(inp) * dout on one tanh an element: the
 * same floats as gelu_forward and gelu_backward_set. */
VEC_IMPL gelu_with_backward_range_impl(float *out, float *dinp, const float *inp, const float *dout,
                                       size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        const float x = inp[i];
        out[i] = gelu(x);
        dinp[i] = gelu_grad(x) * dout[i];
    }
}
VEC_DISPATCH(gelu_with_backward_range,
             (float *out, float *dinp, const float *inp, const float *dout, size_t lo, size_t hi),
             (out, dinp, inp, dout, lo, hi))

void gelu_with_backward(float *out, float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        thread_range(n, &lo, &hi);
        gelu_with_backward_range(out, dinp, inp, dout, lo, hi);
    }
}

VEC_IMPL mul_range_impl(float *a, const float *b, size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) a[i] *= b[i];
}
VEC_DISPATCH(mul_range, (float *a, const float *b, size_t lo, size_t hi), (a, b, lo, hi))

void mul_inplace(float *a, const float *b, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        thread_range(n, &lo, &hi);
        mul_range(a, b, lo, hi);
    }
}

VEC_IMPL bias_gelu_row_impl(float *pre, float *out, const float *bias, int F) {
#pragma omp simd
    for (int j = 0; j < F; j++) {
        float x = pre[j] + bias[j];
        pre[j] = x;
        out[j] = gelu(x);
    }
}
VEC_DISPATCH(bias_gelu_row, (float *pre, float *out, const float *bias, int F), (pre, out, bias, F))

void bias_gelu_forward(float *pre, float *out, const float *bias, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) bias_gelu_row(pre + (size_t)i * F, out + (size_t)i * F, bias, F);
}

void embed_forward(float *out, const int *tokens, const float *wte, int v0, int Vl, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        int v = tokens[i] - v0;
        float *o = out + (size_t)i * C;
        if (v >= 0 && v < Vl) memcpy(o, wte + (size_t)v * C, (size_t)C * sizeof(float));
        else memset(o, 0, (size_t)C * sizeof(float));
    }
}

void embed_backward(float *dwte, const float *dout, const int *tokens, int v0, int Vl, int N,
                    int C) {
    /* Rows of dwte collide when tokens repeat: one pass in token order. */
    for (int i = 0; i < N; i++) {
        int v = tokens[i] - v0;
        if (v < 0 || v >= Vl) continue;
        float *d = dwte + (size_t)v * C;
        const float *g = dout + (size_t)i * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
    }
}

void pos_forward(float *out, const float *wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        const float *p = wpe + (size_t)(bt % T) * C;
        for (int c = 0; c < C; c++) o[c] += p[c];
    }
}

void pos_backward(float *dwpe, const float *dout, int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *d = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *g = dout + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) d[c] += g[c];
        }
    }
}

void residual_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
