/*
 * ckio_index: the text index of a checkpoint. Writing it (every rank's
 * chunk lines gathered on rank 0, the key/value lines, the CRC32 line, one
 * durable write) and reading it back: every line parsed whole and bounded,
 * the CRC checked, each tensor tiled exactly by its chunks, the data
 * file's magic and size.
 */
#include "checkpoint/ckio_impl.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "mpi/check.h"
#include "src/base/files.h"
#include "src/base/util.h"

static void text_append(char **s, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void text_append(char **s, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(*s ? *s + *len : NULL, *s ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (*s && (size_t)k < *cap - *len) {
            *len += (size_t)k;
            return;
        }
        size_t ncap = (*cap ? *cap * 2 : 4096) + (size_t)k;
        char *ns = xmalloc(ncap);
        if (*s) memcpy(ns, *s, *len);
        free(*s);
        *s = ns;
        *cap = ncap;
    }
}

/* Every rank's chunk lines, gathered in rank order on rank 0 (NULL
 * elsewhere): malloc'd text. */
char *gather_chunk_lines(MPI_Comm comm, const CkChunk *chunks, int n) {
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    char *text = NULL;
    size_t tlen = 0, tcap = 0;
    text_append(&text, &tlen, &tcap, "%s", "");
    for (int i = 0; i < n; i++) {
        const CkChunk *c = &chunks[i];
        text_append(&text, &tlen, &tcap,
                    "chunk %s %d %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64
                    " %" PRId64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %08" PRIx32
                    " %c%" PRIu64 ",%c%" PRIu64 ",%c%" PRIu64 ",%c%" PRIu64 "\n",
                    c->name, c->ndim, c->rows, c->cols, c->r0, c->nr, c->c0, c->nc, c->offset,
                    c->csize, c->usize, c->crc, c->codec[0], c->psize[0], c->codec[1],
                    c->psize[1], c->codec[2], c->psize[2], c->codec[3], c->psize[3]);
    }
    int mylen = (int)tlen;
    int *lens = rank == 0 ? xcalloc((size_t)size, sizeof(int)) : NULL;
    int *displs = rank == 0 ? xcalloc((size_t)size, sizeof(int)) : NULL;
    MPI_CHECK(MPI_Gather(&mylen, 1, MPI_INT, lens, 1, MPI_INT, 0, comm));
    char *all = NULL;
    if (rank == 0) {
        size_t sum = 0;
        for (int r = 0; r < size; r++) {
            displs[r] = (int)sum;
            sum += (size_t)lens[r];
        }
        all = xmalloc(sum + 1);
        all[sum] = '\0';
    }
    MPI_CHECK(MPI_Gatherv(text, mylen, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, comm));
    free(text);
    free(lens);
    free(displs);
    return all;
}

/* Step 4 (rank 0): the index, its key/value lines, the chunk lines and the
 * CRC of them all, written durably. Returns 0 or -1 with err set. */
int write_index(const char *dir, unsigned long long total, const CkKV *kv, int nkv,
                const char *chunk_lines, Err *err) {
    char *ix = NULL;
    size_t ilen = 0, icap = 0;
    text_append(&ix, &ilen, &icap, "%s\ndata data.bin %llu\n", CK_INDEX_MAGIC, total);
    for (int i = 0; i < nkv; i++)
        text_append(&ix, &ilen, &icap, "kv %s %s\n", kv[i].key, kv[i].value);
    text_append(&ix, &ilen, &icap, "%s", chunk_lines);
    uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)ix, (uInt)ilen);
    text_append(&ix, &ilen, &icap, "end %08" PRIx32 "\n", crc);
    char ipath[1200];
    snprintf(ipath, sizeof ipath, "%s/index", dir);
    Err werr;
    /* a directory fsync that fails fails the save: it is not committed */
    int rc = write_file_durable("index", ipath, ix, ilen, &werr) != 0 ? -1 : 0;
    if (rc != 0) err_set(err, "ckpt: %s", werr.msg);
    free(ix);
    return rc;
}

