/*
 * bpe_tables: the tokenizer's hash tables, keyed against crafted input:
 * byte strings to values (StrMap: the tokens, the word cache) and pairs of
 * ids to merges (PairMap), and the vocabulary's own hash (FNV-1a).
 */
#include "src/tokenizer/bpe_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

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
HashKey table_key(void) {
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

/* FNV-1a, 64 bits, continued from h: the vocabulary's hash. */
uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

uint64_t fnv1a_u32(uint64_t h, uint32_t x) {
    const uint8_t le[4] = {(uint8_t)x, (uint8_t)(x >> 8), (uint8_t)(x >> 16), (uint8_t)(x >> 24)};
    return fnv1a(h, le, 4);
}

void strmap_init(StrMap *m, size_t want) {
    memset(m, 0, sizeof *m);
    size_t slots = 64;
    while (slots < 2 * want) slots *= 2;
    m->slot = xcalloc(slots, sizeof *m->slot);
    m->mask = slots - 1;
    m->key = table_key();
}

void strmap_free(StrMap *m) {
    free(m->slot);
    free(m->arena);
    free(m->off);
    free(m->len);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* The slot that holds key or the empty one where it would go, and the
 * slots looked at. */
static size_t strmap_slot(const StrMap *m, const uint8_t *k, size_t n, size_t *looked) {
    const size_t home = (size_t)sip13(m->key, k, n) & m->mask;
    for (size_t i = home;; i = (i + 1) & m->mask) {
        const uint32_t e = m->slot[i];
        if (e == 0 || (m->len[e - 1] == n && memcmp(m->arena + m->off[e - 1], k, n) == 0)) {
            *looked = ((i - home) & m->mask) + 1;
            return i;
        }
    }
}

/* The same, counted in m's probes. */
static size_t strmap_find(StrMap *m, const uint8_t *k, size_t n) {
    size_t looked;
    const size_t i = strmap_slot(m, k, n, &looked);
    m->probes.lookups++, m->probes.probes += looked;
    return i;
}

int64_t strmap_get(StrMap *m, const uint8_t *k, size_t n, int64_t missing) {
    const uint32_t e = m->slot[strmap_find(m, k, n)];
    return e ? m->val[e - 1] : missing;
}

int64_t strmap_peek(const StrMap *m, const uint8_t *k, size_t n, int64_t missing) {
    size_t looked;
    const uint32_t e = m->slot[strmap_slot(m, k, n, &looked)];
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
int strmap_put(StrMap *m, const uint8_t *k, size_t n, int64_t v) {
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

/* wyhash's mix: the 128-bit product's halves folded. */
static inline uint64_t mum(uint64_t a, uint64_t b) {
    const __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

/* A pair's slot: a keyed wyhash-style mix of the 64-bit pair (two 128-bit
 * multiplies under the table's key), cheaper than SipHash on the path
 * every candidate pair of a merge takes. */
size_t pair_home(const PairMap *p, uint64_t key) {
    const uint64_t h = mum(key ^ p->hkey.k0, p->hkey.k1 ^ 0xe7037ed1a0b428dbull);
    return (size_t)mum(h ^ p->hkey.k1, p->hkey.k0 ^ 0x8ebc6af09c88c6e3ull) & p->mask;
}

size_t pair_find(const PairMap *p, uint64_t key) {
    for (size_t i = pair_home(p, key);; i = (i + 1) & p->mask)
        if (p->key[i] == 0 || p->key[i] == key) return i;
}

void pair_init(PairMap *p, size_t entries) {
    size_t slots = 64;
    while (slots < 2 * entries) slots *= 2;
    p->key = xcalloc(slots, sizeof *p->key);
    p->rank = xcalloc(slots, sizeof *p->rank);
    p->to = xcalloc(slots, sizeof *p->to);
    p->mask = slots - 1;
    p->hkey = table_key();
}

size_t pair_find_counted(PairMap *p, uint64_t key) {
    const size_t slot = pair_find(p, key);
    p->probes.lookups++, p->probes.probes += ((slot - pair_home(p, key)) & p->mask) + 1;
    return slot;
}

void bpe_vocab_free(Vocab *v) {
    strmap_free(&v->tokens);
    free(v->tok_off);
    free(v->tok_len);
    free(v->merges.key);
    free(v->merges.rank);
    free(v->merges.to);
    if (v->re) pcre2_code_free(v->re);
    free(v->own_pattern);
    free(v);
}
