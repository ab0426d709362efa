/*
 * grid: the process grid world = tp x dp x pp and its communicators, built
 * once with MPI_Comm_split and freed at exit. Ranks are counted node by
 * node (the nodes in the order of their lowest world rank), and the axes
 * laid over that count in a given order, innermost first: with tp
 * innermost, a tp group stays on one node whenever tp divides the ranks a
 * node holds, however the launcher mapped the ranks. World rank 0 is
 * always the grid's origin. Knows nothing of the model.
 */
#ifndef MODTRAIN_GRID_H
#define MODTRAIN_GRID_H

#include <mpi.h>

#include "src/base/util.h"

enum { AXIS_TP = 0, AXIS_DP = 1, AXIS_PP = 2 }; /* the grid's axes */

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
    int nodes;       /* nodes the world spans */
    int axes[3];     /* the order, innermost first (AXIS_TP, AXIS_DP, AXIS_PP) */
    /* per axis (AXIS_*): its groups, and how many of them span nodes */
    int groups[3], crossing[3];
} Grid;

/* The world's nodes and ranks per node (0 when nodes hold unequal counts);
 * collective over MPI_COMM_WORLD. */
void grid_nodes(int *nodes, int *ranks_per_node);
/* The axes of an order named "tp-dp-pp" (any order of the three), innermost
 * first. Returns 0, or -1 when the name is not one. */
int grid_parse_order(const char *name, int axes[3]);

/* Splits the world for the given tp and pp, the axes laid in the order
 * axes (innermost first; NULL: tp, dp, pp). Returns 0, or -1 with err
 * saying why the layout does not fit and which would (the same on every
 * rank; nothing is left to free). */
int grid_init(Grid *g, int tp, int pp, const int axes[3], Err *err);
/* Adds the expert-parallel groups of ep ranks (after grid_init). Returns 0,
 * or -1 with err when ep does not divide dp (the same on every rank; the
 * ep it suggests also divide n_expert). */
int grid_init_ep(Grid *g, int ep, int n_expert, Err *err);
void grid_free(Grid *g);

#endif
