/*
 * bpe: GPT-2's byte-level BPE (see bpe.h).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "src/tokenizer/bpe.h"
#include "src/base/files.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* GPT-2's pre-tokenisation, as tiktoken's "gpt2" encoding writes it. */
static const char PATTERN[] =
    "'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Pieces of up to CACHE_WORD_MAX bytes are cached, up to CACHE_ENTRIES_MAX
 * of them; a piece longer than PIECE_MAX (a megabyte of letters, spaces or
 * bytes that are not UTF-8) is merged in slices of that length, so that
 * the merge's scratch (28 bytes a byte) stays bounded whatever the text. */
enum { CACHE_WORD_MAX = 64, CACHE_ENTRIES_MAX = 1 << 16, PIECE_MAX = 1 << 20 };

/* ------------------------------------------------------------ hashing */

/* Every table keyed by input (the token map, the merges, the word cache)
 * hashes under a key of its own, drawn from the process's random key
 * (getrandom) when the table is made: strings with SipHash-1-3, the
 * merges' pairs of ids with a keyed wyhash-style mix. Which slot a key
 * lands in cannot be predicted from the input, so no vocabulary or text
 * can be crafted to collide (with the old unkeyed FNV and multiplicative
 * hashes a 22 MB vocabulary could take minutes to load). Tables stay at
 * most half full, so a lookup looks at under 2.5 slots on average
 * whatever the input. The slots affect only speed: ids and the
 * vocabulary hash are the same under any key. */
typedef struct {
    uint64_t k0, k1;
} HashKey;

#define SIP_ROUND(v0, v1, v2, v3)                                               \
    do {                                                                        \
        v0 += v1, v1 = v1 << 13 | v1 >> 51, v1 ^= v0, v0 = v0 << 32 | v0 >> 32; \
        v2 += v3, v3 = v3 << 16 | v3 >> 48, v3 ^= v2;                           \
        v0 += v3, v3 = v3 << 21 | v3 >> 43, v3 ^= v0;                           \
        v2 += v1, v1 = v1 << 17 | v1 >> 47, v1 ^= v2, v2 = v2 << 32 | v2 >> 32; \
    } while (0)

/* SipHash-1-3 (Aumasson and Bernstein's keyed hash, with one round a
 * word and three to finish) of n bytes. Words are read in host order: the
 * slots differ on a big-endian machine, nothing else does. */
static uint64_t sip13(HashKey k, const uint8_t *p, size_t n) {
    uint64_t v0 = k.k0 ^ 0x736f6d6570736575ull, v1 = k.k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k.k0 ^ 0x6c7967656e657261ull, v3 = k.k1 ^ 0x7465646279746573ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t m;
        memcpy(&m, p + i, 8);
        v3 ^= m;
        SIP_ROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    uint64_t last = (uint64_t)(n & 0xFF) << 56;
    for (size_t j = 0; i + j < n; j++) last |= (uint64_t)p[i + j] << (8 * j);
    v3 ^= last;
    SIP_ROUND(v0, v1, v2, v3);
    v0 ^= last;
    v2 ^= 0xFF;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

/* The same of one 64-bit word (a merge's pair of ids), without the loop. */
static inline uint64_t sip13_u64(HashKey k, uint64_t m) {
    uint64_t v0 = k.k0 ^ 0x736f6d6570736575ull, v1 = k.k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k.k0 ^ 0x6c7967656e657261ull, v3 = k.k1 ^ 0x7465646279746573ull ^ m;
    SIP_ROUND(v0, v1, v2, v3);
    v0 ^= m;
    const uint64_t last = (uint64_t)8 << 56;
    v3 ^= last;
    SIP_ROUND(v0, v1, v2, v3);
    v0 ^= last;
    v2 ^= 0xFF;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

/* A fresh key for a new table: the process's random key (getrandom once;
 * the clock and addresses where it fails) stepped by a counter, so that no
 * two tables share one. */
static HashKey table_key(void) {
    static uint64_t base[2];
    static int ready;
    static uint64_t count;
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        uint64_t k[2] = {0, 0};
        if (getrandom(k, sizeof k, 0) != (ssize_t)sizeof k) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            k[0] = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 32 ^ (uint64_t)(uintptr_t)&ts;
            k[1] = (uint64_t)getpid() ^ (uint64_t)(uintptr_t)&table_key;
        }
        __atomic_store_n(&base[0], k[0], __ATOMIC_RELAXED);
        __atomic_store_n(&base[1], k[1], __ATOMIC_RELAXED);
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE); /* a racing twin only picks another key */
    }
    const uint64_t c = __atomic_add_fetch(&count, 1, __ATOMIC_RELAXED);
    const HashKey root = {__atomic_load_n(&base[0], __ATOMIC_RELAXED),
                          __atomic_load_n(&base[1], __ATOMIC_RELAXED)};
    return (HashKey){sip13_u64(root, 2 * c), sip13_u64(root, 2 * c + 1)};
}

