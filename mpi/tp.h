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

#endif
