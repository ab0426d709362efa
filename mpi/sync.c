/*
 * sync: gradient and statistics reductions, each a fixed sequence of
 * all-reduces so that a layout's runs are bitwise repeatable.
 */
#include "mpi/sync.h"

#include <assert.h>
#include <math.h>

#include "mpi/check.h"
#include "mpi/dp.h"

void grads_sync(float *grads, size_t n, size_t expert_n, float *tied, size_t tied_n,
                const Grid *g, DpOverlap *ov) {
    if (g->emb_comm != MPI_COMM_NULL && tied) dp_allreduce_sum(tied, tied_n, g->emb_comm);
    if (g->ep == 1) expert_n = 0; /* the experts' replicas are the dp group */
    const size_t shared = n - expert_n;
    assert(!ov || ov->hi <= shared); /* the blocks' shared tensors, never the experts' */
    if (ov) {
        dp_overlap_start_rest(ov); /* every rank starts its collectives in one order */
        dp_allreduce_sum(grads, ov->lo, g->dp_comm);
        dp_allreduce_sum(grads + ov->hi, shared - ov->hi, g->dp_comm);
    } else {
        dp_allreduce_sum(grads, shared, g->dp_comm);
    }
    if (expert_n) dp_allreduce_sum(grads + shared, expert_n, g->edp_comm);
    if (ov) dp_overlap_finish(ov);
}

double grads_norm(const double split[2], const double replicated[2], const Grid *g) {
    double s[2] = {split[0], split[1]};
    if (g->tp > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, s, 2, MPI_DOUBLE, MPI_SUM, g->tp_comm));
    /* each rank of an ep group holds other experts: their sums add up */
    double experts = s[1] + replicated[1];
    if (g->ep > 1)
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &experts, 1, MPI_DOUBLE, MPI_SUM, g->ep_comm));
    double total = replicated[0] + s[0] + experts;
    if (g->pp > 1)
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, g->pp_comm));
    return sqrt(total);
}

void stats_reduce(double *v, int n, MPI_Comm comm) { dp_allreduce_sum_d(v, n, comm); }
