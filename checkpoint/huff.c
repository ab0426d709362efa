/*
 * huff: Huffman-only deflate into a zlib stream. See huff.h.
 */
#include "checkpoint/huff.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* ----------------------------------------------------------- code lengths */

typedef struct {
    uint32_t f;
    int sym;
} Leaf;

static int leaf_order(const void *a, const void *b) {
    const Leaf *x = a, *y = b;
    if (x->f != y->f) return x->f < y->f ? -1 : 1;
    return x->sym - y->sym;
}

/* Huffman code lengths of the m used leaves (sorted by count): the two-queue
 * construction, then each leaf's depth. */
static void huffman_depths(const Leaf *lv, int m, int *depth) {
    uint64_t w[2 * 288];
    int parent[2 * 288], next_leaf = 0, next_node = m, made = m;
    for (int i = 0; i < m; i++) w[i] = lv[i].f;
    for (int k = 0; k < m - 1; k++) {
        int pick[2];
        for (int j = 0; j < 2; j++) {
            /* the lighter of the next leaf and the next unmerged node */
            if (next_leaf < m && (next_node >= made || w[next_leaf] <= w[next_node]))
                pick[j] = next_leaf++;
            else pick[j] = next_node++;
        }
        w[made] = w[pick[0]] + w[pick[1]];
        parent[pick[0]] = parent[pick[1]] = made++;
    }
    int d[2 * 288];
    d[made - 1] = 0;
    for (int i = made - 2; i >= 0; i--) d[i] = d[parent[i]] + 1;
    for (int i = 0; i < m; i++) depth[i] = d[i];
}

void ck_huff_lengths(const uint32_t *freq, int n, int maxbits, uint8_t *len) {
    Leaf lv[288];
    int m = 0, depth[288];
    memset(len, 0, (size_t)n);
    for (int s = 0; s < n; s++)
        if (freq[s]) lv[m++] = (Leaf){freq[s], s};
    if (m == 0) return;
    if (m == 1) {
        len[lv[0].sym] = 1;
        return;
    }
    qsort(lv, (size_t)m, sizeof(Leaf), leaf_order);
    huffman_depths(lv, m, depth);
    /* over the limit: clamp, then lengthen the longest codes still under it
     * (the rarest symbols) until the Kraft sum fits, then shorten where it
     * leaves room */
    const uint64_t full = (uint64_t)1 << maxbits;
    uint64_t kraft = 0;
    for (int i = 0; i < m; i++) {
        if (depth[i] > maxbits) depth[i] = maxbits;
        kraft += full >> depth[i];
    }
    while (kraft > full)
        for (int i = 0; i < m && kraft > full; i++)
            if (depth[i] < maxbits) {
                kraft -= full >> (depth[i] + 1);
                depth[i]++;
            }
    for (int i = m - 1; i >= 0; i--)
        while (depth[i] > 1 && kraft + (full >> depth[i]) <= full) {
            kraft += full >> depth[i];
            depth[i]--;
        }
    for (int i = 0; i < m; i++) len[lv[i].sym] = (uint8_t)depth[i];
}

/* Canonical codes (RFC 1951 3.2.2) of lengths len[0..n), bit-reversed for
 * deflate's LSB-first packing. */
static void canonical_codes(const uint8_t *len, int n, uint16_t *code) {
    int count[16] = {0}, next[16];
    for (int s = 0; s < n; s++) count[len[s]]++;
    count[0] = 0;
    int c = 0;
    for (int b = 1; b < 16; b++) {
        c = (c + count[b - 1]) << 1;
        next[b] = c;
    }
    for (int s = 0; s < n; s++) {
        code[s] = 0;
        if (!len[s]) continue;
        unsigned v = (unsigned)next[len[s]]++, r = 0;
        for (int b = 0; b < len[s]; b++, v >>= 1) r = (r << 1) | (v & 1);
        code[s] = (uint16_t)r;
    }
}

/* ------------------------------------------------------------ bit writer */

typedef struct {
    uint8_t *out;
    size_t pos;
    uint64_t bits;
    int nbits;
} Bits;

static inline void put(Bits *w, uint32_t v, int n) {
    w->bits |= (uint64_t)v << w->nbits;
    w->nbits += n;
    if (w->nbits >= 32) {
        const uint32_t lo = (uint32_t)w->bits;
        w->out[w->pos] = (uint8_t)lo;
        w->out[w->pos + 1] = (uint8_t)(lo >> 8);
        w->out[w->pos + 2] = (uint8_t)(lo >> 16);
        w->out[w->pos + 3] = (uint8_t)(lo >> 24);
        w->pos += 4;
        w->bits >>= 32;
        w->nbits -= 32;
    }
}

static void flush_bytes(Bits *w) {
    while (w->nbits > 0) {
        w->out[w->pos++] = (uint8_t)w->bits;
        w->bits >>= 8;
        w->nbits -= 8;
    }
    w->nbits = 0;
    w->bits = 0;
}

/* ---------------------------------------------------------------- blocks */

#define NLIT 257         /* literals 0-255 and end-of-block */
#define NLENS (NLIT + 2) /* and two distance codes of length 1 */

static const uint8_t cl_order[19] = {16, 17, 18, 0, 8,  7, 9,  6, 10, 5,
                                     11, 4,  12, 3, 13, 2, 14, 1, 15};

