/*
 * prep: text to token shards (`modtrain prep`).
 */
#include "src/prep.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "src/base/util.h"

#define PREP_CHUNK 4096

/* The whole of a file for prep: read, and not empty. NULL with err set. */
static char *prep_read(const char *path, size_t *len, Err *err) {
    Err e;
    char *buf = read_file(path, SIZE_MAX, len, &e);
    if (!buf) {
        err_set(err, "prep: %s (expected text to tokenise)", e.msg);
        return NULL;
    }
    if (*len == 0) {
        err_set(err, "prep: '%s' is empty (expected text to tokenise)", path);
        free(buf);
        return NULL;
    }
    return buf;
}

/* Refuses an output path that exists and is not a file (a directory named
 * val.bin): found before anything is written. Returns 0 or -1. */
static int check_output(const char *path, Err *err) {
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode)) return 0;
    return err_set(err, "prep: '%s' exists and is not a file (prep replaces files only)", path);
}

/* Writes train (and val, when nv > 0) beside their final names, then moves
 * them into place together: val.bin first (or, with no val tokens, an old
 * val.bin removed, so that it never stands beside a new train.bin), then
 * train.bin. A failure before the renames leaves the old outputs as they
 * were. Returns 0 or -1 with err set. */
static int write_outputs(const char *out_dir, const uint16_t *train, size_t nt, const uint16_t *val,
                         size_t nv, const ShardMeta *meta, Err *err) {
    char tp[1024], vp[1024], ts[1100], vs[1100];
    snprintf(tp, sizeof tp, "%s/train.bin", out_dir);
    snprintf(vp, sizeof vp, "%s/val.bin", out_dir);
    snprintf(ts, sizeof ts, "%s.staged.%ld", tp, (long)getpid());
    snprintf(vs, sizeof vs, "%s.staged.%ld", vp, (long)getpid());
    if (check_output(tp, err) != 0 || check_output(vp, err) != 0) return -1;
    if (mkdirs(out_dir) != 0)
        return err_set(err, "prep: cannot create '%s': %s", out_dir, strerror(errno));
    int rc = shard_write(ts, train, nt, meta, err);
    if (rc == 0 && nv > 0) rc = shard_write(vs, val, nv, meta, err);
    if (rc == 0 && nv > 0 && rename(vs, vp) != 0)
        rc = err_set(err, "prep: cannot rename '%s' to '%s': %s", vs, vp, strerror(errno));
    if (rc == 0 && nv == 0 && unlink(vp) != 0 && errno != ENOENT)
        rc = err_set(err, "prep: cannot remove the old '%s': %s", vp, strerror(errno));
    if (rc == 0 && rename(ts, tp) != 0)
        rc = err_set(err, "prep: cannot rename '%s' to '%s': %s", ts, tp, strerror(errno));
    unlink(ts);
    unlink(vs);
    fsync_dir(out_dir);
    return rc;
}

/* Splits n tokens into train and val by 4096-token chunks (a val_fraction
 * of them, spread evenly, at least one when there are two or more) and
 * writes out_dir/train.bin and out_dir/val.bin with meta in the header
 * (write_outputs: both or neither). */
static int split_write(const uint16_t *tokens, size_t n, const ShardMeta *meta, const char *out_dir,
                       double val_fraction, size_t counts[2], Err *err) {
    size_t n_chunks = (n + PREP_CHUNK - 1) / PREP_CHUNK;
    uint16_t *train = xmalloc(n * sizeof(uint16_t) + 2), *val = xmalloc(n * sizeof(uint16_t) + 2);
    size_t nt = 0, nv = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        /* Chunk c goes to val when the running count floor(c * f) steps up:
         * exactly a fraction f of the chunks, spread evenly over the text. */
        int to_val = floor((double)(c + 1) * val_fraction) > floor((double)c * val_fraction);
        /* a short text still gets a validation chunk: its last one */
        if (c == n_chunks - 1 && c > 0 && val_fraction > 0 && nv == 0) to_val = 1;
        size_t lo = c * PREP_CHUNK, hi = lo + PREP_CHUNK < n ? lo + PREP_CHUNK : n;
        for (size_t i = lo; i < hi; i++) {
            if (to_val) val[nv++] = tokens[i];
            else train[nt++] = tokens[i];
        }
    }
    int rc = -1;
    if (nt < 2 || (val_fraction > 0 && nv < 2))
        err_set(err,
                "prep: the text gives %zu train and %zu val tokens; need at least 2 each "
                "(give more text or change --val-fraction)",
                nt, nv);
    else if ((rc = write_outputs(out_dir, train, nt, val, nv, meta, err)) == 0) {
        counts[0] = nt;
        counts[1] = nv;
    }
    free(train);
    free(val);
    return rc;
}

