/*
 * documents: an input's text cut into documents (a whole file, the pieces
 * between --doc_sep lines, or JSON Lines) gathered into blocks, and the
 * worker thread that encodes a sealed block and writes its tokens.
 */
#include "src/prep/prep_impl.h"

#include <jansson.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "src/base/util.h"

/* jansson's tree is not bounded by its text: an empty array's 3 bytes ("[],")
 * cost 138 bytes of malloc chunks, an empty object's 234 (jansson 2.14,
 * glibc), so a line under the cap of nested empty arrays took 45 times
 * its size. Hence an estimate first, from the tokens outside strings, each
 * at its measured cost with a margin (the parent's slot included; a key's
 * member beside its string), plus 3 bytes a byte: the lexer's buffer (up to
 * twice the longest token) and the strings' copies. test_data checks it
 * against jansson's allocations. The other way, a scanner that decodes
 * only the key's string without a tree, would bound the memory by
 * construction but would have to redo jansson's strictness (duplicate keys
 * at every depth, escapes, UTF-8) and its messages; the estimate keeps
 * jansson as the one judge of what is JSON, at one more pass a line. */
enum {
    EST_BYTE = 3,
    EST_ARRAY = 144,
    EST_OBJECT = 256,
    EST_STRING = 96,
    EST_MEMBER = 16,
    EST_SCALAR = 48
};

size_t prep_jsonl_estimate(const char *s, size_t n) {
    size_t arrays = 0, objects = 0, strings = 0, members = 0, scalars = 0;
    int in_scalar = 0;
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case '"': { /* to the closing quote: the next one after an even run of backslashes
                     * (the runs before different quotes are disjoint: still one pass) */
            strings++;
            size_t b = 0;
            do {
                const char *q = memchr(s + i + 1, '"', n - i - 1);
                if (!q) {
                    i = n; /* unterminated: jansson stops there */
                    break;
                }
                i = (size_t)(q - s);
                b = 0;
                while (s[i - 1 - b] == '\\') b++; /* stops at the opening quote */
            } while (b % 2);
            break;
        }
        case '[': arrays++; break;
        case '{': objects++; break;
        case ':': members++; break;
        case ']':
        case '}':
        case ',':
        case ' ':
        case '\t':
        case '\r':
        case '\n': break;
        default: /* a number, true, false, null or garbage: one token a run */
            scalars += !in_scalar;
            in_scalar = 1;
            continue;
        }
        in_scalar = 0;
    }
    size_t est = sat_mul(EST_BYTE, n);
    est = sat_add(est, sat_mul(EST_ARRAY, arrays));
    est = sat_add(est, sat_mul(EST_OBJECT, objects));
    est = sat_add(est, sat_mul(EST_STRING, strings));
    est = sat_add(est, sat_mul(EST_MEMBER, members));
    return sat_add(est, sat_mul(EST_SCALAR, scalars));
}

int prep_doc_is_val(uint64_t d, double f) {
    return floor((double)(d + 1) * f) > floor((double)d * f);
}

/* The counts of what is written into st (no worker at work). */
static void sync_stats(Prep *p) {
    p->st->docs = p->wdocs;
    for (int s = 0; s < 2; s++) {
        p->st->tokens[s] = p->w[s].total + (uint64_t)p->w[s].held;
        p->st->shards[s] = p->w[s].shards;
    }
}

/* Tells the progress every 2 s (force: only brings st up to date): the
 * counts as of the last block written, the documents read since. */
void progress(Prep *p, int force) {
    const double now = now_s();
    if (!force && now - p->last < 2.0) return;
    p->last = now;
    p->st->seconds = now - p->t0;
    if (!p->busy) sync_stats(p);
    if (p->rep && p->rep->progress && !force) {
        PrepStats now_st = *p->st;
        now_st.docs += p->nd + (p->busy ? p->job.nd : 0); /* read, not yet written */
        p->rep->progress(p->rep->ctx, &now_st);
    }
}

/* Room for n more bytes in the block. */
static void block_reserve(Prep *p, size_t n) {
    size_t need;
    if (size_add(p->len, n, &need) != 0) abort();
    if (need <= p->bcap) return;
    size_t c = p->bcap ? p->bcap : IO_CHUNK;
    while (c < need) c = sat_mul(c, 2);
    p->buf = xrealloc(p->buf, c);
    p->bcap = c;
}

