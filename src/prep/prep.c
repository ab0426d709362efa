/*
 * prep: text to token shards (`modtrain prep`), streaming.
 *
 * Each input is read through a Reader (plain bytes, gzip through inflate,
 * zstd through ZSTD_decompressStream) in 1 MiB chunks; the chunks are cut
 * into documents (a whole file, the pieces between --doc_sep lines, or a
 * JSON Lines line) gathered into a block. A full block is sealed and handed
 * to the worker thread, which parses its JSON lines and encodes its
 * documents (on the OpenMP threads, gpt2 each with its Bpe clone) and
 * appends their tokens in document order to the Writer of train or val,
 * while the next block is read; one block at a time, so the order is the
 * input's. A Writer streams shards: a zero header, the tokens, then the
 * real header (count, CRC-32) and fsync. All of it lands in
 * OUT.prep-tmp.HOST.PID beside OUT, which is renamed to OUT at the end.
 */
#include "src/prep/prep.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "src/base/fault.h"
#include "src/base/files.h"
#include "src/base/util.h"

#define IO_CHUNK ((size_t)1 << 20)
#define WRITE_TOKENS ((size_t)1 << 19)
#define PATH_CAP 4096

size_t prep_doc_cap(size_t mem) { return mem / 16; }

/* jansson's tree is not bounded by its text: an empty array's 3 bytes ("[],")
 * cost 138 bytes of malloc chunks, an empty object's 234 (jansson 2.14,
 * glibc), so a line under the cap of nested empty arrays took 45 times
 * its size. Hence an estimate first, from the tokens outside strings, each
 * at its measured cost with a margin (the parent's slot included; a key's
 * member beside its string), plus 3 bytes a byte: the lexer's buffer (up to
 * twice the longest token) and the strings' copies. test_data checks it
 * against jansson's allocations. The other way, a scanner that decodes
 * only the key's string without a tree, would bound the memory by
 * construction but would have to redo jansson's strictness (duplicate keys
 * at every depth, escapes, UTF-8) and its messages; the estimate keeps
 * jansson as the one judge of what is JSON, at one more pass a line. */
enum {
    EST_BYTE = 3,
    EST_ARRAY = 144,
    EST_OBJECT = 256,
    EST_STRING = 96,
    EST_MEMBER = 16,
    EST_SCALAR = 48
};

size_t prep_jsonl_estimate(const char *s, size_t n) {
    size_t arrays = 0, objects = 0, strings = 0, members = 0, scalars = 0;
    int in_scalar = 0;
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case '"': { /* to the closing quote: the next one after an even run of backslashes
                     * (the runs before different quotes are disjoint: still one pass) */
            strings++;
            size_t b = 0;
            do {
                const char *q = memchr(s + i + 1, '"', n - i - 1);
                if (!q) {
                    i = n; /* unterminated: jansson stops there */
                    break;
                }
                i = (size_t)(q - s);
                b = 0;
                while (s[i - 1 - b] == '\\') b++; /* stops at the opening quote */
            } while (b % 2);
            break;
        }
        case '[': arrays++; break;
        case '{': objects++; break;
        case ':': members++; break;
        case ']':
        case '}':
        case ',':
        case ' ':
        case '\t':
        case '\r':
        case '\n': break;
        default: /* a number, true, false, null or garbage: one token a run */
            scalars += !in_scalar;
            in_scalar = 1;
            continue;
        }
        in_scalar = 0;
    }
    size_t est = sat_mul(EST_BYTE, n);
    est = sat_add(est, sat_mul(EST_ARRAY, arrays));
    est = sat_add(est, sat_mul(EST_OBJECT, objects));
    est = sat_add(est, sat_mul(EST_STRING, strings));
    est = sat_add(est, sat_mul(EST_MEMBER, members));
    return sat_add(est, sat_mul(EST_SCALAR, scalars));
}

int prep_parse_size(const char *s, size_t *out) {
    char num[32];
    const size_t n = strlen(s);
    if (n == 0 || n >= sizeof num) return -1;
    size_t unit = 1, digits = n;
    switch (s[n - 1]) {
    case 'K':
    case 'k': unit = (size_t)1 << 10; break;
    case 'M':
    case 'm': unit = (size_t)1 << 20; break;
    case 'G':
    case 'g': unit = (size_t)1 << 30; break;
    case 'T':
    case 't': unit = (size_t)1 << 40; break;
    default: break;
    }
    if (unit > 1) digits--;
    memcpy(num, s, digits);
    num[digits] = '\0';
    for (size_t i = 0; i < digits; i++)
        if (num[i] < '0' || num[i] > '9') return -1; /* no sign, no space */
    long long v;
    size_t r;
    if (parse_i64(num, 0, LLONG_MAX, &v) != 0 || size_mul((size_t)v, unit, &r) != 0) return -1;
    *out = r;
    return 0;
}

int prep_doc_is_val(uint64_t d, double f) {
    return floor((double)(d + 1) * f) > floor((double)d * f);
}

/* ---- reading: plain, gzip, zstd ---- */

enum { IN_PLAIN, IN_GZIP, IN_ZSTD };

typedef struct {
    const char *name; /* for messages: the path, or "standard input" */
    int fd, kind, eof;
    unsigned char *in; /* compressed bytes read, not yet decoded */
    size_t in_len, in_pos;
    z_stream z;
    int z_init, z_done, z_fed;
    ZSTD_DStream *zs;
    size_t zs_ret; /* the last ZSTD_decompressStream return: 0 at a frame's end */
    int window_log;
    uint64_t consumed; /* bytes of the file read */
} Reader;

/* Whether path ends in suffix. */
static int ends_with(const char *path, const char *suffix) {
    const size_t n = strlen(path), k = strlen(suffix);
    return n >= k && strcmp(path + n - k, suffix) == 0;
}

/* What kind an input is, by its name. */
static int input_kind(const char *path) {
    return ends_with(path, ".gz") ? IN_GZIP : ends_with(path, ".zst") ? IN_ZSTD : IN_PLAIN;
}

