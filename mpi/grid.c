/*
 * grid: rank arithmetic and communicators (after HPL's grid_init/grid_exit).
 */
#include "mpi/grid.h"

#include "mpi/check.h"

#include <stdio.h>
#include <string.h>

int grid_init(Grid *g, int tp, int pp, Err *err) {
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g->world));
    MPI_CHECK(MPI_Comm_set_errhandler(g->world, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_size(g->world, &g->world_size));
    MPI_CHECK(MPI_Comm_rank(g->world, &g->world_rank));
    g->tp_comm = g->dp_comm = g->pp_comm = g->emb_comm = MPI_COMM_NULL;
    g->ep_comm = g->edp_comm = MPI_COMM_NULL;
    g->ep = 1;
    g->ep_rank = 0;
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

int grid_init_ep(Grid *g, int ep, int n_expert, Err *err) {
    if (g->dp % ep != 0) {
        /* the alternatives must also split the experts (config_validate) */
        char alts[256] = "";
        for (int k = 1; k <= g->dp && strlen(alts) < sizeof alts - 16; k++)
            if (g->dp % k == 0 && (n_expert == 0 || n_expert % k == 0))
                snprintf(alts + strlen(alts), sizeof alts - strlen(alts), "%s%d",
                         alts[0] ? ", " : "", k);
        return err_set(err,
                       "layout: ep = %d does not divide dp = %d (the experts spread over ep of "
                       "the data-parallel ranks: choose ep in {%s}, or run a multiple of ep x tp "
                       "x pp = %d ranks)",
                       ep, g->dp, alts, ep * g->tp * g->pp);
    }
    g->ep = ep;
    g->ep_rank = g->dp_rank % ep;
    if (ep == 1) return 0;
    const int group = g->dp_rank / ep, groups = g->dp / ep;
    const int stage = g->pp_rank * g->tp;
    MPI_CHECK(MPI_Comm_split(g->world, (stage * groups + group * g->tp) + g->tp_rank, g->ep_rank,
                             &g->ep_comm));
    MPI_CHECK(MPI_Comm_split(g->world, (stage * ep + g->ep_rank * g->tp) + g->tp_rank, group,
                             &g->edp_comm));
    return 0;
}

void grid_free(Grid *g) {
    MPI_Comm *comms[] = {&g->tp_comm, &g->dp_comm,  &g->pp_comm, &g->emb_comm,
                         &g->ep_comm, &g->edp_comm, &g->world};
    for (int i = 0; i < 7; i++)
        if (*comms[i] != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(comms[i]));
}
