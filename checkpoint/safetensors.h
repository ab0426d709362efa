/*
 * safetensors: read and write the Hugging Face safetensors format (8-byte
 * little-endian header length, a JSON header of dtype/shape/data_offsets per
 * tensor plus "__metadata__" strings, then the raw bytes). F32 tensors are
 * written; F32, BF16 and F16 are read (as floats).
 */
#ifndef MODTRAIN_SAFETENSORS_H
#define MODTRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"

#define ST_MAX_DIMS 4
#define ST_MAX_HEADER (100 << 20) /* bytes of JSON, as Hugging Face's reader allows */
/* GPT-2 XL has 580 tensors; the caps keep a 100 MiB header of tiny entries
 * from taking 192 bytes (an StTensor) for each 50 of JSON. */
#define ST_MAX_TENSORS 65536
#define ST_MAX_META 1024

typedef struct {
    char name[128];
    char dtype[8];
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end; /* byte offsets into the data section */
    int kind;            /* ST_F32, ST_BF16 or ST_F16 */
} StTensor;

enum { ST_F32 = 0, ST_BF16 = 1, ST_F16 = 2 };

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
    const uint8_t *file; /* the whole file */
    size_t file_len;
    uint8_t *owned;      /* what st_free frees: the file st_read read */
    const uint8_t *data; /* start of the data section */
    size_t data_len;
} StFile;

/* Parses and checks a whole safetensors file held in buf (len bytes, kept by
 * the caller; name is for messages): the header length within the file and
 * at most ST_MAX_HEADER, the JSON header strictly (no key twice, nothing after
 * it but spaces, at most ST_MAX_TENSORS tensors and ST_MAX_META metadata
 * keys), every tensor F32, BF16 or F16 with a shape whose byte size (checked) equals its
 * data_offsets, and the tensors tiling the data section exactly. Returns 0,
 * or -1 with err naming the file and the problem. */
int st_parse(StFile *f, const uint8_t *buf, size_t len, const char *name, Err *err);
/* st_parse of the file at path, which f then owns. */
int st_read(StFile *f, const char *path, Err *err);
void st_free(StFile *f);
const StTensor *st_find(const StFile *f, const char *name);
const char *st_meta(const StFile *f, const char *key);
/* Element count of a tensor. */
size_t st_numel(const StTensor *t);
/* Element i of a tensor as a float (read byte-wise: the data may have any
 * alignment; BF16 and F16 widened exactly). */
float st_float(const StTensor *t, const StFile *f, size_t i);

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