/* Opens an input ("-": standard input) for reading; window_log caps what a
 * zstd frame may ask for. Returns 0 or -1 with err set. */
static int reader_open(Reader *r, const char *path, int window_log, Err *err) {
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

static void reader_close(Reader *r) {
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
static int reader_read(Reader *r, char *buf, size_t cap, size_t *got, Err *err) {
    if (r->kind == IN_GZIP) return read_gzip(r, buf, cap, got, err);
    if (r->kind == IN_ZSTD) return read_zstd(r, buf, cap, got, err);
    const ssize_t n = read_some(r, buf, cap, err);
    if (n < 0) return -1;
    *got = (size_t)n;
    return 0;
}

/* ---- writing: shards streamed into a folder ---- */

typedef struct {
    const char *dir, *split; /* the temporary folder; "train" or "val" */
    ShardMeta meta;
    size_t per_shard;
    int fd; /* the open shard, -1 none */
    char path[PATH_CAP];
    size_t n; /* tokens in the open shard */
    uint32_t crc;
    uint16_t hold; /* a token past a full shard, kept until a second one comes */
    int held;
    uint16_t *buf; /* (WRITE_TOKENS) tokens not yet written */
    size_t nbuf;
    size_t shards; /* closed shards */
    uint64_t total;
} Writer;

static int writer_flush(Writer *w, Err *err) {
    if (w->nbuf == 0) return 0;
    const size_t bytes = w->nbuf * sizeof(uint16_t);
    w->crc = (uint32_t)crc32_z(w->crc, (const unsigned char *)w->buf, bytes);
    if (fp_write_all("prep.shard.write", w->fd, w->buf, bytes) != 0)
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
static int writer_add(Writer *w, const uint16_t *t, size_t n, Err *err) {
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
static int writer_put(Writer *w, const uint16_t *t, size_t n, Err *err) {
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
static int writer_finish(Writer *w, Err *err) {
    if (w->held && writer_add(w, &w->hold, 1, err) != 0) return -1;
    w->held = 0;
    return w->fd >= 0 ? writer_close(w, err) : 0;
}

/* ---- the output folder ---- */

/* Whether name is one a shard set holds: train*.bin or val*.bin. */
static int is_shard_name(const char *name) {
    return (strncmp(name, "train", 5) == 0 || strncmp(name, "val", 3) == 0) &&
           ends_with(name, ".bin");
}

/* Looks into dir: -1 with err when it is not a folder or holds anything but
 * shard files (regular train*.bin, val*.bin; named in err), else 0 (absent
 * or empty) or 1 (a shard set; one of its names in first). */
static int scan_set(const char *dir, const char *what, char *first, size_t nfirst, Err *err) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        if (errno == ENOTDIR)
            return err_set(
                err, "prep: %s '%s' exists and is not a folder (give a folder for the shards)",
                what, dir);
        return err_set(err, "prep: cannot read %s '%s': %s", what, dir, strerror(errno));
    }
    int found = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[PATH_CAP];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!is_shard_name(e->d_name) || lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
            rc = err_set(err,
                         "prep: %s '%s' holds '%s', which is not a token shard; prep replaces "
                         "only a folder of shards (train*.bin, val*.bin), even with --force: "
                         "give another --out or move it",
                         what, dir, e->d_name);
            break;
        }
        if (!found) snprintf(first, nfirst, "%s", e->d_name);
        found = 1;
    }
    closedir(d);
    return rc != 0 ? rc : found;
}

/* Removes a folder prep wrote: its shard files, then the folder. Something
 * else in it stays (and the folder with it). A folder that is a symbolic
 * link is never entered: the link itself goes. Returns 0 or -1 with errno. */
static int remove_set(const char *dir) {
    DIR *d = opendir_nofollow(dir);
    if (!d && errno == ENOTDIR) return fp_unlink("prep.remove.unlink", dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_shard_name(e->d_name)) continue;
        char p[PATH_CAP];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        fp_unlink("prep.remove.unlink", p);
    }
    closedir(d);
    return fp_rmdir("prep.remove.rmdir", dir);
}

/* The paths of a prep into out: the parent folder, out's last name, and
 * the temporary folder beside it. */
typedef struct {
    char out[PATH_CAP], parent[PATH_CAP], base[256], tmp[PATH_CAP + 300], old[PATH_CAP + 300];
    char host[65]; /* this machine's name, in the temporary folders' names */
} Paths;