static void block_append(Prep *p, const char *s, size_t n) {
    block_reserve(p, n);
    memcpy(p->buf + p->len, s, n);
    p->len += n;
}

/* A document (or line) of more than the cap, from line `line`: refused. */
static int too_long(Prep *p, uint64_t line, const char *what, Err *err) {
    char cap[32];
    format_bytes(cap, sizeof cap, p->cap_doc);
    return err_set(err,
                   "prep: '%s' line %llu: %s longer than %s, the cap under --mem (a sixteenth of "
                   "it; give a larger --mem%s)",
                   p->name, (unsigned long long)line, what, cap,
                   p->o->jsonl_key || p->o->doc_sep ? "" : ", or cut files with --doc_sep LINE");
}

/* The block's bytes under mem (0: too little is left), held_base held before
 * any text and a zstd window besides when there is zstd input: two blocks
 * at a time (one read while the worker writes the other); bytes of text go
 * straight through; JSON Lines add the parse (up to 6 bytes a byte of the
 * block parsed) and the tokens (4: uint32 whatever the shards' width), BPE
 * its tokens and ids (up to 16, typically 3). */
size_t block_bytes_at(const PrepOptions *o, size_t mem, size_t held_base, int has_zstd) {
    const size_t held = sat_add(held_base, has_zstd ? (size_t)1 << zstd_window_log(mem) : 0);
    if (held >= mem / 2) return 0;
    return (mem - held) / (o->bpe ? 52 : o->jsonl_key ? 16 : 8);
}

/* What parsing a block's JSON Lines may take: the parse's 3 bytes a byte of
 * the two blocks block_bytes_at counts, all for the one block parsed at a
 * time, whichever threads parse it. */
size_t parse_cap_of(size_t block_bytes) { return sat_mul(6, block_bytes); }

/* Whether a line whose parse takes est would fit under --mem mem. */
static int parse_fits(const Prep *p, size_t mem, size_t est) {
    return parse_cap_of(block_bytes_at(p->o, mem, p->held_base, p->has_zstd)) >= est;
}

/* A JSON Lines line whose parse alone would take more than parse_cap:
 * refused, with the --mem (whole MiB) under which it would fit. */
static int too_costly(Prep *p, size_t est, Err *err) {
    const size_t mib = (size_t)1 << 20;
    size_t fit = (p->o->mem + mib - 1) / mib * mib;
    while (fit < SIZE_MAX / 4 && !parse_fits(p, fit, est)) fit *= 2;
    for (size_t step = fit / 4 / mib * mib; step >= mib; step = step / 2 / mib * mib)
        if (fit - step > p->o->mem && parse_fits(p, fit - step, est)) fit -= step;
    char e[32], c[32], m[32];
    format_bytes(e, sizeof e, est);
    format_bytes(c, sizeof c, p->parse_cap);
    format_bytes(m, sizeof m, p->o->mem);
    return err_set(
        err,
        "prep: '%s' line %llu: parsing it would take about %s (a tree of many small arrays, "
        "objects or values takes up to 90 times their bytes), more than the %s "
        "that --mem %s leaves for parsing (give --mem %zuM or more)",
        p->name, (unsigned long long)p->line_no, e, c, m, fit / mib);
}

/* The name of input i for messages. */
static const char *input_name(const PrepOptions *o, int i) {
    return strcmp(o->inputs[i], "-") == 0 ? "standard input" : o->inputs[i];
}

/* Checks a JSON Lines line (n bytes at s, of input `input`, line `line`):
 * a JSON object with a string under the key. Returns the parsed value
 * (*text, *len: the document in it), or NULL with err set when err is not
 * NULL. */
static json_t *jsonl_parse(const PrepOptions *o, int input, uint64_t line, const char *s, size_t n,
                           const char **text, size_t *len, Err *err) {
    const char *key = o->jsonl_key, *name = input_name(o, input);
    const unsigned long long ln = (unsigned long long)line;
    json_error_t je;
    json_t *v = json_loadb(s, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!v) {
        if (err)
            err_set(err,
                    "prep: '%s' line %llu is not JSON (%s, column %d; expected one object a line)",
                    name, ln, je.text, je.column);
        return NULL;
    }
    json_t *t = json_is_object(v) ? json_object_get(v, key) : NULL;
    if (!json_is_object(v)) {
        if (err)
            err_set(err,
                    "prep: '%s' line %llu is not a JSON object (expected one object a line, the "
                    "document under \"%s\")",
                    name, ln, key);
    } else if (!t) {
        if (err)
            err_set(err,
                    "prep: '%s' line %llu has no key \"%s\" (expected the document as a string "
                    "there; --jsonl KEY names the key)",
                    name, ln, key);
    } else if (!json_is_string(t)) {
        if (err)
            err_set(err,
                    "prep: '%s' line %llu: \"%s\" is not a string (expected the document's text)",
                    name, ln, key);
    } else {
        *text = json_string_value(t);
        *len = json_string_length(t);
        return v;
    }
    json_decref(v);
    return NULL;
}