/* An open-addressing map from byte strings (kept in an arena) to a value,
 * at most half full. */
typedef struct {
    uint32_t *slot; /* entry index + 1, 0 = empty */
    size_t mask;
    HashKey key;
    BpeProbes probes; /* lookups and the slots they looked at */
    uint8_t *arena;
    size_t alen, acap;
    size_t *off;   /* entry -> key offset in arena */
    uint32_t *len; /* entry -> key length */
    int64_t *val;
    size_t n, cap;
} StrMap;

/* FNV-1a, 64 bits, continued from h: the vocabulary's hash. */
static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static uint64_t fnv1a_u32(uint64_t h, uint32_t x) {
    const uint8_t le[4] = {(uint8_t)x, (uint8_t)(x >> 8), (uint8_t)(x >> 16), (uint8_t)(x >> 24)};
    return fnv1a(h, le, 4);
}

static void strmap_init(StrMap *m, size_t want) {
    memset(m, 0, sizeof *m);
    size_t slots = 64;
    while (slots < 2 * want) slots *= 2;
    m->slot = xcalloc(slots, sizeof *m->slot);
    m->mask = slots - 1;
    m->key = table_key();
}

static void strmap_free(StrMap *m) {
    free(m->slot);
    free(m->arena);
    free(m->off);
    free(m->len);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* The slot that holds key or the empty one where it would go. */
static size_t strmap_find(StrMap *m, const uint8_t *k, size_t n) {
    const size_t home = (size_t)sip13(m->key, k, n) & m->mask;
    for (size_t i = home;; i = (i + 1) & m->mask) {
        const uint32_t e = m->slot[i];
        if (e == 0 || (m->len[e - 1] == n && memcmp(m->arena + m->off[e - 1], k, n) == 0)) {
            m->probes.lookups++, m->probes.probes += ((i - home) & m->mask) + 1;
            return i;
        }
    }
}

static int64_t strmap_get(StrMap *m, const uint8_t *k, size_t n, int64_t missing) {
    const uint32_t e = m->slot[strmap_find(m, k, n)];
    return e ? m->val[e - 1] : missing;
}

static void strmap_grow(StrMap *m) {
    const size_t slots = 2 * (m->mask + 1);
    free(m->slot);
    m->slot = xcalloc(slots, sizeof *m->slot);
    m->mask = slots - 1;
    for (size_t e = 0; e < m->n; e++)
        m->slot[strmap_find(m, m->arena + m->off[e], m->len[e])] = (uint32_t)e + 1;
}

/* Adds key -> v; returns 0, or -1 when the key is there already. */
static int strmap_put(StrMap *m, const uint8_t *k, size_t n, int64_t v) {
    size_t at = strmap_find(m, k, n);
    if (m->slot[at]) return -1;
    if (2 * (m->n + 1) > m->mask + 1) {
        strmap_grow(m);
        at = strmap_find(m, k, n);
    }
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 256;
        m->off = xrealloc(m->off, m->cap * sizeof *m->off);
        m->len = xrealloc(m->len, m->cap * sizeof *m->len);
        m->val = xrealloc(m->val, m->cap * sizeof *m->val);
    }
    if (m->alen + n > m->acap) {
        m->acap = 2 * (m->acap + n);
        m->arena = xrealloc(m->arena, m->acap);
    }
    memcpy(m->arena + m->alen, k, n);
    m->off[m->n] = m->alen, m->len[m->n] = (uint32_t)n, m->val[m->n] = v;
    m->alen += n;
    m->slot[at] = (uint32_t)++m->n;
    return 0;
}

