/*
 * safetensors: a small JSON reader is enough for the header, whose grammar is
 * fixed: an object of objects holding strings, integer arrays and strings.
 * It stays hand-written rather than jansson (which src/tokenizer/bpe_load.c
 * uses for encoder.json) because it keeps only fixed-size records: a tree of a
 * hostile 100 MiB header takes jansson 1.7 GiB (tiny tensor entries) to
 * 7.7 GiB (empty objects), against the 256 MiB docs/reliability.md promises.
 */
#include "checkpoint/safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/files.h"
#include "src/base/util.h"

typedef struct {
    const char *p, *end;
    const char *why; /* what is wrong, when something is */
} Json;

static int bad(Json *j, const char *why) {
    if (!j->why) j->why = why;
    return 0;
}

static void ws(Json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int expect(Json *j, char c) {
    ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return bad(j, "unexpected character");
}

static int peek(Json *j, char c) {
    ws(j);
    return j->p < j->end && *j->p == c;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads a JSON string into out (n bytes with the NUL); a longer one is an
 * error, not a truncation (two long names must not become one). \u escapes
 * outside ASCII read as '?'; names modtrain knows are ASCII. */
static int jstring(Json *j, char *out, size_t n) {
    if (!expect(j, '"')) return 0;
    size_t k = 0;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if ((unsigned char)c < 0x20) return bad(j, "control character in a string");
        if (c == '\\') {
            if (j->p >= j->end) break;
            char e = *j->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case '"':
            case '\\':
            case '/': c = e; break;
            case 'u': {
                int v = 0;
                for (int i = 0; i < 4; i++) {
                    int h = j->p < j->end ? hexval(*j->p++) : -1;
                    if (h < 0) return bad(j, "malformed \\u escape");
                    v = v * 16 + h;
                }
                c = v > 0 && v < 0x80 ? (char)v : '?';
                break;
            }
            default: return bad(j, "unknown escape in a string");
            }
        }
        if (k + 1 >= n) return bad(j, "string too long");
        out[k++] = c;
    }
    out[k] = '\0';
    return expect(j, '"');
}

/* A non-negative JSON integer below 2^63, read within the buffer. */
static int jint(Json *j, int64_t *v) {
    ws(j);
    uint64_t x = 0;
    const char *p0 = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (x > (uint64_t)(INT64_MAX - 9) / 10) return bad(j, "integer out of range");
        x = x * 10 + (uint64_t)(*j->p++ - '0');
    }
    if (j->p == p0) return bad(j, "expected a non-negative integer");
    if (j->p - p0 > 1 && *p0 == '0') return bad(j, "integer with a leading zero");
    *v = (int64_t)x;
    return 1;
}

static int jint_array(Json *j, int64_t *v, int max, int *n, const char *too_many) {
    *n = 0;
    if (!expect(j, '[')) return 0;
    if (peek(j, ']')) return expect(j, ']');
    do {
        int64_t x;
        if (!jint(j, &x)) return 0;
        if (*n == max) return bad(j, too_many);
        v[(*n)++] = x;
    } while (peek(j, ',') && expect(j, ','));
    return expect(j, ']');
}

static int parse_tensor(Json *j, StTensor *t) {
    int64_t offs[2];
    int noffs = -1, have_dtype = 0, have_shape = 0;
    if (!expect(j, '{')) return 0;
    if (!peek(j, '}')) do {
            char key[64];
            if (!jstring(j, key, sizeof key) || !expect(j, ':')) return 0;
            if (strcmp(key, "dtype") == 0 && !have_dtype) {
                if (!jstring(j, t->dtype, sizeof t->dtype)) return 0;
                have_dtype = 1;
            } else if (strcmp(key, "shape") == 0 && !have_shape) {
                if (!jint_array(j, t->shape, ST_MAX_DIMS, &t->ndim, "more than 4 dimensions"))
                    return 0;
                have_shape = 1;
            } else if (strcmp(key, "data_offsets") == 0 && noffs < 0) {
                if (!jint_array(j, offs, 2, &noffs, "data_offsets of more than 2 numbers"))
                    return 0;
                if (noffs != 2) return bad(j, "data_offsets of fewer than 2 numbers");
            } else {
                return bad(j, "unknown or repeated key in a tensor entry");
            }
        } while (peek(j, ',') && expect(j, ','));
    if (!expect(j, '}')) return 0;
    if (!have_dtype || !have_shape || noffs != 2)
        return bad(j, "a tensor entry lacks dtype, shape or data_offsets");
    t->begin = (uint64_t)offs[0];
    t->end = (uint64_t)offs[1];
    return 1;
}

size_t st_numel(const StTensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i]; /* checked by st_parse */
    return n;
}

static int parse_meta(Json *j, StFile *f) {
    if (!expect(j, '{')) return 0;
    if (!peek(j, '}')) do {
            StMeta m;
            if (!jstring(j, m.key, sizeof m.key) || !expect(j, ':') ||
                !jstring(j, m.value, sizeof m.value))
                return 0;
            if (f->nmeta == ST_MAX_META) return bad(j, "more than 1024 metadata keys");
            f->meta = xrealloc(f->meta, (size_t)(f->nmeta + 1) * sizeof(StMeta));
            f->meta[f->nmeta++] = m;
        } while (peek(j, ',') && expect(j, ','));
    return expect(j, '}');
}

