/*
 * readers: an input's text in chunks: plain bytes, gzip through inflate,
 * zstd through ZSTD_decompressStream (a window bounded by --mem).
 */
#include "src/prep/prep_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "src/base/files.h"
#include "src/base/util.h"

/* Whether path ends in suffix. */
int ends_with(const char *path, const char *suffix) {
    const size_t n = strlen(path), k = strlen(suffix);
    return n >= k && strcmp(path + n - k, suffix) == 0;
}

/* What kind an input is, by its name. */
int input_kind(const char *path) {
    return ends_with(path, ".gz") ? IN_GZIP : ends_with(path, ".zst") ? IN_ZSTD : IN_PLAIN;
}

/* Opens an input ("-": standard input) for reading; window_log caps what a
 * zstd frame may ask for. Returns 0 or -1 with err set. */
int reader_open(Reader *r, const char *path, int window_log, Err *err) {
    memset(r, 0, sizeof *r);
    const int is_stdin = strcmp(path, "-") == 0;
    r->name = is_stdin ? "standard input" : path;
    r->kind = is_stdin ? IN_PLAIN : input_kind(path);
    r->window_log = window_log;
    if (is_stdin) r->fd = STDIN_FILENO;
    else {
        Err e;
        if ((r->fd = open_regular(path, O_RDONLY, NULL, &e)) < 0)
            return err_set(err, "prep: %s (expected text to tokenise)", e.msg);
    }
    if (r->kind != IN_PLAIN) r->in = xmalloc(IO_CHUNK);
    if (r->kind == IN_GZIP) {
        if (inflateInit2(&r->z, 16 + MAX_WBITS) != Z_OK) {
            if (!is_stdin) close(r->fd);
            free(r->in);
            return err_set(err, "prep: cannot start zlib for '%s': out of memory", path);
        }
        r->z_init = 1;
    } else if (r->kind == IN_ZSTD) {
        r->zs = ZSTD_createDStream();
        if (!r->zs ||
            ZSTD_isError(ZSTD_DCtx_setParameter(r->zs, ZSTD_d_windowLogMax, window_log))) {
            ZSTD_freeDStream(r->zs);
            if (!is_stdin) close(r->fd);
            free(r->in);
            return err_set(err, "prep: cannot start zstd for '%s': out of memory", path);
        }
    }
    return 0;
}

void reader_close(Reader *r) {
    if (r->fd > STDIN_FILENO) close(r->fd);
    if (r->z_init) inflateEnd(&r->z);
    ZSTD_freeDStream(r->zs);
    free(r->in);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

/* read(2) of up to n bytes, again after a signal. Returns the count (0 at
 * the end) or -1 with err set. */
static ssize_t read_some(Reader *r, void *buf, size_t n, Err *err) {
    for (;;) {
        const ssize_t got = read(r->fd, buf, n);
        if (got >= 0) {
            r->consumed += (uint64_t)got;
            return got;
        }
        if (errno != EINTR)
            return err_set(err, "prep: cannot read '%s': %s", r->name, strerror(errno));
    }
}

/* Refills r->in when it is used up. Returns 0 (eof set at the end) or -1. */
static int reader_fill(Reader *r, Err *err) {
    if (r->in_pos < r->in_len || r->eof) return 0;
    const ssize_t got = read_some(r, r->in, IO_CHUNK, err);
    if (got < 0) return -1;
    r->in_len = (size_t)got, r->in_pos = 0;
    if (got == 0) r->eof = 1;
    return 0;
}

/* gzip: members one after another, as gzip -d reads them. */
static int read_gzip(Reader *r, char *buf, size_t cap, size_t *got, Err *err) {
    for (;;) {
        if (reader_fill(r, err) != 0) return -1;
        const int more_in = r->in_pos < r->in_len;
        if (r->z_done || !r->z_fed) {
            if (!more_in) return (int)(*got = 0); /* the end, after a whole member (or none) */
            if (r->z_done && inflateReset(&r->z) != Z_OK)
                return err_set(err, "prep: cannot restart zlib on '%s'", r->name);
            r->z_done = 0;
        }
        r->z.next_in = r->in + r->in_pos;
        r->z.avail_in = (uInt)(r->in_len - r->in_pos);
        r->z.next_out = (unsigned char *)buf;
        r->z.avail_out = (uInt)cap;
        const int ret = inflate(&r->z, Z_NO_FLUSH);
        r->in_pos = r->in_len - r->z.avail_in;
        r->z_fed |= more_in;
        const size_t produced = cap - r->z.avail_out;
        if (ret == Z_STREAM_END) r->z_done = 1;
        else if (ret == Z_BUF_ERROR && !more_in && produced == 0)
            return err_set(err,
                           "prep: '%s' ends in the middle of its gzip data (truncated? expected "
                           "a whole .gz file)",
                           r->name);
        else if (ret != Z_OK && ret != Z_BUF_ERROR)
            return err_set(err,
                           "prep: '%s' is not valid gzip data (%s near compressed byte %llu; "
                           "expected a .gz file as gzip writes it)",
                           r->name, r->z.msg ? r->z.msg : "corrupt",
                           (unsigned long long)(r->consumed - (r->in_len - r->in_pos)));
        if (produced > 0) return (int)(*got = produced, 0);
    }
}

/* zstd: frames one after another. */
static int read_zstd(Reader *r, char *buf, size_t cap, size_t *got, Err *err) {
    for (;;) {
        if (reader_fill(r, err) != 0) return -1;
        const int more_in = r->in_pos < r->in_len;
        if (!more_in && r->zs_ret == 0) return (int)(*got = 0);
        ZSTD_inBuffer in = {r->in + r->in_pos, r->in_len - r->in_pos, 0};
        ZSTD_outBuffer out = {buf, cap, 0};
        const size_t ret = ZSTD_decompressStream(r->zs, &out, &in);
        r->in_pos += in.pos;
        if (ZSTD_isError(ret)) {
            if (ZSTD_getErrorCode(ret) == ZSTD_error_frameParameter_windowTooLarge)
                return err_set(err,
                               "prep: '%s' asks for a zstd window above 2^%d bytes, more than "
                               "--mem allows (give a larger --mem, or recompress without --long)",
                               r->name, r->window_log);
            return err_set(err,
                           "prep: '%s' is not valid zstd data (%s; expected a .zst file as zstd "
                           "writes it)",
                           r->name, ZSTD_getErrorName(ret));
        }
        r->zs_ret = ret;
        if (out.pos > 0) return (int)(*got = out.pos, 0);
        if (!more_in)
            return err_set(err,
                           "prep: '%s' ends in the middle of a zstd frame (truncated? expected a "
                           "whole .zst file)",
                           r->name);
    }
}

/* Up to cap bytes of the input's text into buf: *got of them, 0 at its end.
 * Returns 0 or -1 with err naming the input. */
int reader_read(Reader *r, char *buf, size_t cap, size_t *got, Err *err) {
    if (r->kind == IN_GZIP) return read_gzip(r, buf, cap, got, err);
    if (r->kind == IN_ZSTD) return read_zstd(r, buf, cap, got, err);
    const ssize_t n = read_some(r, buf, cap, err);
    if (n < 0) return -1;
    *got = (size_t)n;
    return 0;
}

/* The largest window (log2 bytes) a zstd frame may ask for under mem. */
int zstd_window_log(size_t mem) {
    int wl = 10;
    while (wl < 27 && ((size_t)1 << (wl + 1)) <= mem / 4) wl++;
    return wl;
}
