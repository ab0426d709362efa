/*
 * zero: ZeRO-1 (Megatron's distributed optimizer). The flat gradient buffer
 * is cut into pieces of at most DP_BUCKET floats (never across a cut the
 * caller gives: the overlap's buckets, the tied embedding's range, the
 * experts' start), and each piece into one part per rank of its group,
 * on 16 floats: dp for the shared tensors, the experts' replicas (edp) for
 * the experts at ep > 1. A rank reduce-scatters each piece (in place: its
 * part's sum is then where the part lies), updates only its parts
 * (ZeroShard: AdamW's moments hold them back to back) and all-gathers the
 * parameters. The pieces depend only on the buffer's layout and the cuts,
 * so every rank of a group, and both copies of the tied embedding, cut
 * alike, and a run repeats bit for bit.
 */
#ifndef MODTRAIN_ZERO_H
#define MODTRAIN_ZERO_H

#include <mpi.h>
#include <stddef.h>

#include "mpi/progress.h"

/* Pieces of the all-gather in flight at once. */
#define ZERO_INFLIGHT 2

/* A rank's share of the flat parameter buffer under ZeRO-1: ranges
 * [lo[i], hi[i]) of it, ascending and disjoint (AdamW's moments hold them
 * back to back: src/model/optim.h). */
typedef struct {
    int n;
    size_t *lo, *hi;
    size_t floats; /* their total */
    /* dp > 1: every one of dp ranks holds these ranges alike (train_only =
     * routers: the trained tensors), and this is rank dp_rank of them */
    int dp, dp_rank;
} ZeroShard;

typedef struct {
    int npiece;
    size_t *lo, *hi; /* (npiece) the pieces, ascending, tiling [0, n) */
    int *grp;        /* (npiece) 0: over comm[0] (dp), 1: over comm[1] (edp) */
    MPI_Comm comm[2];
    int size[2], rank[2];
    ZeroShard shard; /* this rank's non-empty parts, ascending */
    /* the all-gather in flight (zero_gather_start): each piece's request
     * (MPI_REQUEST_NULL where done or not needed), its counts and
     * displacements, the first piece not yet waited for, and the pump
     * that moves them on while the rank computes (where pump is set) */
    MPI_Request *greq;
    int *gcounts, *gdispls; /* (npiece x the larger group) */
    float *gbuf;
    int gnext, gposted, gready, pump;
    Pump pumping;
} Zero;

/* Cuts [0, n) into pieces: [0, shared) over dp, [shared, n) over edp
 * (edp MPI_COMM_NULL: over dp as well), each also cut at cut[0..ncut).
 * Local. */
void zero_init(Zero *z, size_t n, size_t shared, const size_t *cut, int ncut, MPI_Comm dp,
               MPI_Comm edp);
void zero_free(Zero *z);

/* Reduce-scatters every piece of buf in order, in place (each rank's part
 * then holds its sums), but those inside one of the ranges [skip_lo[i],
 * skip_hi[i]) (in flight already, or left out). Collective over both
 * groups. */
void zero_reduce_scatter(const Zero *z, float *buf, const size_t *skip_lo,
                         const size_t *skip_hi, int nskip);
/* Gathers every rank's parts of buf (the updated parameters), piece by
 * piece. Collective over both groups. */
void zero_gather(Zero *z, float *buf);
/* The same, begun: the pieces' non-blocking all-gathers are posted in
 * order (collective over both groups), ZERO_INFLIGHT ahead of the first
 * not yet waited for (so that a blocking collective meanwhile, whose
 * messages queue behind theirs on a link, waits for few), and the
 * parameters are whole once zero_gather_wait has waited for their pieces:
 * the next step's forward waits for each block's as it reaches the
 * block, each wait posting the next. */
void zero_gather_start(Zero *z, float *buf);
/* Begun before the update: nothing is posted until zero_gather_ready says
 * this rank's parts below `hi` are updated (the pieces they lie in, and
 * those before, may go); zero_gather_ready(z, SIZE_MAX) once the update is
 * done. zero_gather_start is the two at once. */
void zero_gather_begin(Zero *z, float *buf);
void zero_gather_ready(Zero *z, size_t hi);
/* Waits for the pieces that begin below `upto` (SIZE_MAX: all of them; a
 * no-op where nothing is in flight). Local. */
void zero_gather_wait(Zero *z, size_t upto);
/* Seconds spent in zero_gather_wait since start: what of the all-gather a
 * step did not hide. */
extern double dp_gather_wait_s;

/* Parameters gathered since start (bytes; dp_bytes counts the gradients
 * reduce-scattered). */
extern unsigned long long dp_gather_bytes;

#endif
