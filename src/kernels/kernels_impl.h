/*
 * kernels_impl: what the kernel files share and nothing else includes: the
 * AVX2 dispatch of hot loops, a vectorisable exp, a fixed split of work
 * between threads, each thread's scratch buffers.
 *
 * The room: attention.c (causal self-attention, its tiles on mm_tile),
 * elementwise.c (bias, layer norm, GELU, embeddings, residual), llama.c
 * (RMSNorm, rotary positions, SwiGLU), the products (gemm.c, tile.c,
 * pack.c, microkernel.c, sharing gemm_impl.h) and kernels.c (threads, vector width, BLIS's
 * configuration, the timer, the scratch buffers). Every reduction has a fixed order for a fixed
 * thread count, so runs are bitwise repeatable.
 */
#ifndef MODTRAIN_KERNELS_IMPL_H
#define MODTRAIN_KERNELS_IMPL_H

#include <omp.h>
#include <stddef.h>
#include <stdint.h>

/* Hot elementwise loops are compiled three times, for AVX-512, for
 * AVX2+FMA and for the baseline, and picked once at start, so one binary
 * serves every node. (GCC's target_clones("arch=haswell") tests the CPU
 * model, not its features, and took the slow clone on AMD EPYC.) A
 * reduction's lanes follow the vector width, so its last bits may differ
 * between the builds; a machine always runs the same one. */
extern int kernels_avx2;   /* set by kernels_init */
extern int kernels_avx512; /* set by kernels_init */
#if defined(__x86_64__) && defined(__GNUC__)
#define VEC_TARGET __attribute__((target("avx2,fma")))
#define VEC_TARGET512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
#else
#define VEC_TARGET
#define VEC_TARGET512
#endif
#define VEC_DISPATCH(name, params, args)                                  \
    VEC_TARGET512 static void name##_avx512 params { name##_impl args; }  \
    VEC_TARGET static void name##_avx2 params { name##_impl args; }       \
    static void name##_base params { name##_impl args; }                  \
    static void name params {                                             \
        if (kernels_avx512) name##_avx512 args;                           \
        else if (kernels_avx2) name##_avx2 args;                          \
        else name##_base args;                                            \
    }
/* The same for loops that must give the baseline's bits: an AVX2 build
 * without FMA (nothing can be fused; IEEE division and square root round
 * exactly), and the baseline. */
#if defined(__x86_64__) && defined(__GNUC__)
#define VEC_TARGET_NOFMA __attribute__((target("avx2")))
#else
#define VEC_TARGET_NOFMA
#endif
#define VEC_DISPATCH_EXACT(name, params, args)                              \
    VEC_TARGET_NOFMA static void name##_avx2 params { name##_impl args; }   \
    static void name##_base params { name##_impl args; }                    \
    static void name params {                                               \
        if (kernels_avx2) name##_avx2 args;                                 \
        else name##_base args;                                              \
    }
#define VEC_IMPL static inline __attribute__((always_inline)) void

/* A per-thread buffer of at least n floats, 64-byte aligned, kept between
 * calls (a fresh allocation per call cost page faults on every step): one
 * per slot, since attention's tile buffer and mm_tile's packed operands
 * are live at once. */
enum { SCRATCH_TILE, SCRATCH_PACK, SCRATCH_SLOTS };
float *kernels_scratch(int slot, size_t n);
/* The most SCRATCH_PACK floats own_gemm asks for, and mm_tile for a
 * product of M x N over K (either storage of C). */
size_t gemm_pack_floats(void);
size_t mm_tile_pack_floats(int M, int N, int K);

/* This thread's share [lo, hi) of n items inside a parallel region: a fixed
 * partition, so results never depend on scheduling. */
static inline void thread_range(size_t n, size_t *lo, size_t *hi) {
    size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
    *lo = n * t / nt;
    *hi = n * (t + 1) / nt;
}

/* Reductions on 16 lanes: a row's element j goes to lane j % 16, in order
 * (whole chunks of 16 as one AVX-512 vector or two AVX2 ones, a short last
 * chunk element by element), then the lanes combine in a fixed tree. The
 * compiler's own simd reductions end in a serial loop over the lanes,
 * which cost as much as a short row's work; this order is also the same
 * on every vector width. */
/* The per-block partial weight gradients of the norms' backwards (one
 * buffer of at least n floats, grown as needed; elementwise.c). */
float *norm_partials(size_t n);
/* Inside the backward's parallel region, after its blocks: each thread
 * adds the nb blocks' partials of its channels into g[0] .. g[m-1] (block
 * k's j-th vector at part + (k*m + j)*C), in block order, so the sums are
 * the same bits on any thread count. */
void norm_partials_add(float *const *g, int m, const float *part, int nb, int C);
/* The norms' backwards sum their rows in blocks of NORM_ROWS. */
enum { NORM_ROWS = 64 };

enum { LANES = 16 };

static inline float lanes_sum(float *v) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) v[l] += v[l + w];
    return v[0];
}

/* The largest of the lanes (a NaN lane is passed over, as a > b ? a : b
 * passes over it). */
static inline float lanes_max(float *v) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) v[l] = v[l + w] > v[l] ? v[l + w] : v[l];
    return v[0];
}

/* exp on floats in a form the compiler vectorises (Cephes polynomial after
 * a 2^k range reduction; ~2 ulp). libm's expf/tanhf do not vectorise and
 * were a fifth of the step time in GELU alone. */
static inline float fast_expf(float x) {
    x = x < -87.f ? -87.f : x;
    x = x > 88.f ? 88.f : x;
    /* k = round(x / ln 2) by the 1.5 * 2^23 trick: branch-free */
    const float shifter = 12582912.f;
    float t = x * 1.44269504088896341f + shifter;
    /* unsigned: a NaN or Inf input gives garbage bits here (and NaN out),
     * never signed overflow; for finite x the bits are the same */
    union {
        float f;
        uint32_t u;
    } kt = {.f = t}, sh = {.f = shifter};
    uint32_t k = kt.u - sh.u;
    float fk = t - shifter;
    float r = x - fk * 0.693359375f + fk * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    union {
        uint32_t u;
        float f;
    } scale = {.u = (k + 127u) << 23};
    return p * scale.f;
}

#endif