/* The merges: (left id, right id) -> rank and merged id, at most half
 * full. */
typedef struct {
    uint64_t *key; /* (left << 32 | right) + 1, 0 = empty */
    int32_t *rank, *to;
    size_t mask;
    HashKey hkey;
    BpeProbes probes; /* of the load (lookups while encoding are not counted: shared) */
} PairMap;

/* wyhash's mix: the 128-bit product's halves folded. */
static inline uint64_t mum(uint64_t a, uint64_t b) {
    const __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

/* A pair's slot: a keyed wyhash-style mix of the 64-bit pair (two 128-bit
 * multiplies under the table's key), cheaper than SipHash on the path
 * every candidate pair of a merge takes. */
static size_t pair_home(const PairMap *p, uint64_t key) {
    const uint64_t h = mum(key ^ p->hkey.k0, p->hkey.k1 ^ 0xe7037ed1a0b428dbull);
    return (size_t)mum(h ^ p->hkey.k1, p->hkey.k0 ^ 0x8ebc6af09c88c6e3ull) & p->mask;
}

static size_t pair_find(const PairMap *p, uint64_t key) {
    for (size_t i = pair_home(p, key);; i = (i + 1) & p->mask)
        if (p->key[i] == 0 || p->key[i] == key) return i;
}

/* Shared by a Bpe and its clones. */
typedef struct {
    int refs;
    StrMap tokens;   /* bytes -> id */
    size_t *tok_off; /* id -> offset of its bytes in tokens.arena (SIZE_MAX: none) */
    uint32_t *tok_len;
    int vocab, eot;
    int32_t byte_id[256];
    int16_t inverse[512]; /* alphabet code point -> byte, -1: none */
    PairMap merges;
    uint64_t hash; /* bpe_hash */
    pcre2_code *re;
} Vocab;

struct Bpe {
    Vocab *v;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
    StrMap cache; /* word -> offset into cache_ids (low 40 bits) and count (high) */
    int32_t *cache_ids;
    size_t cache_n, cache_cap;
    /* scratch of the merge: symbols as a linked list and a heap of pairs */
    int32_t *tok, *prev, *next;
    uint64_t *heap; /* rank << 32 | left position */
    size_t scratch;
};

/* ------------------------------------------------------------ the alphabet */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other bytes for code points 256 and up, in byte order. */
static void byte_alphabet(int cp[256]) {
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        const int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = printable ? b : 256 + extra++;
    }
}