void ck_index_free(CkIndex *ix) {
    free(ix->kv);
    free(ix->chunks);
    memset(ix, 0, sizeof *ix);
}

const char *ck_kv(const CkIndex *ix, const char *key) {
    for (int i = 0; i < ix->nkv; i++)
        if (strcmp(ix->kv[i].key, key) == 0) return ix->kv[i].value;
    return NULL;
}

/* Splits line at single spaces into at most max fields. Returns the count,
 * or -1 for an empty field (a leading, trailing or doubled space) or too
 * many fields. */
static int split_fields(char *line, char **f, int max) {
    int n = 0;
    for (char *p = line;; p++) {
        char *sp = strchr(p, ' ');
        if (n == max || sp == p || *p == '\0') return -1;
        f[n++] = p;
        if (!sp) return n;
        *sp = '\0';
        p = sp;
    }
}

/* Exactly 8 hex digits. */
static int parse_crc(const char *s, uint32_t *out) {
    if (strlen(s) != 8 || strspn(s, "0123456789abcdefABCDEF") != 8) return -1;
    *out = (uint32_t)strtoul(s, NULL, 16);
    return 0;
}

/* The fields of a chunk line into c; *why says what is wrong. Every number
 * is parsed whole and bounded, and every sum and product is checked. */
static int parse_chunk(CkChunk *c, char **f, const char **why) {
    /* ndim rows cols r0 nr c0 nc offset csize usize */
    long long v[10];
    static const long long lo[10] = {1, 1, 1, 0, 1, 0, 1, 0, 0, 0};
    for (int i = 0; i < 10; i++) {
        long long hi = i < 7 ? INT32_MAX : INT64_MAX;
        if (parse_i64(f[i + 2], lo[i], hi, &v[i]) != 0) {
            *why = "a number is missing, malformed or out of range";
            return -1;
        }
    }
    if (strlen(f[1]) >= sizeof c->name) return (*why = "the tensor name is too long"), -1;
    snprintf(c->name, sizeof c->name, "%s", f[1]);
    c->ndim = (int)v[0], c->rows = v[1], c->cols = v[2], c->r0 = v[3], c->nr = v[4];
    c->c0 = v[5], c->nc = v[6];
    c->offset = (uint64_t)v[7], c->csize = (uint64_t)v[8], c->usize = (uint64_t)v[9];
    uint64_t bytes;
    if (c->ndim > 2 || (c->ndim == 1 && c->cols != 1)) *why = "ndim is not 1 or 2 (1: one column)";
    else if (c->r0 + c->nr > c->rows || c->c0 + c->nc > c->cols)
        *why = "the slice leaves its tensor";
    else if (__builtin_mul_overflow((uint64_t)c->nr * (uint64_t)c->nc, 4, &bytes) ||
             bytes != c->usize)
        *why = "the raw size is not 4 x rows x cols of the slice";
    else if (parse_crc(f[12], &c->crc) != 0) *why = "the CRC32 is not 8 hex digits";
    else return 0;
    return -1;
}

/* A version-2 chunk's planes field, "h123,r4096,r4096,h200": each plane's
 * codec and stored size; raw planes hold exactly a quarter of the raw
 * bytes, and the sizes add up to the stored size (checked sums). */