/* Doc d's tokens from its n bytes of text at s: bytes widened, or gpt2's
 * ids after <|endoftext|>; none for an empty document. */
static void doc_encode(const Prep *p, Doc *d, const char *s, size_t n, Bpe *bpe, BpeIds *ids) {
    d->tok = NULL, d->ntok = 0;
    if (n == 0) return;
    if (!bpe) {
        d->tok = xmalloc(n * sizeof *d->tok);
        for (size_t k = 0; k < n; k++) d->tok[k] = (unsigned char)s[k];
        d->ntok = n;
        return;
    }
    ids->n = 0;
    bpe_encode(bpe, s, n, ids);
    d->tok = xmalloc((ids->n + 1) * sizeof *d->tok);
    d->tok[0] = (uint32_t)p->eot;
    for (size_t k = 0; k < ids->n; k++) d->tok[k + 1] = (uint32_t)ids->ids[k];
    d->ntok = ids->n + 1;
    if (ids->cap > ((size_t)1 << 22)) { /* after a long document: give it back */
        free(ids->ids);
        ids->ids = NULL, ids->n = ids->cap = 0;
    }
}

/* Encodes a sealed block's documents and appends their tokens in order to
 * train or val (document d to val when prep_doc_is_val). gpt2 and JSON
 * Lines work on the threads, a document (a line) on one, the result
 * independent of which; a bad line is reported in order, the first one.
 * Bytes of text go straight through. The worker's work: it alone touches
 * the writers, the tokenizers and wdocs. */
static int block_write(Prep *p, Sealed *b, Err *err) {
    const PrepOptions *o = p->o;
    const int parallel = o->bpe || o->jsonl_key;
    if (parallel && b->nd > 0) {
        Doc *docs = b->docs;
        const long long nd = (long long)b->nd;
#pragma omp parallel num_threads(p->threads)
        {
#ifdef _OPENMP
            const int t = omp_get_thread_num();
#else
            const int t = 0;
#endif
            Bpe *mine = p->clones ? p->clones[t] : NULL;
            BpeIds *ids = &p->ids[t];
#pragma omp for schedule(dynamic, 1)
            for (long long i = 0; i < nd; i++) {
                Doc *d = &docs[i];
                const char *s = b->buf + d->off;
                size_t n = d->len;
                json_t *v = NULL;
                if (o->jsonl_key && !(v = jsonl_parse(o, d->input, d->line, s, n, &s, &n, NULL))) {
                    d->bad = 1;
                    continue;
                }
                doc_encode(p, d, s, n, mine, ids);
                json_decref(v);
            }
        }
#ifdef __GLIBC__
        /* the trees are freed, but into the arenas of the threads that parsed them, and the
         * next block's may be parsed on others: each block's parse has to fit parse_cap on
         * its own, so what is free goes back to the system */
        if (o->jsonl_key) malloc_trim(0);
#endif
    }
    int rc = 0;
    uint32_t *wide = parallel ? NULL : xmalloc(WRITE_TOKENS * sizeof *wide);
    for (size_t i = 0; i < b->nd; i++) {
        Doc *d = &b->docs[i];
        if (rc != 0) {
        } else if (d->bad) { /* the message, made again here, in order */
            const char *t;
            size_t n;
            json_t *v = jsonl_parse(o, d->input, d->line, b->buf + d->off, d->len, &t, &n, err);
            json_decref(v);
            rc = -1;
        } else if (parallel) {
            if (d->ntok > 0) {
                rc = writer_put(&p->w[prep_doc_is_val(p->wdocs, o->val_fraction)], d->tok, d->ntok,
                                err);
                p->wdocs++;
            }
        } else {
            Writer *w = &p->w[prep_doc_is_val(p->wdocs, o->val_fraction)];
            p->wdocs++;
            const unsigned char *s = (const unsigned char *)b->buf + d->off;
            for (size_t at = 0; rc == 0 && at < d->len; at += WRITE_TOKENS) {
                const size_t k = d->len - at < WRITE_TOKENS ? d->len - at : WRITE_TOKENS;
                for (size_t j = 0; j < k; j++) wide[j] = s[at + j];
                rc = writer_put(w, wide, k, err);
            }
        }
        free(d->tok);
        d->tok = NULL;
    }
    free(wide);
    return rc;
}

