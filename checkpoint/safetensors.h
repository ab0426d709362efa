/*
 * safetensors: read and write the Hugging Face safetensors format (8-byte
 * little-endian header length, a JSON header of dtype/shape/data_offsets per
 * tensor plus "__metadata__" strings, then the raw bytes). Only F32 tensors.
 */
#ifndef MODTRAIN_SAFETENSORS_H
#define MODTRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"

typedef struct {
    char name[128];
    char dtype[8];
    int ndim;
    int64_t shape[4];
    uint64_t begin, end; /* byte offsets into the data section */
} StTensor;

typedef struct {
    char key[64];
    char value[256];
} StMeta;

typedef struct {
    char path[512];
    StTensor *t;
    int nt;
    StMeta *meta;
    int nmeta;
    uint8_t *file; /* the whole file */
    size_t file_len;
    const uint8_t *data; /* start of the data section */
    size_t data_len;
} StFile;

/* Reads and checks path (header syntax, offsets inside the file, F32 sizes).
 * Returns 0, or -1 with err naming the file and the problem. */
int st_read(StFile *f, const char *path, Err *err);
void st_free(StFile *f);
const StTensor *st_find(const StFile *f, const char *name);
const char *st_meta(const StFile *f, const char *key);
/* Element count of a tensor. */
size_t st_numel(const StTensor *t);

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[2];
    const float *data; /* row-major, numel floats */
} StOut;

/* Writes the tensors and metadata atomically (temp file, fsync, rename).
 * Returns 0 or -1 with err set. */
int st_write(const char *path, const StOut *t, int n, const StMeta *meta, int nmeta, Err *err);

#endif