static int parse_planes(CkChunk *c, char *field, const char **why) {
    char *f[4];
    int n = 0;
    for (char *p = field;; p++) {
        char *comma = strchr(p, ',');
        if (n == 4 || comma == p || *p == '\0') return (*why = "the planes field is malformed"), -1;
        f[n++] = p;
        if (!comma) break;
        *comma = '\0';
        p = comma;
    }
    if (n != 4) return (*why = "the planes field does not have 4 planes"), -1;
    uint64_t sum = 0;
    for (int p = 0; p < 4; p++) {
        long long v;
        c->codec[p] = f[p][0];
        if ((c->codec[p] != 'h' && c->codec[p] != 'r') || parse_i64(f[p] + 1, 0, INT64_MAX, &v) != 0)
            return (*why = "a plane is not h or r followed by its size"), -1;
        c->psize[p] = (uint64_t)v;
        if (c->codec[p] == 'r' && c->psize[p] != c->usize / 4)
            return (*why = "a raw plane is not a quarter of the raw size"), -1;
        if (__builtin_add_overflow(sum, c->psize[p], &sum))
            return (*why = "the plane sizes overflow"), -1;
    }
    if (sum != c->csize) return (*why = "the plane sizes do not add up to the stored size"), -1;
    return 0;
}

/* One "data", "kv" or "chunk" line of an index into ix; caps are the
 * arrays' capacities. Returns 0, or -1 with *why saying what is wrong. */
static int parse_record(CkIndex *ix, char *line, int *kcap, int *ccap, const char **why) {
    char *f[14];
    *why = "not a data, kv or chunk line";
    if (strncmp(line, "kv ", 3) == 0) {
        char *key = line + 3, *sp = strchr(key, ' ');
        if (!sp || sp == key || (size_t)(sp - key) >= sizeof ix->kv[0].key ||
            strlen(sp + 1) >= sizeof ix->kv[0].value)
            return (*why = "a kv line needs a key and a value of bounded length"), -1;
        *sp = '\0';
        if (ck_kv(ix, key)) return (*why = "the key appears twice"), -1;
        if (ix->nkv == *kcap) {
            *kcap = *kcap ? 2 * *kcap : 32;
            ix->kv = xrealloc(ix->kv, (size_t)*kcap * sizeof(CkKV));
        }
        snprintf(ix->kv[ix->nkv].key, sizeof ix->kv[0].key, "%s", key);
        snprintf(ix->kv[ix->nkv].value, sizeof ix->kv[0].value, "%s", sp + 1);
        ix->nkv++;
        return 0;
    }
    int n = split_fields(line, f, 14);
    if (n == 3 && strcmp(f[0], "data") == 0 && strcmp(f[1], "data.bin") == 0) {
        long long b;
        if (parse_i64(f[2], 8, INT64_MAX, &b) != 0) return (*why = "a bad data size"), -1;
        ix->data_bytes = (uint64_t)b;
        return 0;
    }
    if (n != (ix->version == 1 ? 13 : 14) || strcmp(f[0], "chunk") != 0) return -1;
    if (ix->nchunks == *ccap) {
        *ccap = *ccap ? 2 * *ccap : 128;
        ix->chunks = xrealloc(ix->chunks, (size_t)*ccap * sizeof(CkChunk));
    }
    CkChunk *c = &ix->chunks[ix->nchunks];
    memset(c, 0, sizeof *c);
    if (parse_chunk(c, f, why) != 0 || (ix->version == 2 && parse_planes(c, f[13], why) != 0))
        return -1;
    ix->nchunks++;
    return 0;
}

static int chunk_order(const void *a, const void *b) {
    const CkChunk *x = *(const CkChunk *const *)a, *y = *(const CkChunk *const *)b;
    int k = strcmp(x->name, y->name);
    if (k) return k;
    if (x->r0 != y->r0) return x->r0 < y->r0 ? -1 : 1;
    return x->c0 < y->c0 ? -1 : x->c0 > y->c0;
}

/* The chunks of one tensor, sorted by position, tile it exactly: one shape,
 * no two overlapping, and together as many elements as the tensor has. */
