/*
 * ckio_codec: a chunk's bytes. Its float32 rows split into 4 byte planes
 * (the shuffle), each plane a Huffman-coded zlib stream where a sample of
 * it gains and raw bytes where not, the CRC32 of the raw rows; and the
 * planes back from the stored bytes.
 */
#include "checkpoint/ckio_impl.h"
#include "checkpoint/huff.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

/* Byte b of every float to plane b. On a little-endian machine a float's
 * bytes are its word's bytes from the low end, and shifts of whole words
 * vectorise (2.8 against 7.9 GB/s for the byte loop, one core). */
void ck_shuffle(uint8_t *restrict dst, const float *restrict src, size_t n) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint8_t *restrict p0 = dst, *restrict p1 = dst + n, *restrict p2 = dst + 2 * n,
                      *restrict p3 = dst + 3 * n;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, src + i, 4);
        p0[i] = (uint8_t)w, p1[i] = (uint8_t)(w >> 8), p2[i] = (uint8_t)(w >> 16);
        p3[i] = (uint8_t)(w >> 24);
    }
#else
    const uint8_t *s = (const uint8_t *)src;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) dst[(size_t)b * n + i] = s[4 * i + b];
#endif
}

void ck_unshuffle(float *restrict dst, const uint8_t *restrict src, size_t n) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint8_t *restrict p0 = src, *restrict p1 = src + n, *restrict p2 = src + 2 * n,
                            *restrict p3 = src + 3 * n;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const uint32_t w =
            (uint32_t)p0[i] | (uint32_t)p1[i] << 8 | (uint32_t)p2[i] << 16 | (uint32_t)p3[i] << 24;
        memcpy(dst + i, &w, 4);
    }
#else
    uint8_t *d = (uint8_t *)dst;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) d[4 * i + b] = src[(size_t)b * n + i];
#endif
}

/* Stores one byte plane into out (compressBound(n) bytes): Huffman-coded
 * when a sample of it gains at least 2% and the whole does gain, raw
 * otherwise. Returns the stored size and sets *codec: 'h' (a zlib stream)
 * or 'r' (raw bytes). */
static size_t pack_plane(const uint8_t *plane, size_t n, int level, uint8_t *out, char *codec) {
    *codec = 'r';
    if (level > 0 && n >= 64) {
        const size_t probe = n < CK_PROBE_BYTES ? n : CK_PROBE_BYTES;
        const size_t sample = ck_huffman(plane, probe, out, compressBound((uLong)probe));
        if (sample > 0 && sample < probe - probe / 50) {
            const size_t got = ck_huffman(plane, n, out, compressBound((uLong)n));
            if (got > 0 && got < n) {
                *codec = 'h';
                return got;
            }
        }
    }
    memcpy(out, plane, n);
    return n;
}

/* Bytes pack_piece may store for a piece: each plane deflated or raw. */
size_t piece_bound(const Piece *pc) {
    return 4 * (size_t)compressBound((uLong)((size_t)pc->nr * (size_t)pc->s->nc));
}

/* Packs one piece into out (piece_bound bytes): its rows (first copied
 * contiguous into raw when they are a column slice's), their CRC32, the
 * 4 byte planes (shuffle, into planes) each deflated or raw. raw and
 * planes are the calling thread's scratch, 4 bytes an element. Fills the
 * chunk but its offset. */
void pack_piece(const Piece *pc, int level, CkChunk *c, uint8_t *out, float *raw, uint8_t *planes) {
    const CkSlice *s = pc->s;
    const size_t n = (size_t)pc->nr * (size_t)s->nc, bytes = n * sizeof(float);
    const float *rows = s->data + (pc->r0 - s->r0) * s->ld;
    if (s->ld != s->nc && pc->nr > 1) { /* a column slice: its rows made contiguous */
        for (int64_t r = 0; r < pc->nr; r++)
            memcpy(raw + (size_t)r * s->nc, rows + r * s->ld, (size_t)s->nc * sizeof(float));
        rows = raw;
    }
    ck_shuffle(planes, rows, n);
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", s->name);
    c->ndim = s->ndim;
    c->rows = s->rows, c->cols = s->cols, c->r0 = pc->r0, c->nr = pc->nr, c->c0 = s->c0;
    c->nc = s->nc;
    c->usize = bytes;
    c->crc = (uint32_t)crc32(0L, (const Bytef *)rows, (uInt)bytes);
    for (int p = 0; p < 4; p++) {
        c->psize[p] = pack_plane(planes + (size_t)p * n, n, level, out + c->csize, &c->codec[p]);
        c->csize += c->psize[p];
    }
}

/* The stored bytes of a chunk back to its byte planes (usize bytes):
 * version 1, one zlib stream of them all; version 2, each plane raw or its
 * own zlib stream, which must inflate to exactly a quarter and consume
 * exactly its stored size. Returns 0 or -1. */
int unpack_planes(const CkIndex *ix, const CkChunk *c, const uint8_t *comp, uint8_t *planes) {
    if (ix->version == 1) {
        uLongf ulen = (uLongf)c->usize;
        return uncompress(planes, &ulen, comp, (uLong)c->csize) == Z_OK && ulen == c->usize ? 0
                                                                                             : -1;
    }
    const size_t q = c->usize / 4;
    for (int p = 0; p < 4; p++) {
        if (c->codec[p] == 'r') {
            memcpy(planes + (size_t)p * q, comp, q);
        } else {
            uLongf ulen = (uLongf)q;
            uLong used = (uLong)c->psize[p];
            if (uncompress2(planes + (size_t)p * q, &ulen, comp, &used) != Z_OK || ulen != q ||
                used != c->psize[p])
                return -1;
        }
        comp += c->psize[p];
    }
    return 0;
}
