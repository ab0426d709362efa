/*
 * phases: where a training step's time goes, the way Megatron's timers
 * split it. Each rank measures its own phases; the metrics line of a step
 * and the table at the end of a run reduce them over the ranks.
 *
 * A step's interval runs from the end of the previous step's schedule,
 * sync and update to the end of its own, so validation and checkpoint
 * stalls after step N count in step N+1's interval; "other" is what no
 * phase claims (logging, the stop check, launching sends).
 */
#ifndef MODTRAIN_TRAIN_PHASES_H
#define MODTRAIN_TRAIN_PHASES_H

#include <mpi.h>
#include <stdio.h>

#include "src/train/record.h"
#include "src/train/shared.h"

typedef enum {
    PH_FORWARD,   /* forward compute, tp collectives excluded */
    PH_BACKWARD,  /* backward compute, tp collectives excluded */
    PH_TP,        /* tensor-parallel collectives in the forward and backward */
    PH_EP,        /* expert-parallel all-to-alls in the forward and backward */
    PH_DP,        /* gradient and statistics all-reduces after the schedule */
    PH_PP_WAIT,   /* waiting for a neighbouring stage's activations or gradients */
    PH_OPTIMIZER, /* gradient norm, clipping and AdamW */
    PH_CKPT,      /* checkpoint work training waited for */
    PH_EVAL,      /* validation */
    PH_DATA,      /* reading the step's sequences */
    PH_OTHER,
    PH_N
} Phase;

typedef struct {
    double mark;        /* when the current interval began */
    double cur[PH_N];   /* the current interval's seconds */
    double last[PH_N];  /* the last finished interval's */
    double total[PH_N]; /* every finished interval's, on this rank */
    double last_len, total_len;
    /* the kernel timer's sgemm seconds (kernels_gemm_seconds): at the
     * interval's start, in the last interval, in every finished one */
    double gemm_mark, gemm_last, gemm_total;
    int steps;
} Phases;

/* Starts the first interval now. */
void phases_start(Phases *p);
/* Adds s seconds to phase ph of the current interval. */
void phases_add(Phases *p, Phase ph, double s);
/* Ends the current interval now (other = its length less the phases). */
void phases_end_step(Phases *p);
/* Collective over comm: adds the last interval's phases to rank 0's
 * metrics record (mean over ranks in ms, and min and max of the waits):
 * interval_ms, phase_ms (forward, backward, tp_comm, ep_comm, dp_comm,
 * pp_wait, optimizer, ckpt_stall, eval, data, other), wait_ms and gemm_ms
 * (the time in sgemm calls, inside forward, backward, optimizer and eval). */
void phases_record(const Phases *p, MPI_Comm comm, Record *rec);
/* Collective over comm: the run's table, said by rank 0, with the share
 * of the compute phases (forward, backward, optimizer, eval) spent in
 * sgemm calls. */
void phases_summary(const Phases *p, MPI_Comm comm, const Say *say);

#endif
