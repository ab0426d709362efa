/*
 * vocab_flood: writes a valid GPT-2-format vocabulary (DIR/encoder.json,
 * DIR/vocab.bpe) of MERGES merges "L b" (L four letters, b one byte, L b
 * a token too), for tests/bench/bench_vocab_flood.sh.
 *
 *   vocab_flood DIR MERGES crafted|spread
 *
 * crafted: every pair lands in the first 64th of the merge table under
 * the hash the tokenizer used before it was keyed ((left << 32 | right) + 1 times
 * 2^64 / golden ratio, bits 20 and up), so that its linear probing made
 * one cluster of all of them: MERGES^2 / 2 probes to load. spread: the
 * same tokens, as many merges a left token, the bytes not chosen.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/util.h"

/* GPT-2's byte alphabet: the character of byte b, as UTF-8 into out. */
static size_t alphabet_utf8(int b, char *out) {
    int extra = 0, cp = -1;
    for (int x = 0; x < 256 && cp < 0; x++) {
        const int keep = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
        if (x == b) cp = keep ? x : 256 + extra;
        extra += !keep;
    }
    if (cp < 128) return out[0] = (char)cp, 1;
    out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* A token as JSON: its alphabet characters, '"' and '\' escaped. */
static void json_token(FILE *f, const uint8_t *t, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        char u[2];
        const size_t k = alphabet_utf8(t[i], u);
        if (k == 1 && (u[0] == '"' || u[0] == '\\')) fputc('\\', f);
        fwrite(u, 1, k, f);
    }
    fputc('"', f);
}

static void utf8_token(FILE *f, const uint8_t *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char u[2];
        fwrite(u, 1, alphabet_utf8(t[i], u), f);
    }
}

static size_t old_slot(uint32_t a, uint32_t b, size_t mask) {
    const uint64_t key = ((uint64_t)a << 32 | b) + 1;
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

static FILE *open_in(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) fprintf(stderr, "vocab_flood: cannot write '%s'\n", path);
    return f;
}

int main(int argc, char **argv) {
    long long m;
    if (argc != 4 || parse_i64(argv[2], 1, 1800000, &m) != 0 ||
        (strcmp(argv[3], "crafted") != 0 && strcmp(argv[3], "spread") != 0)) {
        fprintf(stderr, "usage: vocab_flood DIR MERGES(1..1800000) crafted|spread\n");
        return 2;
    }
    const int crafted = strcmp(argv[3], "crafted") == 0;
    size_t slots = 64; /* as load_merges sizes the table: two slots a line or more */
    while (slots < 2 * ((size_t)m + 2)) slots *= 2;
    FILE *ej = open_in(argv[1], "encoder.json"), *vb = open_in(argv[1], "vocab.bpe");
    if (!ej || !vb) return 1;
    uint8_t(*merged)[5] = xmalloc((size_t)m * sizeof *merged);
    fputc('{', ej);
    for (int b = 0; b < 256; b++) {
        const uint8_t byte = (uint8_t)b;
        json_token(ej, &byte, 1);
        fprintf(ej, ": %d, ", b);
    }
    fprintf(vb, "#version: 0.2\n");
    uint32_t id = 256;
    size_t nm = 0;
    for (uint32_t l = 0; nm < (size_t)m; l++) {
        const uint8_t left[4] = {(uint8_t)('a' + l % 26), (uint8_t)('a' + l / 26 % 26),
                                 (uint8_t)('a' + l / 676 % 26), (uint8_t)('a' + l / 17576 % 26)};
        const uint32_t lid = id++;
        json_token(ej, left, 4);
        fprintf(ej, ": %u, ", lid);
        int count = 0;
        for (uint32_t b = 0; b < 256; b++) count += old_slot(lid, b, slots - 1) < slots / 64;
        for (uint32_t b = 0, k = 0; b < 256 && nm < (size_t)m; b++) {
            const uint32_t right = crafted ? b : (lid * 97 + 31 * b) & 255; /* a permutation */
            if (crafted ? old_slot(lid, b, slots - 1) >= slots / 64 : k++ >= (uint32_t)count)
                continue;
            memcpy(merged[nm], left, 4), merged[nm][4] = (uint8_t)right;
            utf8_token(vb, left, 4);
            fputc(' ', vb);
            utf8_token(vb, merged[nm] + 4, 1);
            fputc('\n', vb);
            nm++;
        }
    }
    for (size_t k = 0; k < nm; k++) {
        json_token(ej, merged[k], 5);
        fprintf(ej, ": %u%s", id++, k + 1 < nm ? ", " : "}");
    }
    free(merged);
    const int bad = fclose(ej) != 0 || fclose(vb) != 0;
    printf("vocab_flood: %s: %u tokens, %zu merges (%s)\n", argv[1], id, nm, argv[3]);
    return bad;
}
