/*
 * ep: expert parallelism's all-to-all. A rank sends each of its rows to the
 * rank holding the expert the row chose and gets the experts' outputs back,
 * with MPI_Alltoall of the counts and MPI_Alltoallv of the rows. Knows
 * nothing of the model: rows are C floats, experts are numbered so that
 * rank r of the group holds experts [r * El, (r + 1) * El).
 *
 * The order is fixed, so a layout's runs are bitwise repeatable: a rank
 * sends its rows grouped by expert (ascending), and each expert receives
 * them grouped by sending rank (ascending), each rank's rows in the order
 * it sent them.
 */
#ifndef MODTRAIN_EP_H
#define MODTRAIN_EP_H

#include <mpi.h>

typedef struct {
    MPI_Comm comm; /* MPI_COMM_NULL when alone */
    int size, rank;
} EpGroup;

/* Sends rows send[(sum of send_counts), C], grouped by expert, send_counts
 * (size x El) rows to each expert, and gathers the rows for this rank's El
 * experts into recv, expert by expert: expert el's rows are recv rows
 * [eoff[el], eoff[el + 1]), from rank 0's first. recv_counts (size x El)
 * says how many each rank sent each local expert: exchanged first unless
 * counts_known (the backward reuses the forward's). Returns the rows
 * received (eoff[El]). */
int ep_dispatch(const EpGroup *g, const float *send, const int *send_counts, int El, int C,
                int counts_known, int *recv_counts, int *eoff, float *recv);
/* The way back: rows laid out as ep_dispatch's recv (its counts and
 * offsets) go back to the ranks that sent them, into out laid out as that
 * rank's send. */
void ep_return(const EpGroup *g, const float *rows, const int *send_counts,
               const int *recv_counts, const int *eoff, int El, int C, float *out);

/* Bytes this rank sent in the all-to-alls since start, and the seconds it
 * spent in them (for the step's phases and the benchmarks). */
extern unsigned long long ep_bytes;
extern double ep_time_s;

#endif
