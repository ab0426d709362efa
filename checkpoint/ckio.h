/*
 * ckio: the checkpoint format, independent of the model. A checkpoint is a
 * directory holding
 *
 *   data.bin  an 8-byte magic, then the chunks: each a row block of at most
 *             chunk_floats elements of a tensor slice, its float32 split into
 *             4 byte planes (shuffle), each plane a zlib stream (Huffman
 *             coding alone: the gain of floats is in their exponent bytes'
 *             statistics, not in repeated strings) where a sample of it
 *             gains, raw bytes where not; written by every rank in rounds of
 *             bounded size with MPI_File_write_at_all at offsets from an
 *             exclusive prefix sum of the stored sizes
 *   index     text, written after the data: a magic line, key/value lines
 *             (config, training state, layout), one line per chunk (name,
 *             global shape, slice, offset, stored and raw sizes, CRC32 of
 *             the raw bytes, each plane's codec and stored size) and a last
 *             line with the CRC32 of all others
 *
 * Version 1 (one zlib stream of all 4 planes per tensor slice, no planes
 * field) still reads. A slice is a rectangle of a 2-D tensor (a 1-D tensor
 * is one column); reading maps any slice onto whatever chunks overlap it,
 * so a checkpoint written under one split loads under another.
 */
#ifndef MODTRAIN_CKIO_H
#define MODTRAIN_CKIO_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"

#define CK_DATA_MAGIC "MODTCKP2"
#define CK_INDEX_MAGIC "modtrain-checkpoint 2"
#define CK_DATA_MAGIC_V1 "MODTCKP1"
#define CK_INDEX_MAGIC_V1 "modtrain-checkpoint 1"
#define CK_MAX_CHUNKS 4096          /* chunks of one tensor */
#define CK_ROUND_BYTES (16u << 20)  /* raw state a rank packs per collective write */
#define CK_PROBE_BYTES (64 << 10)   /* sample of a plane that decides its codec */
#define CK_GROUPS 6                 /* kinds of holder groups (CkSlice.group) */

/* A rectangle of a global (rows x cols) tensor held in local memory. */
typedef struct {
    char name[112];
    int ndim;                /* 1 or 2, as the tensor is shown */
    int64_t rows, cols;      /* global shape */
    int64_t r0, nr, c0, nc;  /* the slice */
    float *data;             /* its first element in local memory */
    int64_t ld;              /* local row stride in floats */
    /* the ranks holding the same data share its writing: `holders` of them
     * (0 or 1: this rank alone), this rank being number `holder`, in holder
     * group kind `group` (< CK_GROUPS) */
    int group, holders, holder;
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
    /* version 2: the 4 byte planes stored one after the other, each 'h' (a
     * zlib stream, Huffman-coded when modtrain wrote it) or 'r' (raw) */
    char codec[4];
    uint64_t psize[4];
} CkChunk;

typedef struct {
    char dir[1024];
    int version; /* 1 or 2 */
    CkKV *kv;
    int nkv;
    CkChunk *chunks;
    int nchunks;
    uint64_t data_bytes; /* data.bin size the index promises */
} CkIndex;

/* Test hooks, for a process killed in the middle of a save:
 * MODTRAIN_FAULT=save-crash (or save-crash:STEP, matching the "state.step"
 * key) makes ck_write exit(137) after the data is written and before the
 * index is; MODTRAIN_FAULT=save-kill:PHASE (or save-kill:PHASE:STEP) makes
 * the process kill itself with SIGKILL at ck_fault(PHASE, step): "staged"
 * (the state copied for an asynchronous save), "pack" (a round packed,
 * nothing written), "write" (a round written, the data not synced),
 * "rename" (the index written, the directory not renamed); and
 * MODTRAIN_FAULT=save-slow:MS makes ck_fault("slow", ...) sleep MS ms, a
 * save that takes long. */
void ck_fault(const char *phase, long step);

/* How ck_write packs: the zlib level of the planes that gain (0: every
 * plane raw), the elements of a chunk (a longer row is a chunk alone), the
 * threads that pack (0: OpenMP's count for the calling thread), and
 * whether it runs beside training (background: the calling thread only
 * writes, and `threads` others pack at low priority: SCHED_IDLE beside
 * an OpenMP team, nice 10 beside one training thread). */
typedef struct {
    int level;
    int64_t chunk_floats;
    int threads;
    int background;
} CkWriteOpts;

/* What a save did, over all ranks. */
typedef struct {
    double raw, stored;          /* bytes of state, and of data.bin */
    double share_min, share_max; /* raw bytes one rank packed and wrote */
    long long chunks, planes, planes_deflated;
} CkStats;

/* Writes slices into dir (created by the caller): each rank packs the row
 * blocks of its slices assigned to it among their holders (see CkSlice).
 * Collective over comm. Fills *st (when not NULL). Returns 0 on every
 * rank, or -1 on every rank with err set (one line naming the file and
 * what failed). */
int ck_write(MPI_Comm comm, const char *dir, const CkSlice *slices, int n, const CkKV *kv, int nkv,
             const CkWriteOpts *opt, CkStats *st, Err *err);

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
void ck_shuffle(uint8_t *restrict dst, const float *restrict src, size_t n);
void ck_unshuffle(float *restrict dst, const uint8_t *restrict src, size_t n);

#endif
