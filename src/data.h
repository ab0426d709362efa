/*
 * data: llm.c token shards and the deterministic order in which training
 * reads them.
 *
 * A shard is a 256-int32 header (magic 20240520, version 1, token count;
 * slots 3-6 are modtrain's ShardMeta, zero in llm.c's shards) followed by
 * uint16 tokens. A sequence is a window of T+1 tokens starting at a multiple of
 * T; the global batch of step s is the sequences s*batch .. s*batch+batch-1 of
 * an epoch-wise seeded permutation, so what a step sees depends on the seed
 * alone, never on the parallel layout.
 */
#ifndef MODTRAIN_DATA_H
#define MODTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"
#include "src/bpe.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256

/* The tokenizer that wrote a shard (header slot 4). */
enum { SHARD_TOK_UNKNOWN = 0, SHARD_TOK_BYTE = 1, SHARD_TOK_GPT2 = 2 };

/* What modtrain records in a shard's header beyond the count; zero where
 * llm.c's shards leave it: slot 3 the vocabulary size, slot 4 the
 * tokenizer, slots 5 and 6 the low and high halves of the vocabulary's
 * hash (bpe_hash; 0 for the byte tokenizer). */
typedef struct {
    int vocab;
    int tokenizer;
    uint64_t vocab_hash;
} ShardMeta;

typedef struct {
    char path[512];
    uint16_t *tokens; /* (n_tokens) */
    size_t n_tokens;
    ShardMeta meta;
    int max_token;
} Shard;

/* Loads and checks a shard (magic, version, count against file size).
 * Returns 0, or -1 with err naming the file and the problem. */
int shard_load(Shard *s, const char *path, Err *err);
/* Checks a shard's header: the first len bytes of a file of file_size bytes
 * named name (magic, version, the token count against the size, meta).
 * Returns 0 with the count and meta, or -1 with err. */
int shard_parse_header(const uint8_t *buf, size_t len, uint64_t file_size, const char *name,
                       size_t *n_tokens, ShardMeta *meta, Err *err);
void shard_free(Shard *s);
/* Writes tokens as a shard, atomically. Returns 0 or -1 with err set. */
int shard_write(const char *path, const uint16_t *tokens, size_t n, const ShardMeta *meta,
                Err *err);
/* The tokenizer's name ("byte", "gpt2", "unknown"). */
const char *shard_tokenizer_name(int tokenizer);
/* What wrote a shard, for messages: "the byte tokenizer", "the gpt2
 * tokenizer (vocabulary 0123456789abcdef)", "an unknown tokenizer". */
void shard_describe_tokenizer(const ShardMeta *m, char *buf, size_t n);

/* Sequence windows of length T (plus one target) in a shard. */
size_t shard_num_seqs(const Shard *s, int T);
/* Copies window w: inputs (T) and targets (T). */
void shard_get_seq(const Shard *s, size_t w, int T, int *inputs, int *targets);

/* Deterministic order of training windows. */
typedef struct {
    uint64_t seed;
    size_t n_seqs;
    long long epoch; /* epoch the permutation below belongs to, -1 none */
    size_t *perm;    /* (n_seqs) */
} DataOrder;

void order_init(DataOrder *o, uint64_t seed, size_t n_seqs);
void order_free(DataOrder *o);
/* Window of global sequence index g (= step * batch_size + j). */
size_t order_window(DataOrder *o, uint64_t g);

/* `modtrain prep`: byte-tokenises the files, splits them into train and val
 * by 4096-token chunks (a val_fraction of the chunks, spread evenly, at least
 * one when there are two or more), writes
 * out_dir/train.bin and out_dir/val.bin (none when no chunk goes to val: an
 * old val.bin is removed), both or neither (written beside, then renamed).
 * Returns 0 with the token counts of train and val in counts, or -1 with err
 * set. */
int prep_byte_files(char **files, int nfiles, const char *out_dir, double val_fraction,
                    size_t counts[2], Err *err);

/* Progress of a long prep: fn(ctx, bytes done, bytes in all, seconds). */
typedef struct {
    void (*fn)(void *ctx, size_t done, size_t total, double seconds);
    void *ctx;
} PrepProgress;

typedef struct {
    size_t counts[2]; /* tokens of train and val */
    size_t bytes, docs;
    double seconds; /* tokenising alone */
} PrepStats;

/* `modtrain prep --tokenizer gpt2`: the documents of the files (each file,
 * or with doc_sep the pieces between lines equal to it) encoded with bpe
 * on `threads` threads, each after <|endoftext|> as llm.c writes them,
 * split and written as prep_byte_files does, with the vocabulary size and
 * hash in the shards' header; the same shards whatever the thread count. */
int prep_gpt2_files(char **files, int nfiles, const char *out_dir, double val_fraction,
                    const Bpe *bpe, const char *doc_sep, int threads, const PrepProgress *pg,
                    PrepStats *st, Err *err);

#endif
