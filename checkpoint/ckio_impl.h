/*
 * ckio_impl: what the checkpoint format's own files share and nothing else
 * includes.
 *
 *   ckio_codec.c  a chunk's bytes: the byte shuffle, each plane
 *                 Huffman-coded or raw, the CRC32, and the planes back
 *   ckio_index.c  the text index: written on rank 0 after the data, read
 *                 back and checked
 *   ckio_read.c   slices read back from the chunks that overlap them,
 *                 every chunk checked (ck_read_slices, ck_verify)
 *   ckio_write.c  the collective write (ck_write) and the save's test
 *                 hooks (ck_fault)
 *
 * A file calls only into the files listed before it: ckio_write.c into the
 * codec and the index, ckio_read.c into the codec.
 */
#ifndef MODTRAIN_CKIO_IMPL_H
#define MODTRAIN_CKIO_IMPL_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/ckio.h"
#include "src/base/util.h"

/* One chunk to write: rows [r0, r0 + nr) of a slice. */
typedef struct {
    const CkSlice *s;
    int64_t r0, nr;
} Piece;

/* ckio_codec.c */
/* Bytes pack_piece may store for a piece: each plane deflated or raw. */
size_t piece_bound(const Piece *pc);
/* Packs one piece into out (piece_bound bytes) and fills its chunk but
 * the offset; raw and planes are the calling thread's scratch, 4 bytes an
 * element. */
void pack_piece(const Piece *pc, int level, CkChunk *c, uint8_t *out, float *raw, uint8_t *planes);
/* The stored bytes of a chunk back to its byte planes (usize bytes).
 * Returns 0 or -1. */
int unpack_planes(const CkIndex *ix, const CkChunk *c, const uint8_t *comp, uint8_t *planes);

/* ckio_index.c */
/* Every rank's chunk lines, gathered in rank order on rank 0 (NULL
 * elsewhere): malloc'd text. Collective over comm. */
char *gather_chunk_lines(MPI_Comm comm, const CkChunk *chunks, int n);
/* Rank 0: the index of dir, written durably after the data (total bytes).
 * Returns 0 or -1 with err set. */
int write_index(const char *dir, unsigned long long total, const CkKV *kv, int nkv,
                const char *chunk_lines, Err *err);

#endif