/* The JSON header: one object of tensor entries and at most one
 * "__metadata__", then nothing but spaces. */
static int parse_header(Json *j, StFile *f) {
    int cap = 0, seen_meta = 0;
    if (!expect(j, '{')) return 0;
    if (!peek(j, '}')) do {
            char name[sizeof f->t[0].name];
            if (!jstring(j, name, sizeof name) || !expect(j, ':')) return 0;
            if (strcmp(name, "__metadata__") == 0) {
                if (seen_meta++) return bad(j, "__metadata__ appears twice");
                if (!parse_meta(j, f)) return 0;
                continue;
            }
            if (f->nt == ST_MAX_TENSORS) return bad(j, "more than 65536 tensors");
            if (f->nt == cap) {
                cap = cap ? 2 * cap : 64;
                f->t = xrealloc(f->t, (size_t)cap * sizeof(StTensor));
            }
            StTensor *t = &f->t[f->nt];
            memset(t, 0, sizeof *t);
            snprintf(t->name, sizeof t->name, "%s", name);
            if (!parse_tensor(j, t)) return 0;
            f->nt++;
        } while (peek(j, ',') && expect(j, ','));
    if (!expect(j, '}')) return 0;
    ws(j);
    if (j->p != j->end) return bad(j, "bytes after the JSON object");
    return 1;
}

static int by_string(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first of n strings (each at base + i * stride) that appears twice, or
 * NULL: sorted, so a header of many names is checked in n log n, not n^2. */
static const char *twice(const char *base, size_t stride, int n) {
    const char **s = xcalloc((size_t)n + 1, sizeof *s);
    for (int i = 0; i < n; i++) s[i] = base + (size_t)i * stride;
    qsort(s, (size_t)n, sizeof *s, by_string);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(s[i - 1], s[i]) == 0) dup = s[i];
    free(s);
    return dup;
}