static int paths_make(Paths *p, const char *out, Err *err) {
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--; /* data/x/ is data/x */
    if (n == 0 || n >= sizeof p->out)
        return err_set(err, "prep: --out '%s' is not a usable folder name", out);
    memcpy(p->out, out, n);
    p->out[n] = '\0';
    const char *slash = strrchr(p->out, '/');
    const char *base = slash ? slash + 1 : p->out;
    if (strcmp(base, ".") == 0 || strcmp(base, "..") == 0 || *base == '\0' ||
        strlen(base) >= sizeof p->base - 32)
        return err_set(err,
                       "prep: --out '%s' names no folder of its own (give a path such as "
                       "data/corpus: the set is renamed into place)",
                       out);
    snprintf(p->base, sizeof p->base, "%s", base);
    if (!slash) snprintf(p->parent, sizeof p->parent, ".");
    else if (slash == p->out) snprintf(p->parent, sizeof p->parent, "/");
    else snprintf(p->parent, sizeof p->parent, "%.*s", (int)(slash - p->out), p->out);
    /* the host: a folder shared between machines holds their preps' folders
     * apart, and only this machine's processes can be known to be gone */
    if (gethostname(p->host, sizeof p->host) != 0) snprintf(p->host, sizeof p->host, "host");
    p->host[sizeof p->host - 1] = '\0';
    for (char *c = p->host; *c; c++)
        if (!(*c == '-' || *c == '_' || (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') ||
              (*c >= 'A' && *c <= 'Z')))
            *c = '_';
    if (!p->host[0]) snprintf(p->host, sizeof p->host, "host");
    /* beside out: "x.prep-tmp.HOST.PID" for out "x", "data/x.prep-tmp.HOST.PID" for "data/x" */
    const int plen = (int)(base - p->out);
    snprintf(p->tmp, sizeof p->tmp, "%.*s%s.prep-tmp.%s.%ld", plen, p->out, p->base, p->host,
             (long)getpid());
    snprintf(p->old, sizeof p->old, "%.*s%s.prep-old.%s.%ld", plen, p->out, p->base, p->host,
             (long)getpid());
    return 0;
}

static void say(const PrepReport *rep, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const PrepReport *rep, const char *fmt, ...) {
    if (!rep || !rep->note) return;
    char line[2 * PATH_CAP + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    rep->note(rep->ctx, line);
}

/* Removes the temporary folders of earlier preps on this host into the same
 * out that did not finish (their process gone): OUT.prep-tmp.HOST.PID, and
 * OUT.prep-old.HOST.PID (the set an interrupted --force was replacing: put
 * back when OUT is missing, else removed). Another host's are left alone
 * (said). */
static void clean_stale(const Paths *p, const PrepReport *rep) {
    DIR *d = opendir(p->parent);
    if (!d) return;
    const size_t bl = strlen(p->base);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, p->base, bl) != 0) continue;
        const int is_tmp = strncmp(n + bl, ".prep-tmp.", 10) == 0;
        const int is_old = strncmp(n + bl, ".prep-old.", 10) == 0;
        const char *host = n + bl + 10, *dot = strrchr(host, '.');
        long long pid;
        if ((!is_tmp && !is_old) || !dot || parse_i64(dot + 1, 1, INT_MAX, &pid) != 0) continue;
        char path[PATH_CAP + 300];
        struct stat st;
        snprintf(path, sizeof path, "%.*s%s", (int)(strlen(p->out) - bl), p->out, n);
        if ((size_t)(dot - host) != strlen(p->host) ||
            strncmp(host, p->host, (size_t)(dot - host)) != 0) {
            say(rep,
                "prep: left '%s' alone: another host's prep wrote it (remove it if none runs "
                "there)",
                path);
            continue;
        }
        if (kill((pid_t)pid, 0) == 0 || errno == EPERM)
            continue; /* at work (ours is not made yet) */
        if (is_old && stat(p->out, &st) != 0 && errno == ENOENT &&
            fp_rename("prep.stale.restore", path, p->out) == 0) {
            say(rep, "prep: put '%s' back as '%s' (a prep --force was killed between its renames)",
                path, p->out);
            continue;
        }
        if (remove_set(path) == 0)
            say(rep, "prep: removed '%s', left by a prep (process %lld) that did not finish", path,
                pid);
        else
            say(rep, "prep: could not remove '%s', left by an earlier prep: %s", path,
                strerror(errno));
    }
    closedir(d);
}

/* Checks out before the work: 0 when the set may go there, -1 with err. */
static int check_out(const Paths *p, int force, Err *err) {
    char first[256] = "";
    struct stat st;
    if (lstat(p->out, &st) == 0 && S_ISLNK(st.st_mode))
        return err_set(err,
                       "prep: --out '%s' is a symbolic link (the set is renamed into place; give "
                       "the folder it points to)",
                       p->out);
    const int r = scan_set(p->out, "--out", first, sizeof first, err);
    if (r < 0) return -1;
    if (r == 1 && !force)
        return err_set(err,
                       "prep: '%s' already holds a shard set ('%s'...); give --force to replace "
                       "it whole, or another --out",
                       p->out, first);
    return 0;
}

/* Moves the finished set in p->tmp to p->out: a plain rename when out is
 * absent or empty, else (force) an exchange of the two folders and the old
 * set removed, or where the file system cannot exchange, out renamed aside
 * first. fsyncs the parent. Returns 0 or -1 with err (p->tmp still there). */
static int commit_set(const Paths *p, int force, const PrepReport *rep, Err *err) {
    if (fp_fsync_dir("prep.commit.fsync_tmp", p->tmp) != 0)
        return err_set(err, "prep: cannot fsync '%s': %s", p->tmp, strerror(errno));
    char first[256] = "";
    const int r = scan_set(p->out, "--out", first, sizeof first, err);
    if (r < 0) return -1;
    if (r == 1 && !force)
        return err_set(err,
                       "prep: '%s' now holds a shard set ('%s'...); give --force to replace it",
                       p->out, first);
    if (r == 0) {
        if (fp_rename("prep.commit.rename", p->tmp, p->out) != 0)
            return err_set(err, "prep: cannot rename '%s' to '%s': %s", p->tmp, p->out,
                           strerror(errno));
    } else if (fp_exchange("prep.commit.exchange", p->tmp, p->out) == 0) {
        /* the old set goes only once the exchange is on disk: before, a power
         * loss could bring back the old names over a half-removed set */
        if (fp_fsync_dir("prep.commit.fsync_exchanged", p->parent) != 0)
            say(rep,
                "prep: warning: the old set in '%s' is kept: the fsync of '%s' failed (%s); "
                "the next prep into '%s' removes it",
                p->tmp, p->parent, strerror(errno), p->out);
        else if (remove_set(p->tmp) != 0) /* committed: the next prep into out removes it */
            say(rep,
                "prep: warning: the old set in '%s' could not be removed (%s); the next prep "
                "into '%s' removes it",
                p->tmp, strerror(errno), p->out);
    } else {
        if (fp_rename("prep.commit.aside", p->out, p->old) != 0)
            return err_set(err, "prep: cannot move the old set '%s' aside: %s", p->out,
                           strerror(errno));
        if (fp_rename("prep.commit.rename_new", p->tmp, p->out) != 0) {
            const int e = errno;
            if (fp_rename("prep.commit.restore", p->old, p->out) != 0)
                return err_set(err,
                               "prep: cannot rename '%s' to '%s' (%s), nor put the old set back "
                               "from '%s' (%s): the next prep into '%s' puts it back",
                               p->tmp, p->out, strerror(e), p->old, strerror(errno), p->out);
            return err_set(err, "prep: cannot rename '%s' to '%s': %s", p->tmp, p->out,
                           strerror(e));
        }
        if (fp_fsync_dir("prep.commit.fsync_renamed", p->parent) != 0)
            say(rep,
                "prep: warning: the old set in '%s' is kept: the fsync of '%s' failed (%s); "
                "the next prep into '%s' removes it",
                p->old, p->parent, strerror(errno), p->out);
        else if (remove_set(p->old) != 0)
            say(rep,
                "prep: warning: the old set in '%s' could not be removed (%s); the next prep "
                "into '%s' removes it",
                p->old, strerror(errno), p->out);
    }
    if (fp_fsync_dir("prep.commit.fsync_dir", p->parent) != 0)
        return err_set(err, "prep: the set is at '%s', but its folder's fsync failed: %s", p->out,
                       strerror(errno));
    return 0;
}

