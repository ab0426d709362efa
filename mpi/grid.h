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
    /* expert parallelism: the dp ranks form groups of ep consecutive ones;
     * ep_comm is a rank's group (the all-to-all), edp_comm the ranks that
     * hold the same experts (one per group: the experts' gradient
     * reduction). Both MPI_COMM_NULL at ep 1, where dp_comm serves. */
    int ep, ep_rank;
    MPI_Comm ep_comm, edp_comm;
    int local_ranks; /* ranks on this node, for threads per rank */
} Grid;

/* Splits the world for the given tp and pp. Returns 0, or -1 with err
 * saying why the layout does not fit and which would (the same on every
 * rank; nothing is left to free). */
int grid_init(Grid *g, int tp, int pp, Err *err);
/* Adds the expert-parallel groups of ep ranks (after grid_init). Returns 0,
 * or -1 with err when ep does not divide dp (the same on every rank; the
 * ep it suggests also divide n_expert). */
int grid_init_ep(Grid *g, int ep, int n_expert, Err *err);
void grid_free(Grid *g);

#endif
