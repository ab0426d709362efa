/*
 * prep: text to token shards (`modtrain prep`), streaming.
 *
 * Each input is read through a Reader (plain bytes, gzip through inflate,
 * zstd through ZSTD_decompressStream) in 1 MiB chunks; the chunks are cut
 * into documents (a whole file, the pieces between --doc_sep lines, or a
 * JSON Lines line) gathered into a block. A full block is sealed and handed
 * to the worker thread, which parses its JSON lines and encodes its
 * documents (on the OpenMP threads, gpt2 each with its Bpe clone) and
 * appends their tokens in document order to the Writer of train or val,
 * while the next block is read; one block at a time, so the order is the
 * input's. A Writer streams shards: a zero header, the tokens, then the
 * real header (count, CRC-32) and fsync. All of it lands in
 * OUT.prep-tmp.HOST.PID beside OUT, which is renamed to OUT at the end.
 *
 * This file holds prep_run, which checks the inputs and the output, sizes
 * the blocks under --mem and drives the rest (prep_impl.h lists the files).
 */
#include "src/prep/prep.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/fault.h"
#include "src/base/files.h"
#include "src/base/util.h"
#include "src/prep/prep_impl.h"

size_t prep_doc_cap(size_t mem) { return mem / 16; }

int prep_parse_size(const char *s, size_t *out) {
    char num[32];
    const size_t n = strlen(s);
    if (n == 0 || n >= sizeof num) return -1;
    size_t unit = 1, digits = n;
    switch (s[n - 1]) {
    case 'K':
    case 'k': unit = (size_t)1 << 10; break;
    case 'M':
    case 'm': unit = (size_t)1 << 20; break;
    case 'G':
    case 'g': unit = (size_t)1 << 30; break;
    case 'T':
    case 't': unit = (size_t)1 << 40; break;
    default: break;
    }
    if (unit > 1) digits--;
    memcpy(num, s, digits);
    num[digits] = '\0';
    for (size_t i = 0; i < digits; i++)
        if (num[i] < '0' || num[i] > '9') return -1; /* no sign, no space */
    long long v;
    size_t r;
    if (parse_i64(num, 0, LLONG_MAX, &v) != 0 || size_mul((size_t)v, unit, &r) != 0) return -1;
    *out = r;
    return 0;
}

/* Checks every input before any work: openable files (sizes summed for the
 * ETA), standard input at most once. */
static int check_inputs(const PrepOptions *o, PrepStats *st, int *has_zstd, Err *err) {
    int stdin_seen = 0;
    st->in_known = 1;
    *has_zstd = 0;
    for (int i = 0; i < o->ninputs; i++) {
        const char *f = o->inputs[i];
        struct stat s;
        if (strcmp(f, "-") == 0) {
            if (stdin_seen++)
                return err_set(err,
                               "prep: '-' (standard input) is given twice (it can be read once)");
            if (fstat(STDIN_FILENO, &s) == 0 && S_ISREG(s.st_mode))
                st->in_total += (uint64_t)s.st_size;
            else st->in_known = 0;
            continue;
        }
        Err e;
        const int fd = open_regular(f, O_RDONLY, &s, &e);
        if (fd < 0) return err_set(err, "prep: %s (expected text to tokenise)", e.msg);
        close(fd);
        st->in_total += (uint64_t)s.st_size;
        *has_zstd |= input_kind(f) == IN_ZSTD;
    }
    return 0;
}

/* What the shards' headers record, and the id of the token before each
 * document (<|endoftext|>; llama3's <|begin_of_text|>). Returns 0 or -1 (a
 * vocabulary without it). */
static int shard_meta(const PrepOptions *o, ShardMeta *meta, int *eot, Err *err) {
    *meta = (ShardMeta){.width = 2, .vocab = 256, .tokenizer = SHARD_TOK_BYTE};
    if (!o->bpe) return 0;
    const int vocab = bpe_vocab_size(o->bpe);
    *eot = bpe_eot(o->bpe);
    if (*eot < 0)
        return err_set(err,
                       "prep: the vocabulary of %d tokens has no <|endoftext|>, which goes before "
                       "documents",
                       vocab);
    const char *enc = bpe_encoding(o->bpe);
    *meta = (ShardMeta){.width = shard_width(vocab),
                        .vocab = vocab,
                        .tokenizer = enc ? shard_tokenizer_code(enc) : SHARD_TOK_GPT2,
                        .vocab_hash = bpe_hash(o->bpe)};
    return 0;
}

/* Whether what was read makes a set: documents, val ones where asked for,
 * no split of a single token. Returns 0 or -1 with err set. */
static int check_result(const PrepOptions *o, const PrepStats *st, Err *err) {
    if (st->docs == 0)
        return err_set(err, "prep: the inputs hold no document (every piece between --doc_sep "
                            "lines, or every JSON string, is empty; expected text to tokenise)");
    if (o->val_fraction > 0 && st->tokens[1] == 0)
        return err_set(
            err,
            "prep: %llu document%s give%s none to val at --val_fraction %g (document d goes "
            "there when floor((d+1)*f) > floor(d*f)); give more documents (--doc_sep LINE "
            "cuts text files into documents) or --val_fraction 0",
            (unsigned long long)st->docs, st->docs == 1 ? "" : "s", st->docs == 1 ? "s" : "",
            o->val_fraction);
    for (int s = 0; s < 2; s++)
        if (st->tokens[s] == 1)
            return err_set(err,
                           "prep: the %s split holds 1 token, and a shard needs at least 2 (give "
                           "more text or change --val_fraction)",
                           s ? "val" : "train");
    return 0;
}

