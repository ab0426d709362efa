/*
 * data: shard I/O, the seeded data order, and the byte-level prep.
 */
#include "src/data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "src/base/rng.h"
#include "src/base/util.h"

int shard_parse_header(const uint8_t *buf, size_t len, uint64_t file_size, const char *name,
                       size_t *n_tokens, ShardMeta *meta, Err *err) {
    int32_t hdr[SHARD_HEADER_INTS];
    const size_t hbytes = sizeof hdr;
    if (file_size < hbytes || len < hbytes)
        return err_set(err,
                       "data: '%s' is %llu bytes, shorter than the %zu-byte shard header (not a "
                       "token shard?)",
                       name, (unsigned long long)file_size, hbytes);
    memcpy(hdr, buf, hbytes);
    if (hdr[0] != SHARD_MAGIC)
        return err_set(err, "data: '%s' has magic %d, expected %d (an llm.c token shard)", name,
                       hdr[0], SHARD_MAGIC);
    if (hdr[1] != SHARD_VERSION)
        return err_set(err, "data: '%s' has version %d, expected %d (uint16 tokens)", name, hdr[1],
                       SHARD_VERSION);
    if (hdr[3] < 0 || hdr[3] == 1 || hdr[3] > 65536)
        return err_set(err,
                       "data: '%s' says its vocabulary has %d tokens (expected 0 for unknown, or 2 "
                       "to 65536: tokens are uint16)",
                       name, hdr[3]);
    if (hdr[4] < SHARD_TOK_UNKNOWN || hdr[4] > SHARD_TOK_GPT2)
        return err_set(err,
                       "data: '%s' names tokenizer %d in its header (expected 0 unknown, 1 byte "
                       "or 2 gpt2)",
                       name, hdr[4]);
    if (hdr[2] < 0) return err_set(err, "data: '%s' has a negative token count %d", name, hdr[2]);
    const size_t n = (size_t)hdr[2];
    const uint64_t expect = hbytes + (uint64_t)n * sizeof(uint16_t); /* n < 2^31: no overflow */
    if (file_size != expect)
        return err_set(err,
                       "data: '%s' is %llu bytes but its header promises %zu tokens (%llu bytes): "
                       "truncated or corrupt",
                       name, (unsigned long long)file_size, n, (unsigned long long)expect);
    if (n < 2)
        return err_set(
            err, "data: '%s' holds %zu tokens, too few to train on (expected at least 2)", name, n);
    *n_tokens = n;
    meta->vocab = hdr[3];
    meta->tokenizer = hdr[4];
    meta->vocab_hash = (uint64_t)(uint32_t)hdr[6] << 32 | (uint32_t)hdr[5];
    return 0;
}

int shard_load(Shard *s, const char *path, Err *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", path);
    struct stat st;
    Err e;
    int fd = open_regular(path, O_RDONLY, &st, &e);
    if (fd < 0) return err_set(err, "data: %s (give a token shard from 'modtrain prep')", e.msg);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return err_set(err, "data: cannot open '%s': %s", path, strerror(errno));
    }
    uint8_t head[SHARD_HEADER_INTS * sizeof(int32_t)];
    size_t n = 0;
    const size_t got = fread(head, 1, sizeof head, f);
    if (shard_parse_header(head, got, (uint64_t)st.st_size, path, &n, &s->meta, err) != 0)
        goto fail;
    s->tokens = xmalloc(n * sizeof(uint16_t));
    if (fread(s->tokens, sizeof(uint16_t), n, f) != n) goto io_fail;
    fclose(f);
    s->n_tokens = n;
    s->max_token = 0;
    for (size_t i = 0; i < n; i++)
        if (s->tokens[i] > s->max_token) s->max_token = s->tokens[i];
    return 0;
io_fail:
    err_set(err, "data: cannot read '%s': %s", path, strerror(errno ? errno : EIO));
fail:
    fclose(f);
    free(s->tokens);
    s->tokens = NULL;
    return -1;
}

