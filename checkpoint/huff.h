/*
 * huff: a zlib stream (RFC 1950) of deflate blocks (RFC 1951) that use
 * Huffman coding alone: every byte a literal, one dynamic code per block
 * built from the block's byte counts (a stored block where that would not
 * gain). It is what zlib's Z_HUFFMAN_ONLY
 * strategy writes, and any inflate reads it, at several times the speed of
 * zlib's encoder: no match search and no per-symbol bookkeeping, one table
 * lookup and one bit-buffer append a byte.
 */
#ifndef MODTRAIN_HUFF_H
#define MODTRAIN_HUFF_H

#include <stddef.h>
#include <stdint.h>

#define CK_HUFF_BLOCK 65535 /* input bytes a block: at most a stored block's */

/* Codes n bytes of in into out (cap bytes). Returns the stream's size, or
 * 0 when it would not fit in cap. */
size_t ck_huffman(const uint8_t *in, size_t n, uint8_t *out, size_t cap);

/* Code lengths (at most maxbits, 0 for an unused symbol) of an optimal
 * prefix code within that limit for the counts freq[0..n) (n <= 288); a
 * single used symbol gets length 1. Exposed for the tests. */
void ck_huff_lengths(const uint32_t *freq, int n, int maxbits, uint8_t *len);

#endif
