/*
 * ep: the expert all-to-all (see ep.h), in rows of C floats.
 */
#include "mpi/ep.h"

#include <stdlib.h>
#include <string.h>

#include "mpi/check.h"
#include "src/base/util.h"

unsigned long long ep_bytes = 0;
double ep_time_s = 0;

/* Per-rank row counts and displacements of a (size x El) count table. */
static void rank_rows(const int *counts, int size, int El, int *n, int *displ) {
    int at = 0;
    for (int r = 0; r < size; r++) {
        n[r] = 0;
        for (int e = 0; e < El; e++) n[r] += counts[r * El + e];
        displ[r] = at;
        at += n[r];
    }
}

/* Copies between the rank-major layout of an all-to-all (rank r's rows,
 * expert by expert) and the expert-major one (expert el's rows, rank by
 * rank); to_expert says which way. */
static void regroup(float *expert_major, float *rank_major, const int *counts, const int *displ,
                    const int *eoff, int size, int El, int C, int to_expert) {
    for (int e = 0; e < El; e++) {
        int at = eoff[e];
        for (int r = 0; r < size; r++) {
            int from = displ[r];
            for (int e2 = 0; e2 < e; e2++) from += counts[r * El + e2];
            const size_t bytes = (size_t)counts[r * El + e] * C * sizeof(float);
            float *x = expert_major + (size_t)at * C, *y = rank_major + (size_t)from * C;
            if (bytes) memcpy(to_expert ? x : y, to_expert ? y : x, bytes);
            at += counts[r * El + e];
        }
    }
}

/* One all-to-all of rows; counts and displacements in rows. */
static void alltoallv_rows(const EpGroup *g, const float *send, const int *sn, const int *sd,
                           float *recv, const int *rn, const int *rd, int C) {
    MPI_Datatype row;
    MPI_CHECK(MPI_Type_contiguous(C, MPI_FLOAT, &row));
    MPI_CHECK(MPI_Type_commit(&row));
    MPI_CHECK(MPI_Alltoallv(send, sn, sd, row, recv, rn, rd, row, g->comm));
    MPI_CHECK(MPI_Type_free(&row));
    for (int r = 0; r < g->size; r++)
        if (r != g->rank) ep_bytes += (unsigned long long)sn[r] * C * sizeof(float);
}

int ep_dispatch(const EpGroup *g, const float *send, const int *send_counts, int El, int C,
                int counts_known, int *recv_counts, int *eoff, float *recv) {
    const double t0 = now_s();
    const int P = g->size;
    int *n = xmalloc(4 * (size_t)P * sizeof(int)), *sd = n + P, *rn = n + 2 * P, *rd = n + 3 * P;
    if (!counts_known)
        MPI_CHECK(MPI_Alltoall(send_counts, El, MPI_INT, recv_counts, El, MPI_INT, g->comm));
    rank_rows(send_counts, P, El, n, sd);
    rank_rows(recv_counts, P, El, rn, rd);
    eoff[0] = 0;
    for (int e = 0; e < El; e++) {
        eoff[e + 1] = eoff[e];
        for (int r = 0; r < P; r++) eoff[e + 1] += recv_counts[r * El + e];
    }
    const int R = eoff[El];
    float *tmp = xmalloc(((size_t)R * C + 1) * sizeof(float));
    alltoallv_rows(g, send, n, sd, tmp, rn, rd, C);
    regroup(recv, tmp, recv_counts, rd, eoff, P, El, C, 1);
    free(tmp);
    free(n);
    ep_time_s += now_s() - t0;
    return R;
}

void ep_return(const EpGroup *g, const float *rows, const int *send_counts,
               const int *recv_counts, const int *eoff, int El, int C, float *out) {
    const double t0 = now_s();
    const int P = g->size;
    int *n = xmalloc(4 * (size_t)P * sizeof(int)), *sd = n + P, *rn = n + 2 * P, *rd = n + 3 * P;
    rank_rows(send_counts, P, El, n, sd);
    rank_rows(recv_counts, P, El, rn, rd);
    float *tmp = xmalloc(((size_t)eoff[El] * C + 1) * sizeof(float));
    regroup((float *)rows, tmp, recv_counts, rd, eoff, P, El, C, 0);
    alltoallv_rows(g, tmp, rn, rd, out, n, sd, C);
    free(tmp);
    free(n);
    ep_time_s += now_s() - t0;
}
