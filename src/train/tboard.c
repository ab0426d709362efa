/*
 * tboard: TensorBoard's event files, each Event encoded by hand (the few
 * fields used: wall_time 1, step 2, file_version 3, summary 5, session_log
 * 7; Summary.value 1; Value.tag 1, Value.simple_value 2; SessionLog.status
 * 1, START = 1) and framed as TFRecords.
 */
#include "src/train/tboard.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "src/base/files.h"

struct TBoard {
    FILE *f;
    char path[PATH_MAX + 96];
    unsigned char *buf; /* framed records not yet written */
    size_t len, cap;
};

/* ------------------------------------------------------------- CRC32C */

static uint32_t crc_table[256];

uint32_t crc32c(const void *p, size_t n) {
    if (!crc_table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            crc_table[i] = c;
        }
    const unsigned char *b = p;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ b[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t crc32c_masked(const void *p, size_t n) {
    const uint32_t c = crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ------------------------------------------------ protocol buffer bytes */

typedef struct {
    unsigned char *b;
    size_t len, cap;
} Bytes;

static void bytes_put(Bytes *o, const void *p, size_t n) {
    if (o->len + n > o->cap) {
        o->cap = 2 * (o->len + n) + 64;
        o->b = xrealloc(o->b, o->cap);
    }
    memcpy(o->b + o->len, p, n);
    o->len += n;
}

static void varint(Bytes *o, uint64_t v) {
    unsigned char t[10];
    int n = 0;
    do {
        t[n] = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v) t[n] |= 0x80;
        n++;
    } while (v);
    bytes_put(o, t, (size_t)n);
}

static void key(Bytes *o, int field, int wire) { varint(o, (uint64_t)(field << 3 | wire)); }

static void le(Bytes *o, uint64_t v, int n) {
    unsigned char t[8];
    for (int i = 0; i < n; i++) t[i] = (unsigned char)(v >> (8 * i));
    bytes_put(o, t, (size_t)n);
}

static void field_bytes(Bytes *o, int field, const void *p, size_t n) {
    key(o, field, 2);
    varint(o, n);
    bytes_put(o, p, n);
}

/* An Event's wall_time and step. */
static void event_head(Bytes *e, int step) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    const double wall = (double)tv.tv_sec + tv.tv_usec * 1e-6;
    uint64_t bits;
    memcpy(&bits, &wall, sizeof bits);
    key(e, 1, 1);
    le(e, bits, 8);
    if (step == 0) return; /* proto3 leaves a default out */
    key(e, 2, 0);
    varint(e, (uint64_t)(int64_t)step);
}

/* Frames an Event as a TFRecord in tb's buffer. */
static void frame(TBoard *tb, const Bytes *e) {
    Bytes r = {tb->buf, tb->len, tb->cap};
    unsigned char n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((uint64_t)e->len >> (8 * i));
    bytes_put(&r, n8, 8);
    le(&r, crc32c_masked(n8, 8), 4);
    bytes_put(&r, e->b, e->len);
    le(&r, crc32c_masked(e->b, e->len), 4);
    tb->buf = r.b, tb->len = r.len, tb->cap = r.cap;
}

/* ----------------------------------------------------------- the file */

TBoard *tb_open(const char *dir, int first_step, Err *err) {
    if (mkdirs(dir) != 0) {
        err_set(err, "cannot create '%s': %s", dir, strerror(errno));
        return NULL;
    }
    char host[64] = "host";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "host");
    host[sizeof host - 1] = '\0';
    TBoard *tb = xcalloc(1, sizeof *tb);
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%010lld.%s.%d", dir,
             (long long)time(NULL), host, (int)getpid());
    if (!(tb->f = open_output(tb->path, 0, err))) {
        free(tb);
        return NULL;
    }
    Bytes e = {0};
    event_head(&e, 0);
    field_bytes(&e, 3, "brain.Event:2", 13);
    frame(tb, &e);
    e.len = 0;
    event_head(&e, first_step);
    const unsigned char start[2] = {0x08, 0x01}; /* SessionLog.status = START */
    field_bytes(&e, 7, start, sizeof start);
    frame(tb, &e);
    free(e.b);
    if (tb_flush(tb, err) != 0) {
        tb_close(tb, NULL);
        return NULL;
    }
    return tb;
}

void tb_add(TBoard *tb, const Record *rec) {
    if (!tb || rec->nsc == 0) return;
    Bytes sum = {0}, val = {0}, e = {0};
    for (int i = 0; i < rec->nsc; i++) {
        const RecordScalar *s = &rec->sc[i];
        val.len = 0;
        field_bytes(&val, 1, s->tag, strlen(s->tag));
        uint32_t bits;
        memcpy(&bits, &s->value, sizeof bits);
        key(&val, 2, 5);
        le(&val, bits, 4);
        field_bytes(&sum, 1, val.b, val.len);
    }
    event_head(&e, rec->step);
    field_bytes(&e, 5, sum.b, sum.len);
    frame(tb, &e);
    free(sum.b);
    free(val.b);
    free(e.b);
}

int tb_flush(TBoard *tb, Err *err) {
    if (!tb->f) return err_set(err, "cannot write '%s': it was closed after an error", tb->path);
    const size_t n = tb->len;
    tb->len = 0;
    if ((n && fwrite(tb->buf, 1, n, tb->f) != n) || fflush(tb->f) != 0 || ferror(tb->f))
        return err_set(err, "cannot write '%s': %s", tb->path, strerror(errno));
    return 0;
}

int tb_close(TBoard *tb, Err *err) {
    if (!tb) return 0;
    Err e, e2;
    int rc = tb->f ? tb_flush(tb, &e) : 0;
    if (tb->f && close_output(tb->f, tb->path, &e2) != 0 && rc == 0) rc = -1, e = e2;
    if (rc && err) *err = e;
    free(tb->buf);
    free(tb);
    return rc;
}

const char *tb_path(const TBoard *tb) { return tb->path; }
