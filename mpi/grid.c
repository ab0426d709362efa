/*
 * grid: rank arithmetic and communicators (after HPL's grid_init/grid_exit).
 */
#include "mpi/grid.h"

#include "mpi/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int grid_parse_order(const char *name, int axes[3]) {
    static const char *const names[3] = {"tp", "dp", "pp"};
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        const char *f = name + 3 * i;
        int a = 0;
        while (a < 3 && strncmp(f, names[a], 2) != 0) a++;
        if (a == 3 || f[2] != (i < 2 ? '-' : '\0') || seen & 1 << a) return -1;
        axes[i] = a;
        seen |= 1 << a;
    }
    return 0;
}

/* This rank's node: the node's communicator, and its lowest world rank
 * (the node's name in the ordering). */
static MPI_Comm node_comm(MPI_Comm world, int world_rank, int *leader) {
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Allreduce(&world_rank, leader, 1, MPI_INT, MPI_MIN, node));
    return node;
}

void grid_nodes(int *nodes, int *ranks_per_node) {
    int rank, leader, local, mm[2];
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_Comm node = node_comm(MPI_COMM_WORLD, rank, &leader);
    MPI_CHECK(MPI_Comm_size(node, &local));
    MPI_CHECK(MPI_Comm_free(&node));
    int lead = leader == rank;
    mm[0] = local, mm[1] = -local;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lead, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    *nodes = lead;
    *ranks_per_node = mm[0] == -mm[1] ? local : 0;
}

/* This rank's place when the world is counted node by node, and the nodes
 * (g->nodes, g->local_ranks set). */
static int node_slot(Grid *g) {
    int leader, local_rank;
    MPI_Comm node = node_comm(g->world, g->world_rank, &leader);
    MPI_CHECK(MPI_Comm_size(node, &g->local_ranks));
    MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    MPI_CHECK(MPI_Comm_free(&node));
    int *leaders = xmalloc((size_t)g->world_size * sizeof *leaders), slot = local_rank;
    MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, g->world));
    g->nodes = 0;
    for (int r = 0; r < g->world_size; r++) {
        slot += leaders[r] < leader;
        g->nodes += leaders[r] == r;
    }
    free(leaders);
    return slot;
}

/* Of each axis's groups, how many span nodes: a group's rank 0 asks its
 * members whether they share its node. */
static void count_crossing(Grid *g) {
    const MPI_Comm comms[3] = {g->tp_comm, g->dp_comm, g->pp_comm};
    const int sizes[3] = {g->tp, g->dp, g->pp};
    for (int a = 0; a < 3; a++) {
        MPI_Comm shared;
        int here, rank;
        MPI_CHECK(MPI_Comm_split_type(comms[a], MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared));
        MPI_CHECK(MPI_Comm_size(shared, &here));
        MPI_CHECK(MPI_Comm_free(&shared));
        MPI_CHECK(MPI_Comm_rank(comms[a], &rank));
        g->crossing[a] = rank == 0 && here < sizes[a];
        g->groups[a] = g->world_size / sizes[a];
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, g->crossing, 3, MPI_INT, MPI_SUM, g->world));
}

int grid_init(Grid *g, int tp, int pp, const int axes[3], Err *err) {
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
    const int plain[3] = {AXIS_TP, AXIS_DP, AXIS_PP}, size[3] = {tp, g->dp, pp};
    memcpy(g->axes, axes ? axes : plain, sizeof g->axes);
    int coord[3], stride = 1;
    const int slot = node_slot(g);
    for (int i = 0; i < 3; i++) {
        const int a = g->axes[i];
        coord[a] = slot / stride % size[a];
        stride *= size[a];
    }
    g->tp_rank = coord[AXIS_TP], g->dp_rank = coord[AXIS_DP], g->pp_rank = coord[AXIS_PP];
    MPI_CHECK(MPI_Comm_split(g->world, g->pp_rank * g->dp + g->dp_rank, g->tp_rank, &g->tp_comm));
    MPI_CHECK(MPI_Comm_split(g->world, g->pp_rank * tp + g->tp_rank, g->dp_rank, &g->dp_comm));
    MPI_CHECK(MPI_Comm_split(g->world, g->dp_rank * tp + g->tp_rank, g->pp_rank, &g->pp_comm));
    int ends = pp > 1 && (g->pp_rank == 0 || g->pp_rank == pp - 1);
    MPI_CHECK(MPI_Comm_split(g->world, ends ? g->dp_rank * tp + g->tp_rank : MPI_UNDEFINED,
                             g->pp_rank, &g->emb_comm));
    count_crossing(g);
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
