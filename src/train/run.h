/*
 * run: the trainer's private state, Run, which every file of src/train
 * shares, and the functions they call of each other. Not for use outside
 * src/train: the API is trainer.h.
 */
#ifndef MODTRAIN_TRAIN_RUN_H
#define MODTRAIN_TRAIN_RUN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "checkpoint/ckpt.h"
#include "mpi/dp.h"
#include "mpi/grid.h"
#include "mpi/pipeline.h"
#include "mpi/zero.h"
#include "src/config/config.h"
#include "src/data/dataset.h"
#include "src/model/model.h"
#include "src/model/optim.h"
#include "src/train/phases.h"
#include "src/train/record.h"
#include "src/train/shared.h"
#include "src/train/tboard.h"
#include "src/train/trainer.h"

/* Everything a training run holds. The *_ready flags say what setup reached,
 * so one teardown is right wherever setup stopped. */
typedef struct {
    TrainerOpts opts;
    const Say *say; /* &opts.say */
    Config cfg;
    Grid grid;
    int grid_ready;
    char ckpt_dir[CONFIG_STR + 8];
    Dataset train, val; /* val: when have_val */
    int have_val;
    CkKV *data_id; /* (n_data_id) the training data's identity, saved with each checkpoint */
    int n_data_id;
    int T, local_batch, micro, n_micro; /* local_batch: this dp rank's share of a step */
    Model m;
    AdamW opt;
    int model_ready;
    PpSchedule sched;
    int *inputs, *targets; /* (local_batch, T): this rank's sequences of the step */
    double *frac;          /* (L) share of tokens each block processed */
    FILE *metrics;         /* rank 0 only */
    TBoard *tb;            /* rank 0's, under tensorboard = 1 */
    Record rec;            /* the metrics line being built */
    FILE *data_trace;      /* MODTRAIN_DATA_TRACE: every sample this dp rank reads */
    int threads, n_routed, start;
    double peak_gflops, job_peak_gflops, dense_fpt, step_tokens;
    char peak_how[CONFIG_STR + 64]; /* where peak_gflops came from, for the banner */
    /* timing: the first step pays for warm-up and is left out of the ETA */
    double t_start, time_timed, last_save_s;
    int steps_timed;
    /* asynchronous saves (NULL: synchronous); the one in flight's stall
     * and peak RSS at its start */
    CkptAsync *async;
    double async_stall;
    size_t async_rss0;
    ModelMemory mem; /* what the model takes on this rank */
    Phases ph;       /* where the steps' time goes */
    CkptRunState rs; /* batches skipped, rollbacks, the run id: saved with the step */
    /* the checkpoint this run loaded or committed last ("": none yet), which
     * a rollback returns to, and its step (-1) */
    char last_ckpt[CONFIG_STR + 32];
    int last_step;
    /* time_limit's budget before a save or a validation was timed */
    double save_estimate_s, last_eval_s;
    /* the watchdog's thread, and what it shares with training's */
    pthread_t watchdog;
    pthread_mutex_t watch_lock;
    pthread_cond_t watch_wake;
    int watch_stop;
    atomic_int watch_step;
    int watchdog_ready, resumed;
    DpOverlap ov; /* dp_overlap: the head's and the blocks' buckets (overlap: in use) */
    int overlap, nhead_seg; /* nhead_seg: the head's segments, before the blocks' */
    int *seg_of;            /* (L) each held block's segment of the overlap */
    EmbRows emb_rows;       /* dp > 1 on the first stage: the embedding's rows apart */
    Zero zero;              /* zero 1 at dp > 1 (use_zero): ZeRO-1's pieces and shard */
    int use_zero;
    /* zero 1: the end of the parameters the forward reads before and in
     * each block (index l + 1; 0: the embedding, L + 1: the head: all),
     * which it waits for of the all-gather in flight */
    size_t *zero_need;
    /* train_only = routers: the trained tensors' ranges (n 0: everything
     * trains), AdamW's moments theirs alone */
    ZeroShard trained;
    /* the step loop: begun (the checks before the first step made), the
     * next step's index, the status a run that ended keeps */
    int begun, next, ended;
    TrainStatus end_status;
    TrainerStep last;
} Run;

struct Trainer {
    Run r;
};

