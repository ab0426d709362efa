/*
 * ckio_read: reading slices back. Each slice is mapped onto whatever
 * chunks overlap it (a checkpoint written under one split loads under
 * another), and every chunk read is checked (its sizes, its CRC32, every
 * value finite) on all threads; ck_verify reads and checks them all.
 */
#include "checkpoint/ckio_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "src/base/fault.h"
#include "src/base/files.h"
#include "src/base/util.h"

/* Index of the first NaN or Inf of x[0..n), or n. */
static size_t first_non_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return n;
}

/* Reads, unpacks, unshuffles and checks one chunk into out (usize bytes):
 * sizes, CRC32, and every value finite (a checkpoint holds weights and
 * moments; a NaN with a valid CRC is damage all the same). */
static int load_chunk(const CkIndex *ix, int fd, const CkChunk *c, float *out, Err *err) {
    uint8_t *comp = xmalloc(c->csize + 1), *planes = xmalloc(c->usize + 1);
    int rc = -1;
    size_t got = 0;
    while (got < c->csize) {
        ssize_t k = pread(fd, comp + got, c->csize - got, (off_t)(c->offset + got));
        if (k <= 0) break;
        got += (size_t)k;
    }
    char where[1400];
    snprintf(where, sizeof where, "ckpt: '%s/data.bin': chunk %s [%" PRId64 ":%" PRId64 ", %" PRId64
             ":%" PRId64 "]", ix->dir, c->name, c->r0, c->r0 + c->nr, c->c0, c->c0 + c->nc);
    if (got != c->csize) {
        err_set(err, "%s: short read (%zu of %" PRIu64 " bytes)", where, got, c->csize);
    } else if (unpack_planes(ix, c, comp, planes) != 0) {
        err_set(err, "%s: does not inflate (corrupt)", where);
    } else {
        ck_unshuffle(out, planes, c->usize / 4);
        uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)out, (uInt)c->usize);
        size_t bad = first_non_finite(out, c->usize / 4);
        if (crc != c->crc)
            err_set(err, "%s: CRC32 %08" PRIx32 ", the index says %08" PRIx32 " (corrupt)", where,
                    crc, c->crc);
        else if (bad < c->usize / 4)
            err_set(err, "%s: element %zu is %g (weights and moments must be finite)", where, bad,
                    (double)out[bad]);
        else rc = 0;
    }
    free(comp);
    free(planes);
    return rc;
}

static int open_data(const CkIndex *ix, Err *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/data.bin", ix->dir);
    Err e;
    int fd = open_regular(path, O_RDONLY, NULL, &e);
    if (fd < 0) err_set(err, "ckpt: %s", e.msg);
    return fd;
}

/* A chunk and the part of a slice it fills (NULL slice: only checked). */
typedef struct {
    const CkChunk *c;
    const CkSlice *s;
    int64_t r0, r1, c0, c1;
} Load;

/* Loads every job on all threads (chunks are independent and fill disjoint
 * regions); the first failure in job order is the one reported, whatever
 * the thread count. Returns 0 or -1 with err set. */
static int run_loads(const CkIndex *ix, int fd, const Load *jobs, int n, Err *err) {
    int first = n;
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < n; i++) {
        const Load *L = &jobs[i];
        const CkChunk *c = L->c;
        float *buf = xmalloc(c->usize + 4);
        Err e;
        int bad = fault_point("load.chunk") != 0; /* a read that fails, or stalls */
        if (bad) err_set(&e, "ckpt: '%s': reading chunk %s: %s", ix->dir, c->name, strerror(errno));
        if (bad || load_chunk(ix, fd, c, buf, &e) != 0) {
#pragma omp critical
            if (i < first) {
                first = i;
                *err = e;
            }
        } else if (L->s) {
            const CkSlice *s = L->s;
            for (int64_t r = L->r0; r < L->r1; r++)
                memcpy(s->data + (r - s->r0) * s->ld + (L->c0 - s->c0),
                       buf + (r - c->r0) * c->nc + (L->c0 - c->c0), (size_t)(L->c1 - L->c0) * 4);
        }
        free(buf);
        fault_progress(); /* the watchdog's: a long load is no hang */
    }
    return first < n ? -1 : 0;
}

/* The chunks that overlap slice s, appended to *jobs; checks the shape and
 * that they cover the slice. Returns 0 or -1 with err set. */
static int plan_slice(const CkIndex *ix, const CkSlice *s, Load **jobs, int *n, int *cap,
                      Err *err) {
    int64_t covered = 0, found = 0;
    for (int j = 0; j < ix->nchunks; j++) {
        const CkChunk *c = &ix->chunks[j];
        if (strcmp(c->name, s->name) != 0) continue;
        found = 1;
        if (c->rows != s->rows || c->cols != s->cols)
            return err_set(err,
                           "ckpt: '%s': tensor %s is [%" PRId64 ", %" PRId64 "], this run "
                           "expects [%" PRId64 ", %" PRId64 "]",
                           ix->dir, s->name, c->rows, c->cols, s->rows, s->cols);
        int64_t r0 = c->r0 > s->r0 ? c->r0 : s->r0;
        int64_t r1 = c->r0 + c->nr < s->r0 + s->nr ? c->r0 + c->nr : s->r0 + s->nr;
        int64_t c0 = c->c0 > s->c0 ? c->c0 : s->c0;
        int64_t c1 = c->c0 + c->nc < s->c0 + s->nc ? c->c0 + c->nc : s->c0 + s->nc;
        if (r0 >= r1 || c0 >= c1) continue;
        if (*n == *cap) *jobs = xrealloc(*jobs, (size_t)(*cap = 2 * *cap + 16) * sizeof(Load));
        (*jobs)[(*n)++] = (Load){c, s, r0, r1, c0, c1};
        covered += (r1 - r0) * (c1 - c0);
    }
    if (!found) return err_set(err, "ckpt: '%s' holds no tensor %s", ix->dir, s->name);
    if (covered != s->nr * s->nc)
        return err_set(err,
                       "ckpt: '%s': the chunks of %s cover %" PRId64 " of the %" PRId64
                       " elements this rank needs",
                       ix->dir, s->name, covered, s->nr * s->nc);
    return 0;
}

int ck_read_slices(const CkIndex *ix, const CkSlice *slices, int n, Err *err) {
    Load *jobs = NULL;
    int nj = 0, cap = 0, rc = 0;
    for (int i = 0; i < n && rc == 0; i++) rc = plan_slice(ix, &slices[i], &jobs, &nj, &cap, err);
    int fd = rc == 0 ? open_data(ix, err) : -1;
    if (fd >= 0) {
        rc = run_loads(ix, fd, jobs, nj, err);
        close(fd);
    } else {
        rc = -1;
    }
    free(jobs);
    return rc;
}

int ck_verify(const CkIndex *ix, Err *err) {
    int fd = open_data(ix, err);
    if (fd < 0) return -1;
    Load *jobs = xcalloc((size_t)ix->nchunks + 1, sizeof(Load));
    for (int j = 0; j < ix->nchunks; j++) jobs[j].c = &ix->chunks[j];
    int rc = run_loads(ix, fd, jobs, ix->nchunks, err);
    free(jobs);
    close(fd);
    return rc;
}
