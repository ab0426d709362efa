/*
 * phases: per-phase step timers, reduced over the ranks.
 */
#include "src/train/phases.h"

#include <string.h>

#include "mpi/check.h"
#include "src/base/util.h"
#include "src/kernels/kernels.h"

static const char *const names[PH_N] = {"forward", "backward", "tp_comm",   "ep_comm",
                                        "dp_comm", "pp_wait",  "optimizer", "ckpt_stall",
                                        "eval",    "data",     "other"};

/* Phases that are waits on other ranks: their spread over ranks is shown. */
static int is_wait(int ph) {
    return ph == PH_TP || ph == PH_EP || ph == PH_DP || ph == PH_PP_WAIT || ph == PH_CKPT;
}

void phases_start(Phases *p) {
    memset(p, 0, sizeof *p);
    p->mark = now_s();
    p->gemm_mark = kernels_gemm_seconds();
}

void phases_add(Phases *p, Phase ph, double s) { p->cur[ph] += s; }

void phases_end_step(Phases *p) {
    const double now = now_s(), len = now - p->mark;
    double claimed = 0;
    for (int i = 0; i < PH_OTHER; i++) claimed += p->cur[i];
    p->cur[PH_OTHER] = len - claimed;
    for (int i = 0; i < PH_N; i++) {
        p->last[i] = p->cur[i];
        p->total[i] += p->cur[i];
        p->cur[i] = 0;
    }
    p->last_len = len;
    p->total_len += len;
    const double g = kernels_gemm_seconds();
    p->gemm_last = g - p->gemm_mark;
    p->gemm_total += p->gemm_last;
    p->gemm_mark = g;
    p->steps++;
    p->mark = now;
}

/* Sum, min and max over comm of v[0 .. PH_N + 1] (the phases, the length,
 * the sgemm time) on rank 0. */
enum { NV = PH_N + 2 };
static void reduce(const double *v, MPI_Comm comm, double *sum, double *lo, double *hi, int *n) {
    MPI_CHECK(MPI_Comm_size(comm, n));
    MPI_CHECK(MPI_Reduce(v, sum, NV, MPI_DOUBLE, MPI_SUM, 0, comm));
    MPI_CHECK(MPI_Reduce(v, lo, NV, MPI_DOUBLE, MPI_MIN, 0, comm));
    MPI_CHECK(MPI_Reduce(v, hi, NV, MPI_DOUBLE, MPI_MAX, 0, comm));
}

void phases_record(const Phases *p, MPI_Comm comm, Record *rec) {
    double v[NV], sum[NV], lo[NV], hi[NV];
    memcpy(v, p->last, sizeof p->last);
    v[PH_N] = p->last_len;
    v[PH_N + 1] = p->gemm_last;
    int n, rank;
    reduce(v, comm, sum, lo, hi, &n);
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (rank != 0) return;
    double mean[PH_N], wlo[PH_N], whi[PH_N];
    const char *wait[PH_N];
    int k = 0;
    for (int i = 0; i < PH_N; i++) {
        mean[i] = sum[i] / n * 1e3;
        if (is_wait(i)) wait[k] = names[i], wlo[k] = lo[i] * 1e3, whi[k++] = hi[i] * 1e3;
    }
    record_num(rec, MF_INTERVAL_MS, sum[PH_N] / n * 1e3);
    record_named(rec, MF_PHASE_MS, names, mean, PH_N);
    record_ranges(rec, MF_WAIT_MS, wait, wlo, whi, k);
    record_num(rec, MF_GEMM_MS, sum[PH_N + 1] / n * 1e3);
}

void phases_summary(const Phases *p, MPI_Comm comm, const Say *say) {
    double v[NV], sum[NV], lo[NV], hi[NV];
    memcpy(v, p->total, sizeof p->total);
    v[PH_N] = p->total_len;
    v[PH_N + 1] = p->gemm_total;
    int n;
    reduce(v, comm, sum, lo, hi, &n);
    if (p->steps == 0) return;
    const double len = sum[PH_N] / n, per = 1e3 / p->steps;
    say_log(say, "where the time went: %d steps, %.1f ms each (mean over %d rank%s; min and max over "
         "ranks)\n",
         p->steps, len * per, n, n == 1 ? "" : "s");
    say_log(say, "  %-11s %10s %7s %10s %10s\n", "phase", "ms/step", "share", "min", "max");
    for (int i = 0; i < PH_N; i++)
        say_log(say, "  %-11s %10.2f %6.1f%% %10.2f %10.2f\n", names[i], sum[i] / n * per,
             len > 0 ? 100 * sum[i] / n / len : 0, lo[i] * per, hi[i] * per);
    /* the kernel timer: what of the step is sgemm, what lies between */
    const double compute =
        (sum[PH_FORWARD] + sum[PH_BACKWARD] + sum[PH_OPTIMIZER] + sum[PH_EVAL]) / n;
    const double gemm = sum[PH_N + 1] / n;
    if (len > 0 && compute > 0)
        say_log(say, "  sgemm      %10.2f %6.1f%%   (the rest of the step %.1f%%; of forward, backward, "
             "optimizer and eval, sgemm is %.1f%%)\n",
             gemm * per, 100 * gemm / len, 100 * (len - gemm) / len, 100 * gemm / compute);
}
