/*
 * fma_peak: the most floating-point work the cores can do, measured: each
 * thread runs independent fused multiply-adds on the widest vectors the CPU
 * has (AVX-512 or AVX2), enough of them in flight to hide their latency, and
 * nothing else. No product, packed or not, can run faster, so it bounds what
 * any speed-up of the step can reach; the sgemm peak modtrain measures is a
 * fraction of it (BLIS's kernels, their loads and packing).
 * Prints one line: GFLOP/s (an FMA counts 2), the best of REPEATS runs.
 * usage: fma_peak [THREADS [REPEATS]]
 *   defaults: the machine's threads, 20 repeats (each about 40 ms: on a
 *   shared host the best of many short runs finds the cores undisturbed)
 */
#include <omp.h>
#include <stdio.h>
#include <unistd.h>

#include "src/base/util.h"
#include "tests/bench/bench_util.h"

static const char *prog = "fma_peak";

enum { ACC = 12, ITERS = 20 * 1000 * 1000 };

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* ITERS rounds of ACC independent FMAs on 8 floats; returns a sum of the
 * results so that the compiler keeps them. */
__attribute__((target("avx2,fma"))) static float run_avx2(float seed) {
    __m256 acc[ACC], m = _mm256_set1_ps(1.f - 1e-7f), a = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < ACC; i++) acc[i] = _mm256_set1_ps(seed + (float)i);
    for (long n = 0; n < ITERS; n++) {
#pragma GCC unroll 12 /* the accumulators in registers */
        for (int i = 0; i < ACC; i++) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
    }
    float s = 0.f;
    for (int i = 0; i < ACC; i++) s += _mm256_cvtss_f32(acc[i]);
    return s;
}

/* The same on 16 floats. */
__attribute__((target("avx512f"))) static float run_avx512(float seed) {
    __m512 acc[ACC], m = _mm512_set1_ps(1.f - 1e-7f), a = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < ACC; i++) acc[i] = _mm512_set1_ps(seed + (float)i);
    for (long n = 0; n < ITERS; n++) {
#pragma GCC unroll 12 /* the accumulators in registers */
        for (int i = 0; i < ACC; i++) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
    }
    float s = 0.f;
    for (int i = 0; i < ACC; i++) s += _mm512_cvtss_f32(acc[i]);
    return s;
}

/* The vector width in floats of the widest FMA the CPU has, or 0. */
static int fma_width(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 16;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
    return 0;
}
#else
static float run_avx2(float seed) { return seed; }
static float run_avx512(float seed) { return seed; }
static int fma_width(void) { return 0; }
#endif

int main(int argc, char **argv) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads =
        argc > 1 ? bench_parse(prog, argv[1], 1, 1024, "THREADS") : (int)(cores > 0 ? cores : 1);
    int repeats = argc > 2 ? bench_parse(prog, argv[2], 1, 1000, "REPEATS") : 20;
    if (argc > 3) {
        fprintf(stderr, "usage: fma_peak [THREADS [REPEATS]]\n");
        return 2;
    }
    const int width = fma_width();
    if (!width) {
        fprintf(stderr, "fma_peak: this CPU has neither AVX2 with FMA nor AVX-512\n");
        return 1;
    }
    double best = 0.0;
    float sink = 0.f;
    for (int r = 0; r < repeats; r++) {
        double t0 = now_s();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            float seed = (float)(omp_get_thread_num() + r);
            sink += width == 16 ? run_avx512(seed) : run_avx2(seed);
        }
        double gflops = 2.0 * width * ACC * (double)ITERS * threads / (now_s() - t0) / 1e9;
        best = gflops > best ? gflops : best;
    }
    volatile float keep = sink; /* the results are used: the FMAs stay */
    (void)keep;
    printf("fma peak: %.1f GFLOP/s (%d threads, %s, the best of %d)\n", best, threads,
           width == 16 ? "avx512" : "avx2", repeats);
    return 0;
}