static void *block_work(void *arg) {
    Prep *p = arg;
    p->job_rc = block_write(p, &p->job, &p->job_err);
    return NULL;
}

/* After the worker's block: its buffers become the spare ones. Returns 0,
 * or -1 with its error in err. */
static int block_done(Prep *p, Err *err) {
    sync_stats(p);
    p->spare = p->job;
    p->job = (Sealed){0};
    if (p->job_rc == 0) return 0;
    if (err) *err = p->job_err;
    return -1;
}

/* Waits for the worker's block (block_done). */
int block_join(Prep *p, Err *err) {
    if (!p->busy) return 0;
    pthread_join(p->worker, NULL);
    p->busy = 0;
    return block_done(p, err);
}

/* Hands the block's finished documents to the worker (once it is done
 * with the one before) and goes on reading into the spare buffers, the
 * document being read copied to their front. Returns 0, or -1 with err
 * (the worker's error on the block before). */
int block_flush(Prep *p, Err *err) {
    if (block_join(p, err) != 0) return -1;
    if (p->nd > 0) {
        p->job = (Sealed){p->buf, p->bcap, p->docs, p->nd, p->dcap};
        const char *rest = p->buf + p->doc_start;
        const size_t keep = p->len - p->doc_start;
        p->buf = p->spare.buf, p->bcap = p->spare.cap;
        p->docs = p->spare.docs, p->dcap = p->spare.dcap;
        p->spare = (Sealed){0};
        p->len = 0;
        block_reserve(p, keep);
        if (keep > 0) memcpy(p->buf, rest, keep);
        p->line_start -= p->doc_start;
        p->len = keep, p->doc_start = 0, p->nd = 0, p->est = 0;
        if (pthread_create(&p->worker, NULL, block_work, p) == 0) p->busy = 1;
        else if (block_work(p), block_done(p, err) != 0) /* no thread to be had: here */ return -1;
    }
    progress(p, 0);
    return 0;
}

/* Ends the document [doc_start, end) (an empty one is left out); the next
 * starts at the block's end. Flushes a full block. */
static int doc_end(Prep *p, size_t end, Err *err) {
    if (end > p->doc_start) {
        if (p->nd == p->dcap)
            p->docs = xrealloc(p->docs, (p->dcap = 2 * p->dcap + 64) * sizeof *p->docs);
        p->docs[p->nd++] = (Doc){
            .off = p->doc_start, .len = end - p->doc_start, .line = p->line_no, .input = p->input};
    }
    p->doc_start = p->line_start = p->len;
    return p->len >= p->block_bytes ? block_flush(p, err) : 0;
}

/* Text, one document a file: the chunk appended. */
static int feed_whole(Prep *p, const char *s, size_t n, Err *err) {
    block_append(p, s, n);
    if (p->len - p->doc_start > p->cap_doc)
        return too_long(p, 1, "the document (the whole file, without --doc_sep) is", err);
    return 0;
}

/* Text cut at lines equal to doc_sep: line by line into the block, a
 * separator line dropped where it ends a document. */
static int feed_sep(Prep *p, const char *s, size_t n, Err *err) {
    const char *sep = p->o->doc_sep;
    const size_t sl = strlen(sep);
    while (n > 0) {
        const char *nl = memchr(s, '\n', n);
        const size_t k = nl ? (size_t)(nl - s) + 1 : n;
        block_append(p, s, k);
        s += k, n -= k;
        if (!nl) { /* a line continued in the next chunk */
            if (p->len - p->doc_start > p->cap_doc + sl + 1)
                return too_long(p, p->doc_line, "the document from here is", err);
            break;
        }
        const size_t line = p->len - 1 - p->line_start; /* without its newline */
        const int is_sep = line == sl && memcmp(p->buf + p->line_start, sep, sl) == 0;
        p->line_no++;
        if (is_sep) {
            const size_t at = p->line_start;
            p->len = at;
            if (doc_end(p, at, err) != 0) return -1;
            p->doc_line = p->line_no + 1;
        } else {
            if (p->len - p->doc_start > p->cap_doc)
                return too_long(p, p->doc_line, "the document from here is", err);
            p->line_start = p->len;
        }
    }
    return 0;
}

