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

/* Completes the step's gradients in place: the tied embedding's two copies
 * (first and last pipeline stage; tied may be NULL on other stages) are
 * summed over the embedding group, then every gradient over the
 * data-parallel group (each dp rank holds the gradient of its share of the
 * step's mean), in buckets; the last expert_n floats, the experts', only
 * over the ranks that hold the same experts (edp_comm) when ep > 1. With
 * ov (dp_overlap), the blocks' range is already in flight, bucket by
 * bucket as the backward finished it: the rest is reduced here, then
 * every bucket waited on. */
void grads_sync(float *grads, size_t n, size_t expert_n, float *tied, size_t tied_n,
                const Grid *g, DpOverlap *ov);
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
