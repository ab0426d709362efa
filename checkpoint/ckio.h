/*
 * ckio: the checkpoint format, independent of the model. A checkpoint is a
 * directory holding
 *
 *   data.bin  an 8-byte magic, then one chunk per slice written by its rank:
 *             float32 split into 4 byte planes (shuffle), zlib-deflated;
 *             written by all ranks together with MPI_File_write_at_all at
 *             offsets from an exclusive prefix sum of the compressed sizes
 *   index     text, written after the data: a magic line, key/value lines
 *             (config, training state, layout), one line per chunk (name,
 *             global shape, slice, offset, compressed and raw sizes, CRC32
 *             of the raw bytes) and a last line with the CRC32 of all others
 *
 * A slice is a rectangle of a 2-D tensor (a 1-D tensor is one column);
 * reading maps any slice onto whatever chunks overlap it, so a checkpoint
 * written under one split loads under another.
 */
#ifndef MODTRAIN_CKIO_H
#define MODTRAIN_CKIO_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"

#define CK_DATA_MAGIC "MODTCKP1"
#define CK_INDEX_MAGIC "modtrain-checkpoint 1"
#define CK_MAX_CHUNKS 4096 /* chunks of one tensor */

/* A rectangle of a global (rows x cols) tensor held in local memory. */
typedef struct {
    char name[112];
    int ndim;                /* 1 or 2, as the tensor is shown */
    int64_t rows, cols;      /* global shape */
    int64_t r0, nr, c0, nc;  /* the slice */
    float *data;             /* its first element in local memory */
    int64_t ld;              /* local row stride in floats */
} CkSlice;

typedef struct {
    char key[64];
    char value[256];
} CkKV;

typedef struct {
    char name[112];
    int ndim;
    int64_t rows, cols, r0, nr, c0, nc;
    uint64_t offset, csize, usize;
    uint32_t crc;
} CkChunk;

typedef struct {
    char dir[1024];
    CkKV *kv;
    int nkv;
    CkChunk *chunks;
    int nchunks;
    uint64_t data_bytes; /* data.bin size the index promises */
} CkIndex;

/* Test hook: MODTRAIN_FAULT=save-crash (or save-crash:STEP, matching the
 * "state.step" key) makes ck_write exit(137) after the data is written and
 * before the index is: a process killed in the middle of a save. */

/* Writes slices (each rank its own; replicated tensors from one rank only)
 * into dir (created by the caller) with level 0-9. Collective over comm.
 * Returns 0 on every rank, or -1 on every rank with err set (one line naming
 * the file and what failed). */
int ck_write(MPI_Comm comm, const char *dir, const CkSlice *slices, int n, const CkKV *kv, int nkv,
             int level, Err *err);

/* Reads and checks dir/index (magic, every line, its CRC, the data file's
 * magic and size). Returns 0 or -1 with err set. */
int ck_index_read(const char *dir, CkIndex *ix, Err *err);
/* The index checks alone, on its text in memory (len bytes, cut into lines
 * in place; dir names the checkpoint in messages): magic, every line, the
 * CRC, chunks tiling each tensor. Returns 0 or -1 with err set (ix freed). */
int ck_index_parse(CkIndex *ix, const char *dir, char *text, size_t len, Err *err);
void ck_index_free(CkIndex *ix);
const char *ck_kv(const CkIndex *ix, const char *key);

/* Fills each slice from the chunks that overlap it, checking every chunk's
 * sizes and CRC and that the slice is covered exactly. Local process I/O.
 * Returns 0 or -1 with err naming the file and the chunk. */
int ck_read_slices(const CkIndex *ix, const CkSlice *slices, int n, Err *err);

/* Reads every chunk and checks its CRC. Returns 0 or -1 with err set. */
int ck_verify(const CkIndex *ix, Err *err);

/* Byte shuffle of n floats into 4 planes, and back (exposed for tests and
 * the benchmark). */
void ck_shuffle(uint8_t *dst, const float *src, size_t n);
void ck_unshuffle(float *dst, const uint8_t *src, size_t n);

#endif
