/*
 * dataset: what train_data, val_data and `eval --data` name, and the order
 * in which a run reads it.
 *
 * A spec is one shard, a glob pattern of shards (matched in byte order),
 * or a weighted blend of those, "0.7:web/train_*.bin,0.3:code/train_*.bin"
 * (weights are normalised). Each part of a blend is a dataset: its shards'
 * sequences, windows of T+1 tokens starting at multiples of T within a
 * shard, numbered in shard order. Opening reads the shards' headers only;
 * no rank holds tokens beyond the sequences it reads (pread), and nothing
 * here grows with the number of tokens.
 *
 * The order is a pure function of (seed, g) for sample g of the run (the
 * g-th sequence consumed, from 0):
 *   1. the blend's schedule gives g's dataset d and i, the number of d's
 *      samples before g: a period in which each dataset holds its weight's
 *      share exactly (weights of up to 6 decimals: 0.7 and 0.3 make a
 *      period of 10; others are rounded to 2^-22), laid out so that every
 *      prefix is within 1 - 1/(2D-2) samples of its share (Tijdeman's
 *      chairman assignment), hence every window of N samples within 2;
 *   2. epoch e = i / n_d and position p = i mod n_d of the dataset's n_d
 *      sequences;
 *   3. sequence = a keyed bijection of [0, n_d) applied to p: a Feistel
 *      network on the next even power of two, cycle-walked into range,
 *      keyed by (seed, d, e), so each epoch of each dataset is a new
 *      permutation and needs no table;
 *   4. the shard holding that sequence (a binary search of the shards'
 *      first sequence numbers) and its first token's offset.
 */
#ifndef MODTRAIN_DATASET_H
#define MODTRAIN_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"
#include "src/data/data.h"

#define DS_MAX_PARTS 64          /* datasets in a blend */
#define DS_MAX_SHARDS 1000000    /* shards in a spec */
#define DS_PERIOD_BITS 22        /* the blend schedule's period: at most 2^22 samples */
#define DS_FILES 8               /* shards a Dataset keeps open */

typedef struct {
    char *path;
    uint64_t n_tokens, file_size;
    ShardMeta meta;
    uint64_t first_seq, n_seqs; /* its sequences in the dataset's numbering */
} DsShard;

typedef struct {
    char *pattern;     /* the spec's part, as written */
    double given;      /* the weight as the spec gives it */
    double weight;     /* normalised: the parts' add up to 1 */
    uint32_t quota;    /* samples in each period of the schedule */
    DsShard *shards;   /* (n_shards) */
    int n_shards;
    uint64_t n_tokens, n_seqs;
} DsPart;

typedef struct {
    DsPart *parts; /* (n_parts) */
    int n_parts, T;
    uint64_t seed;
    /* the blend's schedule (n_parts > 1): the dataset of each sample of a
     * period, and every 256th sample's count of each dataset before it */
    uint64_t period; /* samples; at most 2^DS_PERIOD_BITS */
    uint8_t *sched;  /* (period) */
    uint32_t *marks; /* (period / 256 + 1, n_parts) */
    /* shards kept open for reading, least recently used first out */
    struct {
        int fd, part, shard;
        uint64_t used;
    } files[DS_FILES];
    uint64_t clock;
    uint8_t *raw;  /* ((T + 1) x 4): a sequence's bytes as read */
    uint32_t *buf; /* (T + 1): its tokens */
} Dataset;

/* Where sample g of the run (or a sequence of a dataset) lies. */
typedef struct {
    int part;        /* the blend's dataset, from 0 */
    int shard;       /* in the dataset */
    uint64_t epoch;  /* of that dataset */
    uint64_t index;  /* the dataset's samples before this one */
    uint64_t seq;    /* the sequence's number in the dataset */
    uint64_t offset; /* the shard's index of the sequence's first token */
} DsSample;

/* Splits spec into its parts (at most DS_MAX_PARTS) and their weights (1
 * for a spec of one part without one); pats[] are allocated for the
 * caller. Reads no file. Returns the count, or -1 with err naming the bad
 * part (nothing left allocated). */
int ds_parse_spec(const char *spec, char **pats, double *w, Err *err);

/* Parses spec, expands its patterns and reads every shard's header:
 * present, a token shard, the same tokenizer and vocabulary as the first,
 * and every dataset at least one sequence of T + 1 tokens. Returns 0, or -1
 * with err naming the shard or the part of the spec. */
int ds_open(Dataset *ds, const char *spec, int T, uint64_t seed, Err *err);
void ds_free(Dataset *ds);
/* What ds_open found, as bytes (malloc'd, *len of them), and the dataset
 * again from them on another rank: one rank reads the headers of a
 * thousand shards, not every rank. ds_unpack returns 0 or -1 with err
 * set (a malformed buffer). */
uint8_t *ds_pack(const Dataset *ds, size_t *len);
int ds_unpack(Dataset *ds, const uint8_t *buf, size_t len, int T, uint64_t seed, Err *err);

/* The shards' common tokenizer and vocabulary (the first shard's). */
const ShardMeta *ds_meta(const Dataset *ds);
/* Every shard's tokens, and sequences, over all datasets. */
uint64_t ds_tokens(const Dataset *ds);

/* Where sample g of the run lies. */
void ds_locate(const Dataset *ds, uint64_t g, DsSample *s);
/* Where sequence seq (< n_seqs) of dataset part lies, unshuffled
 * (validation reads a dataset's first sequences in order). */
void ds_locate_seq(const Dataset *ds, int part, uint64_t seq, DsSample *s);
/* The samples of dataset part among the run's first g. */
uint64_t ds_part_count(const Dataset *ds, int part, uint64_t g);

/* Reads the sequence at s: inputs (T) and targets (T), every token below
 * vocab. Returns 0, or -1 with err naming the shard and the offset (a
 * short read: the file was truncated; a token outside the vocabulary). */
int ds_read(Dataset *ds, const DsSample *s, int vocab, int *inputs, int *targets, Err *err);

/* Bytes the data path takes on a rank that reads local_batch sequences of
 * T tokens a step from spec: the step's inputs and targets, the read
 * buffer, the shard table (shards of `shards` entries) and a blend's
 * schedule (from the weights alone; no file is read). A spec that does
 * not parse counts as one dataset. */
size_t ds_memory(const char *spec, int local_batch, int T, size_t shards);

/* Asks the kernel to start reading the sequence at s (a step's reads of
 * the next step's samples: a cold page cache then fills while the step
 * computes). Failures are left to the read. */
void ds_prefetch(Dataset *ds, const DsSample *s);

/* The keyed bijection of [0, n) (n >= 1) that orders a dataset's epoch. */
uint64_t ds_permute(uint64_t x, uint64_t n, uint64_t key);

/* The dataset's identity, as a checkpoint records it: (key, value) pairs
 * "data.parts", "data.pD" (weight, shards, tokens) and "data.pD.sS" (a
 * shard's name, tokens and content hash, or its size where its header has
 * none). fn is called once per pair. */
void ds_identity(const Dataset *ds, void (*fn)(void *ctx, const char *key, const char *value),
                 void *ctx);
/* Compares the identity a checkpoint recorded (look(ctx, key) gives its
 * value, NULL where absent) with ds's. Returns 0 when they agree, 1 when
 * the checkpoint has no record (written before there was one), or -1
 * with why naming the first difference. */
int ds_identity_compare(const Dataset *ds, const char *(*look)(void *ctx, const char *key),
                        void *ctx, Err *why);

#endif
