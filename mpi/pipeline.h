/*
 * pipeline: every stage-to-stage transfer, and the GPipe, 1F1B and
 * interleaved 1F1B schedules over the micro-batches of a step. It knows
 * nothing of the model: a stage is a set of callbacks (forward and backward
 * of micro-batch mb in activation slot s) and four buffers; the schedule
 * moves activations forward and their gradients back with MPI
 * point-to-point messages over the pipeline communicator. Nothing outside
 * this file calls MPI point-to-point.
 *
 * Interleaved 1F1B (Megatron-LM's): each of the p ranks holds v chunks of
 * blocks, rank s's chunk k being virtual stage k * p + s of p * v. A
 * micro-batch goes around the ranks v times (rank p - 1's chunk k hands on
 * to rank 0's chunk k + 1), and the bubble shrinks from (p - 1) / (m + p - 1)
 * to (p - 1) / (v * m + p - 1) of the step, for more messages (p v - 1
 * boundaries a micro-batch crosses each way, against p - 1). Each
 * chunk's forwards and backwards still run in micro-batch order, so every
 * gradient sums in the same order as under plain 1F1B.
 */
#ifndef MODTRAIN_PIPELINE_H
#define MODTRAIN_PIPELINE_H

#include <mpi.h>
#include <stddef.h>

typedef enum { PP_1F1B = 0, PP_GPIPE = 1 } PpSchedule;

/* One operation of a rank's schedule: the forward (fwd 1) or backward of
 * micro-batch mb through the rank's chunk `chunk`. */
typedef struct {
    int fwd, chunk, mb;
} PpOp;

/* The operations rank `stage` of `stages` runs in a step of n_micro
 * micro-batches over v chunks (v > 1: 1F1B only, n_micro a multiple of
 * stages), in order, into ops (room for 2 * n_micro * v); returns their
 * count. */
int pp_order(PpSchedule s, int n_micro, int v, int stage, int stages, PpOp *ops);

/* Activation sets the rank needs: the most micro-batches (of any of its v
 * chunks) it has in flight at once under the schedule. A forward takes the
 * lowest free set, for whichever chunk; its backward frees it. */
int pp_sets(PpSchedule s, int n_micro, int v, int stage, int stages);

typedef struct {
    void *ctx;
    /* the forward of micro-batch mb through the rank's chunk `chunk`, in
     * activation set `slot` (which the backward then names) */
    void (*forward)(void *ctx, int chunk, int mb, int slot);
    void (*backward)(void *ctx, int mb, int slot);
    /* where slot's input goes before its forward (stages after the first;
     * the same buffer whatever chunk the set is for) */
    float *(*input)(void *ctx, int slot);
    /* slot's output after its forward (stages before the last) */
    float *(*output)(void *ctx, int slot);
    /* the gradient of the stage's output, before a backward (not the last
     * stage), and of its input, after one (not the first) */
    float *(*grad_out)(void *ctx);
    float *(*grad_in)(void *ctx);
    size_t count; /* floats in one activation message */
    int chunks;   /* v: chunks of blocks this rank holds (0 is taken as 1) */
    int pump;     /* 1: a thread drives MPI's progress during the step (slow links) */
} PpStage;

/* Message tags of the transfers outside a training step's schedule (whose
 * tags are 0 ... 2 * v * n_micro - 1, on the same communicator but never in
 * flight at the same time). */
enum { PP_TAG_EVAL = 0, PP_TAG_DECODE = 1 };

/* Blocking receive of n floats from the previous stage / send to the next
 * stage of pp_comm (rank = stage; the last stage's next is the first, as
 * interleaved chunks go round). */
void pp_recv_prev(float *buf, size_t n, int tag, MPI_Comm pp_comm);
void pp_send_next(const float *buf, size_t n, int tag, MPI_Comm pp_comm);

/* Activation slots a stage needs: 1F1B holds at most pp - stage micro-
 * batches at once, GPipe all of them. */
int pp_slots(PpSchedule s, int n_micro, int stage, int stages);

/* The tags a step of n_micro micro-batches over v chunks uses: 2 v n_micro. */
long long pp_tags(int n_micro, int v);

/* Runs one step's forwards and backwards in the schedule's order; a
 * chunk's backwards always run in micro-batch order, so every schedule
 * accumulates gradients identically. *max_live gets the most activation
 * slots in use at once. Collective over pp_comm (rank = stage). */
void pp_run(PpSchedule s, int n_micro, MPI_Comm pp_comm, const PpStage *st, int *max_live);

/* Seconds this rank spent waiting for its neighbours in pp_run (benchmarks). */
extern double pp_wait_s;
/* Bytes this rank has sent to its neighbouring stages since start. */
extern unsigned long long pp_bytes;

/* Ranks 0 and 1 of comm send `bytes` back and forth `reps` times; returns
 * the best one-way time in seconds on both (0 on the other ranks, or with
 * fewer than 2). For `modtrain plan --calibrate`: the link a pipeline's
 * sends and every collective ride on. */
double pp_pingpong(MPI_Comm comm, int bytes, int reps);
/* Ranks 0 and 1 of comm each send the other `bytes` at once, `reps`
 * times; returns the best time in seconds on both (0 elsewhere): a link
 * loaded both ways, as 1F1B's two directions and an all-reduce load it. */
double pp_exchange(MPI_Comm comm, int bytes, int reps);

/* Jobs of at most this many ranks open every pair's connections at start */
#define PP_CONNECT_MAX_RANKS 64

/* Right after MPI_Init, before any other message: a byte from every rank
 * to every other, all sends posted before any receive, so that between
 * two nodes each direction gets a TCP connection of its own (two ranks
 * whose first message went one way shared one, at half the link's rate
 * each way: mpi_env_defaults). Collective over MPI_COMM_WORLD; it waits
 * 50 ms first, for every rank to leave MPI_Init. Nothing for jobs of one
 * rank, of one node (OMPI_COMM_WORLD_LOCAL_SIZE) or of more than
 * PP_CONNECT_MAX_RANKS. */
void pp_connect_peers(void);

#endif