/* One UTF-8 code point from s[*i..n); -1 when it is not valid UTF-8. */
static int32_t utf8_next(const uint8_t *s, size_t n, size_t *i) {
    const uint8_t c = s[*i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || *i + (size_t)len > n) return -1;
    int32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((s[*i + k] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (s[*i + k] & 0x3F);
    }
    static const int32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *i += (size_t)len;
    return cp;
}

/* Code points of the alphabet -> bytes into out (one byte each). Returns
 * 0, or -1 at a code point outside the alphabet. */
static int alphabet_bytes(const Vocab *v, const int32_t *cps, size_t n, uint8_t *out) {
    for (size_t i = 0; i < n; i++) {
        if (cps[i] < 0 || cps[i] >= 512 || v->inverse[cps[i]] < 0) return -1;
        out[i] = (uint8_t)v->inverse[cps[i]];
    }
    return 0;
}

/* ----------------------------------------------------------- encoder.json */

/* jansson parses the file; this file checks what it holds. */

/* A non-negative integer below BPE_MAX_VOCAB. */
#define BPE_MAX_VOCAB (1 << 24)

/* jansson holds the whole document as a tree, about 140 bytes an entry of
 * a flat object but up to 80 times its input for nested empty arrays and
 * objects ("[[],{},...]"). An encoder.json has no nesting, so any '[', or a
 * '{' after the first, outside a string is refused before jansson builds
 * anything: the tree and the token map stay within about 20 times the
 * file (README: Hostile input). Returns the offset of the first such byte, or n. */
static size_t nesting_at(const uint8_t *s, size_t n) {
    int in_string = 0, objects = 0;
    for (size_t i = 0; i < n; i++) {
        if (in_string) {
            if (s[i] == '\\') i++;
            else if (s[i] == '"') in_string = 0;
        } else if (s[i] == '"') {
            in_string = 1;
        } else if (s[i] == '[' || (s[i] == '{' && objects++ > 0)) {
            return i;
        }
    }
    return n;
}

/* A token for a message: quoted, at most 40 bytes, other than printable
 * ASCII as \xNN. */
static void token_text(const char *k, size_t len, char *out, size_t cap) {
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < len && o + 8 < cap; i++) {
        const uint8_t c = (uint8_t)k[i];
        if (i == 40) {
            o += (size_t)snprintf(out + o, cap - o, "...");
            break;
        }
        if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    snprintf(out + o, cap - o, "\"");
}

/* Fills v->tokens, tok_off/tok_len and vocab from encoder.json. */
static int load_encoder(Vocab *v, const uint8_t *s, size_t n, Err *err) {
    const size_t nest = nesting_at(s, n);
    if (nest < n)
        return err_set(err,
                       "encoder.json: at byte %zu: a '%c' (an array or a second object); "
                       "expected one JSON object of tokens to integer ids, nothing nested",
                       nest, s[nest]);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)s, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        const enum json_error_code code = json_error_code(&jerr);
        const char *what = code == json_error_duplicate_key ? "a token listed twice"
                           : code == json_error_null_byte_in_key
                               ? "a token with U+0000, outside GPT-2's byte alphabet"
                           : code == json_error_end_of_input_expected
                               ? "expected the end of the file after the object"
                               : "not valid JSON";
        return err_set(err, "encoder.json: at byte %d (line %d, column %d): %s (jansson: %s)",
                       jerr.position, jerr.line, jerr.column, what, jerr.text);
    }
    int rc = -1;
    uint8_t *bytes = NULL;
    int32_t *cps = NULL;
    char tok[200];
    strmap_init(&v->tokens, json_is_object(root) ? json_object_size(root) + 1 : 1);
    if (!json_is_object(root)) {
        err_set(err, "encoder.json: a JSON array; expected one object of tokens to ids");
        goto done;
    }
    for (void *it = json_object_iter(root); it; it = json_object_iter_next(root, it)) {
        const char *key = json_object_iter_key(it);
        const size_t klen = json_object_iter_key_len(it);
        const json_t *val = json_object_iter_value(it);
        /* jansson checked the UTF-8 and the escapes: code points, then bytes */
        bytes = xrealloc(bytes, klen + 1);
        cps = xrealloc(cps, (klen + 1) * sizeof *cps);
        size_t ncp = 0;
        for (size_t i = 0; i < klen;) {
            const int32_t cp = utf8_next((const uint8_t *)key, klen, &i);
            if (cp < 0) break; /* cannot happen after jansson; refused below */
            cps[ncp++] = cp;
        }
        int bad = ncp == 0 || alphabet_bytes(v, cps, ncp, bytes) != 0;
        if (!bad) { /* every code point decoded, none lost */
            size_t enc = 0;
            for (size_t i = 0; i < ncp; i++) enc += cps[i] < 0x80 ? 1 : cps[i] < 0x800 ? 2 : 3;
            bad = enc != klen;
        }
        token_text(key, klen, tok, sizeof tok);
        if (bad) {
            err_set(err,
                    "encoder.json: the token %s: a character outside GPT-2's byte alphabet (or "
                    "empty); expected the file GPT-2 was released with",
                    tok);
            goto done;
        }
        const json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= BPE_MAX_VOCAB) {
            err_set(err, "encoder.json: the token %s: expected an integer id in [0, %d)", tok,
                    BPE_MAX_VOCAB);
            goto done;
        }
        if (strmap_put(&v->tokens, bytes, ncp, (int64_t)id) != 0) {
            err_set(err, "encoder.json: the token %s: listed twice", tok);
            goto done;
        }
    }
    rc = 0;
