/*
 * shared: what the trainer and the commands both use: the voice through
 * which the trainer's lines reach whoever prints them, agreeing on failure
 * across ranks, thread counts, a step's statistics over the ranks, and
 * evaluation over a dataset (through the pipeline when there is one).
 * Nothing here prints: a failure comes back in an Err.
 */
#ifndef MODTRAIN_TRAIN_SHARED_H
#define MODTRAIN_TRAIN_SHARED_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"
#include "src/config/config.h"
#include "src/data/data.h"
#include "src/data/dataset.h"
#include "src/model/model.h"

/* Where the trainer's lines go: log, a line of progress (whole, with its
 * newline; the caller shows rank 0's); error, one line of trouble without
 * its newline, from the rank that found it (a warning, or a failure said
 * before the one that comes back). Either may be NULL: the line is lost. */
typedef struct {
    void (*log)(void *ctx, const char *text);
    void (*error)(void *ctx, const char *line);
    void *ctx;
} Say;

void say_log(const Say *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void say_error(const Say *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether rc == 0 on every rank of comm (collective). When not, returns -1
 * and leaves err's message on the lowest failing rank only (the others'
 * is ""), so the job says one line and no rank is left waiting. err may be
 * NULL; it is read only where rc != 0. */
int ranks_agree(int rc, Err *err, MPI_Comm comm);

/* Number of threads for "threads = 0": OMP_NUM_THREADS when it is set to a
 * number, else the cores this process may use over the node's ranks. */
int default_threads(int local_ranks);

/* Whether the node's ranks of comm run more threads (each `threads`) than
 * the cores their affinity masks allow together: 1 on the lowest rank of
 * such a node, with msg (n bytes) the warning and what would fit; else 0.
 * Collective over comm. */
int oversubscribed(int threads, MPI_Comm comm, char *msg, size_t n);

/* Sums a step's (or an evaluation's) loss and routing counters over comm
 * into m->stats; returns the summed loss. */
double reduce_step_stats(Model *m, double loss_sum, MPI_Comm comm);

/* Ends the job when a forward found a fault the model cannot recover from
 * (tp ranks that routed differently): the other ranks would wait forever. */
void check_model_fault(const Model *m);

/* ds_open on rank 0 of comm, which shares what it found with the others:
 * one rank reads the shards' headers, however many ranks the job has.
 * Collective. Returns 0, or -1 with err set as ranks_agree leaves it. */
int ds_open_agreed(Dataset *ds, const char *spec, int T, uint64_t seed, MPI_Comm comm, Err *err);

/* Mean loss of m over the first n_seqs sequences (in order) of dataset
 * `part` of ds, in micro-batches of `micro` (summed per sequence, in
 * sequence order: the same bits under any micro), through the pipeline when m
 * has one, with routed blocks choosing tokens by `mode`; m->stats holds
 * what routing did. With backward, also accumulates the gradient of that
 * mean loss (aux_weight for the router's BCE). Collective over
 * MPI_COMM_WORLD (every rank evaluates): a read failing on any rank sets
 * *failed on all and returns NAN, with err set as ranks_agree leaves it. */
double eval_loss(Model *m, Dataset *ds, int part, int micro, size_t n_seqs, RouteMode mode,
                 int backward, float aux_weight, int *failed, Err *err);

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

#endif