static int check_tensor_tiling(const CkIndex *ix, CkChunk **c, int k, Err *err) {
    if (k > CK_MAX_CHUNKS)
        return err_set(err, "ckpt: '%s/index': tensor %s has %d chunks (at most %d)", ix->dir,
                       c[0]->name, k, CK_MAX_CHUNKS);
    uint64_t area = 0, total = (uint64_t)c[0]->rows * (uint64_t)c[0]->cols;
    for (int i = 0; i < k; i++) {
        if (c[i]->ndim != c[0]->ndim || c[i]->rows != c[0]->rows || c[i]->cols != c[0]->cols)
            return err_set(err, "ckpt: '%s/index': the chunks of %s disagree on its shape", ix->dir,
                           c[0]->name);
        for (int j = i + 1; j < k && c[j]->r0 < c[i]->r0 + c[i]->nr; j++)
            if (c[j]->c0 < c[i]->c0 + c[i]->nc && c[i]->c0 < c[j]->c0 + c[j]->nc)
                return err_set(err,
                               "ckpt: '%s/index': chunks of %s overlap at rows %" PRId64
                               " and %" PRId64 " (a region stored twice)",
                               ix->dir, c[0]->name, c[i]->r0, c[j]->r0);
        area += (uint64_t)c[i]->nr * (uint64_t)c[i]->nc; /* <= total: no overflow */
    }
    if (area != total)
        return err_set(err,
                       "ckpt: '%s/index': the chunks of %s hold %" PRIu64 " of its %" PRIu64
                       " elements (a region is missing)",
                       ix->dir, c[0]->name, area, total);
    return 0;
}

/* Every tensor of the index is tiled exactly by its chunks. */
static int check_tiling(const CkIndex *ix, Err *err) {
    CkChunk **order = xcalloc((size_t)ix->nchunks + 1, sizeof(CkChunk *));
    for (int i = 0; i < ix->nchunks; i++) order[i] = &ix->chunks[i];
    qsort(order, (size_t)ix->nchunks, sizeof(CkChunk *), chunk_order);
    int rc = 0;
    for (int i = 0, j; rc == 0 && i < ix->nchunks; i = j) {
        j = i + 1; /* [i, j): one tensor's chunks */
        while (j < ix->nchunks && strcmp(order[j]->name, order[i]->name) == 0) j++;
        rc = check_tensor_tiling(ix, order + i, j - i, err);
    }
    free(order);
    return rc;
}

/* The lines of an index after its magic: records, then an "end" line whose
 * CRC32 covers every line before it. Returns 0 or -1 with err set. */
static int parse_index(CkIndex *ix, const char *path, char *text, size_t len, Err *err) {
    int lineno = 0, have_end = 0, kcap = 0, ccap = 0;
    const char *why = "";
    char cur[96];
    uint32_t running = (uint32_t)crc32(0L, Z_NULL, 0);
    for (char *line = text, *next; line < text + len; line = next) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        if (!nl)
            return err_set(err, "ckpt: '%s' ends without a newline at line %d (truncated index)",
                           path, lineno + 1);
        /* the CRC of every line before "end", taken before the line is cut */
        uint32_t crc_before = running;
        running = (uint32_t)crc32(running, (const Bytef *)line, (uInt)(nl + 1 - line));
        *nl = '\0';
        next = nl + 1;
        lineno++;
        snprintf(cur, sizeof cur, "%s", line); /* parsing cuts the line up */
        if (have_end)
            return err_set(err, "ckpt: '%s' has text after its 'end' line (line %d)", path, lineno);
        if (lineno == 1) continue;
        if (strncmp(line, "end ", 4) == 0) {
            uint32_t want;
            if (parse_crc(line + 4, &want) != 0)
                return err_set(err,
                               "ckpt: '%s' line %d is malformed (an end line needs 8 hex "
                               "digits): '%.80s'",
                               path, lineno, cur);
            if (want != crc_before)
                return err_set(err,
                               "ckpt: '%s' is garbled (CRC32 %08" PRIx32 ", its end line says "
                               "%08" PRIx32 ")",
                               path, crc_before, want);
            have_end = 1;
        } else if (parse_record(ix, line, &kcap, &ccap, &why) != 0) {
            return err_set(err, "ckpt: '%s' line %d is malformed (%s): '%.80s'", path, lineno, why,
                           cur);
        }
    }
    if (!have_end) return err_set(err, "ckpt: '%s' has no 'end' line (truncated index)", path);
    return 0;
}