done:
    free(bytes);
    free(cps);
    json_decref(root);
    return rc;
}

/* id -> bytes, every id in [0, vocab) present once; the bytes' ids; the
 * end-of-text token's. */
static int index_ids(Vocab *v, Err *err) {
    StrMap *t = &v->tokens;
    v->vocab = 0;
    for (size_t e = 0; e < t->n; e++)
        if (t->val[e] + 1 > v->vocab) v->vocab = (int)t->val[e] + 1;
    if ((size_t)v->vocab != t->n)
        return err_set(err,
                       "encoder.json: %zu tokens with ids up to %d; expected the ids 0 to %zu, "
                       "each once",
                       t->n, v->vocab - 1, t->n - 1);
    v->tok_off = xcalloc((size_t)v->vocab, sizeof *v->tok_off);
    v->tok_len = xcalloc((size_t)v->vocab, sizeof *v->tok_len);
    for (int i = 0; i < v->vocab; i++) v->tok_off[i] = SIZE_MAX;
    for (size_t e = 0; e < t->n; e++) {
        if (v->tok_off[t->val[e]] != SIZE_MAX)
            return err_set(err, "encoder.json: id %lld given to two tokens; expected each id once",
                           (long long)t->val[e]);
        v->tok_off[t->val[e]] = t->off[e], v->tok_len[t->val[e]] = t->len[e];
    }
    for (int b = 0; b < 256; b++) {
        const uint8_t byte = (uint8_t)b;
        v->byte_id[b] = (int32_t)strmap_get(t, &byte, 1, -1);
        if (v->byte_id[b] < 0)
            return err_set(err,
                           "encoder.json: no token for the byte 0x%02x; a byte-level vocabulary "
                           "has one for each of the 256",
                           b);
    }
    v->eot = (int)strmap_get(t, (const uint8_t *)"<|endoftext|>", 13, -1);
    v->hash = 14695981039346656037ull;
    for (int i = 0; i < v->vocab; i++)
        v->hash = fnv1a(fnv1a_u32(v->hash, v->tok_len[i]), t->arena + v->tok_off[i], v->tok_len[i]);
    return 0;
}

/* ------------------------------------------------------------- vocab.bpe */

/* One side of a merge line: UTF-8 of alphabet characters -> its id. */
static int32_t merge_side(Vocab *v, const uint8_t *s, size_t n, uint8_t *bytes, int32_t *cps) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        const int32_t cp = utf8_next(s, n, &i);
        if (cp < 0) return -1;
        cps[k++] = cp;
    }
    if (k == 0 || alphabet_bytes(v, cps, k, bytes) != 0) return -1;
    return (int32_t)strmap_get(&v->tokens, bytes, k, -1);
}

