/* Fuzz harness: the decode reader (bpe_decode_feed, `tokenize --decode`)
 * on a small vocabulary (the 256 bytes, "he" and "hel"). The input is read
 * whole, then again in chunks whose sizes its first byte chooses: the two
 * must give the same bytes and the same error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/bpe.h"
#include "tests/fuzz/fuzz.h"

/* GPT-2's alphabet character of byte b, as UTF-8 into out (1 or 2 bytes). */
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

static Bpe *small_vocab(void) {
    char ej[4096];
    size_t n = 1;
    ej[0] = '{';
    for (int b = 0; b < 256; b++) {
        char u[2];
        const size_t k = alphabet_utf8(b, u);
        ej[n++] = '"';
        if (k == 1 && (u[0] == '"' || u[0] == '\\')) ej[n++] = '\\';
        memcpy(ej + n, u, k), n += k;
        n += (size_t)snprintf(ej + n, sizeof ej - n, "\": %d, ", b);
    }
    n += (size_t)snprintf(ej + n, sizeof ej - n, "\"he\": 256, \"hel\": 257}");
    static const char vb[] = "#version: 0.2\nh e\nhe l\n";
    Err err;
    Bpe *b = bpe_from_memory(ej, n, vb, sizeof vb - 1, &err);
    if (!b) abort();
    return b;
}

/* Decodes in[0..n) in chunks of `chunk` bytes (0: whole). Returns 0 or -1. */
static int decode(const Bpe *b, const char *in, size_t n, size_t chunk, BpeBytes *out, Err *err) {
    BpeDecoder d;
    bpe_decoder_init(&d);
    out->n = 0;
    for (size_t at = 0; at < n;) {
        const size_t k = chunk && n - at > chunk ? chunk : n - at;
        if (bpe_decode_feed(b, &d, in + at, k, out, err) != 0) return -1;
        at += k;
    }
    return bpe_decode_end(b, &d, out, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Bpe *b;
    if (!b) b = small_vocab();
    const size_t chunk = size ? 1 + data[0] % 17 : 1;
    BpeBytes whole = {0}, parts = {0};
    Err e1 = {{0}}, e2 = {{0}};
    const int r1 = decode(b, (const char *)data, size, 0, &whole, &e1);
    const int r2 = decode(b, (const char *)data, size, chunk, &parts, &e2);
    if (r1 != r2 || whole.n != parts.n || (whole.n && memcmp(whole.bytes, parts.bytes, whole.n)))
        abort();
    if (r1 != 0 && strcmp(e1.msg, e2.msg) != 0) abort();
    if (whole.n > 3 * size) abort(); /* no id gives more than 3 bytes here, and each takes one */
    free(whole.bytes);
    free(parts.bytes);
    return 0;
}
