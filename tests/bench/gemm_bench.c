/*
 * gemm_bench: a block's four linear layers (qkv, the attention's
 * projection, the MLP's two) on modtrain's own packing (gemm = own) against
 * bli_sgemm_ex (gemm = blis), side by side in one run: the forward product,
 * the input's gradient and the weights' gradient, each on twelve blocks'
 * weights in turn (as a model's step meets them, not the same hot matrix),
 * the two alternating so drift hits both. Prints ms per block and the
 * ratio own / blis for each shape, and the largest difference between the
 * two products' outputs. Where own reads a side in place (skx's kernels:
 * kernels_inplace's KERNELS_INPLACE_GEMM), own with that side packed runs in turn too, and the
 * last ratio is own / own packed.
 * usage: gemm_bench [THREADS [REPEATS [C N]...]]
 *   defaults: the machine's threads, 3 repeats; C 768 at N 128 and 1024
 *   (GPT-2 small: a routed block's rows, a dense block's), C 256 at N 2048
 *   (bench_dense.sh's model)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/util.h"
#include "src/kernels/kernels.h"
#include "tests/bench/bench_util.h"

static const char *prog = "gemm_bench";

enum { BLOCKS = 12 };

typedef struct {
    int C, N;
    float *w, *dw, *x, *y; /* BLOCKS blocks' weights and their gradients; activations */
    size_t per_block;
} Shape;

/* One pass over the blocks: ms per block of the forward, dx and dw
 * products of the four layers into t[3]. */
static void pass(const Shape *s, double t[3]) {
    const int C = s->C, N = s->N;
    const int in[4] = {C, C, C, 4 * C}, out[4] = {3 * C, C, 4 * C, C};
    t[0] = t[1] = t[2] = 0;
    for (int b = 0; b < BLOCKS; b++) {
        size_t o = (size_t)b * s->per_block;
        for (int j = 0; j < 4; j++) {
            const float *w = s->w + o;
            float *dw = s->dw + o;
            o += (size_t)in[j] * out[j];
            double t0 = now_s();
            mm(0, 0, N, out[j], in[j], 1.f, s->x, in[j], w, out[j], 0.f, s->y, out[j]);
            double t1 = now_s();
            mm(0, 1, N, in[j], out[j], 1.f, s->y, out[j], w, out[j], 0.f, s->x, in[j]);
            double t2 = now_s();
            mm(1, 0, in[j], out[j], N, 1.f, s->x, in[j], s->y, out[j], 1.f, dw, out[j]);
            t[0] += t1 - t0, t[1] += t2 - t1, t[2] += now_s() - t2;
        }
    }
    for (int i = 0; i < 3; i++) t[i] *= 1e3 / BLOCKS;
}

/* The largest difference between the two products' forward outputs on
 * the first block's qkv weights. */
static double max_diff(const Shape *s) {
    const int C = s->C, N = s->N;
    float *a = xmalloc((size_t)N * 3 * C * sizeof(float)), *b = xmalloc((size_t)N * 3 * C * 4);
    bench_fill(s->x, (size_t)N * 4 * C, 11);
    kernels_set_gemm(0);
    mm(0, 0, N, 3 * C, C, 1.f, s->x, C, s->w, 3 * C, 0.f, a, 3 * C);
    kernels_set_gemm(1);
    mm(0, 0, N, 3 * C, C, 1.f, s->x, C, s->w, 3 * C, 0.f, b, 3 * C);
    double d = 0;
    for (size_t i = 0; i < (size_t)N * 3 * C; i++) d = fmax(d, fabs(a[i] - b[i]));
    free(a);
    free(b);
    return d;
}

int main(int argc, char **argv) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads =
        argc > 1 ? bench_parse(prog, argv[1], 1, 1024, "THREADS") : (int)(cores > 0 ? cores : 1);
    int repeats = argc > 2 ? bench_parse(prog, argv[2], 1, 1000, "REPEATS") : 3;
    int defaults[] = {768, 128, 768, 1024, 256, 2048}, *dims = defaults, nshapes = 3;
    if (argc > 3) {
        if ((argc - 3) % 2 != 0) {
            fprintf(stderr, "gemm_bench: shapes come in pairs C N (got %d numbers)\n", argc - 3);
            return 2;
        }
        nshapes = (argc - 3) / 2;
        dims = xmalloc((size_t)(argc - 3) * sizeof(int));
        for (int i = 3; i < argc; i++)
            dims[i - 3] = bench_parse(prog, argv[i], 1, i % 2 ? 8192 : 65536, i % 2 ? "C" : "N");
    }
    kernels_init(threads, "auto");
    printf("%d threads, BLIS %s kernels; ms per block (4 layers), the best of %d passes over "
           "%d blocks\n",
           threads, kernels_blis_arch(), repeats, BLOCKS);
    printf("%6s %6s | %8s %8s %8s %8s | %8s %8s %8s %8s | %6s %9s", "C", "N", "blis fwd", "dx",
           "dw", "sum", "own fwd", "dx", "dw", "sum", "ratio", "max diff");
    const int inplace = kernels_inplace() & KERNELS_INPLACE_GEMM;
    if (inplace) printf(" | %8s %8s %8s %8s | %6s", "packed", "dx", "dw", "sum", "ratio");
    printf("\n");
    for (int k = 0; k < nshapes; k++) {
        Shape s = {.C = dims[2 * k], .N = dims[2 * k + 1]};
        s.per_block = (size_t)12 * s.C * s.C;
        s.w = xmalloc(BLOCKS * s.per_block * sizeof(float));
        s.dw = xcalloc(BLOCKS * s.per_block, sizeof(float));
        s.x = xmalloc((size_t)s.N * 4 * s.C * sizeof(float));
        s.y = xmalloc((size_t)s.N * 4 * s.C * sizeof(float));
        bench_fill(s.w, BLOCKS * s.per_block, 7);
        bench_fill(s.x, (size_t)s.N * 4 * s.C, 9);
        bench_fill(s.y, (size_t)s.N * 4 * s.C, 10);
        /* blis, own, own with the broadcast side packed (where own reads it
         * in place: kernels_inplace) */
        double best[3][3], t[3];
        for (int i = 0; i < 9; i++) best[i / 3][i % 3] = INFINITY;
        for (int r = 0; r <= repeats; r++) /* the first pass of each warms up */
            for (int v = 0; v < 3; v++) {
                kernels_set_gemm(v > 0);
                kernels_set_inplace(v < 2);
                pass(&s, t);
                for (int i = 0; r > 0 && i < 3; i++) best[v][i] = fmin(best[v][i], t[i]);
            }
        kernels_set_inplace(1);
        double sum[3];
        for (int v = 0; v < 3; v++) sum[v] = best[v][0] + best[v][1] + best[v][2];
        printf("%6d %6d | %8.2f %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f %8.2f | %6.3f %9.2g", s.C,
               s.N, best[0][0], best[0][1], best[0][2], sum[0], best[1][0], best[1][1], best[1][2],
               sum[1], sum[1] / sum[0], max_diff(&s));
        if (inplace)
            printf(" | %8.2f %8.2f %8.2f %8.2f | %6.3f", best[2][0], best[2][1], best[2][2], sum[2],
                   sum[1] / sum[2]);
        printf("\n");
        free(s.w), free(s.dw), free(s.x), free(s.y);
    }
    kernels_set_gemm(1);
    if (dims != defaults) free(dims);
    return 0;
}
