/*
 * kernels: what every kernel file leans on: the threads and vector width
 * kernels_init sets, BLIS's configuration, the kernel timer and each
 * thread's scratch buffers.
 */
#include "src/kernels/kernels.h"

#include <blis.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/base/util.h"
#include "src/kernels/gemm_impl.h"
#include "src/kernels/kernels_impl.h"

int g_threads = 1;
int kernels_avx2 = 0;
int kernels_avx512 = 0;
static int g_vec_max = 0; /* the widest build this CPU runs */

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

/* The kernel timer: nanoseconds spent in sgemm calls, as wall time. A call
 * inside a parallel region of n threads counts a nth of its time (the
 * threads' products overlap); one outside counts all of it. */
static atomic_llong g_gemm_ns;

void count_ns(struct timespec t0, struct timespec t1) {
    long long ns = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    if (omp_in_parallel()) ns /= omp_get_num_threads();
    atomic_fetch_add_explicit(&g_gemm_ns, ns, memory_order_relaxed);
}

double kernels_gemm_seconds(void) {
    return (double)atomic_load_explicit(&g_gemm_ns, memory_order_relaxed) * 1e-9;
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