/* ---- documents and blocks ---- */

/* A document of the block: its bytes (JSON Lines: its line's), and once
 * encoded its tokens. */
typedef struct {
    size_t off, len;
    uint64_t line; /* JSON Lines: the line's number */
    int input;     /* the input it came from */
    int bad;       /* JSON Lines: the line is not what it must be */
    uint16_t *tok; /* its tokens (gpt2: <|endoftext|> first; none: an empty document) */
    size_t ntok;
} Doc;

/* A block's finished documents: their bytes and where each lies. */
typedef struct {
    char *buf;
    size_t cap;
    Doc *docs;
    size_t nd, dcap;
} Sealed;

typedef struct {
    const PrepOptions *o;
    const PrepReport *rep;
    PrepStats *st;
    Paths paths;
    Writer w[2];
    size_t cap_doc, block_bytes;
    size_t parse_cap, est; /* JSON Lines: what parsing a block may take; the block's estimate */
    size_t held_base;      /* held before any text but a zstd window (for what --mem would do) */
    int has_zstd;
    char *buf; /* the block: finished documents, then the one being read */
    size_t len, bcap;
    size_t doc_start, line_start;
    Doc *docs;
    size_t nd, dcap;
    char *line; /* JSON Lines: a line split across chunks */
    size_t llen, lcap;
    Bpe **clones;
    BpeIds *ids;
    int eot;
    double t0, last;
    const char *name;  /* the input being read */
    int input;         /* its index */
    int threads;       /* that encode (gpt2) and parse (JSON Lines) */
    uint64_t line_no;  /* of the line being read (1-based) */
    uint64_t doc_line; /* where the document being read starts */
    uint64_t in_done0; /* input bytes of the inputs before this one */
    /* the worker: encodes and writes one sealed block while the next is read */
    Sealed job, spare; /* the block it works on; buffers to read the next into */
    pthread_t worker;
    int busy, job_rc;
    Err job_err;
    uint64_t wdocs; /* documents written (the worker's count) */
} Prep;

/* The counts of what is written into st (no worker at work). */
static void sync_stats(Prep *p) {
    p->st->docs = p->wdocs;
    for (int s = 0; s < 2; s++) {
        p->st->tokens[s] = p->w[s].total + (uint64_t)p->w[s].held;
        p->st->shards[s] = p->w[s].shards;
    }
}

/* Tells the progress every 2 s (force: only brings st up to date): the
 * counts as of the last block written, the documents read since. */
static void progress(Prep *p, int force) {
    const double now = now_s();
    if (!force && now - p->last < 2.0) return;
    p->last = now;
    p->st->seconds = now - p->t0;
    if (!p->busy) sync_stats(p);
    if (p->rep && p->rep->progress && !force) {
        PrepStats now_st = *p->st;
        now_st.docs += p->nd + (p->busy ? p->job.nd : 0); /* read, not yet written */
        p->rep->progress(p->rep->ctx, &now_st);
    }
}

/* Room for n more bytes in the block. */
static void block_reserve(Prep *p, size_t n) {
    size_t need;
    if (size_add(p->len, n, &need) != 0) abort();
    if (need <= p->bcap) return;
    size_t c = p->bcap ? p->bcap : IO_CHUNK;
    while (c < need) c = sat_mul(c, 2);
    p->buf = xrealloc(p->buf, c);
    p->bcap = c;
}

static void block_append(Prep *p, const char *s, size_t n) {
    block_reserve(p, n);
    memcpy(p->buf + p->len, s, n);
    p->len += n;
}

/* A document (or line) of more than the cap, from line `line`: refused. */
static int too_long(Prep *p, uint64_t line, const char *what, Err *err) {
    char cap[32];
    format_bytes(cap, sizeof cap, p->cap_doc);
    return err_set(err,
                   "prep: '%s' line %llu: %s longer than %s, the cap under --mem (a sixteenth of "
                   "it; give a larger --mem%s)",
                   p->name, (unsigned long long)line, what, cap,
                   p->o->jsonl_key || p->o->doc_sep ? "" : ", or cut files with --doc_sep LINE");
}

static int zstd_window_log(size_t mem);

/* The block's bytes under mem (0: too little is left), held_base held before
 * any text and a zstd window besides when there is zstd input: two blocks
 * at a time (one read while the worker writes the other); bytes of text go
 * straight through; JSON Lines add the parse (up to 3 bytes a byte) and the
 * tokens (2), gpt2 its tokens and ids (up to 12, typically 2). */
static size_t block_bytes_at(const PrepOptions *o, size_t mem, size_t held_base, int has_zstd) {
    const size_t held = sat_add(held_base, has_zstd ? (size_t)1 << zstd_window_log(mem) : 0);
    if (held >= mem / 2) return 0;
    return (mem - held) / (o->bpe ? 48 : o->jsonl_key ? 16 : 8);
}

/* What parsing a block's JSON Lines may take: the parse's 3 bytes a byte of
 * the two blocks block_bytes_at counts, all for the one block parsed at a
 * time, whichever threads parse it. */
static size_t parse_cap_of(size_t block_bytes) { return sat_mul(6, block_bytes); }

