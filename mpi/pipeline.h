/*
 * pipeline: every stage-to-stage transfer, and the GPipe and 1F1B schedules
 * over the micro-batches of a step. It knows nothing of the model: a stage
 * is a set of callbacks (forward and backward of micro-batch mb in
 * activation slot s) and four buffers; the schedule moves activations
 * forward and their gradients back with MPI point-to-point messages over the
 * pipeline communicator. Nothing outside this file calls MPI point-to-point.
 */
#ifndef MODTRAIN_PIPELINE_H
#define MODTRAIN_PIPELINE_H

#include <mpi.h>
#include <stddef.h>

typedef enum { PP_1F1B = 0, PP_GPIPE = 1 } PpSchedule;

typedef struct {
    void *ctx;
    void (*forward)(void *ctx, int mb, int slot);
    void (*backward)(void *ctx, int mb, int slot);
    /* where slot's input goes before its forward (stages after the first) */
    float *(*input)(void *ctx, int slot);
    /* slot's output after its forward (stages before the last) */
    float *(*output)(void *ctx, int slot);
    /* the gradient of the stage's output, before a backward (not the last
     * stage), and of its input, after one (not the first) */
    float *(*grad_out)(void *ctx);
    float *(*grad_in)(void *ctx);
    size_t count; /* floats in one activation message */
} PpStage;

/* Message tags of the transfers outside a training step's schedule (whose
 * tags are micro-batch numbers, >= 0 ... n_micro - 1, on the same
 * communicator but never in flight at the same time). */
enum { PP_TAG_EVAL = 0, PP_TAG_DECODE = 1 };

/* Blocking receive of n floats from the previous stage / send to the next
 * stage of pp_comm (rank = stage). */
void pp_recv_prev(float *buf, size_t n, int tag, MPI_Comm pp_comm);
void pp_send_next(const float *buf, size_t n, int tag, MPI_Comm pp_comm);

/* Activation slots a stage needs: 1F1B holds at most pp - stage micro-
 * batches at once, GPipe all of them. */
int pp_slots(PpSchedule s, int n_micro, int stage, int stages);

/* Runs one step's forwards and backwards in the schedule's order; backwards
 * always run in micro-batch order, so both schedules accumulate gradients
 * identically. *max_live gets the most activation slots in use at once.
 * Collective over pp_comm (rank = stage). */
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

#endif
