/*
 * sync: gradient and statistics reductions, each a fixed sequence of
 * all-reduces so that a layout's runs are bitwise repeatable.
 */
#include "mpi/sync.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "mpi/check.h"
#include "mpi/dp.h"
#include "src/base/util.h"

void grads_sync(float *grads, size_t n, size_t expert_n, const TiedGrad *tied, const Grid *g,
                DpOverlap *ov, const Zero *z) {
    if (g->ep == 1) expert_n = 0; /* the experts' replicas are the dp group */
    const size_t shared = n - expert_n;
    const int rows_apart = tied && tied->rows;
    /* what the overlap has in flight, and a stage's tied range without its
     * head (zero but for the rows reduced apart), are left out of the rest */
    const int k = (ov ? ov->nbucket : 0) + (rows_apart && !tied->head);
    size_t *lo = xmalloc(((size_t)k + 1) * sizeof(size_t)), *hi = xmalloc(((size_t)k + 1) * sizeof(size_t));
    for (int b = 0; ov && b < ov->nbucket; b++) {
        assert(ov->bhi[b] <= shared); /* the shared tensors, never the experts' */
        lo[b] = ov->blo[b], hi[b] = ov->bhi[b];
    }
    if (rows_apart && !tied->head) lo[k - 1] = tied->offset, hi[k - 1] = tied->offset + tied->numel;
    /* the buckets first: every rank starts its collectives on dp_comm in
     * one order, and the queue's last ones may not have started yet */
    if (ov) dp_overlap_finish(ov);
    if (z) {
        zero_reduce_scatter(z, grads, lo, hi, k);
    } else {
        dp_allreduce_sum_outside(grads, shared, lo, hi, k, g->dp_comm);
        if (expert_n) dp_allreduce_sum(grads + shared, expert_n, g->edp_comm);
    }
    free(lo);
    free(hi);
    if (rows_apart)
        dp_rows_reduce_add(grads + tied->offset, tied->Vl, tied->C, tied->slot, tied->rows,
                           g->dp_comm);
    if (g->emb_comm == MPI_COMM_NULL || !tied || !tied->shared) return;
    if (!z) {
        dp_allreduce_sum(grads + tied->offset, tied->numel, g->emb_comm);
        return;
    }
    for (int i = 0; i < z->shard.n; i++) { /* both copies cut the range alike */
        const size_t a = z->shard.lo[i] > tied->offset ? z->shard.lo[i] : tied->offset;
        const size_t e = tied->offset + tied->numel;
        const size_t b = z->shard.hi[i] < e ? z->shard.hi[i] : e;
        if (a < b) dp_allreduce_sum(grads + a, b - a, g->emb_comm);
    }
}

void zero_sumsq_reduce(double split[2], double replicated[2], const Zero *z) {
    double v[4] = {split[0], replicated[0], split[1], replicated[1]};
    if (z->size[0] > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM, z->comm[0]));
    if (z->size[1] > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v + 2, 2, MPI_DOUBLE, MPI_SUM, z->comm[1]));
    split[0] = v[0], replicated[0] = v[1], split[1] = v[2], replicated[1] = v[3];
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
