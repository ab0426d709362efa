/*
 * safetensors: a small JSON reader is enough for the header, whose grammar is
 * fixed: an object of objects holding strings, integer arrays and strings.
 */
#include "checkpoint/safetensors.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/util.h"

typedef struct {
    const char *p, *end;
    int bad;
} Json;

static void ws(Json *j) {
    while (j->p < j->end && isspace((unsigned char)*j->p)) j->p++;
}

static int expect(Json *j, char c) {
    ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    j->bad = 1;
    return 0;
}

static int peek(Json *j, char c) {
    ws(j);
    return j->p < j->end && *j->p == c;
}

/* Reads a JSON string into out (truncated to n-1 bytes). */
static int jstring(Json *j, char *out, size_t n) {
    if (!expect(j, '"')) return 0;
    size_t k = 0;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\' && j->p < j->end) {
            char e = *j->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u':
                if (j->end - j->p < 4) {
                    j->bad = 1;
                    return 0;
                }
                c = '?';
                j->p += 4;
                break;
            default: c = e;
            }
        }
        if (k + 1 < n) out[k++] = c;
    }
    if (k < n) out[k] = '\0';
    return expect(j, '"');
}

static int jint(Json *j, int64_t *v) {
    ws(j);
    char *e;
    errno = 0;
    long long x = strtoll(j->p, &e, 10);
    if (e == j->p || errno || x < 0) {
        j->bad = 1;
        return 0;
    }
    j->p = e;
    *v = x;
    return 1;
}

static int jint_array(Json *j, int64_t *v, int max, int *n) {
    *n = 0;
    if (!expect(j, '[')) return 0;
    if (peek(j, ']')) return expect(j, ']');
    do {
        int64_t x;
        if (!jint(j, &x)) return 0;
        if (*n < max) v[*n] = x;
        (*n)++;
    } while (peek(j, ',') && expect(j, ','));
    return expect(j, ']');
}

static int parse_tensor(Json *j, StTensor *t) {
    int64_t offs[2];
    int noffs = 0, have_dtype = 0, have_shape = 0;
    if (!expect(j, '{')) return 0;
    if (!peek(j, '}')) do {
            char key[64];
            if (!jstring(j, key, sizeof key) || !expect(j, ':')) return 0;
            if (strcmp(key, "dtype") == 0) {
                if (!jstring(j, t->dtype, sizeof t->dtype)) return 0;
                have_dtype = 1;
            } else if (strcmp(key, "shape") == 0) {
                if (!jint_array(j, t->shape, 4, &t->ndim)) return 0;
                if (t->ndim > 4) {
                    j->bad = 1;
                    return 0;
                }
                have_shape = 1;
            } else if (strcmp(key, "data_offsets") == 0) {
                if (!jint_array(j, offs, 2, &noffs) || noffs != 2) {
                    j->bad = 1;
                    return 0;
                }
            } else {
                j->bad = 1;
                return 0;
            }
        } while (peek(j, ',') && expect(j, ','));
    if (!expect(j, '}')) return 0;
    if (!have_dtype || !have_shape || noffs != 2) {
        j->bad = 1;
        return 0;
    }
    t->begin = (uint64_t)offs[0];
    t->end = (uint64_t)offs[1];
    return 1;
}

size_t st_numel(const StTensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

int st_read(StFile *f, const char *path, Err *err) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    errno = 0;
    f->file = (uint8_t *)read_file(path, &f->file_len);
    if (!f->file) {
        return err_set(err, "safetensors: cannot read '%s': %s", path,
                       strerror(errno ? errno : EIO));
    }
    uint64_t hlen = 0;
    if (f->file_len < 8) goto truncated;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->file[i];
    if (hlen > f->file_len - 8) goto truncated;
    f->data = f->file + 8 + hlen;
    f->data_len = f->file_len - 8 - hlen;
    Json j = {(const char *)f->file + 8, (const char *)f->file + 8 + hlen, 0};
    int cap = 0;
    if (!expect(&j, '{')) goto bad_header;
    if (!peek(&j, '}')) do {
            char name[128];
            if (!jstring(&j, name, sizeof name) || !expect(&j, ':')) goto bad_header;
            if (strcmp(name, "__metadata__") == 0) {
                if (!expect(&j, '{')) goto bad_header;
                if (!peek(&j, '}')) do {
                        StMeta m;
                        if (!jstring(&j, m.key, sizeof m.key) || !expect(&j, ':') ||
                            !jstring(&j, m.value, sizeof m.value))
                            goto bad_header;
                        f->meta = xrealloc(f->meta, (size_t)(f->nmeta + 1) * sizeof(StMeta));
                        f->meta[f->nmeta++] = m;
                    } while (peek(&j, ',') && expect(&j, ','));
                if (!expect(&j, '}')) goto bad_header;
                continue;
            }
            if (f->nt == cap) {
                cap = cap ? 2 * cap : 64;
                f->t = xrealloc(f->t, (size_t)cap * sizeof(StTensor));
            }
            StTensor *t = &f->t[f->nt];
            memset(t, 0, sizeof *t);
            snprintf(t->name, sizeof t->name, "%s", name);
            if (!parse_tensor(&j, t)) goto bad_header;
            f->nt++;
            if (t->end < t->begin || t->end > f->data_len) {
                err_set(err,
                        "safetensors: '%s': tensor '%s' has data_offsets [%llu, %llu] outside the "
                        "%zu data bytes (truncated file?)",
                        path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                        f->data_len);
                goto fail;
            }
            if (strcmp(t->dtype, "F32") == 0 && t->end - t->begin != st_numel(t) * 4) {
                err_set(err, "safetensors: '%s': tensor '%s' holds %llu bytes, its shape needs %zu",
                        path, t->name, (unsigned long long)(t->end - t->begin), st_numel(t) * 4);
                goto fail;
            }
        } while (peek(&j, ',') && expect(&j, ','));
    if (!expect(&j, '}') || j.bad) goto bad_header;
    return 0;
truncated:
    err_set(err, "safetensors: '%s' is truncated (%zu bytes, shorter than its header says)", path,
            f->file_len);
    goto fail;
bad_header:
    err_set(err, "safetensors: '%s' has a malformed JSON header near byte %ld", path,
            (long)(j.p - (const char *)f->file));
fail:
    st_free(f);
    return -1;
}

void st_free(StFile *f) {
    free(f->t);
    free(f->meta);
    free(f->file);
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
