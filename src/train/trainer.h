/*
 * trainer: a training run as an object. trainer_open sets a run up once
 * (config, grid, data, model, resume, metrics), trainer_step trains one
 * step (schedule -> sync -> clip -> optimizer), logs it, validates it
 * sometimes and may end it in a save or an early stop, and trainer_close
 * frees whatever setup reached. The trainer prints nothing: its lines go
 * to the Say of its options, and a failure comes back as a TrainStatus and
 * an Err, of which the caller makes a message and an exit code.
 */
#ifndef MODTRAIN_TRAIN_TRAINER_H
#define MODTRAIN_TRAIN_TRAINER_H

#include <stdatomic.h>

#include "src/base/util.h"
#include "src/config/config.h"
#include "src/train/shared.h"

typedef enum {
    TRAIN_STEPPED,   /* a step made (or a rollback), more to come */
    TRAIN_DONE,      /* every step trained and the last saved, or nothing was left to train */
    TRAIN_BAD_INPUT, /* bad input found before work: config, arguments, layout, data, checkpoint */
    TRAIN_FAILED,    /* a failure while working: a save that could not be written */
    TRAIN_STOPPED,   /* stopped early on a signal or time_limit, the state saved: requeue */
    TRAIN_DIVERGED,  /* the loss was not finite (and rollbacks gave up): do not requeue */
} TrainStatus;

typedef struct {
    double start_s;   /* now_s() when the process started: time_limit counts from it */
    atomic_int *stop; /* a signal's number asks to stop at the next step boundary (NULL: none) */
    Say say;          /* where the run's lines go */
    /* a test hook called after the backward of step `step` (1-based) on
     * world rank `rank`; NULL: none */
    void (*after_backward)(void *ctx, int rank, int step);
    /* the watchdog found no progress for watchdog_s seconds: `line` says
     * where; it ends the process (NULL, or when it returns: the watchdog
     * stops watching) */
    void (*hang)(void *ctx, const char *line);
    void *ctx; /* after_backward's and hang's */
    /* the exit codes the run's lines name (TRAIN_STOPPED's, TRAIN_DIVERGED's,
     * the watchdog's) */
    int code_stopped, code_diverged, code_watchdog;
} TrainerOpts;

/* What the last step measured. */
typedef struct {
    int step;          /* the steps done with it (1-based) */
    long long samples; /* the data cursor after it */
    double loss, grad_norm, lr, step_s;
    int nonfinite; /* the loss or gradient was not finite: no update made */
} TrainerStep;

typedef struct Trainer Trainer;

/* Sets up a run from `modtrain train`'s arguments (--config FILE, --key
 * value ...); collective over MPI_COMM_WORLD. *out is set, also on failure
 * (trainer_close it). Returns TRAIN_STEPPED (ready), or TRAIN_BAD_INPUT
 * with err set (its message "" on the ranks that leave saying it to
 * another). */
TrainStatus trainer_open(Trainer **out, int argc, char **argv, const TrainerOpts *opts, Err *err);
/* One step (the first call also checks whether there is anything to
 * train; the last also makes the final save). Returns TRAIN_STEPPED while
 * there is more, else how the run ended, with err set as trainer_open's;
 * a run that ended returns the same again. */
TrainStatus trainer_step(Trainer *t, Err *err);
/* trainer_step until the run ends; returns how. */
TrainStatus trainer_run(Trainer *t, Err *err);
/* The last step's figures (step 0 before any). */
const TrainerStep *trainer_last(const Trainer *t);
/* The run's config, as resolved (vocabulary, tokenizer, time_limit). */
const Config *trainer_config(const Trainer *t);
/* Frees what setup reached (joining the watchdog, closing the metrics). */
void trainer_close(Trainer *t);

#endif
