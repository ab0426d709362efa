/*
 * grid: rank arithmetic and communicators (after HPL's grid_init/grid_exit).
 */
#include "mpi/grid.h"

#include "mpi/check.h"

int grid_init(Grid *g, int tp, int pp, Err *err) {
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g->world));
    MPI_CHECK(MPI_Comm_set_errhandler(g->world, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_size(g->world, &g->world_size));
    MPI_CHECK(MPI_Comm_rank(g->world, &g->world_rank));
    g->tp_comm = g->dp_comm = g->pp_comm = g->emb_comm = MPI_COMM_NULL;
    if (g->world_size % (tp * pp) != 0) {
        MPI_CHECK(MPI_Comm_free(&g->world));
        return err_set(err,
                       "layout: %d ranks are not divisible by tp x pp = %d x %d (run a multiple "
                       "of %d ranks)",
                       g->world_size, tp, pp, tp * pp);
    }
    g->tp = tp;
    g->pp = pp;
    g->dp = g->world_size / (tp * pp);
    g->tp_rank = g->world_rank % tp;
    g->dp_rank = (g->world_rank / tp) % g->dp;
    g->pp_rank = g->world_rank / (tp * g->dp);
    MPI_CHECK(MPI_Comm_split(g->world, g->pp_rank * g->dp + g->dp_rank, g->tp_rank, &g->tp_comm));
    MPI_CHECK(MPI_Comm_split(g->world, g->pp_rank * tp + g->tp_rank, g->dp_rank, &g->dp_comm));
    MPI_CHECK(MPI_Comm_split(g->world, g->dp_rank * tp + g->tp_rank, g->pp_rank, &g->pp_comm));
    int ends = pp > 1 && (g->pp_rank == 0 || g->pp_rank == pp - 1);
    MPI_CHECK(MPI_Comm_split(g->world, ends ? g->dp_rank * tp + g->tp_rank : MPI_UNDEFINED,
                             g->pp_rank, &g->emb_comm));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(g->world, MPI_COMM_TYPE_SHARED, g->world_rank, MPI_INFO_NULL,
                                  &node));
    MPI_CHECK(MPI_Comm_size(node, &g->local_ranks));
    MPI_CHECK(MPI_Comm_free(&node));
    return 0;
}

void grid_free(Grid *g) {
    MPI_Comm *comms[] = {&g->tp_comm, &g->dp_comm, &g->pp_comm, &g->emb_comm, &g->world};
    for (int i = 0; i < 5; i++)
        if (*comms[i] != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(comms[i]));
}