/* Whether a line whose parse takes est would fit under --mem mem. */
static int parse_fits(const Prep *p, size_t mem, size_t est) {
    return parse_cap_of(block_bytes_at(p->o, mem, p->held_base, p->has_zstd)) >= est;
}

/* A JSON Lines line whose parse alone would take more than parse_cap:
 * refused, with the --mem (whole MiB) under which it would fit. */
static int too_costly(Prep *p, size_t est, Err *err) {
    const size_t mib = (size_t)1 << 20;
    size_t fit = (p->o->mem + mib - 1) / mib * mib;
    while (fit < SIZE_MAX / 4 && !parse_fits(p, fit, est)) fit *= 2;
    for (size_t step = fit / 4 / mib * mib; step >= mib; step = step / 2 / mib * mib)
        if (fit - step > p->o->mem && parse_fits(p, fit - step, est)) fit -= step;
    char e[32], c[32], m[32];
    format_bytes(e, sizeof e, est);
    format_bytes(c, sizeof c, p->parse_cap);
    format_bytes(m, sizeof m, p->o->mem);
    return err_set(
        err,
        "prep: '%s' line %llu: parsing it would take about %s (a tree of many small arrays, "
        "objects or values takes up to 90 times their bytes), more than the %s "
        "that --mem %s leaves for parsing (give --mem %zuM or more)",
        p->name, (unsigned long long)p->line_no, e, c, m, fit / mib);
}

/* The name of input i for messages. */
static const char *input_name(const PrepOptions *o, int i) {
    return strcmp(o->inputs[i], "-") == 0 ? "standard input" : o->inputs[i];
}

/* Checks a JSON Lines line (n bytes at s, of input `input`, line `line`):
 * a JSON object with a string under the key. Returns the parsed value
 * (*text, *len: the document in it), or NULL with err set when err is not
 * NULL. */
static json_t *jsonl_parse(const PrepOptions *o, int input, uint64_t line, const char *s, size_t n,
                           const char **text, size_t *len, Err *err) {
    const char *key = o->jsonl_key, *name = input_name(o, input);
    const unsigned long long ln = (unsigned long long)line;
    json_error_t je;
    json_t *v = json_loadb(s, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!v) {
        if (err)
            err_set(err,
                    "prep: '%s' line %llu is not JSON (%s, column %d; expected one object a line)",
                    name, ln, je.text, je.column);
        return NULL;
    }
    json_t *t = json_is_object(v) ? json_object_get(v, key) : NULL;
    if (!json_is_object(v)) {
        if (err)
            err_set(err,
                    "prep: '%s' line %llu is not a JSON object (expected one object a line, the "
                    "document under \"%s\")",
                    name, ln, key);
    } else if (!t) {
        if (err)
            err_set(err,
                    "prep: '%s' line %llu has no key \"%s\" (expected the document as a string "
                    "there; --jsonl KEY names the key)",
                    name, ln, key);
    } else if (!json_is_string(t)) {
        if (err)
            err_set(err,
                    "prep: '%s' line %llu: \"%s\" is not a string (expected the document's text)",
                    name, ln, key);
    } else {
        *text = json_string_value(t);
        *len = json_string_length(t);
        return v;
    }
    json_decref(v);
    return NULL;
}

/* Doc d's tokens from its n bytes of text at s: bytes widened, or gpt2's
 * ids after <|endoftext|>; none for an empty document. */
static void doc_encode(const Prep *p, Doc *d, const char *s, size_t n, Bpe *bpe, BpeIds *ids) {
    d->tok = NULL, d->ntok = 0;
    if (n == 0) return;
    if (!bpe) {
        d->tok = xmalloc(n * sizeof *d->tok);
        for (size_t k = 0; k < n; k++) d->tok[k] = (unsigned char)s[k];
        d->ntok = n;
        return;
    }
    ids->n = 0;
    bpe_encode(bpe, s, n, ids);
    d->tok = xmalloc((ids->n + 1) * sizeof *d->tok);
    d->tok[0] = (uint16_t)p->eot;
    for (size_t k = 0; k < ids->n; k++) d->tok[k + 1] = (uint16_t)ids->ids[k];
    d->ntok = ids->n + 1;
    if (ids->cap > ((size_t)1 << 22)) { /* after a long document: give it back */
        free(ids->ids);
        ids->ids = NULL, ids->n = ids->cap = 0;
    }
}

/* Encodes a sealed block's documents and appends their tokens in order to
 * train or val (document d to val when prep_doc_is_val). gpt2 and JSON
 * Lines work on the threads, a document (a line) on one, the result
 * independent of which; a bad line is reported in order, the first one.
 * Bytes of text go straight through. The worker's work: it alone touches
 * the writers, the tokenizers and wdocs. */