/* One JSON Lines line: into the block as it is (parsed on the threads at
 * the flush); a blank one is left out. Any of the block's lines may be
 * parsed at the same time, a thread each, so their estimates add up within
 * parse_cap: the block is flushed before a line that would go over it, and
 * a line over it alone is refused. Over the whole block, not a share a
 * thread: however many threads split it, their trees together stay within
 * parse_cap. */
static int jsonl_line(Prep *p, const char *s, size_t n, Err *err) {
    size_t k = 0;
    while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
    if (k == n) return 0;
    const size_t est = prep_jsonl_estimate(s, n);
    if (est > p->parse_cap) return too_costly(p, est, err);
    if (p->nd > 0 && sat_add(p->est, est) > p->parse_cap && block_flush(p, err) != 0) return -1;
    block_append(p, s, n);
    p->est = sat_add(p->est, est);
    return doc_end(p, p->len, err);
}

/* JSON Lines: each whole line to the block; one split across chunks
 * gathered in p->line first. */
static int feed_jsonl(Prep *p, const char *s, size_t n, Err *err) {
    while (n > 0) {
        const char *nl = memchr(s, '\n', n);
        const size_t k = nl ? (size_t)(nl - s) : n;
        if (!nl || p->llen > 0) {
            if (p->llen + k > p->cap_doc) return too_long(p, p->line_no + 1, "the line is", err);
            if (p->llen + k > p->lcap) {
                p->lcap = p->llen + k > 2 * p->lcap ? p->llen + k : 2 * p->lcap;
                p->line = xrealloc(p->line, p->lcap);
            }
            memcpy(p->line + p->llen, s, k);
            p->llen += k;
        }
        if (!nl) break;
        p->line_no++;
        if (k > p->cap_doc) return too_long(p, p->line_no, "the line is", err);
        const int rc =
            p->llen > 0 ? jsonl_line(p, p->line, p->llen, err) : jsonl_line(p, s, k, err);
        p->llen = 0;
        if (p->lcap > IO_CHUNK) { /* after a long line: give it back */
            free(p->line);
            p->line = NULL, p->lcap = 0;
        }
        if (rc != 0) return -1;
        s += k + 1, n -= k + 1;
    }
    return 0;
}

/* Reads one input to its end through the splitter. */
int read_input(Prep *p, int input, int window_log, char *chunk, Err *err) {
    const char *path = p->o->inputs[input];
    Reader r;
    if (reader_open(&r, path, window_log, err) != 0) return -1;
    p->name = r.name;
    p->input = input;
    p->line_no = 0, p->doc_line = 1, p->llen = 0;
    uint64_t text = 0;
    int rc = 0;
    for (;;) {
        size_t got = 0;
        if ((rc = reader_read(&r, chunk, IO_CHUNK, &got, err)) != 0) break;
        p->st->in_done = p->in_done0 + r.consumed;
        if (got == 0) break;
        text += got, p->st->bytes += got;
        rc = p->o->jsonl_key ? feed_jsonl(p, chunk, got, err)
             : p->o->doc_sep ? feed_sep(p, chunk, got, err)
                             : feed_whole(p, chunk, got, err);
        if (rc != 0) break;
        progress(p, 0);
    }
    if (rc == 0 && text == 0)
        rc = err_set(err, "prep: '%s' is empty (expected text to tokenise)", r.name);
    if (rc == 0 && p->o->jsonl_key && p->llen > 0) { /* a last line without a newline */
        p->line_no++;
        rc = jsonl_line(p, p->line, p->llen, err);
        p->llen = 0;
    }
    if (rc == 0 && p->o->doc_sep && p->len > p->line_start) { /* the same, of text */
        const size_t sl = strlen(p->o->doc_sep);
        p->line_no++;
        if (p->len - p->line_start == sl && memcmp(p->buf + p->line_start, p->o->doc_sep, sl) == 0)
            p->len = p->line_start;
    }
    if (rc == 0 && !p->o->jsonl_key) rc = doc_end(p, p->len, err); /* a file ends its document */
    p->in_done0 += r.consumed;
    reader_close(&r);
    return rc;
}
