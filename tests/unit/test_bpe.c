/*
 * test_bpe: GPT-2's byte-level BPE on vocabularies built here. The ids of
 * words equal a naive reference merge (the lowest-ranked adjacent pair,
 * the leftmost among equals, one merge at a time, as tiktoken does) on
 * random words and random merge lists; any bytes, UTF-8 or not, and a
 * piece longer than the 1 MiB the merge takes at once, decode back to
 * themselves; malformed vocabulary files are refused with a line
 * naming the file and what is wrong.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "src/tokenizer/bpe.h"
#include "tests/unit/testutil.h"

/* GPT-2's byte alphabet, written out again: the printable Latin-1 bytes
 * stand for themselves, the others for 256, 257, ... in byte order. */
static int alphabet(int b) {
    int extra = 0;
    for (int x = 0; x < 256; x++) {
        const int keep = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
        if (x == b) return keep ? x : 256 + extra;
        extra += !keep;
    }
    return -1;
}

/* Appends the JSON string of token bytes t[0..n) in the alphabet. */
static void json_token(char *out, const uint8_t *t, size_t n) {
    strcat(out, "\"");
    for (size_t i = 0; i < n; i++) {
        const int c = alphabet(t[i]);
        char e[16];
        if (c == '"' || c == '\\') snprintf(e, sizeof e, "\\%c", c);
        else if (c < 128) snprintf(e, sizeof e, "%c", c);
        else snprintf(e, sizeof e, "\\u%04x", c);
        strcat(out, e);
    }
    strcat(out, "\"");
}

/* The same token as a vocab.bpe side: UTF-8 of the alphabet characters. */
static void utf8_token(char *out, const uint8_t *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const int c = alphabet(t[i]);
        char e[4] = {0};
        if (c < 128) e[0] = (char)c;
        else e[0] = (char)(0xC0 | (c >> 6)), e[1] = (char)(0x80 | (c & 0x3F));
        strcat(out, e);
    }
}

enum { NMERGE = 40, MAXTOK = 64 };
typedef struct {
    uint8_t tok[256 + NMERGE][MAXTOK];
    size_t len[256 + NMERGE];
    int left[NMERGE], right[NMERGE], ntok;
} Vocab;

/* A random vocabulary over the bytes 'a'..'d': each merge joins two
 * tokens already there (bytes or earlier merges) into a new one. */
static Bpe *random_vocab(Vocab *v, uint32_t *seed, char *ej, char *vb) {
    v->ntok = 256;
    for (int b = 0; b < 256; b++) v->tok[b][0] = (uint8_t)b, v->len[b] = 1;
    for (int m = 0; m < NMERGE;) {
        *seed = *seed * 1103515245u + 12345u;
        const int pool = 4 + m, a = (int)(*seed >> 8) % pool, c = (int)(*seed >> 20) % pool;
        const int ta = a < 4 ? 'a' + a : 256 + a - 4, tc = c < 4 ? 'a' + c : 256 + c - 4;
        if (v->len[ta] + v->len[tc] > MAXTOK) continue;
        uint8_t cat[2 * MAXTOK];
        memcpy(cat, v->tok[ta], v->len[ta]);
        memcpy(cat + v->len[ta], v->tok[tc], v->len[tc]);
        int dup = 0;
        for (int t = 0; t < v->ntok; t++)
            dup |= v->len[t] == v->len[ta] + v->len[tc] && !memcmp(v->tok[t], cat, v->len[t]);
        if (dup) continue;
        memcpy(v->tok[v->ntok], cat, v->len[ta] + v->len[tc]);
        v->len[v->ntok++] = v->len[ta] + v->len[tc];
        v->left[m] = ta, v->right[m] = tc, m++;
    }
    strcpy(ej, "{");
    for (int t = 0; t < v->ntok; t++) {
        if (t) strcat(ej, ", ");
        json_token(ej, v->tok[t], v->len[t]);
        sprintf(ej + strlen(ej), ": %d", t);
    }
    strcat(ej, "}");
    strcpy(vb, "#version: 0.2\n");
    for (int m = 0; m < NMERGE; m++) {
        utf8_token(vb, v->tok[v->left[m]], v->len[v->left[m]]);
        strcat(vb, " ");
        utf8_token(vb, v->tok[v->right[m]], v->len[v->right[m]]);
        strcat(vb, "\n");
    }
    Err err;
    Bpe *b = bpe_from_memory(ej, strlen(ej), vb, strlen(vb), &err);
    if (!b) fprintf(stderr, "%s\n", err.msg);
    return b;
}