static int load_merges(Vocab *v, const uint8_t *s, size_t n, Err *err) {
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += s[i] == '\n';
    size_t slots = 64;
    while (slots < 2 * lines) slots *= 2;
    PairMap *p = &v->merges;
    p->key = xcalloc(slots, sizeof *p->key);
    p->rank = xcalloc(slots, sizeof *p->rank);
    p->to = xcalloc(slots, sizeof *p->to);
    p->mask = slots - 1;
    p->hkey = table_key();
    size_t longest = 0;
    for (int i = 0; i < v->vocab; i++)
        if (v->tok_len[i] > longest) longest = v->tok_len[i];
    uint8_t *bytes = xmalloc(n + 2 * longest + 2);
    int32_t *cps = xcalloc(n + 1, sizeof *cps);
    int32_t rank = 0, rc = 0;
    size_t line = 0;
    for (size_t at = 0; at < n && rc == 0; line++) {
        const uint8_t *nl = memchr(s + at, '\n', n - at);
        const size_t len = nl ? (size_t)(nl - (s + at)) : n - at, from = at;
        at += len + 1;
        if (len == 0 || (line == 0 && len >= 8 && memcmp(s + from, "#version", 8) == 0)) continue;
        const uint8_t *sp = memchr(s + from, ' ', len);
        const size_t ll = sp ? (size_t)(sp - (s + from)) : len, rl = sp ? len - ll - 1 : 0;
        int32_t a = -1, b = -1, to = -1;
        if (sp && !memchr(sp + 1, ' ', rl)) {
            a = merge_side(v, s + from, ll, bytes, cps);
            b = merge_side(v, sp + 1, rl, bytes, cps);
        }
        if (a >= 0 && b >= 0) {
            memcpy(bytes, v->tokens.arena + v->tok_off[a], v->tok_len[a]);
            memcpy(bytes + v->tok_len[a], v->tokens.arena + v->tok_off[b], v->tok_len[b]);
            to = (int32_t)strmap_get(&v->tokens, bytes, v->tok_len[a] + v->tok_len[b], -1);
        }
        const uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
        size_t slot = 0;
        if (to >= 0) {
            slot = pair_find(p, key);
            p->probes.lookups++, p->probes.probes += ((slot - pair_home(p, key)) & p->mask) + 1;
        }
        if (to < 0)
            rc = err_set(err,
                         "vocab.bpe: line %zu: expected 'A B', two tokens of encoder.json "
                         "whose concatenation is one too",
                         line + 1);
        else if (p->key[slot] != 0)
            rc = err_set(err, "vocab.bpe: line %zu: a merge listed twice", line + 1);
        else {
            p->key[slot] = key, p->rank[slot] = rank++, p->to[slot] = to;
            v->hash = fnv1a_u32(fnv1a_u32(v->hash, (uint32_t)a), (uint32_t)b);
        }
    }
    free(bytes);
    free(cps);
    return rc;
}

/* ------------------------------------------------------------------ load */

static void vocab_free(Vocab *v) {
    strmap_free(&v->tokens);
    free(v->tok_off);
    free(v->tok_len);
    free(v->merges.key);
    free(v->merges.rank);
    free(v->merges.to);
    if (v->re) pcre2_code_free(v->re);
    free(v);
}

static Bpe *bpe_on(Vocab *v) {
    Bpe *b = xcalloc(1, sizeof *b);
    b->v = v;
    __atomic_add_fetch(&v->refs, 1, __ATOMIC_RELAXED);
    b->md = pcre2_match_data_create_from_pattern(v->re, NULL);
    b->mctx = pcre2_match_context_create(NULL);
    b->stack = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    if (!b->md || !b->mctx || !b->stack) {
        bpe_free(b);
        return NULL;
    }
    pcre2_jit_stack_assign(b->mctx, NULL, b->stack);
    strmap_init(&b->cache, 1024);
    return b;
}

