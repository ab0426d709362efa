/*
 * tp: the tensor-parallel collectives the model calls between its kernels
 * (Megatron's f and g operators). With one tp rank they do nothing.
 */
#ifndef MODTRAIN_TP_H
#define MODTRAIN_TP_H

#include <mpi.h>
#include <stddef.h>

typedef struct {
    MPI_Comm comm; /* MPI_COMM_NULL when alone */
    int size, rank;
} TpGroup;

/* In-place all-reduces over the tensor-parallel group. */
void tp_allreduce_sum(float *buf, size_t n, const TpGroup *g);
void tp_allreduce_max(float *buf, size_t n, const TpGroup *g);
/* out(size * n) = every rank's in(n), in rank order. */
void tp_allgather(float *out, const float *in, size_t n, const TpGroup *g);
/* 1 when v is the same on every rank of the group. */
int tp_agree_u64(unsigned long long v, const TpGroup *g);

/* Bytes handed to tensor-parallel collectives since start (benchmarks). */
extern unsigned long long tp_bytes;
/* Seconds this rank spent in the tp collectives (for the step's phases). */
extern double tp_time_s;

#endif