/* The naive reference: ids of w under v's merges. */
static size_t naive(const Vocab *v, const uint8_t *w, size_t n, int *ids) {
    for (size_t i = 0; i < n; i++) ids[i] = w[i];
    for (;;) {
        int best = -1, at = -1;
        for (size_t i = 0; i + 1 < n; i++)
            for (int m = 0; m < NMERGE; m++)
                if (v->left[m] == ids[i] && v->right[m] == ids[i + 1] && (best < 0 || m < best))
                    best = m, at = (int)i;
        if (best < 0) return n;
        ids[at] = 256 + best;
        memmove(ids + at + 1, ids + at + 2, (n - (size_t)at - 2) * sizeof *ids);
        n--;
    }
}

static void test_merges(void) {
    static char ej[1 << 16], vb[1 << 14];
    static Vocab v;
    uint32_t seed = 7;
    for (int round = 0; round < 20; round++) {
        Bpe *b = random_vocab(&v, &seed, ej, vb);
        CU_ASSERT_FATAL(b != NULL);
        CU_ASSERT(bpe_vocab_size(b) == 256 + NMERGE && bpe_eot(b) == -1);
        for (int k = 0; k < 50; k++) {
            uint8_t w[200];
            seed = seed * 1103515245u + 12345u;
            const size_t n = 1 + (seed >> 16) % 199;
            for (size_t i = 0; i < n; i++) {
                seed = seed * 1103515245u + 12345u;
                w[i] = (uint8_t)('a' + (seed >> 20) % 4);
            }
            int want[200];
            const size_t nw = naive(&v, w, n, want);
            BpeIds got = {0};
            bpe_encode(b, (const char *)w, n, &got);
            CU_ASSERT(got.n == nw && memcmp(got.ids, want, nw * sizeof *want) == 0);
            free(got.ids);
        }
        bpe_free(b);
    }
}

static void test_round_trip(void) {
    static char ej[1 << 16], vb[1 << 14];
    static Vocab v;
    uint32_t seed = 99;
    Bpe *b = random_vocab(&v, &seed, ej, vb);
    CU_ASSERT_FATAL(b != NULL);
    const char *texts[] = {"abcd dcba  \n\n  ab12cd's x",
                           "caf\xc3\xa9 \xe2\x80\x99s \xf0\x9f\x98\x80",
                           "\xff\xfe bad \xc3 utf8 \xed\xa0\x80 \xf4\x90\x80\x80 ok"};
    uint8_t rnd[4096];
    for (size_t i = 0; i < sizeof rnd; i++) {
        seed = seed * 1103515245u + 12345u;
        rnd[i] = (uint8_t)(seed >> 16);
    }
    for (int t = 0; t < 4; t++) {
        const char *s = t < 3 ? texts[t] : (const char *)rnd;
        const size_t n = t < 3 ? strlen(s) : sizeof rnd;
        BpeIds ids = {0};
        bpe_encode(b, s, n, &ids);
        uint8_t back[4096 + 64];
        size_t at = 0;
        for (size_t i = 0; i < ids.n; i++) {
            size_t len = 0;
            const uint8_t *p = bpe_token(b, ids.ids[i], &len);
            CU_ASSERT_FATAL(p != NULL && at + len <= sizeof back);
            memcpy(back + at, p, len);
            at += len;
        }
        CU_ASSERT(at == n && memcmp(back, s, n) == 0);
        free(ids.ids);
    }
    size_t len;
    CU_ASSERT(bpe_token(b, -1, &len) == NULL && bpe_token(b, 256 + NMERGE, &len) == NULL);
    /* one piece of 2.5 MB (letters only), merged in 1 MiB slices */
    const size_t big = 2500000;
    char *letters = malloc(big);
    for (size_t i = 0; i < big; i++) {
        seed = seed * 1103515245u + 12345u;
        letters[i] = (char)('a' + (seed >> 20) % 4);
    }
    BpeIds ids = {0};
    bpe_encode(b, letters, big, &ids);
    size_t at = 0;
    int same = 1;
    for (size_t i = 0; i < ids.n && same; i++) {
        const uint8_t *p = bpe_token(b, ids.ids[i], &len);
        same = p && at + len <= big && memcmp(letters + at, p, len) == 0;
        at += len;
    }
    CU_ASSERT(same && at == big && ids.n < big);
    free(ids.ids);
    free(letters);
    bpe_free(b);
}

