/*
 * sync: the reductions between a training step's schedule and its
 * optimizer: gradients summed where several ranks hold parts of one sum, the
 * global gradient norm, and the step's statistics. Knows nothing of the
 * model: gradients are one flat buffer, the tied embedding one range of it.
 *
 * A step reads: schedule (pipeline.h) -> grads_sync -> grads_norm (clip)
 * -> optimizer.
 */
#ifndef MODTRAIN_SYNC_H
#define MODTRAIN_SYNC_H

#include <stddef.h>

#include "mpi/dp.h"
#include "mpi/grid.h"
#include "mpi/zero.h"

/* The token embedding's gradient on a stage that holds it: its range of
 * the gradients, whether this stage's head adds to it (tied, the last
 * stage), whether both end stages hold a copy (tied), and the embedding's
 * rows when they are kept apart (dp > 1 on the first stage: EmbRows' slot
 * and rows over the Vl x C table; rows NULL otherwise, when the
 * embedding's backward added into the range). */
typedef struct {
    size_t offset, numel;
    int head, shared;
    const int *slot;
    const float *rows;
    int Vl, C;
} TiedGrad;

/* Completes the step's gradients in place: every gradient over the
 * data-parallel group (each dp rank holds the gradient of its share of the
 * step's mean), in buckets; the last expert_n floats, the experts', only
 * over the ranks that hold the same experts (edp_comm) when ep > 1. The
 * tied embedding (tied, NULL on stages without it): the head's share over
 * dp with the rest, the embedding's rows kept apart over dp into the
 * range (a stage without the head reduces only those rows), then the two
 * stages' copies summed over the embedding group. With ov (dp_overlap),
 * the segments ov was given are queued or in flight already, bucket by
 * bucket as the backward finished them: every bucket is waited on, then
 * the rest reduced here. The order of the sums is the same with and without ov, so a
 * dp 2 run gives the same bits either way. With z (ZeRO-1), every
 * reduction over dp and edp is z's reduce-scatter instead: only this
 * rank's parts hold the sums after (the tied embedding's too, summed over
 * the embedding group part by part). */
void grads_sync(float *grads, size_t n, size_t expert_n, const TiedGrad *tied, const Grid *g,
                DpOverlap *ov, const Zero *z);
/* ZeRO-1's sums of squares (model_grad_sumsq_ranges over z's shard)
 * completed over the parts' groups: [0] over dp, [1] (the experts') over
 * edp. Then grads_norm as without ZeRO. */
void zero_sumsq_reduce(double split[2], double replicated[2], const Zero *z);
/* The L2 norm of the whole model's gradients from this rank's sums of
 * squares ([0] of the shared tensors, [1] of this rank's experts): those of
 * tensors split across tp are summed over the tp group, replicated ones
 * count once, the experts' are summed over the ep group; the stages' totals
 * are summed over the pipeline. Collective over tp, ep and pp. */
double grads_norm(const double split[2], const double replicated[2], const Grid *g);
/* Sums v[0..n) over comm in place; a no-op for MPI_COMM_NULL or a group of
 * one. */
void stats_reduce(double *v, int n, MPI_Comm comm);

#endif