void shard_free(Shard *s) {
    free(s->tokens);
    s->tokens = NULL;
}

const char *shard_tokenizer_name(int tokenizer) {
    return tokenizer == SHARD_TOK_BYTE ? "byte" : tokenizer == SHARD_TOK_GPT2 ? "gpt2" : "unknown";
}

void shard_describe_tokenizer(const ShardMeta *m, char *buf, size_t n) {
    if (m->tokenizer == SHARD_TOK_GPT2)
        snprintf(buf, n, "the gpt2 tokenizer (vocabulary %016llx)",
                 (unsigned long long)m->vocab_hash);
    else if (m->tokenizer == SHARD_TOK_BYTE) snprintf(buf, n, "the byte tokenizer");
    else snprintf(buf, n, "an unknown tokenizer");
}

int shard_write(const char *path, const uint16_t *tokens, size_t n, const ShardMeta *meta,
                Err *err) {
    if (n > INT32_MAX) {
        return err_set(err, "data: %zu tokens do not fit one shard (max %d)", n, INT32_MAX);
    }
    size_t bytes = SHARD_HEADER_INTS * sizeof(int32_t) + n * sizeof(uint16_t);
    char *buf = xcalloc(1, bytes);
    int32_t *hdr = (int32_t *)buf;
    hdr[0] = SHARD_MAGIC;
    hdr[1] = SHARD_VERSION;
    hdr[2] = (int32_t)n;
    hdr[3] = meta->vocab;
    hdr[4] = meta->tokenizer;
    hdr[5] = (int32_t)(uint32_t)meta->vocab_hash;
    hdr[6] = (int32_t)(uint32_t)(meta->vocab_hash >> 32);
    memcpy(buf + SHARD_HEADER_INTS * sizeof(int32_t), tokens, n * sizeof(uint16_t));
    int rc = write_file_atomic(path, buf, bytes, err);
    free(buf);
    return rc;
}

size_t shard_num_seqs(const Shard *s, int T) {
    return s->n_tokens > (size_t)T ? (s->n_tokens - 1) / (size_t)T : 0;
}

void shard_get_seq(const Shard *s, size_t w, int T, int *inputs, int *targets) {
    const uint16_t *p = s->tokens + w * (size_t)T;
    for (int t = 0; t < T; t++) {
        inputs[t] = p[t];
        targets[t] = p[t + 1];
    }
}

void order_init(DataOrder *o, uint64_t seed, size_t n_seqs) {
    o->seed = seed;
    o->n_seqs = n_seqs;
    o->epoch = -1;
    o->perm = xmalloc(n_seqs * sizeof(size_t));
}

void order_free(DataOrder *o) {
    free(o->perm);
    o->perm = NULL;
}

size_t order_window(DataOrder *o, uint64_t g) {
    long long epoch = (long long)(g / o->n_seqs);
    if (epoch != o->epoch) {
        /* Fisher-Yates driven by the counter RNG of (seed, "data", epoch). */
        uint64_t stream = rng_hash_str("data-order") ^ (uint64_t)epoch * 0x9e3779b97f4a7c15ULL;
        for (size_t i = 0; i < o->n_seqs; i++) o->perm[i] = i;
        for (size_t i = o->n_seqs - 1; i > 0; i--) {
            size_t j = (size_t)(rng_u64(o->seed, stream, i) % (i + 1));
            size_t t = o->perm[i];
            o->perm[i] = o->perm[j];
            o->perm[j] = t;
        }
        o->epoch = epoch;
    }
    return o->perm[g % o->n_seqs];
}

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
    const ShardMeta meta = {256, SHARD_TOK_BYTE, 0};
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
    const ShardMeta meta = {vocab, SHARD_TOK_GPT2, bpe_hash(bpe)};
    rc = split_write(tokens, n, &meta, out_dir, val_fraction, st->counts, err);
    free(tokens);
done:
    for (int i = 0; i < nfiles; i++) free(bufs[i]);
    free(bufs);
    free(docs);
    return rc;
}
