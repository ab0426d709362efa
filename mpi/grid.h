/*
 * grid: the process grid world = dp x pp x tp (tp fastest, then dp, then pp)
 * and its communicators, built once with MPI_Comm_split and freed at exit.
 * Knows nothing of the model.
 */
#ifndef MODTRAIN_GRID_H
#define MODTRAIN_GRID_H

#include <mpi.h>

/* Checks an MPI call; on failure prints rank, call, file and line and aborts
 * the whole job (communicators use MPI_ERRORS_RETURN so this sees errors). */
#define MPI_CHECK(call)                                                                  \
    do {                                                                                 \
        int mpi_check_rc_ = (call);                                                      \
        if (mpi_check_rc_ != MPI_SUCCESS) grid_mpi_fail(mpi_check_rc_, #call, __FILE__, __LINE__); \
    } while (0)

void grid_mpi_fail(int rc, const char *call, const char *file, int line);

typedef struct {
    int world_size, world_rank;
    int tp, pp, dp;
    int tp_rank, pp_rank, dp_rank;
    MPI_Comm world; /* a dup of MPI_COMM_WORLD with MPI_ERRORS_RETURN */
    MPI_Comm tp_comm, dp_comm, pp_comm;
    MPI_Comm emb_comm; /* first and last pipeline stage (the tied wte); NULL elsewhere */
    int local_ranks; /* ranks on this node, for threads per rank */
} Grid;

/* Splits the world for the given tp and pp. Returns 0, or -1 after rank 0
 * printed why the layout does not fit and which would. */
int grid_init(Grid *g, int tp, int pp);
void grid_free(Grid *g);

#endif
