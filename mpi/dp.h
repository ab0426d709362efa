/*
 * dp: data-parallel gradient averaging. Gradients are summed over the
 * data-parallel group in buckets (one all-reduce per bucket of floats rather
 * than one per tensor), in place.
 */
#ifndef MODTRAIN_DP_H
#define MODTRAIN_DP_H

#include <mpi.h>
#include <stddef.h>

/* Floats per all-reduce call: 4 Mi (16 MiB). */
#define DP_BUCKET ((size_t)1 << 22)

/* buf[0..n) summed over comm in buckets; a no-op for a group of one. */
void dp_allreduce_sum(float *buf, size_t n, MPI_Comm comm);
/* The same for doubles (loss sums, routing counters), unbucketed. */
void dp_allreduce_sum_d(double *buf, int n, MPI_Comm comm);

/* Bytes handed to data-parallel all-reduces since start (for benchmarks). */
extern unsigned long long dp_bytes;

#endif
