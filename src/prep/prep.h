/*
 * prep: text to token shards, the work of `modtrain prep`, at corpus
 * scale: the inputs (text, gzip, zstd, JSON Lines) stream through in
 * bounded blocks of documents; the tokens go, in document order, into
 * shards of a fixed size written into a folder beside the output, which is
 * renamed into place as a whole when every shard is complete.
 */
#ifndef MODTRAIN_PREP_H
#define MODTRAIN_PREP_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"
#include "src/tokenizer/bpe.h"
#include "src/data/data.h"

#define PREP_MEM_DEFAULT ((size_t)512 << 20)
#define PREP_MEM_MIN ((size_t)16 << 20)
#define PREP_SHARD_TOKENS_DEFAULT 100000000

/* What a prep does. */
typedef struct {
    const char *out; /* the folder the shard set is committed to */
    char **inputs;   /* paths; "-" is standard input */
    int ninputs;     /* .gz and .zst inputs are decompressed */
    const Bpe *bpe;  /* GPT-2's BPE, or NULL for the byte tokenizer */
    const char
        *doc_sep; /* text: documents are the pieces between lines equal to it (NULL: a file) */
    const char *jsonl_key; /* JSON Lines: each line an object, the document under this key */
    double val_fraction;   /* in [0, 1) */
    int threads;           /* >= 1: the threads that encode (gpt2) and parse (JSON Lines) */
    size_t mem;            /* the memory bound, bytes (>= PREP_MEM_MIN) */
    size_t held;           /* bytes held before the prep that count against mem (the
                            * vocabulary); 0: the process's peak RSS, as the command
                            * measures it (tests and harnesses in a process that holds
                            * more, a sanitizer's shadow, say what is theirs) */
    size_t shard_tokens;   /* tokens a shard, 2 .. INT32_MAX - 1 */
    int force;             /* replace a shard set already at out */
} PrepOptions;

/* Where a prep stands (and, at the end, what it did). */
typedef struct {
    double seconds;
    uint64_t in_done, in_total; /* input bytes consumed (as stored: compressed) */
    int in_known;               /* in_total is the whole input (no pipe among them) */
    uint64_t bytes;             /* text read (decompressed) */
    uint64_t docs;
    uint64_t tokens[2]; /* train, val */
    size_t shards[2];   /* shards written of train, val */
    int threads;        /* the threads that worked */
} PrepStats;

/* The command layer's ears: progress(ctx, st) every 2 s or so, note(ctx,
 * line) for a line worth telling (a stale temporary folder removed). Any
 * may be NULL. */
typedef struct {
    void (*progress)(void *ctx, const PrepStats *st);
    void (*note)(void *ctx, const char *line);
    void *ctx;
} PrepReport;

/* The largest document (or JSON Lines line) a prep under the bound mem
 * takes: mem / 16. */
size_t prep_doc_cap(size_t mem);

/* The memory jansson may take to parse the JSON text s of n bytes, from one
 * pass over its bytes: an over-estimate for any input (valid or not). */
size_t prep_jsonl_estimate(const char *s, size_t n);

/* Parses a size: bytes, or a number followed by K, M, G or T (binary: 512M
 * is 512 MiB), the whole string, no overflow. Returns 0 with *out, or -1. */
int prep_parse_size(const char *s, size_t *out);

/* Whether document d (counting from 0 over all inputs) goes to val:
 * floor((d + 1) * f) > floor(d * f), every 1/f-th document. */
int prep_doc_is_val(uint64_t d, double f);

/* `modtrain prep`: the documents of o->inputs encoded (bytes, or o->bpe's
 * ids each after <|endoftext|>), document d to val when prep_doc_is_val
 * (whole documents only), written as OUT/train_000000.bin, ... and
 * OUT/val_000000.bin, ... of o->shard_tokens tokens each (the last of a
 * split the remainder; a remainder of 1 joins the shard before it), each
 * with its count and CRC-32 in the header. The shards are written into
 * OUT.prep-tmp.HOST.PID beside OUT and renamed to OUT when all are done; an
 * existing OUT holding a shard set is refused unless o->force (then the
 * set is replaced whole), one holding anything else always. Stale
 * temporary folders of a prep that was killed are removed first (said
 * through rep->note). The same bytes whatever o->threads. Returns 0 with
 * st filled, or -1 with err set and nothing left at OUT's name or beside
 * it. */
int prep_run(const PrepOptions *o, const PrepReport *rep, PrepStats *st, Err *err);

#endif
