/*
 * shards: a split's Writer, streaming its tokens into shards of a fixed
 * size: a header of zeros, the tokens, then the real header (count,
 * CRC-32) and fsync.
 */
#include "src/prep/prep_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "src/base/fault.h"
#include "src/base/util.h"

static int writer_flush(Writer *w, Err *err) {
    if (w->nbuf == 0) return 0;
    const size_t bytes = w->nbuf * (size_t)w->meta.width;
    shard_pack_tokens(w->buf, w->nbuf, w->meta.width, w->bytes);
    w->crc = (uint32_t)crc32_z(w->crc, w->bytes, bytes);
    if (fp_write_all("prep.shard.write", w->fd, w->bytes, bytes) != 0)
        return err_set(err, "prep: cannot write '%s': %s", w->path, strerror(errno));
    w->nbuf = 0;
    return 0;
}

/* Starts shard number w->shards: a header of zeros (not a shard until the
 * end writes the real one). */
static int writer_open(Writer *w, Err *err) {
    snprintf(w->path, sizeof w->path, "%s/%s_%06zu.bin", w->dir, w->split, w->shards);
    w->fd = fp_open("prep.shard.open", w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) return err_set(err, "prep: cannot create '%s': %s", w->path, strerror(errno));
    static const int32_t zero[SHARD_HEADER_INTS];
    w->n = 0, w->crc = (uint32_t)crc32_z(0, NULL, 0);
    if (fp_write_all("prep.shard.zeros", w->fd, zero, sizeof zero) != 0)
        return err_set(err, "prep: cannot write '%s': %s", w->path, strerror(errno));
    return 0;
}

/* Ends the open shard: its tokens written, the header (count, CRC-32) over
 * the zeros, fsync. */
static int writer_close(Writer *w, Err *err) {
    if (writer_flush(w, err) != 0) return -1;
    int32_t hdr[SHARD_HEADER_INTS];
    ShardMeta m = w->meta;
    m.has_crc = 1, m.crc = w->crc;
    shard_header_fill(hdr, w->n, &m);
    if (fp_pwrite_all("prep.shard.header", w->fd, hdr, sizeof hdr, 0) != 0 ||
        fp_fsync("prep.shard.fsync", w->fd) != 0)
        return err_set(err, "prep: cannot write '%s': %s", w->path, strerror(errno));
    const int rc = close(w->fd);
    w->fd = -1;
    if (rc != 0) return err_set(err, "prep: cannot close '%s': %s", w->path, strerror(errno));
    w->shards++;
    return 0;
}

/* Appends n tokens to the open shard (room for them known). */
static int writer_add(Writer *w, const uint32_t *t, size_t n, Err *err) {
    while (n > 0) {
        size_t k = WRITE_TOKENS - w->nbuf;
        if (k > n) k = n;
        memcpy(w->buf + w->nbuf, t, k * sizeof *t);
        w->nbuf += k, w->n += k, w->total += k, t += k, n -= k;
        if (w->nbuf == WRITE_TOKENS && writer_flush(w, err) != 0) return -1;
    }
    return 0;
}

/* Appends n tokens to the split: shards of per_shard tokens, a full one
 * closed only when two more tokens have come (so that no shard ends up
 * with one). Returns 0 or -1 with err set. */
int writer_put(Writer *w, const uint32_t *t, size_t n, Err *err) {
    while (n > 0) {
        if (w->fd >= 0 && w->n == w->per_shard) {
            if (!w->held) {
                w->hold = *t++, n--, w->held = 1;
                continue;
            }
            if (writer_close(w, err) != 0) return -1;
        }
        if (w->fd < 0) {
            if (writer_open(w, err) != 0) return -1;
            if (w->held && writer_add(w, &w->hold, 1, err) != 0) return -1;
            w->held = 0;
        }
        size_t k = w->per_shard - w->n;
        if (k > n) k = n;
        if (writer_add(w, t, k, err) != 0) return -1;
        t += k, n -= k;
    }
    return 0;
}

/* Ends the split: a held token joins the last shard (per_shard + 1 <=
 * INT32_MAX), which is closed. */
int writer_finish(Writer *w, Err *err) {
    if (w->held && writer_add(w, &w->hold, 1, err) != 0) return -1;
    w->held = 0;
    return w->fd >= 0 ? writer_close(w, err) : 0;
}