static int block_write(Prep *p, Sealed *b, Err *err) {
    const PrepOptions *o = p->o;
    const int parallel = o->bpe || o->jsonl_key;
    if (parallel && b->nd > 0) {
        Doc *docs = b->docs;
        const long long nd = (long long)b->nd;
#pragma omp parallel num_threads(p->threads)
        {
#ifdef _OPENMP
            const int t = omp_get_thread_num();
#else
            const int t = 0;
#endif
            Bpe *mine = p->clones ? p->clones[t] : NULL;
            BpeIds *ids = &p->ids[t];
#pragma omp for schedule(dynamic, 1)
            for (long long i = 0; i < nd; i++) {
                Doc *d = &docs[i];
                const char *s = b->buf + d->off;
                size_t n = d->len;
                json_t *v = NULL;
                if (o->jsonl_key && !(v = jsonl_parse(o, d->input, d->line, s, n, &s, &n, NULL))) {
                    d->bad = 1;
                    continue;
                }
                doc_encode(p, d, s, n, mine, ids);
                json_decref(v);
            }
        }
#ifdef __GLIBC__
        /* the trees are freed, but into the arenas of the threads that parsed them, and the
         * next block's may be parsed on others: each block's parse has to fit parse_cap on
         * its own, so what is free goes back to the system */
        if (o->jsonl_key) malloc_trim(0);
#endif
    }
    int rc = 0;
    uint16_t *wide = parallel ? NULL : xmalloc(WRITE_TOKENS * sizeof *wide);
    for (size_t i = 0; i < b->nd; i++) {
        Doc *d = &b->docs[i];
        if (rc != 0) {
        } else if (d->bad) { /* the message, made again here, in order */
            const char *t;
            size_t n;
            json_t *v = jsonl_parse(o, d->input, d->line, b->buf + d->off, d->len, &t, &n, err);
            json_decref(v);
            rc = -1;
        } else if (parallel) {
            if (d->ntok > 0) {
                rc = writer_put(&p->w[prep_doc_is_val(p->wdocs, o->val_fraction)], d->tok, d->ntok,
                                err);
                p->wdocs++;
            }
        } else {
            Writer *w = &p->w[prep_doc_is_val(p->wdocs, o->val_fraction)];
            p->wdocs++;
            const unsigned char *s = (const unsigned char *)b->buf + d->off;
            for (size_t at = 0; rc == 0 && at < d->len; at += WRITE_TOKENS) {
                const size_t k = d->len - at < WRITE_TOKENS ? d->len - at : WRITE_TOKENS;
                for (size_t j = 0; j < k; j++) wide[j] = s[at + j];
                rc = writer_put(w, wide, k, err);
            }
        }
        free(d->tok);
        d->tok = NULL;
    }
    free(wide);
    return rc;
}

static void *block_work(void *arg) {
    Prep *p = arg;
    p->job_rc = block_write(p, &p->job, &p->job_err);
    return NULL;
}

/* After the worker's block: its buffers become the spare ones. Returns 0,
 * or -1 with its error in err. */
static int block_done(Prep *p, Err *err) {
    sync_stats(p);
    p->spare = p->job;
    p->job = (Sealed){0};
    if (p->job_rc == 0) return 0;
    if (err) *err = p->job_err;
    return -1;
}

/* Waits for the worker's block (block_done). */
static int block_join(Prep *p, Err *err) {
    if (!p->busy) return 0;
    pthread_join(p->worker, NULL);
    p->busy = 0;
    return block_done(p, err);
}

/* Hands the block's finished documents to the worker (once it is done
 * with the one before) and goes on reading into the spare buffers, the
 * document being read copied to their front. Returns 0, or -1 with err
 * (the worker's error on the block before). */
static int block_flush(Prep *p, Err *err) {
    if (block_join(p, err) != 0) return -1;
    if (p->nd > 0) {
        p->job = (Sealed){p->buf, p->bcap, p->docs, p->nd, p->dcap};
        const char *rest = p->buf + p->doc_start;
        const size_t keep = p->len - p->doc_start;
        p->buf = p->spare.buf, p->bcap = p->spare.cap;
        p->docs = p->spare.docs, p->dcap = p->spare.dcap;
        p->spare = (Sealed){0};
        p->len = 0;
        block_reserve(p, keep);
        if (keep > 0) memcpy(p->buf, rest, keep);
        p->line_start -= p->doc_start;
        p->len = keep, p->doc_start = 0, p->nd = 0, p->est = 0;
        if (pthread_create(&p->worker, NULL, block_work, p) == 0) p->busy = 1;
        else if (block_work(p), block_done(p, err) != 0) /* no thread to be had: here */ return -1;
    }
    progress(p, 0);
    return 0;
}

/* Ends the document [doc_start, end) (an empty one is left out); the next
 * starts at the block's end. Flushes a full block. */
static int doc_end(Prep *p, size_t end, Err *err) {
    if (end > p->doc_start) {
        if (p->nd == p->dcap)
            p->docs = xrealloc(p->docs, (p->dcap = 2 * p->dcap + 64) * sizeof *p->docs);
        p->docs[p->nd++] = (Doc){
            .off = p->doc_start, .len = end - p->doc_start, .line = p->line_no, .input = p->input};
    }
    p->doc_start = p->line_start = p->len;
    return p->len >= p->block_bytes ? block_flush(p, err) : 0;
}

/* Text, one document a file: the chunk appended. */
static int feed_whole(Prep *p, const char *s, size_t n, Err *err) {
    block_append(p, s, n);
    if (p->len - p->doc_start > p->cap_doc)
        return too_long(p, 1, "the document (the whole file, without --doc_sep) is", err);
    return 0;
}

/* Text cut at lines equal to doc_sep: line by line into the block, a
 * separator line dropped where it ends a document. */
static int feed_sep(Prep *p, const char *s, size_t n, Err *err) {
    const char *sep = p->o->doc_sep;
    const size_t sl = strlen(sep);
    while (n > 0) {
        const char *nl = memchr(s, '\n', n);
        const size_t k = nl ? (size_t)(nl - s) + 1 : n;
        block_append(p, s, k);
        s += k, n -= k;
        if (!nl) { /* a line continued in the next chunk */
            if (p->len - p->doc_start > p->cap_doc + sl + 1)
                return too_long(p, p->doc_line, "the document from here is", err);
            break;
        }
        const size_t line = p->len - 1 - p->line_start; /* without its newline */
        const int is_sep = line == sl && memcmp(p->buf + p->line_start, sep, sl) == 0;
        p->line_no++;
        if (is_sep) {
            const size_t at = p->line_start;
            p->len = at;
            if (doc_end(p, at, err) != 0) return -1;
            p->doc_line = p->line_no + 1;
        } else {
            if (p->len - p->doc_start > p->cap_doc)
                return too_long(p, p->doc_line, "the document from here is", err);
            p->line_start = p->len;
        }
    }
    return 0;
}

/* One JSON Lines line: into the block as it is (parsed on the threads at
 * the flush); a blank one is left out. Any of the block's lines may be
 * parsed at the same time, a thread each, so their estimates add up within
 * parse_cap: the block is flushed before a line that would go over it, and
 * a line over it alone is refused. Over the whole block, not a share a
 * thread: however many threads split it, their trees together stay within
 * parse_cap. */