int prep_run(const PrepOptions *o, const PrepReport *rep, PrepStats *st, Err *err) {
    memset(st, 0, sizeof *st);
    Prep p;
    memset(&p, 0, sizeof p);
    p.o = o, p.rep = rep, p.st = st;
    p.t0 = p.last = now_s();
    if (o->shard_tokens < 2 || o->shard_tokens > (size_t)INT32_MAX - 1)
        return err_set(err, "prep: %zu tokens a shard is outside [2, %d]", o->shard_tokens,
                       INT32_MAX - 1);
    ShardMeta meta;
    if (shard_meta(o, &meta, &p.eot, err) != 0) return -1;
    int has_zstd;
    if (paths_make(&p.paths, o->out, rep, err) != 0 || check_inputs(o, st, &has_zstd, err) != 0)
        return -1;
    fset_clean_stale(&p.paths);
    if (fset_check_out(&p.paths, o->force, err) != 0) return -1;
    /* the memory: what is held already (the vocabulary), the threads'
     * tokenizers, a zstd window; the rest for the block */
    const int threads = o->bpe || o->jsonl_key ? (o->threads > 0 ? o->threads : 1) : 1;
    p.ids = xcalloc((size_t)threads, sizeof *p.ids);
    p.threads = st->threads = threads;
    if (o->bpe) {
        p.clones = xcalloc((size_t)threads, sizeof *p.clones);
        for (int t = 0; t < threads; t++)
            if (!(p.clones[t] = bpe_clone(o->bpe))) {
                fprintf(stderr, "modtrain: out of memory for a tokenizer's match data\n");
                abort();
            }
    }
    const int wl = zstd_window_log(o->mem);
    p.held_base = /* a thread's caches, 1 MiB each, besides */
        sat_add(o->held ? o->held : peak_rss(), sat_mul((size_t)threads, (size_t)1 << 20));
    p.has_zstd = has_zstd;
    const size_t held = sat_add(p.held_base, has_zstd ? (size_t)1 << wl : 0);
    int rc = -1;
    char *chunk = NULL;
    p.block_bytes = block_bytes_at(o, o->mem, p.held_base, has_zstd);
    if (p.block_bytes == 0) {
        char m[32], h[32];
        format_bytes(m, sizeof m, o->mem);
        format_bytes(h, sizeof h, held);
        err_set(err,
                "prep: --mem %s leaves too little: %s are held before any text (the vocabulary, "
                "%d %s%s); give --mem of at least twice that, or fewer --threads",
                m, h, threads, threads == 1 ? "thread's tokenizer" : "threads' tokenizers",
                has_zstd ? ", a zstd window" : "");
        goto done;
    }
    p.cap_doc = prep_doc_cap(o->mem);
    p.parse_cap = parse_cap_of(p.block_bytes);
    if (mkdirs(p.paths.parent) != 0) {
        err_set(err, "prep: cannot create '%s': %s", p.paths.parent, strerror(errno));
        goto done;
    }
    if (fp_mkdir("prep.mkdir", p.paths.tmp, 0755) != 0) {
        err_set(err, "prep: cannot create '%s': %s", p.paths.tmp, strerror(errno));
        goto done;
    }
    for (int s = 0; s < 2; s++)
        p.w[s] = (Writer){.dir = p.paths.tmp,
                          .split = s ? "val" : "train",
                          .meta = meta,
                          .per_shard = o->shard_tokens,
                          .fd = -1,
                          .buf = xmalloc(WRITE_TOKENS * sizeof(uint32_t)),
                          .bytes = xmalloc(WRITE_TOKENS * sizeof(uint32_t))};
    chunk = xmalloc(IO_CHUNK);
    for (int i = 0; i < o->ninputs; i++)
        if (read_input(&p, i, wl, chunk, err) != 0) goto fail;
    if (block_flush(&p, err) != 0 || block_join(&p, err) != 0 || writer_finish(&p.w[0], err) != 0 ||
        writer_finish(&p.w[1], err) != 0)
        goto fail;
    progress(&p, 1);
    if (check_result(o, st, err) != 0) goto fail;
    if (fset_commit(&p.paths, o->force, err) != 0) goto fail;
    rc = 0;
    goto done;
fail:
    block_join(&p, err); /* the worker's error, on earlier documents, comes first */
    for (int s = 0; s < 2; s++)
        if (p.w[s].fd >= 0) close(p.w[s].fd);
    fset_remove(&p.paths, p.paths.tmp);
done:
    st->seconds = now_s() - p.t0;
    for (int s = 0; s < 2; s++) free(p.w[s].buf), free(p.w[s].bytes);
    for (int t = 0; t < threads; t++) {
        if (p.clones) bpe_free(p.clones[t]);
        free(p.ids[t].ids);
    }
    free(p.clones);
    free(p.ids);
    free(chunk);
    free(p.buf);
    free(p.docs);
    free(p.spare.buf);
    free(p.spare.docs);
    free(p.line);
    return rc;
}