int prep_byte_files(char **files, int nfiles, const char *out_dir, double val_fraction,
                    size_t counts[2], Err *err) {
    size_t cap = 1 << 20, n = 0;
    uint16_t *tokens = xmalloc(cap * sizeof *tokens);
    for (int i = 0; i < nfiles; i++) {
        size_t len;
        char *buf = prep_read(files[i], &len, err);
        if (!buf) {
            free(tokens);
            return -1;
        }
        if (n + len > cap) {
            while (n + len > cap) cap *= 2;
            tokens = xrealloc(tokens, cap * sizeof *tokens);
        }
        for (size_t k = 0; k < len; k++) tokens[n++] = (uint8_t)buf[k];
        free(buf);
    }
    const ShardMeta meta = {.vocab = 256, .tokenizer = SHARD_TOK_BYTE};
    const int rc = split_write(tokens, n, &meta, out_dir, val_fraction, counts, err);
    free(tokens);
    return rc;
}

/* A document: bytes of one of the files. */
typedef struct {
    const char *p;
    size_t n;
} Doc;

/* Appends the documents of text to *docs: the whole, or with sep the pieces
 * between lines equal to sep (a line's newline stays with it); empty ones
 * are left out. */
static void split_docs(const char *text, size_t n, const char *sep, Doc **docs, size_t *nd,
                       size_t *cap) {
    const size_t sl = sep ? strlen(sep) : 0;
    size_t start = 0;
    for (size_t at = 0; at <= n;) {
        const char *nl = at < n ? memchr(text + at, '\n', n - at) : NULL;
        const size_t end = nl ? (size_t)(nl - text) : n; /* this line: [at, end) */
        const int is_sep = sep && end - at == sl && memcmp(text + at, sep, sl) == 0;
        if (is_sep || end >= n) {
            const size_t stop = is_sep ? at : n;
            if (stop > start) {
                if (*nd == *cap) *docs = xrealloc(*docs, (*cap = 2 * *cap + 16) * sizeof **docs);
                (*docs)[(*nd)++] = (Doc){text + start, stop - start};
            }
            start = is_sep ? (nl ? end + 1 : n) : n;
        }
        if (!nl) break;
        at = end + 1;
    }
}

/* Each document's ids, on threads of their own (a Bpe clone each, the
 * documents handed out in order), so the result does not depend on the
 * thread count. Calls progress from the first thread every 2 s. */
static void encode_docs(const Bpe *bpe, const Doc *docs, size_t nd, int threads, BpeIds *ids,
                        const PrepProgress *pg, size_t total) {
    size_t done_bytes = 0;
    const double t0 = now_s();
    double last = t0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        Bpe *mine = bpe_clone(bpe);
        if (!mine) {
            fprintf(stderr, "modtrain: out of memory for a tokenizer's match data\n");
            abort();
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t d = 0; d < nd; d++) {
            bpe_encode(mine, docs[d].p, docs[d].n, &ids[d]);
            size_t now_done;
#pragma omp atomic capture
            now_done = done_bytes += docs[d].n;
#ifdef _OPENMP
            const int first = omp_get_thread_num() == 0;
#else
            const int first = 1;
#endif
            if (first && pg && pg->fn && now_s() - last >= 2.0) {
                last = now_s();
                pg->fn(pg->ctx, now_done, total, last - t0);
            }
        }
        bpe_free(mine);
    }
}

int prep_gpt2_files(char **files, int nfiles, const char *out_dir, double val_fraction,
                    const Bpe *bpe, const char *doc_sep, int threads, const PrepProgress *pg,
                    PrepStats *st, Err *err) {
    const int vocab = bpe_vocab_size(bpe), eot = bpe_eot(bpe);
    if (vocab > 65536 || eot < 0)
        return err_set(err,
                       "prep: the vocabulary has %d tokens%s; shards hold ids below 65536 "
                       "and documents are separated by <|endoftext|>",
                       vocab, eot < 0 ? " and no <|endoftext|>" : "");
    char **bufs = xcalloc((size_t)nfiles, sizeof *bufs);
    Doc *docs = NULL;
    size_t nd = 0, cap = 0, total = 0, n = 0;
    int rc = -1;
    for (int i = 0; i < nfiles; i++) {
        size_t len;
        if (!(bufs[i] = prep_read(files[i], &len, err))) goto done;
        split_docs(bufs[i], len, doc_sep, &docs, &nd, &cap);
        total += len;
    }
    BpeIds *ids = xcalloc(nd + 1, sizeof *ids);
    const double t0 = now_s();
    encode_docs(bpe, docs, nd, threads, ids, pg, total);
    st->seconds = now_s() - t0, st->bytes = total, st->docs = nd;
    for (size_t d = 0; d < nd; d++) n += ids[d].n + 1;
    uint16_t *tokens = xmalloc(n * sizeof *tokens + 2);
    n = 0;
    for (size_t d = 0; d < nd; d++) { /* <|endoftext|> before each document, as llm.c */
        tokens[n++] = (uint16_t)eot;
        for (size_t k = 0; k < ids[d].n; k++) tokens[n++] = (uint16_t)ids[d].ids[k];
        free(ids[d].ids);
    }
    free(ids);
    const ShardMeta meta = {.vocab = vocab, .tokenizer = SHARD_TOK_GPT2, .vocab_hash = bpe_hash(bpe)};
    rc = split_write(tokens, n, &meta, out_dir, val_fraction, st->counts, err);
    free(tokens);
done:
    for (int i = 0; i < nfiles; i++) free(bufs[i]);
    free(bufs);
    free(docs);
    return rc;
}
