/*
 * prep_impl: what the prep room's files share and nothing else includes.
 *
 * The room from the top down; a file calls only the files below it:
 *   prep.c       prep_run: the inputs and the output checked, the memory
 *                split, the inputs read, the set committed
 *   documents.c  the splitters (whole files, --doc_sep, JSON Lines) into
 *                blocks, and the worker that encodes and writes a block
 *   shards.c     a split's Writer: shards streamed with their headers
 *   commit.c     the output folder: checks, stale temporaries, the commit
 *   readers.c    an input's text: plain, gzip, zstd
 */
#ifndef MODTRAIN_PREP_IMPL_H
#define MODTRAIN_PREP_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <zlib.h>
#include <zstd.h>

#include "src/base/folder_set.h"
#include "src/base/util.h"
#include "src/data/data.h"
#include "src/prep/prep.h"
#include "src/tokenizer/bpe.h"

#define IO_CHUNK ((size_t)1 << 20)
#define WRITE_TOKENS ((size_t)1 << 19)
#define PATH_CAP 4096

/* ---- reading: plain, gzip, zstd (readers.c) ---- */

enum { IN_PLAIN, IN_GZIP, IN_ZSTD };

typedef struct {
    const char *name; /* for messages: the path, or "standard input" */
    int fd, kind, eof;
    unsigned char *in; /* compressed bytes read, not yet decoded */
    size_t in_len, in_pos;
    z_stream z;
    int z_init, z_done, z_fed;
    ZSTD_DStream *zs;
    size_t zs_ret; /* the last ZSTD_decompressStream return: 0 at a frame's end */
    int window_log;
    uint64_t consumed; /* bytes of the file read */
} Reader;

/* Whether path ends in suffix. */
int ends_with(const char *path, const char *suffix);
/* What kind an input is, by its name. */
int input_kind(const char *path);
/* Opens an input ("-": standard input) for reading; window_log caps what a
 * zstd frame may ask for. Returns 0 or -1 with err set. */
int reader_open(Reader *r, const char *path, int window_log, Err *err);
void reader_close(Reader *r);
/* Up to cap bytes of the input's text into buf: *got of them, 0 at its end.
 * Returns 0 or -1 with err naming the input. */
int reader_read(Reader *r, char *buf, size_t cap, size_t *got, Err *err);
/* The largest window (log2 bytes) a zstd frame may ask for under mem. */
int zstd_window_log(size_t mem);

/* ---- writing: shards streamed into a folder (shards.c) ---- */

typedef struct {
    const char *dir, *split; /* the temporary folder; "train" or "val" */
    ShardMeta meta;
    size_t per_shard;
    int fd; /* the open shard, -1 none */
    char path[PATH_CAP];
    size_t n; /* tokens in the open shard */
    uint32_t crc;
    uint32_t hold; /* a token past a full shard, kept until a second one comes */
    int held;
    uint32_t *buf;  /* (WRITE_TOKENS) tokens not yet written */
    uint8_t *bytes; /* (WRITE_TOKENS x 4) them as the shard stores them (meta.width) */
    size_t nbuf;
    size_t shards; /* closed shards */
    uint64_t total;
} Writer;

/* Appends n tokens to the split, in shards of per_shard tokens. Returns 0
 * or -1 with err set. */
int writer_put(Writer *w, const uint32_t *t, size_t n, Err *err);
/* Ends the split: its last shard closed. */
int writer_finish(Writer *w, Err *err);

/* ---- the output folder (commit.c) ---- */

/* A prep's output folder: a shard set written whole (folder_set.h), its
 * warnings to rep. */
typedef FolderSet Paths;
int paths_make(Paths *p, const char *out, const PrepReport *rep, Err *err);

/* ---- documents and blocks (documents.c) ---- */

/* A document of the block: its bytes (JSON Lines: its line's), and once
 * encoded its tokens. */
typedef struct {
    size_t off, len;
    uint64_t line; /* JSON Lines: the line's number */
    int input;     /* the input it came from */
    int bad;       /* JSON Lines: the line is not what it must be */
    uint32_t *tok; /* its tokens (BPE: <|endoftext|> first; none: an empty document) */
    size_t ntok;
} Doc;

/* A block's finished documents: their bytes and where each lies. */
typedef struct {
    char *buf;
    size_t cap;
    Doc *docs;
    size_t nd, dcap;
} Sealed;

typedef struct {
    const PrepOptions *o;
    const PrepReport *rep;
    PrepStats *st;
    Paths paths;
    Writer w[2];
    size_t cap_doc, block_bytes;
    size_t parse_cap, est; /* JSON Lines: what parsing a block may take; the block's estimate */
    size_t held_base;      /* held before any text but a zstd window (for what --mem would do) */
    int has_zstd;
    char *buf; /* the block: finished documents, then the one being read */
    size_t len, bcap;
    size_t doc_start, line_start;
    Doc *docs;
    size_t nd, dcap;
    char *line; /* JSON Lines: a line split across chunks */
    size_t llen, lcap;
    Bpe **clones;
    BpeIds *ids;
    int eot;
    double t0, last;
    const char *name;  /* the input being read */
    int input;         /* its index */
    int threads;       /* that encode (gpt2) and parse (JSON Lines) */
    uint64_t line_no;  /* of the line being read (1-based) */
    uint64_t doc_line; /* where the document being read starts */
    uint64_t in_done0; /* input bytes of the inputs before this one */
    /* the worker: encodes and writes one sealed block while the next is read */
    Sealed job, spare; /* the block it works on; buffers to read the next into */
    pthread_t worker;
    int busy, job_rc;
    Err job_err;
    uint64_t wdocs; /* documents written (the worker's count) */
} Prep;

/* Tells the progress every 2 s (force: only brings st up to date). */
void progress(Prep *p, int force);
/* The block's bytes under mem (0: too little is left). */
size_t block_bytes_at(const PrepOptions *o, size_t mem, size_t held_base, int has_zstd);
/* What parsing a block's JSON Lines may take. */
size_t parse_cap_of(size_t block_bytes);
/* Reads one input to its end through the splitter. */
int read_input(Prep *p, int input, int window_log, char *chunk, Err *err);
/* Hands the block's finished documents to the worker; block_join waits for
 * it. Each returns 0, or -1 with err. */
int block_flush(Prep *p, Err *err);
int block_join(Prep *p, Err *err);

#endif
