/* Fuzz harness: hostile merge tables. The input is a vocab.bpe; the
 * harness writes the encoder.json that makes it valid (the 256 bytes and
 * both sides of every line "A B" and their concatenation, as tokens, ids
 * in sorted order), so the fuzzer spends its time on tables that load.
 * A table that loads must encode its own text back to itself, and no
 * table (the merge table, the token map, the word cache) may look at more
 * than 8 slots a lookup (and 32): with keyed hashes a crafted
 * table collides no more than any other, and an input that makes them
 * (hash flooding) aborts here rather than only running slowly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/bpe.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_bpe.h"

typedef struct {
    const uint8_t *s;
    size_t n;
} Str;

static int cmp_str(const void *a, const void *b) {
    const Str *x = a, *y = b;
    const int c = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* GPT-2's alphabet character of byte b, as UTF-8 into out (1 or 2 bytes). */
static size_t alphabet_utf8(int b, uint8_t *out) {
    int extra = 0, cp = -1;
    for (int x = 0; x < 256 && cp < 0; x++) {
        const int keep = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
        if (x == b) cp = keep ? x : 256 + extra;
        extra += !keep;
    }
    if (cp < 128) return out[0] = (uint8_t)cp, 1;
    out[0] = (uint8_t)(0xC0 | (cp >> 6)), out[1] = (uint8_t)(0x80 | (cp & 0x3F));
    return 2;
}

/* encoder.json of the tokens strs[0..n) (sorted, duplicates skipped). */
static char *encoder_json(Str *strs, size_t n, size_t *len) {
    qsort(strs, n, sizeof *strs, cmp_str);
    size_t cap = 16;
    for (size_t i = 0; i < n; i++) cap += 6 * strs[i].n + 16;
    char *j = xmalloc(cap), *p = j;
    *p++ = '{';
    for (size_t i = 0, id = 0; i < n; i++) {
        if (i > 0 && cmp_str(&strs[i], &strs[i - 1]) == 0) continue;
        p += sprintf(p, "%s\"", id ? ", " : "");
        for (size_t k = 0; k < strs[i].n; k++) {
            const uint8_t c = strs[i].s[k];
            if (c < 0x20) p += sprintf(p, "\\u%04x", c);
            else if (c == '"' || c == '\\') p += sprintf(p, "\\%c", c);
            else *p++ = (char)c;
        }
        p += sprintf(p, "\": %zu", id++);
    }
    *p++ = '}';
    *len = (size_t)(p - j);
    return j;
}

/* Keyed, at most half full: beyond 8 probes a lookup and 32 more takes
 * most of 20 random keys in one run of 64 slots (p < 1e-7), while 16
 * merges of one right side did it under the old hash. */
static void check_probes(const BpeProbes *p) {
    if (p->probes > 8 * p->lookups + 32) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Str *strs = xmalloc((256 + 3 * (size / 2 + 1)) * sizeof *strs);
    uint8_t bytes[256][2], *cat = xmalloc(size + 1);
    size_t n = 0, catn = 0;
    for (int b = 0; b < 256; b++) strs[n++] = (Str){bytes[b], alphabet_utf8(b, bytes[b])};
    for (size_t at = 0; at < size;) {
        const uint8_t *nl = memchr(data + at, '\n', size - at);
        const size_t len = nl ? (size_t)(nl - (data + at)) : size - at;
        const uint8_t *line = data + at, *sp = memchr(line, ' ', len);
        at += len + 1;
        if (!sp || sp == line || sp + 1 == line + len) continue;
        const size_t ll = (size_t)(sp - line), rl = len - ll - 1;
        strs[n++] = (Str){line, ll};
        strs[n++] = (Str){sp + 1, rl};
        memcpy(cat + catn, line, ll), memcpy(cat + catn + ll, sp + 1, rl);
        strs[n++] = (Str){cat + catn, ll + rl};
        catn += ll + rl;
    }
    size_t elen;
    char *ej = encoder_json(strs, n, &elen);
    Err err;
    Bpe *b = bpe_from_memory(ej, elen, (const char *)data, size, &err);
    if (b) {
        fuzz_bpe_roundtrip(b, data, size);
        BpeProbes merges, tokens, words;
        bpe_probes(b, &merges, &tokens, &words);
        check_probes(&merges), check_probes(&tokens), check_probes(&words);
        bpe_free(b);
    }
    free(ej);
    free(cat);
    free(strs);
    return 0;
}