/* A vocabulary whose load fails with a message containing want. */
static void refused(const char *ej, const char *vb, const char *want) {
    Err err = {{0}};
    Bpe *b = bpe_from_memory(ej, strlen(ej), vb, strlen(vb), &err);
    CU_ASSERT(b == NULL);
    if (!b && !strstr(err.msg, want)) fprintf(stderr, "got '%s', want '%s'\n", err.msg, want);
    CU_ASSERT(!b && strstr(err.msg, want) != NULL);
    bpe_free(b);
}

static void test_refused(void) {
    static char ej[1 << 16], vb[1 << 14];
    static Vocab v;
    uint32_t seed = 5;
    Bpe *ok = random_vocab(&v, &seed, ej, vb);
    CU_ASSERT_FATAL(ok != NULL);
    bpe_free(ok);
    refused("", vb, "encoder.json: at byte 0");
    refused("{\"a\": 0, \"a\": 1}", vb, "listed twice");
    refused("{\"a\": 01}", vb, "encoder.json: at byte 7 (line 1, column 7): not valid JSON");
    refused("{\"a\": 0, \"\\u0061\": 1}", vb, "listed twice"); /* the same token escaped */
    refused("{\"a\": 1.5}", vb, "the token \"a\": expected an integer id in [0, 16777216)");
    refused("{\"a\": -1}", vb, "expected an integer id");
    refused("{\"a\": \"0\"}", vb, "expected an integer id");
    refused("{\"a\": 99999999999999999999}", vb, "not valid JSON");
    refused("{\"a\\u0000\": 0}", vb, "U+0000, outside GPT-2's byte alphabet");
    refused("{\"\\udc00\": 0}", vb, "not valid JSON (jansson: invalid Unicode");
    refused("{\"\": 0}", vb,
            "the token \"\": a character outside GPT-2's byte alphabet (or empty)");
    refused("{\"a\": 0, \"b\": [1]}", vb, "at byte 14: a '['");
    refused("{\"a\": 0, \"b\": {}}", vb, "at byte 14: a '{'");
    refused("[0, 1]", vb, "at byte 0: a '['");
    refused("{\"a\": 0, \"b\": 0}", vb, "each once");
    refused("{\"a\": 0}", vb, "no token for the byte");
    refused("{\"a b\": 0}", vb, "outside GPT-2's byte alphabet");
    refused("{\"a\": 0} x", vb, "at byte 10 (line 1, column 10): expected the end of the file");
    static char bad[1 << 15];
    snprintf(bad, sizeof bad, "%szz q\n", vb);
    refused(ej, bad, "vocab.bpe: line 42");
    snprintf(bad, sizeof bad, "%sa  b\n", vb);
    refused(ej, bad, "expected 'A B'");
    const char *nl = strchr(vb, '\n') + 1, *second = strchr(nl, '\n') + 1;
    snprintf(bad, sizeof bad, "%s%.*s", vb, (int)(second - nl), nl);
    refused(ej, bad, "listed twice");
}

/* The hash names the vocabulary, not how its files are written: the same
 * tokens and merges hash the same in JSON laid out another way and without
 * the #version line; one merge fewer, or two ids swapped, hash otherwise. */
