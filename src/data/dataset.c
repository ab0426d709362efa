/*
 * dataset: specs, their shards' headers, the blend schedule, the keyed
 * permutation and the reads (see dataset.h for the order).
 */
#include "src/data/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/files.h"
#include "src/base/rng.h"

#define MARK_BITS 8 /* a count of each dataset every 2^MARK_BITS samples */
#define HDR_BYTES (SHARD_HEADER_INTS * sizeof(int32_t))

/* ------------------------------------------------------------- the order */

uint64_t ds_permute(uint64_t x, uint64_t n, uint64_t key) {
    if (n <= 1) return 0;
    int bits = 2;
    while (bits < 64 && ((uint64_t)1 << bits) < n) bits += 2;
    const int h = bits / 2;
    const uint64_t mask = ((uint64_t)1 << h) - 1;
    do { /* cycle-walking: x < n came from the cycle, so it returns into range */
        uint64_t l = x >> h, r = x & mask;
        for (uint64_t round = 0; round < 6; round++) {
            const uint64_t f = rng_u64(key, round, r) & mask;
            const uint64_t t = r;
            r = l ^ f;
            l = t;
        }
        x = l << h | r;
    } while (x >= n);
    return x;
}

static uint64_t gcd_u64(uint64_t a, uint64_t b) {
    while (b) {
        const uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The quotas: each of the D datasets' samples in one period of the
 * schedule, and the period. Where the weights are decimals of at most 6
 * digits after the point whose scaled sum is at most 2^DS_PERIOD_BITS,
 * they are exact: the weights as integers over their greatest common
 * divisor (0.7 and 0.3 make a period of 10); otherwise each normalised
 * weight's share of a 2^DS_PERIOD_BITS period, the largest remainders
 * rounded up (a quota may then be 0). */
static uint64_t blend_period(const double *w, int D, uint32_t *quota) {
    const uint64_t max_period = (uint64_t)1 << DS_PERIOD_BITS;
    double wmax = 0, wsum = 0; /* over the largest weight first: 1e308 and 1e308 add up */
    for (int d = 0; d < D; d++) wmax = fmax(wmax, w[d]);
    for (int d = 0; d < D; d++) wsum += w[d] / wmax;
    for (double scale = 1; scale <= 1e6; scale *= 10) {
        uint64_t a[DS_MAX_PARTS], g = 0, sum = 0;
        int exact = 1;
        for (int d = 0; d < D && exact; d++) {
            const double x = w[d] * scale, r = nearbyint(x);
            exact = r >= 1 && r <= (double)max_period && fabs(x - r) <= 1e-9 * x;
            a[d] = exact ? (uint64_t)r : 0;
            g = gcd_u64(g, a[d]);
        }
        if (!exact) continue;
        for (int d = 0; d < D; d++) sum += a[d] / g;
        if (sum > max_period) break;
        for (int d = 0; d < D; d++) quota[d] = (uint32_t)(a[d] / g);
        return sum;
    }
    uint64_t given = 0;
    double rem[DS_MAX_PARTS];
    for (int d = 0; d < D; d++) {
        const double share = w[d] / wmax / wsum * (double)max_period;
        quota[d] = (uint32_t)floor(share);
        rem[d] = share - floor(share);
        given += quota[d];
    }
    while (given < max_period) { /* the largest remainder first, ties to the first */
        int best = 0;
        for (int d = 1; d < D; d++)
            if (rem[d] > rem[best]) best = d;
        quota[best]++;
        rem[best] = -1;
        given++;
    }
    return max_period;
}

/* The blend's quotas and period. Returns 0 or -1 (a weight too small to
 * get a sample). */
static int blend_quotas(Dataset *ds, const double *w, Err *err) {
    uint32_t q[DS_MAX_PARTS];
    ds->period = blend_period(w, ds->n_parts, q);
    for (int d = 0; d < ds->n_parts; d++) {
        ds->parts[d].quota = q[d];
        if (q[d] == 0)
            return err_set(err,
                           "data: the weight of '%s' is %.3g of the blend, less than one sample in "
                           "2^%d (raise it or leave the dataset out)",
                           ds->parts[d].pattern, ds->parts[d].weight, DS_PERIOD_BITS);
    }
    return 0;
}

/* Lays out one period of the schedule: at each sample, among the datasets
 * whose share is at least sigma = 1/(2D-2) ahead of their count, the one
 * whose share would run a full sample ahead first (Tijdeman's rule, which
 * keeps every dataset's count within 1 - sigma of its share at every
 * prefix). Integer arithmetic throughout, so every machine agrees. */
static void blend_schedule(Dataset *ds) {
    const int D = ds->n_parts;
    const uint64_t S = 2 * (uint64_t)D - 2, Q = ds->period;
    uint64_t c[DS_MAX_PARTS] = {0};
    ds->sched = xmalloc(Q);
    ds->marks = xcalloc(((Q >> MARK_BITS) + 1) * (size_t)D, sizeof(uint32_t));
    for (uint64_t t = 0; t < Q; t++) {
        if ((t & ((1u << MARK_BITS) - 1)) == 0)
            for (int d = 0; d < D; d++)
                ds->marks[(t >> MARK_BITS) * (uint64_t)D + (uint64_t)d] = (uint32_t)c[d];
        int best = -1;
        for (int d = 0; d < D; d++) {
            const uint64_t q = ds->parts[d].quota;
            /* eligible: (t+1) q / Q - c >= 1/S */
            if (S * (t + 1) * q < Q * (S * c[d] + 1)) continue;
            /* deadline (S c + S - 1) / q, the smallest first */
            if (best < 0 || (S * c[d] + S - 1) * ds->parts[best].quota <
                                (S * c[best] + S - 1) * q)
                best = d;
        }
        if (best < 0) { /* not reached under the theorem; the most behind, to be safe */
            best = 0;
            for (int d = 1; d < D; d++)
                if ((t + 1) * ds->parts[d].quota - Q * c[d] >
                    (t + 1) * ds->parts[best].quota - Q * c[best])
                    best = d;
        }
        ds->sched[t] = (uint8_t)best;
        c[best]++;
    }
}

uint64_t ds_part_count(const Dataset *ds, int part, uint64_t g) {
    if (ds->n_parts == 1) return g;
    const uint64_t r = g % ds->period, base = r >> MARK_BITS << MARK_BITS;
    uint64_t n = g / ds->period * ds->parts[part].quota +
                 ds->marks[(r >> MARK_BITS) * (uint64_t)ds->n_parts + (uint64_t)part];
    for (uint64_t t = base; t < r; t++) n += ds->sched[t] == part;
    return n;
}

/* The shard of a dataset's sequence: the last one starting at or before it
 * (shards without a sequence start where the next one does). */
static int shard_of_seq(const DsPart *p, uint64_t seq) {
    int lo = 0, hi = p->n_shards - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (p->shards[mid].first_seq <= seq) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

void ds_locate_seq(const Dataset *ds, int part, uint64_t seq, DsSample *s) {
    const DsPart *p = &ds->parts[part];
    s->part = part;
    s->seq = seq;
    s->shard = shard_of_seq(p, seq);
    s->offset = (seq - p->shards[s->shard].first_seq) * (uint64_t)ds->T;
}

void ds_locate(const Dataset *ds, uint64_t g, DsSample *s) {
    const int d = ds->n_parts == 1 ? 0 : ds->sched[g % ds->period];
    const uint64_t i = ds_part_count(ds, d, g), n = ds->parts[d].n_seqs;
    const uint64_t epoch = i / n;
    const uint64_t key = rng_u64(ds->seed, rng_hash_str("data-order") ^ (uint64_t)d, epoch);
    ds_locate_seq(ds, d, ds_permute(i % n, n, key), s);
    s->epoch = epoch;
    s->index = i;
}

/* ----------------------------------------------------------------- reads */

/* An open descriptor of a shard, from the cache or opened now (the least
 * recently used one closed). Returns it, or -1 with err set. */
static int shard_fd(Dataset *ds, int part, int shard, Err *err) {
    int slot = 0;
    for (int i = 0; i < DS_FILES; i++) {
        if (ds->files[i].fd >= 0 && ds->files[i].part == part && ds->files[i].shard == shard) {
            ds->files[i].used = ++ds->clock;
            return ds->files[i].fd;
        }
        if (ds->files[i].used < ds->files[slot].used) slot = i;
    }
    const char *path = ds->parts[part].shards[shard].path;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, "data: cannot open '%s': %s", path, strerror(errno));
    if (ds->files[slot].fd >= 0) close(ds->files[slot].fd);
    ds->files[slot].fd = fd;
    ds->files[slot].part = part;
    ds->files[slot].shard = shard;
    ds->files[slot].used = ++ds->clock;
    return fd;
}

void ds_prefetch(Dataset *ds, const DsSample *s) {
    const int fd = shard_fd(ds, s->part, s->shard, NULL);
    if (fd < 0) return; /* the read will say why */
    const int width = ds->parts[s->part].shards[s->shard].meta.width;
    const off_t at = (off_t)(HDR_BYTES + s->offset * (uint64_t)width);
    (void)posix_fadvise(fd, at, (off_t)(((size_t)ds->T + 1) * (size_t)width), POSIX_FADV_WILLNEED);
}

int ds_read(Dataset *ds, const DsSample *s, int vocab, int *inputs, int *targets, Err *err) {
    const DsShard *sh = &ds->parts[s->part].shards[s->shard];
    const int fd = shard_fd(ds, s->part, s->shard, err);
    if (fd < 0) return -1;
    const int width = sh->meta.width;
    const size_t want = ((size_t)ds->T + 1) * (size_t)width;
    const uint64_t at = HDR_BYTES + s->offset * (uint64_t)width;
    size_t got = 0;
    while (got < want) {
        const ssize_t n = pread(fd, ds->raw + got, want - got, (off_t)(at + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return err_set(err, "data: cannot read '%s' at token %" PRIu64 ": %s", sh->path,
                           s->offset, strerror(errno));
        if (n == 0) {
            struct stat st;
            const unsigned long long now = fstat(fd, &st) == 0 ? (unsigned long long)st.st_size : 0;
            return err_set(err,
                           "data: '%s' ends at byte %llu, inside the sequence at token %" PRIu64
                           " (bytes %" PRIu64 "-%" PRIu64 "; its header promised %" PRIu64
                           " tokens: truncated while in use?)",
                           sh->path, now, s->offset, at, at + want, sh->n_tokens);
        }
        got += (size_t)n;
    }
    shard_unpack_tokens(ds->raw, (size_t)ds->T + 1, width, ds->buf);
    for (int t = 0; t <= ds->T; t++) {
        const uint32_t id = ds->buf[t];
        if (id < (uint32_t)vocab) continue;
        char fix[96];
        if (id < MODTRAIN_MAX_VOCAB)
            snprintf(fix, sizeof fix, "set vocab_size > %" PRIu32 ", or", id);
        else
            snprintf(fix, sizeof fix,
                     "no vocabulary reaches it, ids end below %d:", MODTRAIN_MAX_VOCAB);
        return err_set(err,
                       "data: '%s' holds token %" PRIu32 " at offset %" PRIu64
                       ", outside vocab_size = %d (%s give shards of this vocabulary)",
                       sh->path, id, s->offset + (uint64_t)t, vocab, fix);
    }
    for (int t = 0; t < ds->T; t++) {
        inputs[t] = (int)ds->buf[t];
        targets[t] = (int)ds->buf[t + 1];
    }
    return 0;
}

/* ------------------------------------------------------------------ open */

/* Reads one shard's header into sh. Returns 0 or -1 with err set. */
static int read_header(DsShard *sh, int T, Err *err) {
    struct stat st;
    Err e;
    const int fd = open_regular(sh->path, O_RDONLY, &st, &e);
    if (fd < 0) return err_set(err, "data: %s (give a token shard from 'modtrain prep')", e.msg);
    uint8_t head[HDR_BYTES];
    ssize_t got = pread(fd, head, sizeof head, 0);
    const int saved = errno;
    close(fd);
    if (got < 0)
        return err_set(err, "data: cannot read '%s': %s", sh->path, strerror(saved));
    size_t n = 0;
    if (shard_parse_header(head, (size_t)got, (uint64_t)st.st_size, sh->path, &n, &sh->meta, err) !=
        0)
        return -1;
    sh->n_tokens = n;
    sh->file_size = (uint64_t)st.st_size;
    sh->n_seqs = n > (size_t)T ? (n - 1) / (size_t)T : 0;
    return 0;
}

static int has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The shard paths a pattern names, in byte order: the path itself, or a
 * glob's matches (at least one). Returns the count, or -1 with err set. */
static int expand(const char *pattern, char ***out, Err *err) {
    if (!has_glob_chars(pattern)) {
        *out = xcalloc(1, sizeof(char *));
        (*out)[0] = xstrdup(pattern);
        return 1;
    }
    glob_t g;
    const int rc = glob(pattern, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        globfree(&g);
        return err_set(err,
                       "data: '%s' matches no file (give a shard, a pattern such as "
                       "'data/train_*.bin', or a blend W:PATTERN,...)",
                       pattern);
    }
    if (rc != 0) {
        globfree(&g);
        return err_set(err, "data: cannot expand '%s': %s", pattern,
                       rc == GLOB_NOSPACE ? "out of memory" : "a folder could not be read");
    }
    if (g.gl_pathc > DS_MAX_SHARDS) {
        globfree(&g);
        return err_set(err, "data: '%s' matches %zu files, more than %d shards", pattern,
                       (size_t)g.gl_pathc, DS_MAX_SHARDS);
    }
    const int n = (int)g.gl_pathc;
    *out = xcalloc((size_t)n, sizeof(char *));
    for (int i = 0; i < n; i++) (*out)[i] = xstrdup(g.gl_pathv[i]);
    globfree(&g);
    qsort(*out, (size_t)n, sizeof(char *), cmp_str);
    return n;
}

/* s (at most n - 1 bytes of it) for a one-line message: control bytes
 * shown as '?'. */
static const char *shown(const char *s, char *buf, size_t n) {
    size_t k = 0;
    for (; s[k] && k + 1 < n; k++) buf[k] = (unsigned char)s[k] < 0x20 || s[k] == 0x7f ? '?' : s[k];
    buf[k] = '\0';
    return buf;
}

int ds_parse_spec(const char *spec, char **pats, double *w, Err *err) {
    if (!spec[0]) return err_set(err, "data: the spec is empty (give a shard or a pattern)");
    int n = 0;
    char *item = NULL, sp[201], si[201];
    for (const char *p = spec;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (n == DS_MAX_PARTS) {
            err_set(err, "data: '%s' blends more than %d datasets", shown(spec, sp, sizeof sp),
                    DS_MAX_PARTS);
            goto fail;
        }
        item = xcalloc(len + 1, 1);
        memcpy(item, p, len);
        const char *colon = strchr(item, ':');
        double v = 1;
        int has_w = 0;
        if (colon) {
            char num[64];
            const size_t nl = (size_t)(colon - item);
            snprintf(num, sizeof num, "%.*s", (int)(nl < 63 ? nl : 63), item);
            has_w = nl < 63 && parse_f64(num, &v) == 0;
            if (has_w && !(v > 0)) {
                err_set(err,
                        "data: the weight '%s' of '%s' is not a positive number (blends are "
                        "W:PATTERN,... with W > 0)",
                        shown(num, sp, sizeof sp), shown(item, si, sizeof si));
                goto fail;
            }
        }
        if (!has_w && (comma || n > 0)) {
            err_set(err,
                    "data: '%s' in the blend '%s' has no weight (write each part as "
                    "W:PATTERN, e.g. 0.7:web/train_*.bin,0.3:code/train_*.bin)",
                    shown(item, si, sizeof si), shown(spec, sp, sizeof sp));
            goto fail;
        }
        const char *pat = has_w ? colon + 1 : item;
        if (!pat[0]) {
            err_set(err, "data: a part of '%s' names no shard (expected W:PATTERN)",
                    shown(spec, sp, sizeof sp));
            goto fail;
        }
        pats[n] = xstrdup(pat);
        w[n++] = v;
        free(item);
        item = NULL;
        if (!comma) break;
        p = comma + 1;
    }
    return n;
fail:
    free(item);
    for (int d = 0; d < n; d++) free(pats[d]);
    return -1;
}

/* Checks that a shard was written by the same tokenizer and vocabulary as
 * the first one. Returns 0 or -1 with err naming both. */
static int check_same_tokens(const DsShard *first, const DsShard *sh, Err *err) {
    const ShardMeta *a = &first->meta, *b = &sh->meta;
    if (a->width != b->width)
        return err_set(err,
                       "data: '%s' holds uint%d tokens, but '%s' uint%d; a dataset's shards need "
                       "one vocabulary (prep them alike)",
                       sh->path, 8 * b->width, first->path, 8 * a->width);
    if (a->vocab == b->vocab && a->tokenizer == b->tokenizer && a->vocab_hash == b->vocab_hash)
        return 0;
    char wa[96], wb[96];
    shard_describe_tokenizer(a, wa, sizeof wa);
    shard_describe_tokenizer(b, wb, sizeof wb);
    return err_set(err,
                   "data: '%s' was written by %s with vocabulary size %d, but '%s' by %s with %d; "
                   "a dataset's shards need one tokenizer (prep them alike)",
                   sh->path, wb, b->vocab, first->path, wa, a->vocab);
}

/* What opening and unpacking share once the shards are known: the blend's
 * quotas and schedule, and the read buffer. Returns 0 or -1. */
static int ds_finish(Dataset *ds, Err *err) {
    if (ds->n_parts > 1) {
        double w[DS_MAX_PARTS];
        for (int d = 0; d < ds->n_parts; d++) w[d] = ds->parts[d].given;
        if (blend_quotas(ds, w, err) != 0) return -1;
        blend_schedule(ds);
    }
    ds->buf = xmalloc(((size_t)ds->T + 1) * sizeof *ds->buf);
    ds->raw = xmalloc(((size_t)ds->T + 1) * sizeof *ds->buf); /* the widest tokens */
    return 0;
}

int ds_open(Dataset *ds, const char *spec, int T, uint64_t seed, Err *err) {
    memset(ds, 0, sizeof *ds);
    for (int i = 0; i < DS_FILES; i++) ds->files[i].fd = -1;
    ds->T = T;
    ds->seed = seed;
    char *pats[DS_MAX_PARTS];
    double w[DS_MAX_PARTS], wmax = 0, wsum = 0;
    const int np = ds_parse_spec(spec, pats, w, err);
    if (np < 0) return -1;
    for (int d = 0; d < np; d++) wmax = fmax(wmax, w[d]);
    ds->parts = xcalloc((size_t)np, sizeof(DsPart));
    ds->n_parts = np;
    for (int d = 0; d < np; d++) {
        ds->parts[d].pattern = pats[d];
        ds->parts[d].given = w[d];
        wsum += w[d] / wmax; /* over the largest first, so that no sum overflows */
    }
    int rc = 0;
    const DsShard *first = NULL;
    for (int d = 0; d < np && rc == 0; d++) {
        DsPart *p = &ds->parts[d];
        p->weight = w[d] / wmax / wsum;
        char **paths = NULL;
        const int n = expand(p->pattern, &paths, err);
        if (n < 0) {
            rc = -1;
            break;
        }
        p->shards = xcalloc((size_t)n, sizeof(DsShard));
        p->n_shards = n;
        for (int s = 0; s < n; s++) p->shards[s].path = paths[s];
        free(paths);
        for (int s = 0; s < n && rc == 0; s++) {
            DsShard *sh = &p->shards[s];
            rc = read_header(sh, T, err);
            if (rc == 0 && first) rc = check_same_tokens(first, sh, err);
            if (rc != 0) break;
            if (!first) first = sh;
            sh->first_seq = p->n_seqs;
            p->n_seqs += sh->n_seqs;
            p->n_tokens += sh->n_tokens;
        }
        if (rc == 0 && p->n_seqs == 0)
            rc = err_set(err,
                         "data: '%s' holds no sequence of seq_len + 1 = %d tokens (its largest "
                         "shard is shorter; lower seq_len or give more text)",
                         p->pattern, T + 1);
    }
    if (rc == 0) rc = ds_finish(ds, err);
    if (rc != 0) ds_free(ds);
    return rc;
}

/* ------------------------------------------------------- one rank reads */

/* A growing byte buffer for ds_pack. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} Buf;

static void put(Buf *b, const void *v, size_t n) {
    if (b->n + n > b->cap) b->p = xrealloc(b->p, b->cap = 2 * (b->n + n) + 256);
    memcpy(b->p + b->n, v, n);
    b->n += n;
}

static void put_u64(Buf *b, uint64_t v) { put(b, &v, sizeof v); }

static void put_str(Buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

uint8_t *ds_pack(const Dataset *ds, size_t *len) {
    Buf b = {NULL, 0, 0};
    put_u64(&b, (uint64_t)ds->n_parts);
    for (int d = 0; d < ds->n_parts; d++) {
        const DsPart *p = &ds->parts[d];
        put_str(&b, p->pattern);
        put(&b, &p->given, sizeof p->given);
        put(&b, &p->weight, sizeof p->weight);
        put_u64(&b, (uint64_t)p->n_shards);
        for (int s = 0; s < p->n_shards; s++) {
            const DsShard *sh = &p->shards[s];
            put_str(&b, sh->path);
            put(&b, sh, sizeof *sh); /* the path pointer in it is replaced on unpacking */
        }
    }
    *len = b.n;
    return b.p;
}

/* The next n bytes of a packed dataset, or NULL past its end. */
static const uint8_t *take(const uint8_t **at, const uint8_t *end, size_t n) {
    if ((size_t)(end - *at) < n) return NULL;
    const uint8_t *p = *at;
    *at += n;
    return p;
}

static int take_u64(const uint8_t **at, const uint8_t *end, uint64_t *v) {
    const uint8_t *p = take(at, end, sizeof *v);
    if (p) memcpy(v, p, sizeof *v);
    return p ? 0 : -1;
}

static char *take_str(const uint8_t **at, const uint8_t *end) {
    uint64_t n;
    const uint8_t *p;
    if (take_u64(at, end, &n) != 0 || n > 1 << 20 || !(p = take(at, end, (size_t)n))) return NULL;
    char *s = xcalloc((size_t)n + 1, 1);
    memcpy(s, p, (size_t)n);
    return s;
}

int ds_unpack(Dataset *ds, const uint8_t *buf, size_t len, int T, uint64_t seed, Err *err) {
    memset(ds, 0, sizeof *ds);
    for (int i = 0; i < DS_FILES; i++) ds->files[i].fd = -1;
    ds->T = T;
    ds->seed = seed;
    const uint8_t *at = buf, *end = buf + len;
    uint64_t np;
    if (take_u64(&at, end, &np) != 0 || np < 1 || np > DS_MAX_PARTS) goto bad;
    ds->parts = xcalloc((size_t)np, sizeof(DsPart));
    ds->n_parts = (int)np;
    for (int d = 0; d < ds->n_parts; d++) {
        DsPart *p = &ds->parts[d];
        uint64_t ns;
        const uint8_t *g, *w;
        if (!(p->pattern = take_str(&at, end)) || !(g = take(&at, end, sizeof p->given)) ||
            !(w = take(&at, end, sizeof p->weight)) || take_u64(&at, end, &ns) != 0 ||
            ns > DS_MAX_SHARDS)
            goto bad;
        memcpy(&p->given, g, sizeof p->given);
        memcpy(&p->weight, w, sizeof p->weight);
        p->shards = xcalloc((size_t)ns, sizeof(DsShard));
        for (; p->n_shards < (int)ns; p->n_shards++) {
            DsShard *sh = &p->shards[p->n_shards];
            char *path = take_str(&at, end);
            const uint8_t *raw = path ? take(&at, end, sizeof *sh) : NULL;
            if (!raw) {
                free(path);
                goto bad;
            }
            memcpy(sh, raw, sizeof *sh);
            sh->path = path;
            p->n_tokens += sh->n_tokens;
            p->n_seqs += sh->n_seqs;
        }
    }
    if (at != end) goto bad;
    if (ds_finish(ds, err) == 0) return 0;
    ds_free(ds);
    return -1;
bad:
    ds_free(ds);
    return err_set(err, "data: a packed dataset of %zu bytes is malformed", len);
}

void ds_free(Dataset *ds) {
    if (!ds->parts) return;
    for (int i = 0; i < DS_FILES; i++)
        if (ds->files[i].fd >= 0) close(ds->files[i].fd);
    for (int d = 0; d < ds->n_parts; d++) {
        DsPart *p = &ds->parts[d];
        for (int s = 0; s < p->n_shards; s++) free(p->shards[s].path);
        free(p->shards);
        free(p->pattern);
    }
    free(ds->parts);
    free(ds->sched);
    free(ds->marks);
    free(ds->buf);
    free(ds->raw);
    memset(ds, 0, sizeof *ds);
}

const ShardMeta *ds_meta(const Dataset *ds) { return &ds->parts[0].shards[0].meta; }

uint64_t ds_tokens(const Dataset *ds) {
    uint64_t n = 0;
    for (int d = 0; d < ds->n_parts; d++) n += ds->parts[d].n_tokens;
    return n;
}

size_t ds_memory(const char *spec, int local_batch, int T, size_t shards) {
    size_t bytes = sat_mul(sat_mul(2 * sizeof(int), (size_t)local_batch), (size_t)T);
    bytes = sat_add(bytes, sat_mul(2 * sizeof(uint32_t), (size_t)T + 1)); /* buf and raw */
    bytes = sat_add(bytes, sat_mul(shards, sizeof(DsShard) + 256));
    char *pats[DS_MAX_PARTS];
    double w[DS_MAX_PARTS];
    const int np = ds_parse_spec(spec, pats, w, NULL);
    for (int d = 0; d < np; d++) free(pats[d]);
    if (np > 1) {
        uint32_t q[DS_MAX_PARTS];
        const uint64_t period = blend_period(w, np, q);
        bytes = sat_add(bytes, (size_t)period);
        bytes = sat_add(bytes, ((size_t)(period >> MARK_BITS) + 1) * (size_t)np * sizeof(uint32_t));
    }
    return bytes;
}

/* ------------------------------------------------------------- identity */

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void shard_identity(const DsShard *sh, char *v, size_t n) {
    if (sh->meta.has_crc)
        snprintf(v, n, "%.180s %" PRIu64 " crc32:%08x", base_name(sh->path), sh->n_tokens,
                 (unsigned)sh->meta.crc);
    else
        snprintf(v, n, "%.180s %" PRIu64 " size:%" PRIu64, base_name(sh->path), sh->n_tokens,
                 sh->file_size);
}

static void part_identity(const DsPart *p, char *v, size_t n) {
    snprintf(v, n, "weight %.9g shards %d tokens %" PRIu64, p->weight, p->n_shards, p->n_tokens);
}

void ds_identity(const Dataset *ds, void (*fn)(void *ctx, const char *key, const char *value),
                 void *ctx) {
    char k[64], v[256];
    snprintf(v, sizeof v, "%d", ds->n_parts);
    fn(ctx, "data.parts", v);
    for (int d = 0; d < ds->n_parts; d++) {
        snprintf(k, sizeof k, "data.p%d", d);
        part_identity(&ds->parts[d], v, sizeof v);
        fn(ctx, k, v);
        for (int s = 0; s < ds->parts[d].n_shards; s++) {
            snprintf(k, sizeof k, "data.p%d.s%d", d, s);
            shard_identity(&ds->parts[d].shards[s], v, sizeof v);
            fn(ctx, k, v);
        }
    }
}

int ds_identity_compare(const Dataset *ds, const char *(*look)(void *ctx, const char *key),
                        void *ctx, Err *why) {
    const char *np = look(ctx, "data.parts");
    if (!np) return 1;
    char k[64], v[256];
    snprintf(v, sizeof v, "%d", ds->n_parts);
    if (strcmp(np, v) != 0)
        return err_set(why, "the checkpoint's run read a blend of %.20s datasets, this spec has %d",
                       np, ds->n_parts);
    for (int d = 0; d < ds->n_parts; d++) {
        const DsPart *p = &ds->parts[d];
        for (int s = 0;; s++) {
            snprintf(k, sizeof k, "data.p%d.s%d", d, s);
            const char *had = look(ctx, k);
            if (s == p->n_shards) {
                if (had)
                    return err_set(why,
                                   "dataset %d ('%s') lacks the shard '%.200s' that the "
                                   "checkpoint's run read as its shard %d (a shard removed?)",
                                   d, p->pattern, had, s);
                break;
            }
            shard_identity(&p->shards[s], v, sizeof v);
            if (!had)
                return err_set(why,
                               "dataset %d ('%s') has a shard %d, '%s', that the checkpoint's "
                               "run did not read (a shard added?)",
                               d, p->pattern, s, p->shards[s].path);
            if (strcmp(had, v) != 0)
                return err_set(why,
                               "shard %d of dataset %d is '%s' now but was '%.200s' for the "
                               "checkpoint's run (a shard added, removed, reordered or rewritten?)",
                               s, d, v, had);
        }
        snprintf(k, sizeof k, "data.p%d", d);
        const char *had = look(ctx, k);
        part_identity(p, v, sizeof v);
        if (!had || strcmp(had, v) != 0)
            return err_set(why, "dataset %d ('%s') is '%s' now but was '%.200s'", d, p->pattern, v,
                           had ? had : "absent");
    }
    return 0;
}
