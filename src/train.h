/*
 * train: the training driver and the inference commands: the only code,
 * with the CLI, that sees the config, the grid, the data, the model, the
 * optimizer and the checkpoints together.
 */
#ifndef MODTRAIN_TRAIN_H
#define MODTRAIN_TRAIN_H

/* The exit code of a run that saved a checkpoint and stopped early, on
 * SIGTERM/SIGUSR1 or at time_limit: the job should be requeued. */
#define EXIT_REQUEUE 75

/* `modtrain train [--config FILE] [--key value ...]`; returns the exit code. */
int train_main(int argc, char **argv);
/* `modtrain eval --ckpt DIR --data FILE [--json] ...`; returns the exit code. */
int eval_main(int argc, char **argv);
/* `modtrain sample --ckpt DIR [--prompt TEXT] ...`; returns the exit code. */
int sample_main(int argc, char **argv);
/* `modtrain ckpt list|verify|inspect|export|import ...` (ckpt_cmd.c). */
int ckpt_main(int argc, char **argv);

/* Number of threads for "threads = 0": the node's cores over its ranks. */
int default_threads(int local_ranks);

#include "data.h"
#include "model.h"

/* Mean loss of m over the first n_seqs windows of s, in micro-batches of
 * `micro`, with routed blocks choosing tokens by `mode`; m->stats holds what
 * routing did. With backward, also accumulates the gradient of that mean loss
 * (aux_weight for the router's BCE). */
double evaluate(Model *m, const Shard *s, int micro, size_t n_seqs, RouteMode mode, int backward,
                float aux_weight);

#endif
