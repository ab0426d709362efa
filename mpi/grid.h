/*
 * grid: the process grid world = dp x pp x tp (tp fastest, then dp, then pp)
 * and its communicators, built once with MPI_Comm_split and freed at exit.
 * Knows nothing of the model.
 */
#ifndef MODTRAIN_GRID_H
#define MODTRAIN_GRID_H

#include <mpi.h>

#include "src/base/util.h"

typedef struct {
    int world_size, world_rank;
    int tp, pp, dp;
    int tp_rank, pp_rank, dp_rank;
    MPI_Comm world; /* a dup of MPI_COMM_WORLD with MPI_ERRORS_RETURN */
    MPI_Comm tp_comm, dp_comm, pp_comm;
    MPI_Comm emb_comm; /* first and last pipeline stage (the tied wte); NULL elsewhere */
    int local_ranks; /* ranks on this node, for threads per rank */
} Grid;

/* Splits the world for the given tp and pp. Returns 0, or -1 with err
 * saying why the layout does not fit and which would (the same on every
 * rank; nothing is left to free). */
int grid_init(Grid *g, int tp, int pp, Err *err);
void grid_free(Grid *g);

#endif