static void test_hash(void) {
    static char ej[1 << 16], vb[1 << 14], other[1 << 17];
    static Vocab v;
    uint32_t seed = 11;
    Bpe *a = random_vocab(&v, &seed, ej, vb);
    CU_ASSERT_FATAL(a != NULL);
    const uint64_t h = bpe_hash(a);
    Err err;
    size_t o = 0; /* ej with every ", " between entries as " ,\n\t", a newline after "{" */
    memcpy(other, " {\n", 3), o = 3;
    for (const char *p = ej + 1; *p; p++) {
        if (p[0] == ',' && p[1] == ' ' && p[-1] >= '0' && p[-1] <= '9') { /* after an id */
            memcpy(other + o, " ,\n\t", 4), o += 4, p++;
        } else other[o++] = *p;
    }
    other[o] = '\0';
    Bpe *b = bpe_from_memory(other, o, vb, strlen(vb), &err);
    CU_ASSERT_FATAL(b != NULL);
    CU_ASSERT(bpe_hash(b) == h);
    bpe_free(b);
    const char *merges = strchr(vb, '\n') + 1; /* past "#version: 0.2" */
    b = bpe_from_memory(ej, strlen(ej), merges, strlen(merges), &err);
    CU_ASSERT_FATAL(b != NULL);
    CU_ASSERT(bpe_hash(b) == h);
    bpe_free(b);
    const size_t cut = (size_t)(strrchr(vb, '\n') - vb); /* the last line's newline */
    const char *last = vb + cut - 1;
    while (last[-1] != '\n') last--;
    b = bpe_from_memory(ej, strlen(ej), vb, (size_t)(last - vb), &err);
    CU_ASSERT_FATAL(b != NULL);
    CU_ASSERT(bpe_hash(b) != h);
    bpe_free(b);
    /* the ids of the first two tokens swapped: ": 0" and ": 1" trade places */
    snprintf(other, sizeof other, "%s", ej);
    char *zero = strstr(other, ": 0,"), *one = strstr(other, ": 1,");
    CU_ASSERT_FATAL(zero && one);
    zero[2] = '1', one[2] = '0';
    b = bpe_from_memory(other, strlen(other), vb, strlen(vb), &err);
    CU_ASSERT_FATAL(b != NULL);
    CU_ASSERT(bpe_hash(b) != h);
    bpe_free(b);
    bpe_free(a);
}

/* Decode input fed in two chunks, split at every byte, gives the bytes
 * and the error of it fed whole; a NUL or any byte but digits and
 * whitespace, and an id outside the vocabulary, are errors naming the
 * byte offset, however far into the input. */
static int decode_split(const Bpe *b, const char *in, size_t n, size_t cut, BpeBytes *out,
                        Err *err) {
    BpeDecoder d;
    bpe_decoder_init(&d);
    out->n = 0;
    if (bpe_decode_feed(b, &d, in, cut, out, err) != 0) return -1;
    if (bpe_decode_feed(b, &d, in + cut, n - cut, out, err) != 0) return -1;
    return bpe_decode_end(b, &d, out, err);
}

