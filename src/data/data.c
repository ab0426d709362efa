/*
 * data: shard headers and shard I/O.
 */
#include "src/data/data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "src/base/rng.h"
#include "src/base/files.h"
#include "src/base/util.h"

int shard_parse_header(const uint8_t *buf, size_t len, uint64_t file_size, const char *name,
                       size_t *n_tokens, ShardMeta *meta, Err *err) {
    int32_t hdr[SHARD_HEADER_INTS];
    const size_t hbytes = sizeof hdr;
    if (file_size < hbytes || len < hbytes)
        return err_set(err,
                       "data: '%s' is %llu bytes, shorter than the %zu-byte shard header (not a "
                       "token shard?)",
                       name, (unsigned long long)file_size, hbytes);
    memcpy(hdr, buf, hbytes);
    const int width = hdr[0] == SHARD_MAGIC ? 2 : hdr[0] == SHARD_MAGIC_U32 ? 4 : 0;
    if (!width)
        return err_set(err,
                       "data: '%s' has magic %d, expected %d or %d (an llm.c token shard of "
                       "uint16 or uint32 tokens)",
                       name, hdr[0], SHARD_MAGIC, SHARD_MAGIC_U32);
    const int version = width == 2 ? SHARD_VERSION : SHARD_VERSION_U32;
    if (hdr[1] != version)
        return err_set(
            err, "data: '%s' has magic %d and version %d, expected version %d (uint%d tokens)",
            name, hdr[0], hdr[1], version, 8 * width);
    const int vmax = width == 2 ? SHARD_U16_VOCAB : MODTRAIN_MAX_VOCAB;
    if (hdr[3] < 0 || hdr[3] == 1 || hdr[3] > vmax)
        return err_set(err,
                       "data: '%s' says its vocabulary has %d tokens (expected 0 for unknown, or 2 "
                       "to %d for uint%d tokens)",
                       name, hdr[3], vmax, 8 * width);
    if (hdr[4] < SHARD_TOK_UNKNOWN || hdr[4] > SHARD_TOK_LAST)
        return err_set(err,
                       "data: '%s' names tokenizer %d in its header (expected 0 unknown, 1 byte, "
                       "2 gpt2, 3 r50k_base, 4 cl100k_base, 5 o200k_base or 6 llama3)",
                       name, hdr[4]);
    if (hdr[8] != 0 && hdr[8] != 1)
        return err_set(err,
                       "data: '%s' has %d in header slot 8, expected 0 or 1 (whether slot 7 holds "
                       "the tokens' CRC-32)",
                       name, hdr[8]);
    if (hdr[2] < 0) return err_set(err, "data: '%s' has a negative token count %d", name, hdr[2]);
    const size_t n = (size_t)hdr[2];
    const uint64_t expect = hbytes + (uint64_t)n * (uint64_t)width; /* n < 2^31: no overflow */
    if (file_size != expect)
        return err_set(err,
                       "data: '%s' is %llu bytes but its header promises %zu tokens (%llu bytes): "
                       "truncated or corrupt",
                       name, (unsigned long long)file_size, n, (unsigned long long)expect);
    if (n < 2)
        return err_set(
            err, "data: '%s' holds %zu tokens, too few to train on (expected at least 2)", name, n);
    *n_tokens = n;
    meta->width = width;
    meta->vocab = hdr[3];
    meta->tokenizer = hdr[4];
    meta->vocab_hash = (uint64_t)(uint32_t)hdr[6] << 32 | (uint32_t)hdr[5];
    meta->has_crc = hdr[8];
    meta->crc = hdr[8] ? (uint32_t)hdr[7] : 0;
    return 0;
}

int shard_load(Shard *s, const char *path, Err *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", path);
    struct stat st;
    Err e;
    int fd = open_regular(path, O_RDONLY, &st, &e);
    if (fd < 0) return err_set(err, "data: %s (give a token shard from 'modtrain prep')", e.msg);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return err_set(err, "data: cannot open '%s': %s", path, strerror(errno));
    }
    uint8_t head[SHARD_HEADER_INTS * sizeof(int32_t)];
    size_t n = 0;
    const size_t got = fread(head, 1, sizeof head, f);
    if (shard_parse_header(head, got, (uint64_t)st.st_size, path, &n, &s->meta, err) != 0)
        goto fail;
    const size_t bytes = n * (size_t)s->meta.width;
    uint8_t *raw = xmalloc(bytes);
    if (fread(raw, 1, bytes, f) != bytes) {
        free(raw);
        goto io_fail;
    }
    fclose(f);
    s->tokens = xmalloc(n * sizeof *s->tokens);
    shard_unpack_tokens(raw, n, s->meta.width, s->tokens);
    free(raw);
    s->n_tokens = n;
    s->max_token = 0;
    for (size_t i = 0; i < n; i++)
        if (s->tokens[i] > s->max_token) s->max_token = s->tokens[i];
    return 0;
io_fail:
    err_set(err, "data: cannot read '%s': %s", path, strerror(errno ? errno : EIO));