static int jsonl_line(Prep *p, const char *s, size_t n, Err *err) {
    size_t k = 0;
    while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
    if (k == n) return 0;
    const size_t est = prep_jsonl_estimate(s, n);
    if (est > p->parse_cap) return too_costly(p, est, err);
    if (p->nd > 0 && sat_add(p->est, est) > p->parse_cap && block_flush(p, err) != 0) return -1;
    block_append(p, s, n);
    p->est = sat_add(p->est, est);
    return doc_end(p, p->len, err);
}

/* JSON Lines: each whole line to the block; one split across chunks
 * gathered in p->line first. */
static int feed_jsonl(Prep *p, const char *s, size_t n, Err *err) {
    while (n > 0) {
        const char *nl = memchr(s, '\n', n);
        const size_t k = nl ? (size_t)(nl - s) : n;
        if (!nl || p->llen > 0) {
            if (p->llen + k > p->cap_doc) return too_long(p, p->line_no + 1, "the line is", err);
            if (p->llen + k > p->lcap) {
                p->lcap = p->llen + k > 2 * p->lcap ? p->llen + k : 2 * p->lcap;
                p->line = xrealloc(p->line, p->lcap);
            }
            memcpy(p->line + p->llen, s, k);
            p->llen += k;
        }
        if (!nl) break;
        p->line_no++;
        if (k > p->cap_doc) return too_long(p, p->line_no, "the line is", err);
        const int rc =
            p->llen > 0 ? jsonl_line(p, p->line, p->llen, err) : jsonl_line(p, s, k, err);
        p->llen = 0;
        if (p->lcap > IO_CHUNK) { /* after a long line: give it back */
            free(p->line);
            p->line = NULL, p->lcap = 0;
        }
        if (rc != 0) return -1;
        s += k + 1, n -= k + 1;
    }
    return 0;
}

/* Reads one input to its end through the splitter. */
static int read_input(Prep *p, int input, int window_log, char *chunk, Err *err) {
    const char *path = p->o->inputs[input];
    Reader r;
    if (reader_open(&r, path, window_log, err) != 0) return -1;
    p->name = r.name;
    p->input = input;
    p->line_no = 0, p->doc_line = 1, p->llen = 0;
    uint64_t text = 0;
    int rc = 0;
    for (;;) {
        size_t got = 0;
        if ((rc = reader_read(&r, chunk, IO_CHUNK, &got, err)) != 0) break;
        p->st->in_done = p->in_done0 + r.consumed;
        if (got == 0) break;
        text += got, p->st->bytes += got;
        rc = p->o->jsonl_key ? feed_jsonl(p, chunk, got, err)
             : p->o->doc_sep ? feed_sep(p, chunk, got, err)
                             : feed_whole(p, chunk, got, err);
        if (rc != 0) break;
        progress(p, 0);
    }
    if (rc == 0 && text == 0)
        rc = err_set(err, "prep: '%s' is empty (expected text to tokenise)", r.name);
    if (rc == 0 && p->o->jsonl_key && p->llen > 0) { /* a last line without a newline */
        p->line_no++;
        rc = jsonl_line(p, p->line, p->llen, err);
        p->llen = 0;
    }
    if (rc == 0 && p->o->doc_sep && p->len > p->line_start) { /* the same, of text */
        const size_t sl = strlen(p->o->doc_sep);
        p->line_no++;
        if (p->len - p->line_start == sl && memcmp(p->buf + p->line_start, p->o->doc_sep, sl) == 0)
            p->len = p->line_start;
    }
    if (rc == 0 && !p->o->jsonl_key) rc = doc_end(p, p->len, err); /* a file ends its document */
    p->in_done0 += r.consumed;
    reader_close(&r);
    return rc;
}

/* The largest window (log2 bytes) a zstd frame may ask for under mem. */
static int zstd_window_log(size_t mem) {
    int wl = 10;
    while (wl < 27 && ((size_t)1 << (wl + 1)) <= mem / 4) wl++;
    return wl;
}

/* Checks every input before any work: openable files (sizes summed for the
 * ETA), standard input at most once. */
static int check_inputs(const PrepOptions *o, PrepStats *st, int *has_zstd, Err *err) {
    int stdin_seen = 0;
    st->in_known = 1;
    *has_zstd = 0;
    for (int i = 0; i < o->ninputs; i++) {
        const char *f = o->inputs[i];
        struct stat s;
        if (strcmp(f, "-") == 0) {
            if (stdin_seen++)
                return err_set(err,
                               "prep: '-' (standard input) is given twice (it can be read once)");
            if (fstat(STDIN_FILENO, &s) == 0 && S_ISREG(s.st_mode))
                st->in_total += (uint64_t)s.st_size;
            else st->in_known = 0;
            continue;
        }
        Err e;
        const int fd = open_regular(f, O_RDONLY, &s, &e);
        if (fd < 0) return err_set(err, "prep: %s (expected text to tokenise)", e.msg);
        close(fd);
        st->in_total += (uint64_t)s.st_size;
        *has_zstd |= input_kind(f) == IN_ZSTD;
    }
    return 0;
}

/* What the shards' headers record, and the id of <|endoftext|> (gpt2).
 * Returns 0 or -1 (a vocabulary shards cannot hold). */
static int shard_meta(const PrepOptions *o, ShardMeta *meta, int *eot, Err *err) {
    *meta = (ShardMeta){.vocab = 256, .tokenizer = SHARD_TOK_BYTE};
    if (!o->bpe) return 0;
    const int vocab = bpe_vocab_size(o->bpe);
    *eot = bpe_eot(o->bpe);
    if (vocab > 65536 || *eot < 0)
        return err_set(err,
                       "prep: the vocabulary has %d tokens%s; shards hold ids below 65536 "
                       "and documents are separated by <|endoftext|>",
                       vocab, *eot < 0 ? " and no <|endoftext|>" : "");
    *meta =
        (ShardMeta){.vocab = vocab, .tokenizer = SHARD_TOK_GPT2, .vocab_hash = bpe_hash(o->bpe)};
    return 0;
}