static int by_begin(const void *a, const void *b) {
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Every tensor F32, BF16 or F16, its byte size its shape's (checked), and
 * the tensors tiling the data section exactly: no overlap, no gap, nothing
 * after. */
static int check_tensors(StFile *f, Err *err) {
    for (int i = 0; i < f->nt; i++) {
        StTensor *t = &f->t[i];
        t->kind = strcmp(t->dtype, "F32") == 0    ? ST_F32
                  : strcmp(t->dtype, "BF16") == 0 ? ST_BF16
                  : strcmp(t->dtype, "F16") == 0  ? ST_F16
                                                  : -1;
        if (t->kind < 0)
            return err_set(err,
                           "safetensors: '%s': tensor '%s' has dtype '%s' (modtrain reads F32, "
                           "BF16 and F16)",
                           f->path, t->name, t->dtype);
        size_t bytes = t->kind == ST_F32 ? 4 : 2;
        for (int d = 0; d < t->ndim; d++)
            if (size_mul(bytes, (size_t)t->shape[d], &bytes) != 0)
                return err_set(err,
                               "safetensors: '%s': tensor '%s' has a shape whose size overflows",
                               f->path, t->name);
        if (t->end < t->begin || t->end - t->begin != bytes)
            return err_set(
                err,
                "safetensors: '%s': tensor '%s' has data_offsets [%llu, %llu], its shape "
                "needs %zu bytes",
                f->path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end, bytes);
    }
    const StTensor **order = xcalloc((size_t)f->nt + 1, sizeof *order);
    for (int i = 0; i < f->nt; i++) order[i] = &f->t[i];
    qsort(order, (size_t)f->nt, sizeof *order, by_begin);
    uint64_t at = 0;
    int rc = 0;
    for (int i = 0; i < f->nt && rc == 0; i++) {
        const StTensor *t = order[i];
        if (t->begin < at)
            rc =
                err_set(err, "safetensors: '%s': tensors '%s' and '%s' overlap in the data section",
                        f->path, order[i - 1]->name, t->name);
        else if (t->begin > at)
            rc = err_set(err,
                         "safetensors: '%s': bytes [%llu, %llu) of the data section belong to no "
                         "tensor",
                         f->path, (unsigned long long)at, (unsigned long long)t->begin);
        at = t->end;
    }
    if (rc == 0 && at != f->data_len)
        rc = err_set(err,
                     "safetensors: '%s': the tensors end at byte %llu of the %zu-byte data section "
                     "(%s)",
                     f->path, (unsigned long long)at, f->data_len,
                     at > f->data_len ? "truncated file?" : "bytes after the last tensor");
    free(order);
    return rc;
}

int st_parse(StFile *f, const uint8_t *buf, size_t len, const char *name, Err *err) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", name);
    f->file = buf;
    f->file_len = len;
    uint64_t hlen = 0;
    if (len < 8) return err_set(err, "safetensors: '%s' is truncated (%zu bytes)", name, len);
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > len - 8) {
        err_set(err,
                "safetensors: '%s' is truncated (%zu bytes, shorter than its %llu-byte header)",
                name, len, (unsigned long long)hlen);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        err_set(err, "safetensors: '%s' has a %llu-byte header (at most %d)", name,
                (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    f->data = buf + 8 + hlen;
    f->data_len = len - 8 - hlen;
    Json j = {(const char *)buf + 8, (const char *)buf + 8 + hlen, NULL};
    if (!parse_header(&j, f)) {
        err_set(err, "safetensors: '%s' has a malformed JSON header at byte %ld: %s", name,
                (long)(j.p - (const char *)buf), j.why ? j.why : "unexpected character");
        goto fail;
    }
    const char *dup = f->nt ? twice(f->t[0].name, sizeof f->t[0], f->nt) : NULL;
    if (dup) {
        err_set(err,
                "safetensors: '%s' has a malformed JSON header: a tensor name appears twice "
                "('%s')",
                name, dup);
        goto fail;
    }
    dup = f->nmeta ? twice(f->meta[0].key, sizeof f->meta[0], f->nmeta) : NULL;
    if (dup) {
        err_set(err,
                "safetensors: '%s' has a malformed JSON header: a metadata key appears twice "
                "('%s')",
                name, dup);
        goto fail;
    }
    if (check_tensors(f, err) != 0) goto fail;
    return 0;
fail:
    free(f->t);
    free(f->meta);
    memset(f, 0, sizeof *f);
    return -1;
}

int st_read(StFile *f, const char *path, Err *err) {
    size_t len = 0;
    Err e;
    uint8_t *buf = (uint8_t *)read_file(path, SIZE_MAX, &len, &e);
    if (!buf) {
        memset(f, 0, sizeof *f);
        return err_set(err, "safetensors: %s", e.msg);
    }
    if (st_parse(f, buf, len, path, err) != 0) {
        free(buf);
        return -1;
    }
    f->owned = buf;
    return 0;
}

/* IEEE half to float: exact (every half is a float). */
static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t bits;
    if (e == 0x1f) bits = sign | 0x7f800000u | (m << 13); /* inf, NaN */
    else if (e) bits = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) bits = sign;
    else { /* subnormal: m * 2^-24, normalised */ int k = 0;
        uint32_t mm = m;
        while (!(mm & 0x400)) mm <<= 1, k++;
        bits = sign | ((uint32_t)(113 - k) << 23) | ((mm & 0x3ff) << 13);
    }
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

float st_float(const StTensor *t, const StFile *f, size_t i) {
    const uint8_t *p = f->data + t->begin; /* data may sit at any alignment */
    if (t->kind == ST_F32) {
        float v;
        memcpy(&v, p + 4 * i, sizeof v);
        return v;
    }
    const uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8); /* little-endian */
    if (t->kind == ST_F16) return half_to_float(h);
    const uint32_t bits = (uint32_t)h << 16; /* BF16: a float's upper half */
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

void st_free(StFile *f) {
    free(f->t);
    free(f->meta);
    free(f->owned);
    memset(f, 0, sizeof *f);
}

const StTensor *st_find(const StFile *f, const char *name) {
    for (int i = 0; i < f->nt; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

const char *st_meta(const StFile *f, const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    return NULL;
}

/* Appends printf output to a growing buffer. */
typedef struct {
    char *s;
    size_t n, cap;
} Buf;

static void bprintf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(Buf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        b->cap = b->cap * 2 + (size_t)k + 64;
        b->s = xrealloc(b->s, b->cap);
    }
}

int st_write(const char *path, const StOut *t, int n, const StMeta *meta, int nmeta, Err *err) {
    Buf h = {xmalloc(4096), 0, 4096};
    h.s[0] = '\0';
    bprintf(&h, "{\"__metadata__\":{");
    for (int i = 0; i < nmeta; i++)
        bprintf(&h, "%s\"%s\":\"%s\"", i ? "," : "", meta[i].key, meta[i].value);
    bprintf(&h, "}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        bprintf(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", t[i].name);
        for (int d = 0; d < t[i].ndim; d++) {
            bprintf(&h, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
            numel *= (size_t)t[i].shape[d];
        }
        bprintf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                (unsigned long long)(off + numel * 4));
        off += numel * 4;
    }
    bprintf(&h, "}");
    while (h.n % 8) bprintf(&h, " "); /* data starts 8-byte aligned */
    size_t total = 8 + h.n + off;
    uint8_t *buf = xmalloc(total);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
    memcpy(buf + 8, h.s, h.n);
    uint8_t *p = buf + 8 + h.n;
    for (int i = 0; i < n; i++) {
        size_t bytes = 4;
        for (int d = 0; d < t[i].ndim; d++) bytes *= (size_t)t[i].shape[d];
        memcpy(p, t[i].data, bytes);
        p += bytes;
    }
    int rc = write_file_atomic(path, buf, total, err);
    free(buf);
    free(h.s);
    return rc;
}
