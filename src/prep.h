/*
 * prep: text files to token shards, the work of `modtrain prep`.
 */
#ifndef MODTRAIN_PREP_H
#define MODTRAIN_PREP_H

#include <stddef.h>

#include "src/base/util.h"
#include "src/bpe.h"
#include "src/data.h"

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
