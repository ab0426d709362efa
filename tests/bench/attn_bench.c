/*
 * attn_bench: the O(T) attention kernels against the kept ones that store
 * the T x T probabilities, side by side in one run: forward + backward
 * time (best of REPEATS, the two alternating so drift hits both) and the
 * bytes each keeps between forward and backward, at GPT-2 small's heads.
 * The O(T) kernels with every head whole on one thread run in turn too:
 * O(T)/whole shows what cutting heads into parts gains where B * NH heads
 * are too few for the threads (B 1 NH 1 on 2 threads, say) and costs where
 * they are not. Where the tile products read op(A) in place (kernels_inplace), the O(T)
 * kernels with it packed run in turn too, and the last ratio is in place
 * over packed.
 * usage: attn_bench [THREADS [REPEATS [B NH HS T...]]]
 *   defaults: the machine's threads, 5 repeats, B 4, 12 heads of 64, T 256 1024
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "src/base/util.h"
#include "src/kernels/kernels.h"
#include "tests/bench/bench_util.h"

static const char *prog = "attn_bench";

/* One forward + backward at B sequences of T, NH heads of hs: run 0 the
 * O(T) kernels, 1 the kept ones, 2 the O(T) ones with each head whole on
 * one thread (where run 0 may cut heads into parts), 3 the O(T) ones with
 * op(A) packed. Returns seconds. */
enum { RUN_OT, RUN_KEPT, RUN_WHOLE, RUN_PACKED };
static double step(int run, float *o, float *keep, float *dq, const float *qkv, const float *dy,
                   int B, const int *off, int NH, int hs) {
    kernels_set_inplace(run != RUN_PACKED);
    attention_set_parts(run == RUN_WHOLE ? 0 : -1);
    double t0 = now_s();
    if (run == RUN_KEPT) {
        attention_forward_full(o, keep, qkv, B, off, NH, hs);
        attention_backward_full(dq, dy, qkv, keep, B, off, NH, hs);
    } else {
        attention_forward(o, keep, qkv, B, off, NH, hs);
        attention_backward(dq, dy, qkv, o, keep, B, off, NH, hs);
    }
    const double t = now_s() - t0;
    kernels_set_inplace(1);
    attention_set_parts(-1);
    return t;
}

static void bench(int B, int NH, int hs, int T, int reps) {
    const size_t N = (size_t)B * T, C = (size_t)NH * hs;
    const size_t nfull = (size_t)B * NH * T * T, nlse = N * NH;
    float *qkv = xmalloc(N * 3 * C * sizeof(float)), *dy = xmalloc(N * C * sizeof(float));
    float *o = xmalloc(N * C * sizeof(float)), *dq = xmalloc(N * 3 * C * sizeof(float));
    float *att = xmalloc(nfull * sizeof(float)), *lse = xmalloc(nlse * sizeof(float));
    int *off = xmalloc((size_t)(B + 1) * sizeof(int));
    for (int b = 0; b <= B; b++) off[b] = b * T;
    bench_fill(qkv, N * 3 * C, 1), bench_fill(dy, N * C, 2);
    const int runs = kernels_inplace() & KERNELS_INPLACE_TILE ? 4 : 3;
    double best[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    for (int r = 0; r <= reps; r++) /* round 0 warms each up */
        for (int run = 0; run < runs; run++) {
            double t = step(run, o, run == RUN_KEPT ? att : lse, dq, qkv, dy, B, off, NH, hs);
            if (r > 0 && t < best[run]) best[run] = t;
        }
    printf("T %5d: O(T) %8.2f ms, full %8.2f ms, O(T)/full %.3f; kept %9.3f MB against %9.1f MB",
           T, 1e3 * best[0], 1e3 * best[1], best[0] / best[1], 4e-6 * nlse, 4e-6 * nfull);
    printf("; whole heads %8.2f ms, O(T)/whole %.3f", 1e3 * best[2], best[0] / best[2]);
    if (runs == 4)
        printf("; packed %8.2f ms, in place/packed %.3f", 1e3 * best[3], best[0] / best[3]);
    printf("\n");
    free(qkv), free(dy), free(o), free(dq), free(att), free(lse), free(off);
}

int main(int argc, char **argv) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = argc > 1   ? bench_parse(prog, argv[1], 1, 1024, "THREADS")
                  : cpus > 0 ? (int)cpus
                             : 1;
    int reps = argc > 2 ? bench_parse(prog, argv[2], 1, 1000, "REPEATS") : 5;
    kernels_init(threads, "auto");
    int B = 4, NH = 12, hs = 64;
    if (argc == 4 || argc == 5) {
        fprintf(stderr, "attn_bench: B, NH and HS go together "
                        "(usage: attn_bench [THREADS [REPEATS [B NH HS T...]]])\n");
        return 2;
    }
    if (argc > 5) {
        B = bench_parse(prog, argv[3], 1, 4096, "B"),
        NH = bench_parse(prog, argv[4], 1, 1024, "NH");
        hs = bench_parse(prog, argv[5], 1, 1024, "HS");
    }
    printf("attention, forward + backward, best of %d: B %d, %d heads of %d, %d threads, BLIS %s\n",
           reps, B, NH, hs, threads, kernels_blis_arch());
    if (argc > 6)
        for (int i = 6; i < argc; i++)
            bench(B, NH, hs, bench_parse(prog, argv[i], 1, 1 << 16, "T"), reps);
    else
        for (int T = 256; T <= 1024; T *= 4) bench(B, NH, hs, T, reps);
    return 0;
}