fail:
    fclose(f);
    free(s->tokens);
    s->tokens = NULL;
    return -1;
}

void shard_free(Shard *s) {
    free(s->tokens);
    s->tokens = NULL;
}

static const char *const TOKENIZER_NAMES[SHARD_TOK_LAST + 1] = {
    "unknown", "byte", "gpt2", "r50k_base", "cl100k_base", "o200k_base", "llama3", "hf"};

const char *shard_tokenizer_name(int tokenizer) {
    return tokenizer > 0 && tokenizer <= SHARD_TOK_LAST ? TOKENIZER_NAMES[tokenizer] : "unknown";
}

int shard_tokenizer_code(const char *name) {
    for (int t = 1; t <= SHARD_TOK_LAST; t++)
        if (strcmp(name, TOKENIZER_NAMES[t]) == 0) return t;
    return SHARD_TOK_UNKNOWN;
}

void shard_describe_tokenizer(const ShardMeta *m, char *buf, size_t n) {
    if (m->tokenizer >= SHARD_TOK_GPT2 && m->tokenizer <= SHARD_TOK_LAST)
        snprintf(buf, n, "the %s tokenizer (vocabulary %016llx)",
                 shard_tokenizer_name(m->tokenizer), (unsigned long long)m->vocab_hash);
    else if (m->tokenizer == SHARD_TOK_BYTE) snprintf(buf, n, "the byte tokenizer");
    else snprintf(buf, n, "an unknown tokenizer");
}

int shard_width(int vocab) { return vocab > SHARD_U16_VOCAB ? 4 : 2; }

void shard_header_fill(int32_t hdr[SHARD_HEADER_INTS], size_t n, const ShardMeta *meta) {
    memset(hdr, 0, SHARD_HEADER_INTS * sizeof(int32_t));
    hdr[0] = meta->width == 4 ? SHARD_MAGIC_U32 : SHARD_MAGIC;
    hdr[1] = meta->width == 4 ? SHARD_VERSION_U32 : SHARD_VERSION;
    hdr[2] = (int32_t)n;
    hdr[3] = meta->vocab;
    hdr[4] = meta->tokenizer;
    hdr[5] = (int32_t)(uint32_t)meta->vocab_hash;
    hdr[6] = (int32_t)(uint32_t)(meta->vocab_hash >> 32);
    hdr[7] = meta->has_crc ? (int32_t)meta->crc : 0;
    hdr[8] = meta->has_crc ? 1 : 0;
}

void shard_pack_tokens(const uint32_t *tokens, size_t n, int width, uint8_t *out) {
    for (size_t i = 0; i < n; i++) {
        const uint32_t t = tokens[i];
        out[0] = (uint8_t)t, out[1] = (uint8_t)(t >> 8);
        if (width == 4) out[2] = (uint8_t)(t >> 16), out[3] = (uint8_t)(t >> 24);
        out += width;
    }
}

void shard_unpack_tokens(const uint8_t *in, size_t n, int width, uint32_t *out) {
    if (width == 4)
        for (size_t i = 0; i < n; i++, in += 4)
            out[i] = (uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 |
                     (uint32_t)in[3] << 24;
    else
        for (size_t i = 0; i < n; i++, in += 2) out[i] = (uint32_t)in[0] | (uint32_t)in[1] << 8;
}

int shard_write(const char *path, const uint32_t *tokens, size_t n, const ShardMeta *meta,
                Err *err) {
    if (n > INT32_MAX) {
        return err_set(err, "data: %zu tokens do not fit one shard (max %d)", n, INT32_MAX);
    }
    const int width = meta->width == 4 ? 4 : 2;
    for (size_t i = 0; width == 2 && i < n; i++)
        if (tokens[i] > UINT16_MAX)
            return err_set(err,
                           "data: token %u at offset %zu does not fit a shard of uint16 tokens "
                           "(write uint32 tokens: a vocabulary of %d)",
                           tokens[i], i, meta->vocab);
    const size_t head = SHARD_HEADER_INTS * sizeof(int32_t), bytes = head + n * (size_t)width;
    uint8_t *buf = xcalloc(1, bytes);
    shard_pack_tokens(tokens, n, width, buf + head);
    ShardMeta m = *meta;
    m.width = width;
    m.has_crc = 1;
    m.crc = (uint32_t)crc32_z(0, buf + head, n * (size_t)width);
    shard_header_fill((int32_t *)buf, n, &m);
    int rc = write_file_atomic(path, buf, bytes, err);
    free(buf);
    return rc;
}

size_t shard_num_seqs(const Shard *s, int T) {
    return s->n_tokens > (size_t)T ? (s->n_tokens - 1) / (size_t)T : 0;
}

void shard_get_seq(const Shard *s, size_t w, int T, int *inputs, int *targets) {
    const uint32_t *p = s->tokens + w * (size_t)T;
    for (int t = 0; t < T; t++) {
        inputs[t] = (int)p[t];
        targets[t] = (int)p[t + 1];
    }
}