/* The code lengths as the code-length alphabet's symbols: runs of zeros as
 * 17 (3-10) or 18 (11-138) with their extra bits. Returns the count. */
static int rle_lengths(const uint8_t *lens, uint8_t *sym, uint8_t *extra) {
    int k = 0;
    for (int i = 0; i < NLENS;) {
        int run = 1;
        while (lens[i] == 0 && i + run < NLENS && lens[i + run] == 0 && run < 138) run++;
        if (lens[i] == 0 && run >= 11) {
            sym[k] = 18, extra[k++] = (uint8_t)(run - 11);
        } else if (lens[i] == 0 && run >= 3) {
            sym[k] = 17, extra[k++] = (uint8_t)(run - 3);
        } else {
            sym[k] = lens[i], extra[k++] = 0;
            run = 1;
        }
        i += run;
    }
    return k;
}

/* A stored block (BTYPE 00) of in[0..n), n < 65536: where coding does not
 * gain (bytes close to uniform). Returns -1, writing nothing, when it
 * would pass `end`. */
static int put_stored(Bits *w, const uint8_t *in, size_t n, int last, size_t end) {
    if (w->pos + (w->nbits + 3 + 7) / 8 + 4 + n + 8 > end) return -1;
    put(w, (uint32_t)last, 3);
    flush_bytes(w); /* to a byte boundary */
    const uint8_t hdr[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)~n, (uint8_t)(~n >> 8)};
    memcpy(w->out + w->pos, hdr, 4);
    memcpy(w->out + w->pos + 4, in, n);
    w->pos += 4 + n;
    return 0;
}

/* One block of in[0..n): its code from the counts, the header, the bytes,
 * the end-of-block code. Returns -1, writing nothing, when the block would
 * pass `end` (bytes of out). */
static int put_block(Bits *w, const uint8_t *in, size_t n, int last, size_t end) {
    uint32_t f[NLIT] = {0};
    for (size_t i = 0; i < n; i++) f[in[i]]++;
    f[256] = 1;
    uint8_t lens[NLENS];
    ck_huff_lengths(f, NLIT, 15, lens);
    lens[NLIT] = lens[NLIT + 1] = 1;
    uint8_t sym[NLENS], extra[NLENS], cl_len[19];
    const int ns = rle_lengths(lens, sym, extra);
    uint32_t cf[19] = {0};
    for (int i = 0; i < ns; i++) cf[sym[i]]++;
    ck_huff_lengths(cf, 19, 7, cl_len);
    int ncl = 19;
    while (ncl > 4 && cl_len[cl_order[ncl - 1]] == 0) ncl--;
    /* its size in bits, before anything is written */
    uint64_t size = 3 + 5 + 5 + 4 + 3 * (uint64_t)ncl;
    for (int i = 0; i < ns; i++) size += cl_len[sym[i]] + (sym[i] == 17 ? 3 : sym[i] == 18 ? 7 : 0);
    for (int s = 0; s < NLIT; s++) size += (uint64_t)f[s] * lens[s];
    if (size >= 3 + 7 + 32 + 8 * (uint64_t)n) return put_stored(w, in, n, last, end);
    if (w->pos + (w->nbits + size + 7) / 8 + 8 > end) return -1;
    uint16_t code[NLIT], cl_code[19];
    canonical_codes(lens, NLIT, code);
    canonical_codes(cl_len, 19, cl_code);
    put(w, (uint32_t)last | 2u << 1, 3); /* BFINAL, BTYPE = dynamic Huffman */
    put(w, NLIT - 257, 5);
    put(w, 1, 5); /* two distance codes */
    put(w, (uint32_t)ncl - 4, 4);
    for (int i = 0; i < ncl; i++) put(w, cl_len[cl_order[i]], 3);
    for (int i = 0; i < ns; i++) {
        put(w, cl_code[sym[i]], cl_len[sym[i]]);
        if (sym[i] == 17) put(w, extra[i], 3);
        if (sym[i] == 18) put(w, extra[i], 7);
    }
    /* codes are at most 15 bits: two a put */
    size_t i = 0;
    for (; i + 1 < n; i += 2)
        put(w, code[in[i]] | (uint32_t)code[in[i + 1]] << lens[in[i]],
            lens[in[i]] + lens[in[i + 1]]);
    if (i < n) put(w, code[in[i]], lens[in[i]]);
    put(w, code[256], lens[256]);
    return 0;
}

size_t ck_huffman(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    if (cap < 16) return 0;
    Bits w = {out, 0, 0, 0};
    out[w.pos++] = 0x78; /* deflate, 32 KiB window */
    out[w.pos++] = 0x01; /* fastest; (0x78 * 256 + 0x01) % 31 == 0 */
    size_t at = 0;
    do {
        const size_t len = n - at < CK_HUFF_BLOCK ? n - at : CK_HUFF_BLOCK;
        if (put_block(&w, in + at, len, at + len == n, cap - 4) != 0) return 0;
        at += len;
    } while (at < n);
    flush_bytes(&w);
    const uint32_t a = (uint32_t)adler32(adler32(0L, Z_NULL, 0), in, (uInt)n);
    for (int k = 3; k >= 0; k--) out[w.pos++] = (uint8_t)(a >> (8 * k));
    return w.pos;
}