static void test_decode(void) {
    static char ej[1 << 16], vb[1 << 14];
    static Vocab v;
    uint32_t seed = 3;
    Bpe *b = random_vocab(&v, &seed, ej, vb);
    CU_ASSERT_FATAL(b != NULL);
    const char ok[] = "97 98\n\t256 \r\n00099 257";
    BpeBytes whole = {0}, part = {0};
    Err err;
    CU_ASSERT_FATAL(decode_split(b, ok, strlen(ok), 0, &whole, &err) == 0);
    size_t l0, l1;
    const uint8_t *t0 = bpe_token(b, 256, &l0), *t1 = bpe_token(b, 257, &l1);
    CU_ASSERT(whole.n == 3 + l0 + l1 && memcmp(whole.bytes, "ab", 2) == 0 &&
              memcmp(whole.bytes + 2, t0, l0) == 0 && whole.bytes[2 + l0] == 'c' &&
              memcmp(whole.bytes + 3 + l0, t1, l1) == 0);
    for (size_t cut = 0; cut <= strlen(ok); cut++) {
        CU_ASSERT(decode_split(b, ok, strlen(ok), cut, &part, &err) == 0);
        CU_ASSERT(part.n == whole.n && memcmp(part.bytes, whole.bytes, whole.n) == 0);
    }
    static const struct {
        const char *in;
        size_t n;
        const char *want;
    } bad[] = {
        {"97\n\0\n99999", 10, "byte 3 (line 2) is 0x00, not a digit"},
        {"97\n\0\n296", 8, "byte 3 (line 2) is 0x00"},
        {"97 296", 6, "byte 3 (line 1): 296 is not a token id in [0, 296)"},
        {"97 -1", 5, "byte 3 (line 1) is '-'"},
        {"97 9a", 5, "byte 4 (line 1) is 'a'"},
        {"97,98", 5, "byte 2 (line 1) is ','"},
        {"1 123456789012345678901", 23, "byte 2 (line 1): an id of more than 20 digits"},
        {"99999999999999999999", 20, "byte 0 (line 1): 99999999999999999999 is not a token id"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
        for (size_t cut = 0; cut <= bad[k].n; cut++) {
            err.msg[0] = '\0';
            CU_ASSERT(decode_split(b, bad[k].in, bad[k].n, cut, &part, &err) == -1);
            if (!strstr(err.msg, bad[k].want))
                fprintf(stderr, "got '%s', want '%s'\n", err.msg, bad[k].want);
            CU_ASSERT(strstr(err.msg, bad[k].want) != NULL);
        }
    /* a bad id 5 MB in */
    const size_t big = 5000000;
    char *far = malloc(big + 8);
    memset(far, ' ', big);
    memcpy(far + big, "97 x", 4);
    CU_ASSERT(decode_split(b, far, big + 4, big / 2, &part, &err) == -1);
    CU_ASSERT(strstr(err.msg, "byte 5000003 (line 1) is 'x'") != NULL);
    free(far);
    free(whole.bytes);
    free(part.bytes);
    bpe_free(b);
}

/* ------------------------------------------------------ hash flooding */

/* The hashes the tokenizer used before it keyed them, to craft collisions: the
 * merge table's multiplicative hash of (left << 32 | right) + 1, whose
 * slot depends only on the key's low bits, and the string map's FNV-1a. */
static size_t old_pair_slot(uint32_t a, uint32_t b, size_t mask) {
    const uint64_t key = ((uint64_t)a << 32 | b) + 1;
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

static uint64_t old_fnv(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Appends a token to a long buffer at *at (json_token's strcat would
 * rescan it from the start each time). */
static void put_json(char *buf, size_t *at, const uint8_t *t, size_t n) {
    buf[*at] = '\0';
    json_token(buf + *at, t, n);
    *at += strlen(buf + *at);
}

static void put_utf8(char *buf, size_t *at, const uint8_t *t, size_t n) {
    buf[*at] = '\0';
    utf8_token(buf + *at, t, n);
    *at += strlen(buf + *at);
}

/* A valid vocabulary of m merges "L b" (L four letters, b any byte) whose
 * pairs all fall in the first 1024 slots of the old merge table: the
 * old code's linear probing made one cluster of them, m^2/2 probes. */
static Bpe *colliding_merges(size_t m) {
    size_t lines = m + 2, slots = 64; /* as load_merges counts them */
    while (slots < 2 * lines) slots *= 2;
    char *ej = malloc(48 * (m + 256) + 64 * m), *vb = malloc(24 * m + 64);
    uint8_t(*merged)[5] = malloc(m * sizeof *merged);
    size_t ea = 1, va = 0, nm = 0;
    strcpy(ej, "{");
    for (int b = 0; b < 256; b++) {
        const uint8_t byte = (uint8_t)b;
        put_json(ej, &ea, &byte, 1);
        ea += (size_t)sprintf(ej + ea, ": %d, ", b);
    }
    va += (size_t)sprintf(vb, "#version: 0.2\n");
    uint32_t id = 256;
    for (uint32_t l = 0; nm < m; l++) {
        const uint8_t left[4] = {(uint8_t)('a' + l % 26), (uint8_t)('a' + l / 26 % 26),
                                 (uint8_t)('a' + l / 676 % 26), (uint8_t)('a' + l / 17576 % 26)};
        const uint32_t lid = id++;
        put_json(ej, &ea, left, 4);
        ea += (size_t)sprintf(ej + ea, ": %u, ", lid);
        for (uint32_t b = 0; b < 256 && nm < m; b++) {
            if (old_pair_slot(lid, b, slots - 1) >= 1024) continue;
            memcpy(merged[nm], left, 4), merged[nm][4] = (uint8_t)b;
            put_utf8(vb, &va, left, 4);
            vb[va++] = ' ';
            put_utf8(vb, &va, merged[nm] + 4, 1);
            vb[va++] = '\n';
            nm++;
        }
    }
    for (size_t k = 0; k < nm; k++) {
        put_json(ej, &ea, merged[k], 5);
        ea += (size_t)sprintf(ej + ea, ": %u%s", id++, k + 1 < nm ? ", " : "}");
    }
    Err err;
    Bpe *b = bpe_from_memory(ej, ea, vb, va, &err);
    if (!b) fprintf(stderr, "%s\n", err.msg);
    free(ej), free(vb), free(merged);
    return b;
}

/* 150,000 merges crafted to collide under the old hash: 1.1e10 probes
 * there (6 s), a few per merge here. */
static void test_colliding_merges(void) {
    const size_t m = 150000;
    Bpe *b = colliding_merges(m);
    CU_ASSERT_FATAL(b != NULL);
    BpeProbes merges, tokens;
    bpe_probes(b, &merges, &tokens, NULL);
    printf("\n    %zu colliding merges: %llu probes; %llu tokens: %llu probes\n", m,
           (unsigned long long)merges.probes, (unsigned long long)tokens.lookups,
           (unsigned long long)tokens.probes);
    CU_ASSERT(merges.lookups == m);
    CU_ASSERT(merges.probes < 4 * merges.lookups);
    CU_ASSERT(tokens.probes < 4 * tokens.lookups);
    size_t len = 0;
    const uint8_t *first = bpe_token(b, 256, &len);
    CU_ASSERT(first && len == 4 && memcmp(first, "aaaa", 4) == 0);
    bpe_free(b);
}

/* 4096 words that all fell in one slot of the old word cache (FNV-1a,
 * folded, 8192 slots when full): 8.4e6 probes there to encode them once,
 * a few a word here. */
static void test_colliding_words(void) {
    char ej[1 << 13];
    size_t ea = 1;
    strcpy(ej, "{");
    for (int b = 0; b < 256; b++) {
        const uint8_t byte = (uint8_t)b;
        put_json(ej, &ea, &byte, 1);
        ea += (size_t)sprintf(ej + ea, ": %d%s", b, b < 255 ? ", " : "}");
    }
    Err err;
    Bpe *b = bpe_from_memory(ej, ea, "", 0, &err);
    CU_ASSERT_FATAL(b != NULL);
    enum { WORDS = 4096, LEN = 7 }; /* " " and six letters: one piece each */
    char *text = malloc(WORDS * LEN);
    size_t n = 0;
    uint8_t w[LEN] = {' '};
    for (uint32_t k = 0; n < WORDS; k++) {
        for (int i = 0, x = (int)k; i < 6; i++, x /= 26) w[1 + i] = (uint8_t)('a' + x % 26);
        const uint64_t h = old_fnv(1469598103934665603ull, w, LEN);
        if (((h ^ (h >> 29)) & 8191) == 0) memcpy(text + LEN * n++, w, LEN);
    }
    BpeIds ids = {0};
    bpe_encode(b, text, WORDS * LEN, &ids);
    CU_ASSERT(ids.n == WORDS * LEN);
    BpeProbes words;
    bpe_probes(b, NULL, NULL, &words);
    printf("\n    %d colliding words: %llu lookups, %llu probes\n", WORDS,
           (unsigned long long)words.lookups, (unsigned long long)words.probes);
    CU_ASSERT(words.lookups >= WORDS);
    CU_ASSERT(words.probes < 4 * words.lookups);
    free(ids.ids);
    free(text);
    bpe_free(b);
}

int main(void) {
    CU_TestInfo tests[] = {{"merges equal a naive reference on random vocabularies", test_merges},
                           {"any bytes decode back to themselves", test_round_trip},
                           {"malformed vocabularies: one line naming what is wrong", test_refused},
                           {"the hash names the tokens and merges, not the layout", test_hash},
                           {"decode input: strict, in chunks split anywhere", test_decode},
                           {"merges crafted to collide: a few probes each", test_colliding_merges},
                           {"words crafted to collide: a few probes each", test_colliding_words},
                           CU_TEST_INFO_NULL};
    return run_suite("bpe", tests);
}