/* The data file an index describes: its magic, the size the index
 * promises, every chunk inside it. Returns 0 or -1 with err set. */
static int check_data_file(const CkIndex *ix, Err *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/data.bin", ix->dir);
    struct stat st;
    Err e;
    int fd = open_regular(path, O_RDONLY, &st, &e);
    if (fd < 0) return err_set(err, "ckpt: %s", e.msg);
    char magic[8] = {0};
    const ssize_t got = (uint64_t)st.st_size == ix->data_bytes ? pread(fd, magic, 8, 0) : 0;
    close(fd);
    if ((uint64_t)st.st_size != ix->data_bytes)
        return err_set(err, "ckpt: '%s' is %lld bytes, its index says %llu (truncated or extended)",
                       path, (long long)st.st_size, (unsigned long long)ix->data_bytes);
    const char *want = ix->version == 1 ? CK_DATA_MAGIC_V1 : CK_DATA_MAGIC;
    if (got != 8 || memcmp(magic, want, 8) != 0)
        return err_set(err, "ckpt: '%s' has the wrong magic (expected '%s')", path, want);
    for (int i = 0; i < ix->nchunks; i++) {
        const CkChunk *c = &ix->chunks[i];
        /* zlib deflates at most 1032:1, so usize is bounded by the file too */
        if (c->offset < 8 || c->csize > ix->data_bytes || c->offset > ix->data_bytes - c->csize ||
            c->usize / 1032 > c->csize + 1)
            return err_set(err,
                           "ckpt: '%s': chunk %s [%" PRId64 ":%" PRId64 ", %" PRId64 ":%" PRId64
                           "] lies outside the data file or claims more than it can inflate to",
                           ix->dir, c->name, c->r0, c->r0 + c->nr, c->c0, c->c0 + c->nc);
    }
    return 0;
}

int ck_index_parse(CkIndex *ix, const char *dir, char *text, size_t len, Err *err) {
    memset(ix, 0, sizeof *ix);
    snprintf(ix->dir, sizeof ix->dir, "%s", dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/index", dir);
    int rc;
    size_t ml = strlen(CK_INDEX_MAGIC); /* the same length for every version */
    if (len > ml && strncmp(text, CK_INDEX_MAGIC, ml) == 0 && text[ml] == '\n') ix->version = 2;
    else if (len > ml && strncmp(text, CK_INDEX_MAGIC_V1, ml) == 0 && text[ml] == '\n')
        ix->version = 1;
    if (!ix->version)
        rc = err_set(err,
                     "ckpt: '%s' does not start with '%s' or '%s' (not a modtrain checkpoint "
                     "index)",
                     path, CK_INDEX_MAGIC, CK_INDEX_MAGIC_V1);
    else rc = parse_index(ix, path, text, len, err);
    if (rc == 0) rc = check_tiling(ix, err);
    if (rc != 0) ck_index_free(ix);
    return rc;
}

int ck_index_read(const char *dir, CkIndex *ix, Err *err) {
    memset(ix, 0, sizeof *ix);
    char path[1200];
    snprintf(path, sizeof path, "%s/index", dir);
    size_t len = 0;
    Err e;
    char *text = read_file(path, SIZE_MAX, &len, &e);
    if (!text) return err_set(err, "ckpt: %s (an interrupted save or not a checkpoint)", e.msg);
    int rc = ck_index_parse(ix, dir, text, len, err);
    free(text);
    if (rc == 0 && check_data_file(ix, err) != 0) {
        ck_index_free(ix);
        rc = -1;
    }
    return rc;
}
