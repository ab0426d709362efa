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

/* Exit codes. EXIT_FAILURE (1, from <stdlib.h>) is a failure while working:
 * a save that could not be written, a diverged loss, a checkpoint that does
 * not verify. */
#define EXIT_OK 0       /* done */
#define EXIT_USAGE 2    /* bad input (config, arguments, data, checkpoint) found before work */
#define EXIT_REQUEUE 75 /* saved a checkpoint and stopped early: requeue the job */
#define EXIT_DIVERGED 65 /* the loss was not finite (and rollbacks gave up): do not requeue */
#define EXIT_WATCHDOG 124 /* a rank made no progress for watchdog_s seconds */

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

/* Number of threads for "threads = 0": OMP_NUM_THREADS when it is set to a
 * number, else the cores this process may use over the node's ranks. */
int default_threads(int local_ranks);

/* The sgemm peak of one rank running `threads` threads, for MFU: the
 * config's peak_gflops, else its calibration file's gflops_per_core x
 * threads, else MODTRAIN_PEAK_GFLOPS, else measured now; how (n bytes)
 * says which, for the banner. Returns 0, or -1 with err set (the file, the
 * variable). */
int cmd_peak_gflops(const Config *c, int threads, double *peak, char *how, size_t n, Err *err);

/* The end of this SLURM job (time_limit = auto): SLURM_JOB_END_TIME, else
 * what squeue, else scontrol show job, says for SLURM_JOB_ID. Returns 1
 * with *end set and why naming the source, 0 with why saying what was
 * missing (not in a job, no end time), or -1 with why saying which of the
 * two variables is malformed or out of range. */
int cmd_slurm_end_time(time_t *end, char *why, size_t n);

/* Warns, once from the lowest rank of each node, when the node's ranks of
 * comm run more threads (each `threads`) than the cores their affinity
 * masks allow together, saying what would fit. Collective over comm. */
void warn_oversubscribed(int threads, MPI_Comm comm);

/* Whether rc == 0 on every rank of comm (collective): when not, the lowest
 * failing rank prints its err, so the job reports one line and no rank is
 * left waiting. Returns 0 or -1. */
int cmd_agree(int rc, const Err *err, MPI_Comm comm);

/* Sums a step's (or an evaluation's) loss and routing counters over comm
 * into m->stats; returns the summed loss. */
double reduce_step_stats(Model *m, double loss_sum, MPI_Comm comm);

/* Ends the job when a forward found a fault the model cannot recover from
 * (tp ranks that routed differently): the other ranks would wait forever. */
void check_model_fault(const Model *m);

/* ds_open on rank 0 of comm, which shares what it found with the others:
 * one rank reads the shards' headers, however many ranks the job has.
 * Collective. Returns 0, or -1 (printed once). */
int ds_open_shared(Dataset *ds, const char *spec, int T, uint64_t seed, MPI_Comm comm);

/* Mean loss of m over the first n_seqs sequences (in order) of dataset
 * `part` of ds, in micro-batches of `micro` (summed per sequence, in
 * sequence order: the same bits under any micro), through the pipeline when m
 * has one, with routed blocks choosing tokens by `mode`; m->stats holds
 * what routing did. With backward, also accumulates the gradient of that
 * mean loss (aux_weight for the router's BCE). Collective over
 * MPI_COMM_WORLD (every rank evaluates): a read failing on any rank sets
 * *failed on all (printed once) and returns NAN. */
double evaluate(Model *m, Dataset *ds, int part, int micro, size_t n_seqs, RouteMode mode,
                int backward, float aux_weight, int *failed);

/* Validation's sequences of dataset `part` of ds: the first n of the whole
 * (0: all of it) in the blend's order hold this many of part's, read from
 * its first in order (ds_locate_seq): at least one, at most all it has. */
uint64_t val_seqs(const Dataset *ds, int part, uint64_t n);

/* The tokenizer a shard header's code names (TOK_AUTO for none), and back
 * (SHARD_TOK_UNKNOWN for auto and none). */
Tokenizer tokenizer_of_shard(int shard_tokenizer);
int shard_code_of_tokenizer(Tokenizer t);
/* A vocabulary hash as the 16 lowercase hex digits configs record. */
void format_vocab_hash(uint64_t hash, char hex[CONFIG_HASH_HEX + 1]);

/* Restores a run from a checkpoint as cfg->resume says:
 * - auto: the newest checkpoint of ckpt_dir's line that loads (the line of
 *   the one `latest` names: it, or a newer one of the same run id that a
 *   save killed before `latest` left; then older ones of the line);
 *   another run's checkpoints are never loaded;
 * - never: a fresh start, the checkpoints already in ckpt_dir moved to
 *   ckpt_dir/abandoned/;
 * - a path: that checkpoint.
 * Collective over comm. Returns 1 loaded (*start = its step, *rs its run
 * state, loaded[ln] its directory), 0 start fresh, -1 an error (printed). */
int resume_run(const Config *cfg, const char *ckpt_dir, Model *m, AdamW *opt, int *start,
               CkptRunState *rs, char *loaded, size_t ln, MPI_Comm comm);
/* A rollback's reload: `last` (the checkpoint this run loaded or committed
 * last), or when it no longer loads the newest of line run_id in ckpt_dir;
 * only a step in [lo, hi] (the run's start, the current step) is taken.
 * Collective. Returns 1 (*step, *rs, last[ln] the one loaded), 0 when last
 * is "" (nothing loaded or saved yet: the caller re-initialises), or -1
 * (printed). */
int rollback_run(const Config *cfg, const char *ckpt_dir, char *last, size_t ln,
                 const char *run_id, int lo, int hi, Model *m, AdamW *opt, int *step,
                 CkptRunState *rs, MPI_Comm comm);

/* init_from, before resume_run: refuses (printed, -1) a checkpoint of the
 * run's own ckpt_dir, whose step names a new run would collide with.
 * Collective; 0 or -1. */
int init_from_check(const Config *cfg, const char *ckpt_dir, MPI_Comm comm);
/* init_from, after resume_run (resumed: its result, start: the step it
 * loaded; -1: a rollback before the first save, which loads the weights
 * again): a resumed run logs that init_from is ignored; a new one loads
 * only the weights of init_from (a checkpoint or ckpt_dir under any
 * layout, or a GPT-2 safetensors file), whose model must be cfg's, and
 * leaves the moments as they are. Collective; 0, or -1 (printed once). */
int init_from_load(const Config *cfg, const char *ckpt_dir, Model *m, int resumed, int start,
                   MPI_Comm comm);

#endif
