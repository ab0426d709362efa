/*
 * cmd: the command layer, the only code that prints errors and chooses exit
 * codes. Library code below it (src/, mpi/, checkpoint/) returns a status
 * and fills an Err; a command prints that one line and exits with one of
 * the codes below.
 */
#ifndef MODTRAIN_CMD_H
#define MODTRAIN_CMD_H

#include <mpi.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

#include "checkpoint/ckpt.h"
#include "src/base/util.h"
#include "src/data/data.h"
#include "src/data/dataset.h"
#include "src/model/model.h"
#include "src/model/optim.h"
#include "src/train/shared.h"

/* Exit codes (what each means: exit_codes in commands.c). EXIT_FAILURE is
 * 1, from <stdlib.h>. */
#define EXIT_OK 0       /* done */
#define EXIT_USAGE 2    /* bad input (config, arguments, data, checkpoint) found before work */
#define EXIT_REQUEUE 75 /* saved a checkpoint and stopped early: requeue the job */
#define EXIT_DIVERGED 65 /* the loss was not finite (and rollbacks gave up): do not requeue */
#define EXIT_WATCHDOG 124 /* a rank made no progress for watchdog_s seconds */
#define EXIT_INTERRUPTED 130 /* a second Ctrl-C: ended at once, nothing saved */

/* When the process started (now_s's clock): time_limit counts from it. */
extern double cmd_start_s;

/* Installs train's stop handlers (SIGTERM, SIGUSR1, SIGINT), first thing,
 * so that a signal during setup or the resume load is not lost. */
void train_install_signals(void);

/* The subcommands; each returns its exit code. */
int prep_main(int argc, char **argv);   /* prep.c */
int data_main(int argc, char **argv);   /* data_cmd.c */
int tokenize_main(int argc, char **argv); /* tokenize.c */
int train_main(int argc, char **argv);  /* train.c */
int eval_main(int argc, char **argv);   /* eval.c */
int sample_main(int argc, char **argv); /* sample.c */
int ckpt_main(int argc, char **argv);   /* ckpt_cmd.c */
int plan_main(int argc, char **argv);   /* plan.c */
int reference_main(int argc, char **argv); /* reference.c */
/* The configuration keys, in doc_format (train.c): train's --help, the
 * reference's table. */
void train_print_keys(void);

/* The tables --help, the dispatch, the reference and the man pages come
 * from: the commands (reference.c), exit codes and variables (commands.c). */
typedef struct {
    const char *name;
    int (*main)(int argc, char **argv);
    int mpi; /* 0: none; 1: MPI_Init (funneled); 2: MPI_THREAD_MULTIPLE (train) */
    const char *summary;
} Command;
extern const Command commands[]; /* {NULL} ends it */
typedef struct {
    int code;
    const char *meaning;
} ExitCode;
extern const ExitCode exit_codes[]; /* {-1} ends it */
typedef struct {
    const char *name, *reader, *meaning;
} EnvVar;
extern const EnvVar env_vars[]; /* {NULL} ends it */

/* Warns, once from the lowest rank of each node, when the node's ranks of
 * comm run more threads (each `threads`) than the cores their affinity
 * masks allow together, saying what would fit (oversubscribed). Collective
 * over comm. */
void warn_oversubscribed(int threads, MPI_Comm comm);

/* Whether rc == 0 on every rank of comm (collective): when not, the lowest
 * failing rank prints its err, so the job reports one line and no rank is
 * left waiting. Returns 0 or -1. */
int cmd_agree(int rc, const Err *err, MPI_Comm comm);

/* ds_open_agreed, its error printed once. Returns 0 or -1. */
int ds_open_shared(Dataset *ds, const char *spec, int T, uint64_t seed, MPI_Comm comm);

/* eval_loss, a failed read printed once (*failed set on every rank). */
double evaluate(Model *m, Dataset *ds, int part, int micro, size_t n_seqs, RouteMode mode,
                int backward, float aux_weight, int *failed);

#endif
