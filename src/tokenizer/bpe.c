/*
 * bpe: GPT-2's byte-level BPE (see bpe.h): text encoded (PCRE2's pieces,
 * each merged by rank, short ones cached) and ids decoded, on a Bpe that
 * bpe_load.c made.
 */
#include "src/tokenizer/bpe_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pieces of up to CACHE_WORD_MAX bytes are cached, up to CACHE_ENTRIES_MAX
 * of them; a piece longer than PIECE_MAX (a megabyte of letters, spaces or
 * bytes that are not UTF-8) is merged in slices of that length, so that
 * the merge's scratch (28 bytes a byte) stays bounded whatever the text. */
enum { CACHE_WORD_MAX = 64, CACHE_ENTRIES_MAX = 1 << 16, PIECE_MAX = 1 << 20 };

int bpe_vocab_size(const Bpe *b) { return b->v->vocab; }
int bpe_eot(const Bpe *b) { return b->v->eot; }
uint64_t bpe_hash(const Bpe *b) { return b->v->hash; }
const char *bpe_encoding(const Bpe *b) { return b->v->encoding; }

void bpe_probes(const Bpe *b, BpeProbes *merges, BpeProbes *tokens, BpeProbes *words) {
    if (merges) *merges = b->v->merges.probes;
    if (tokens) *tokens = b->v->tokens.probes;
    if (words) *words = b->cache.probes;
}

const uint8_t *bpe_token(const Bpe *b, int id, size_t *len) {
    if (id < 0 || id >= b->v->vocab || b->v->tok_off[id] == SIZE_MAX) return NULL;
    *len = b->v->tok_len[id];
    return b->v->tokens.arena + b->v->tok_off[id];
}

/* ---------------------------------------------------------------- encode */

static void ids_push(BpeIds *o, int32_t id) {
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 1024;
        o->ids = xrealloc(o->ids, o->cap * sizeof *o->ids);
    }
    o->ids[o->n++] = id;
}

/* The merge of the pair at i and its right neighbour: rank and id, or 0. */
static int pair_at(const Bpe *b, int32_t i, int32_t *rank, int32_t *to) {
    if (i < 0 || b->next[i] < 0) return 0;
    const int32_t j = b->next[i];
    const PairMap *p = &b->v->merges;
    const uint64_t key = ((uint64_t)(uint32_t)b->tok[i] << 32 | (uint32_t)b->tok[j]) + 1;
    const size_t s = pair_find(p, key);
    if (p->key[s] != key) return 0;
    *rank = p->rank[s], *to = p->to[s];
    return 1;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t x) {
    size_t i = (*n)++;
    for (; i > 0 && h[(i - 1) / 2] > x; i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
    h[i] = x;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    const uint64_t top = h[0], last = h[--*n];
    size_t i = 0;
    for (size_t c; (c = 2 * i + 1) < *n; i = c) {
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= last) break;
        h[i] = h[c];
    }
    h[i] = last;
    return top;
}

static void push_pair(Bpe *b, int32_t i, size_t *hn) {
    int32_t rank, to;
    if (pair_at(b, i, &rank, &to)) heap_push(b->heap, hn, (uint64_t)rank << 32 | (uint32_t)i);
}

/* The ids of one piece: its bytes merged as tiktoken does, the pair of
 * lowest rank first (the leftmost among equals), one merge at a time; a
 * heap of candidate pairs keeps a long piece O(n log n). */