/* Whether what was read makes a set: documents, val ones where asked for,
 * no split of a single token. Returns 0 or -1 with err set. */
static int check_result(const PrepOptions *o, const PrepStats *st, Err *err) {
    if (st->docs == 0)
        return err_set(err, "prep: the inputs hold no document (every piece between --doc_sep "
                            "lines, or every JSON string, is empty; expected text to tokenise)");
    if (o->val_fraction > 0 && st->tokens[1] == 0)
        return err_set(
            err,
            "prep: %llu document%s give%s none to val at --val_fraction %g (document d goes "
            "there when floor((d+1)*f) > floor(d*f)); give more documents (--doc_sep LINE "
            "cuts text files into documents) or --val_fraction 0",
            (unsigned long long)st->docs, st->docs == 1 ? "" : "s", st->docs == 1 ? "s" : "",
            o->val_fraction);
    for (int s = 0; s < 2; s++)
        if (st->tokens[s] == 1)
            return err_set(err,
                           "prep: the %s split holds 1 token, and a shard needs at least 2 (give "
                           "more text or change --val_fraction)",
                           s ? "val" : "train");
    return 0;
}

int prep_run(const PrepOptions *o, const PrepReport *rep, PrepStats *st, Err *err) {
    memset(st, 0, sizeof *st);
    Prep p;
    memset(&p, 0, sizeof p);
    p.o = o, p.rep = rep, p.st = st;
    p.t0 = p.last = now_s();
    if (o->shard_tokens < 2 || o->shard_tokens > (size_t)INT32_MAX - 1)
        return err_set(err, "prep: %zu tokens a shard is outside [2, %d]", o->shard_tokens,
                       INT32_MAX - 1);
    ShardMeta meta;
    if (shard_meta(o, &meta, &p.eot, err) != 0) return -1;
    int has_zstd;
    if (paths_make(&p.paths, o->out, err) != 0 || check_inputs(o, st, &has_zstd, err) != 0)
        return -1;
    clean_stale(&p.paths, rep);
    if (check_out(&p.paths, o->force, err) != 0) return -1;
    /* the memory: what is held already (the vocabulary), the threads'
     * tokenizers, a zstd window; the rest for the block */
    const int threads = o->bpe || o->jsonl_key ? (o->threads > 0 ? o->threads : 1) : 1;
    p.ids = xcalloc((size_t)threads, sizeof *p.ids);
    p.threads = st->threads = threads;
    if (o->bpe) {
        p.clones = xcalloc((size_t)threads, sizeof *p.clones);
        for (int t = 0; t < threads; t++)
            if (!(p.clones[t] = bpe_clone(o->bpe))) {
                fprintf(stderr, "modtrain: out of memory for a tokenizer's match data\n");
                abort();
            }
    }
    const int wl = zstd_window_log(o->mem);
    p.held_base = /* a thread's caches, 1 MiB each, besides */
        sat_add(o->held ? o->held : peak_rss(), sat_mul((size_t)threads, (size_t)1 << 20));
    p.has_zstd = has_zstd;
    const size_t held = sat_add(p.held_base, has_zstd ? (size_t)1 << wl : 0);
    int rc = -1;
    char *chunk = NULL;
    p.block_bytes = block_bytes_at(o, o->mem, p.held_base, has_zstd);
    if (p.block_bytes == 0) {
        char m[32], h[32];
        format_bytes(m, sizeof m, o->mem);
        format_bytes(h, sizeof h, held);
        err_set(err,
                "prep: --mem %s leaves too little: %s are held before any text (the vocabulary, "
                "%d threads' tokenizers%s); give --mem of at least twice that, or fewer --threads",
                m, h, threads, has_zstd ? ", a zstd window" : "");
        goto done;
    }
    p.cap_doc = prep_doc_cap(o->mem);
    p.parse_cap = parse_cap_of(p.block_bytes);
    if (mkdirs(p.paths.parent) != 0) {
        err_set(err, "prep: cannot create '%s': %s", p.paths.parent, strerror(errno));
        goto done;
    }
    if (fp_mkdir("prep.mkdir", p.paths.tmp, 0755) != 0) {
        err_set(err, "prep: cannot create '%s': %s", p.paths.tmp, strerror(errno));
        goto done;
    }
    for (int s = 0; s < 2; s++)
        p.w[s] = (Writer){.dir = p.paths.tmp,
                          .split = s ? "val" : "train",
                          .meta = meta,
                          .per_shard = o->shard_tokens,
                          .fd = -1,
                          .buf = xmalloc(WRITE_TOKENS * sizeof(uint16_t))};
    chunk = xmalloc(IO_CHUNK);
    for (int i = 0; i < o->ninputs; i++)
        if (read_input(&p, i, wl, chunk, err) != 0) goto fail;
    if (block_flush(&p, err) != 0 || block_join(&p, err) != 0 || writer_finish(&p.w[0], err) != 0 ||
        writer_finish(&p.w[1], err) != 0)
        goto fail;
    progress(&p, 1);
    if (check_result(o, st, err) != 0) goto fail;
    if (commit_set(&p.paths, o->force, rep, err) != 0) goto fail;
    rc = 0;
    goto done;
fail:
    block_join(&p, err); /* the worker's error, on earlier documents, comes first */
    for (int s = 0; s < 2; s++)
        if (p.w[s].fd >= 0) close(p.w[s].fd);
    remove_set(p.paths.tmp);
done:
    st->seconds = now_s() - p.t0;
    for (int s = 0; s < 2; s++) free(p.w[s].buf);
    for (int t = 0; t < threads; t++) {
        if (p.clones) bpe_free(p.clones[t]);
        free(p.ids[t].ids);
    }
    free(p.clones);
    free(p.ids);
    free(chunk);
    free(p.buf);
    free(p.docs);
    free(p.spare.buf);
    free(p.spare.docs);
    free(p.line);
    return rc;
}