/* What one step measured. */
typedef struct {
    double loss, grad_norm, lr, dt, bubble, fpt;
    unsigned long long tp_bytes, dp_bytes, pp_bytes, ep_bytes;
    unsigned long long dp_gather_bytes; /* zero 1: the parameters all-gathered */
    double gather_wait_s; /* zero 1: the forwards' wait for the last step's all-gather */
    int live;
    int nonfinite;  /* the loss or gradient was not finite: no update made */
    int data_error; /* a read failed (err set): no step made */
    uint64_t data_hash; /* the sum over the step's samples of a hash of where each lies */
} StepResult;

/* Where a failure's message stays: on world rank 0 only. Returns -1. */
static inline int run_err_rank0(const Run *r, Err *err) {
    if (err && r->grid.world_rank != 0) err->msg[0] = '\0';
    return -1;
}

/* Waits for ZeRO-1's all-gather in flight, if any: the parameters are
 * whole once it returns. Anything that reads them between steps (a save,
 * an evaluation, a rollback) calls it first. */
static inline void run_params_settle(Run *r) {
    if (r->use_zero) zero_gather_wait(&r->zero, SIZE_MAX);
}

/* setup.c: the config, the grid, the data; the checks of a resumed run. */
int run_setup_layout(Run *r, int argc, char **argv, Err *err);
int run_setup_data(Run *r, Err *err);
int run_check_data(Run *r, CkptRunState *rs, const char *what, Err *err);
void run_new_id(Run *r);
void run_resume_notice(const Run *r);
/* stage.c: this rank's stage of the model and its optimizer, restored or
 * initialised. */
int run_saves_async(const Config *c);
int run_setup_model(Run *r, Err *err);
/* metrics.c: the banner, metrics.jsonl, a step's line. */
int train_peak_gflops(const Config *c, int threads, double *peak, char *how, size_t n, Err *err);
void run_banner(const Run *r);
int run_open_metrics(Run *r, Err *err);
/* Writes r->rec (record_end'ed here) to metrics.jsonl and its scalars to
 * the TensorBoard file (rank 0; the others' records are dropped). */
void run_emit(Run *r);
void run_flush_metrics(Run *r);
/* The TensorBoard file reaches the file system: at each log line. */
void run_flush_tb(Run *r);
void run_close_metrics(Run *r);
double run_step_flops(Run *r);
void run_log(Run *r, int step, const StepResult *s);
/* step.c: one optimizer step. */
void run_step(Run *r, int step, StepResult *out, Err *err);
/* eval.c: validation. */
int run_validate(Run *r, int done, Err *err);
double run_eval_estimate(const Run *r, int done, double per_step);
/* save.c: checkpoints. */
int run_probe_save(Run *r, Err *err);
void run_log_stall(Run *r, int done, double stall);
int run_save(Run *r, int step, Err *err);
int run_finish_async(Run *r, int done, int block, double *stall);
void run_periodic_save(Run *r, int done, double *stall);
/* stop.c: time_limit, stop signals, the checks before the first step. */
int run_time_limit_auto(Run *r, Err *err);
TrainStatus run_maybe_save_or_stop(Run *r, int done, double dt, Err *err);
TrainStatus run_before_steps(Run *r);
/* rollback.c: a non-finite step. */
TrainStatus run_nonfinite(Run *r, int *step, const StepResult *s, Err *err);
/* watchdog.c */
void watchdog_start(Run *r);
void watchdog_stop(Run *r);
/* resume.c: see there. */
int resume_run(const Config *cfg, const char *ckpt_dir, Model *m, AdamW *opt, int *start,
               CkptRunState *rs, char *loaded, size_t ln, MPI_Comm comm, const Say *say,
               Err *err);
int rollback_run(const Config *cfg, const char *ckpt_dir, char *last, size_t ln,
                 const char *run_id, int lo, int hi, Model *m, AdamW *opt, int *step,
                 CkptRunState *rs, MPI_Comm comm, const Say *say, Err *err);
int init_from_check(const Config *cfg, const char *ckpt_dir, MPI_Comm comm, Err *err);
int init_from_load(const Config *cfg, const char *ckpt_dir, Model *m, int resumed, int start,
                   MPI_Comm comm, const Say *say, Err *err);

#endif