static void bpe_word(Bpe *b, const uint8_t *w, size_t n, BpeIds *out) {
    if (n > b->scratch) {
        b->scratch = n;
        b->tok = xrealloc(b->tok, n * sizeof *b->tok);
        b->prev = xrealloc(b->prev, n * sizeof *b->prev);
        b->next = xrealloc(b->next, n * sizeof *b->next);
        b->heap = xrealloc(b->heap, 2 * n * sizeof *b->heap);
    }
    for (size_t i = 0; i < n; i++) {
        b->tok[i] = b->v->byte_id[w[i]];
        b->prev[i] = (int32_t)i - 1;
        b->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(b, (int32_t)i, &hn);
    while (hn > 0) {
        const uint64_t e = heap_pop(b->heap, &hn);
        const int32_t i = (int32_t)(e & 0xFFFFFFFFu);
        int32_t rank, to;
        if (b->tok[i] < 0 || !pair_at(b, i, &rank, &to) || (uint64_t)rank != e >> 32) continue;
        const int32_t j = b->next[i];
        b->tok[i] = to, b->tok[j] = -1;
        b->next[i] = b->next[j];
        if (b->next[j] >= 0) b->prev[b->next[j]] = i;
        push_pair(b, b->prev[i], &hn);
        push_pair(b, i, &hn);
    }
    for (int32_t i = 0; i >= 0; i = b->next[i]) ids_push(out, b->tok[i]);
}

/* A piece's ids without the cache: a rank file's token whole (no special
 * token), or its bytes merged; a piece longer than PIECE_MAX merges in
 * slices of it. */
static void bpe_uncached(Bpe *b, const uint8_t *w, size_t n, BpeIds *out) {
    if (b->v->whole_first) {
        const int64_t id = strmap_peek(&b->v->tokens, w, n, -1);
        if (id >= 0 && id < b->v->ranks) {
            ids_push(out, (int32_t)id);
            return;
        }
    }
    for (size_t at = 0; at < n; at += PIECE_MAX)
        bpe_word(b, w + at, n - at < PIECE_MAX ? n - at : PIECE_MAX, out);
}

/* A piece through the cache of words seen (short ones; the cache starts
 * over when full, so hostile text cannot grow it without bound): the small
 * cache first, the vocabulary's large token map only on a miss. */
static void bpe_piece(Bpe *b, const uint8_t *w, size_t n, BpeIds *out) {
    if (n == 1) {
        ids_push(out, b->v->byte_id[w[0]]);
        return;
    }
    if (n > CACHE_WORD_MAX) {
        bpe_uncached(b, w, n, out);
        return;
    }
    const int64_t hit = strmap_get(&b->cache, w, n, -1);
    if (hit >= 0) {
        for (int64_t k = 0; k < (hit & 0xFF); k++) ids_push(out, b->cache_ids[(hit >> 8) + k]);
        return;
    }
    const size_t from = out->n;
    bpe_uncached(b, w, n, out);
    const size_t count = out->n - from;
    if (b->cache.n >= CACHE_ENTRIES_MAX) {
        const BpeProbes counted = b->cache.probes;
        strmap_free(&b->cache);
        strmap_init(&b->cache, 1024);
        b->cache.probes = counted;
        b->cache_n = 0;
    }
    if (b->cache_n + count > b->cache_cap) {
        b->cache_cap = 2 * (b->cache_cap + count);
        b->cache_ids = xrealloc(b->cache_ids, b->cache_cap * sizeof *b->cache_ids);
    }
    memcpy(b->cache_ids + b->cache_n, out->ids + from, count * sizeof *out->ids);
    strmap_put(&b->cache, w, n, (int64_t)(b->cache_n << 8 | count));
    b->cache_n += count;
}

/* Pieces are the pattern's matches and the text between them (bytes that
 * are not UTF-8); an empty match (a tokenizer.json's pattern may have one)
 * is no piece, and the search goes on from the next byte. */
void bpe_encode(Bpe *b, const char *text, size_t n, BpeIds *out) {
    const uint8_t *s = (const uint8_t *)text;
    size_t gap = 0; /* where the text not yet in a piece begins */
    for (size_t at = 0; at < n;) {
        const int rc = pcre2_match(b->v->re, s, n, at, 0, b->md, b->mctx);
        size_t from = n, to = n;
        if (rc > 0) {
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
            from = ov[0], to = ov[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) { /* a limit of PCRE2's: this byte alone */
            from = at, to = at + 1;
        }
        if (to == from && from < n) {
            at = from + 1;
            continue;
        }
        if (from > gap) bpe_piece(b, s + gap, from - gap, out);
        if (to > from) bpe_piece(b, s + from, to - from, out);
        gap = at = to;
    }
    if (gap < n) bpe_piece(b, s + gap, n - gap, out);
}

/* ---------------------------------------------------------------- decode */

void bpe_decoder_init(BpeDecoder *d) {
    memset(d, 0, sizeof *d);
    d->line = 1;
}

/* The id just read, to its bytes at the end of out. */
static int decode_id(const Bpe *b, BpeDecoder *d, BpeBytes *out, Err *err) {
    d->digits[d->len] = '\0';
    long long id;
    size_t len;
    const uint8_t *t;
    if (parse_i64(d->digits, 0, (long long)b->v->vocab - 1, &id) != 0 ||
        !(t = bpe_token(b, (int)id, &len)))
        return err_set(err, "byte %llu (line %llu): %s is not a token id in [0, %d)",
                       (unsigned long long)d->id_at, (unsigned long long)d->line, d->digits,
                       b->v->vocab);
    d->len = 0;
    if (out->n + len > out->cap) {
        out->cap = 2 * (out->cap + len);
        out->bytes = xrealloc(out->bytes, out->cap);
    }
    memcpy(out->bytes + out->n, t, len);
    out->n += len;
    return 0;
}

int bpe_decode_feed(const Bpe *b, BpeDecoder *d, const char *buf, size_t n, BpeBytes *out,
                    Err *err) {
    for (size_t i = 0; i < n; i++, d->at++) {
        const uint8_t c = (uint8_t)buf[i];
        if (c >= '0' && c <= '9') {
            if (d->len == 0) d->id_at = d->at;
            if (d->len == 20)
                return err_set(err,
                               "byte %llu (line %llu): an id of more than 20 digits; expected "
                               "token ids in [0, %d)",
                               (unsigned long long)d->id_at, (unsigned long long)d->line,
                               b->v->vocab);
            d->digits[d->len++] = (char)c;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            if (d->len > 0 && decode_id(b, d, out, err) != 0) return -1;
            d->line += c == '\n';
        } else {
            char what[16];
            if (c > ' ' && c < 0x7F) snprintf(what, sizeof what, "'%c'", c);
            else snprintf(what, sizeof what, "0x%02x", c);
            return err_set(err,
                           "byte %llu (line %llu) is %s, not a digit or whitespace; expected "
                           "token ids in decimal separated by whitespace",
                           (unsigned long long)d->at, (unsigned long long)d->line, what);
        }
    }
    return 0;
}

int bpe_decode_end(const Bpe *b, BpeDecoder *d, BpeBytes *out, Err *err) {
    return d->len > 0 ? decode_id(b, d, out, err) : 0;
}
