/*
 * sync: gradient and statistics reductions, each a fixed sequence of
 * all-reduces so that a layout's runs are bitwise repeatable.
 */
#include "mpi/sync.h"

#include <math.h>

#include "mpi/check.h"
#include "mpi/dp.h"

void grads_sync(float *grads, size_t n, float *tied, size_t tied_n, const Grid *g) {
    if (g->emb_comm != MPI_COMM_NULL && tied) dp_allreduce_sum(tied, tied_n, g->emb_comm);
    dp_allreduce_sum(grads, n, g->dp_comm);
}

double grads_norm(double sumsq_split, double sumsq_replicated, const Grid *g) {
    if (g->tp > 1)
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sumsq_split, 1, MPI_DOUBLE, MPI_SUM, g->tp_comm));
    double total = sumsq_replicated + sumsq_split;
    if (g->pp > 1)
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, g->pp_comm));
    return sqrt(total);
}

void stats_reduce(double *v, int n, MPI_Comm comm) { dp_allreduce_sum_d(v, n, comm); }