Bpe *bpe_from_memory(const char *encoder_json, size_t elen, const char *vocab_bpe, size_t vlen,
                     Err *err) {
    Vocab *v = xcalloc(1, sizeof *v);
    int cp[256];
    byte_alphabet(cp);
    for (int i = 0; i < 512; i++) v->inverse[i] = -1;
    for (int b = 0; b < 256; b++) v->inverse[cp[b]] = (int16_t)b;
    if (load_encoder(v, (const uint8_t *)encoder_json, elen, err) != 0 || index_ids(v, err) != 0 ||
        load_merges(v, (const uint8_t *)vocab_bpe, vlen, err) != 0) {
        vocab_free(v);
        return NULL;
    }
    int ec;
    PCRE2_SIZE eo;
    v->re = pcre2_compile((PCRE2_SPTR)PATTERN, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
    if (!v->re) {
        err_set(err,
                "bpe: PCRE2 could not compile GPT-2's pattern (error %d at %zu); is it built "
                "with Unicode support?",
                ec, (size_t)eo);
        vocab_free(v);
        return NULL;
    }
    pcre2_jit_compile(v->re, PCRE2_JIT_COMPLETE); /* the interpreter where JIT is missing */
    Bpe *b = bpe_on(v);
    if (!b) err_set(err, "bpe: out of memory for PCRE2's match data");
    return b;
}

/* A vocabulary file's bytes, bounded before they are read: vocab.bpe at
 * most 64 MiB, encoder.json at most 8 MiB (GPT-2's is 1 MB), since jansson's
 * tree of it and the token map take up to about 20 times the file: an 8 MiB
 * file of short tokens peaks at 171 MiB (README: Hostile input). */
static char *read_vocab_file(const char *dir, const char *name, unsigned mib, size_t *len,
                             Err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    Err e;
    char *s = read_file(path, (size_t)mib << 20, len, &e);
    if (!s)
        err_set(err,
                "bpe: %s (%s is at most %u MiB; jobs/get_gpt2_vocab.sh DIR places GPT-2's "
                "files)",
                e.msg, name, mib);
    return s;
}

Bpe *bpe_load(const char *dir, Err *err) {
    size_t elen = 0, vlen = 0;
    char *e = read_vocab_file(dir, "encoder.json", 8, &elen, err), *m = NULL;
    if (e) m = read_vocab_file(dir, "vocab.bpe", 64, &vlen, err);
    Bpe *b = e && m ? bpe_from_memory(e, elen, m, vlen, err) : NULL;
    if (e && m && !b) { /* name the folder too */
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        err_set(err, "bpe: %s/%s", dir, msg);
    }
    free(e);
    free(m);
    return b;
}

Bpe *bpe_clone(const Bpe *b) { return bpe_on(b->v); }

void bpe_free(Bpe *b) {
    if (!b) return;
    if (__atomic_sub_fetch(&b->v->refs, 1, __ATOMIC_ACQ_REL) == 0) vocab_free(b->v);
    pcre2_match_data_free(b->md);
    pcre2_match_context_free(b->mctx);
    pcre2_jit_stack_free(b->stack);
    strmap_free(&b->cache);
    free(b->cache_ids);
    free(b->tok);
    free(b->prev);
    free(b->next);
    free(b->heap);
    free(b);
}

int bpe_vocab_size(const Bpe *b) { return b->v->vocab; }
int bpe_eot(const Bpe *b) { return b->v->eot; }
uint64_t bpe_hash(const Bpe *b) { return b->v->hash; }

void bpe_probes(const Bpe *b, BpeProbes *merges, BpeProbes *tokens, BpeProbes *words) {
    if (merges) *merges = b->v->merges.probes;
    if (tokens) *tokens = b->v->tokens.probes;
    if (words) *words = b->cache.probes;
}

const uint8_t *bpe_token(const Bpe *b, int id, size_t *len) {
    if (id < 0 || id >= b->v->vocab) return NULL;
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

/* A piece through the cache of words seen (short ones; the cache starts
 * over when full, so hostile text cannot grow it without bound). */
static void bpe_piece(Bpe *b, const uint8_t *w, size_t n, BpeIds *out) {
    if (n == 1) {
        ids_push(out, b->v->byte_id[w[0]]);
        return;
    }
    if (n > CACHE_WORD_MAX) { /* a piece longer than PIECE_MAX merges in slices of it */
        for (size_t at = 0; at < n; at += PIECE_MAX)
            bpe_word(b, w + at, n - at < PIECE_MAX ? n - at : PIECE_MAX, out);
        return;
    }
    const int64_t hit = strmap_get(&b->cache, w, n, -1);
    if (hit >= 0) {
        for (int64_t k = 0; k < (hit & 0xFF); k++) ids_push(out, b->cache_ids[(hit >> 8) + k]);
        return;
    }
    const size_t from = out->n;
    bpe_word(b, w, n, out);
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

void bpe_encode(Bpe *b, const char *text, size_t n, BpeIds *out) {
    const uint8_t *s = (const uint8_t *)text;
    for (size_t at = 0; at < n;) {
        const int rc = pcre2_match(b->v->re, s, n, at, 0, b->md, b->mctx);
        size_t from = n, to = n;
        if (rc > 0) {
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
            from = ov[0], to = ov[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) { /* a limit of PCRE2's: this byte alone */
            from = at, to = at + 1;
        }
        if (from > at) bpe_piece(b, s + at, from - at, out); /* bytes that are not UTF-8 */
        if (to > from) bpe_piece(b, s + from, to - from, out);
        at = to > at ? to : at + 1;
    }
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
