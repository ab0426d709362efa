/*
 * test_dataset: the keyed permutation, the blend schedule's proportions
 * over every window, the mapping of samples to shards and offsets against
 * a naive reference, reads, identities, and every way a spec can be bad.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/util.h"
#include "src/data/dataset.h"
#include "testutil.h"

static char dir[] = "/tmp/modtrain-dataset-XXXXXX";

/* Writes shard NAME of n tokens of the given width, token i = (i * mul +
 * add) % 251 + base (vocabulary vocab). Returns 0 or -1. */
static int make_shard_w(const char *name, size_t n, int mul, int add, int width, uint32_t base,
                        int vocab) {
    uint32_t *tok = xmalloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint32_t)((i * (size_t)mul + (size_t)add) % 251) + base;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    const ShardMeta meta = {.width = width, .vocab = vocab, .tokenizer = SHARD_TOK_BYTE};
    const int rc = shard_write(p, tok, n, &meta, NULL);
    free(tok);
    return rc;
}

/* Shard NAME of n byte tokens (uint16), as make_shard_w. */
static int make_shard(const char *name, size_t n, int mul, int add) {
    return make_shard_w(name, n, mul, add, 2, 0, 256);
}

/* fmt with each "@" replaced by the test's folder. */
static void spec_in(char *buf, size_t n, const char *fmt) {
    size_t k = 0;
    for (const char *f = fmt; *f && k + 1 < n; f++) {
        if (*f == '@') k += (size_t)snprintf(buf + k, n - k, "%s", dir);
        else buf[k++] = *f;
        if (k >= n) k = n - 1;
    }
    buf[k] = '\0';
}

static void test_permute(void) {
    const uint64_t ns[] = {1, 2, 3, 5, 17, 64, 1000, 4097, 100003};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const uint64_t n = ns[k];
        uint8_t *seen = xcalloc(n, 1);
        int ok = 1, moved = 0;
        for (uint64_t x = 0; x < n; x++) {
            const uint64_t y = ds_permute(x, n, 42);
            if (y >= n || seen[y]) ok = 0;
            else seen[y] = 1;
            moved += y != x;
        }
        CU_ASSERT(ok); /* a bijection of [0, n) */
        if (n >= 17) CU_ASSERT(moved > (int)(n / 2)); /* and it shuffles */
        free(seen);
    }
    /* another key, another order */
    int differ = 0;
    for (uint64_t x = 0; x < 1000; x++) differ += ds_permute(x, 1000, 1) != ds_permute(x, 1000, 2);
    CU_ASSERT(differ > 900);
}

/* The largest |count - N x weight| over windows of every size from 1 to
 * 10,000 (starting at every 97th sample of the 60,000 that end a run
 * longer than a period, so across a period's end), and the range of the
 * prefix error over that run: below 2 means every window of any length
 * is within 2. `exact`: the weights have a period of their own (not
 * rounded to 2^-22), so the range holds however long the run. */
static void check_blend(const char *spec, int parts, int exact) {
    Dataset ds;
    Err e;
    CU_ASSERT_EQUAL_FATAL(ds_open(&ds, spec, 8, 5, &e), 0);
    CU_ASSERT_EQUAL_FATAL(ds.n_parts, parts);
    CU_ASSERT(exact ? ds.period < ((uint64_t)1 << DS_PERIOD_BITS) : 1);
    const uint64_t L = ds.period + 70000, from = L - 60000;
    uint64_t count[DS_MAX_PARTS] = {0};
    double lo[DS_MAX_PARTS] = {0}, hi[DS_MAX_PARTS] = {0};
    uint32_t *pre = xcalloc((size_t)(L - from + 1) * (size_t)parts, sizeof(uint32_t));
    int ok = 1;
    for (uint64_t g = 0; g <= L; g++) {
        if (g >= from)
            for (int d = 0; d < parts; d++)
                pre[(g - from) * (uint64_t)parts + (uint64_t)d] = (uint32_t)count[d];
        for (int d = 0; d < parts; d++) {
            const double err = (double)count[d] - (double)g * ds.parts[d].weight;
            lo[d] = fmin(lo[d], err), hi[d] = fmax(hi[d], err);
        }
        if (g == L) break;
        DsSample s;
        ds_locate(&ds, g, &s);
        /* the dataset's own count before g is the index the order used */
        ok &= s.index == count[s.part];
        count[s.part]++;
    }
    CU_ASSERT(ok);
    double worst = 0, range = 0;
    for (int d = 0; d < parts; d++) {
        const double w = ds.parts[d].weight;
        range = fmax(range, hi[d] - lo[d]);
        for (uint64_t start = 0; start + 10000 <= L - from; start += 97)
            for (uint64_t n = 1; n <= 10000; n++) {
                const double got = pre[(start + n) * (uint64_t)parts + (uint64_t)d] -
                                   (double)pre[start * (uint64_t)parts + (uint64_t)d];
                worst = worse(worst, fabs(got - (double)n * w));
            }
        /* ds_part_count agrees with the counts, beyond a period too */
        CU_ASSERT_EQUAL(ds_part_count(&ds, d, L), count[d]);
    }
    CU_ASSERT(worst <= 2.0);
    if (exact) CU_ASSERT(range < 2.0);
    if (worst > 2.0 || (exact && range >= 2.0))
        fprintf(stderr, "blend %s: worst window %.3f, prefix range %.3f\n", spec, worst, range);
    free(pre);
    ds_free(&ds);
}

static void test_blend(void) {
    char spec[2048];
    spec_in(spec, sizeof spec, "0.7:@/a.bin,0.3:@/b.bin");
    check_blend(spec, 2, 1);
    spec_in(spec, sizeof spec, "2:@/a.bin,1:@/b.bin,1:@/c.bin"); /* not normalised */
    check_blend(spec, 3, 1);
    spec_in(spec, sizeof spec, "1:@/a.bin,1:@/b.bin,1:@/c.bin"); /* thirds, exactly */
    check_blend(spec, 3, 1);
    spec_in(spec, sizeof spec, "0.01:@/a.bin,0.333:@/b.bin,0.657:@/c.bin");
    check_blend(spec, 3, 1);
    spec_in(spec, sizeof spec, "0.05:@/a.bin,0.1:@/b.bin,0.15:@/c.bin,0.2:@/a.bin,0.22:@/b.bin,0.28:@/c.bin");
    check_blend(spec, 6, 1);
    /* weights of more digits than the exact period takes: rounded */
    spec_in(spec, sizeof spec, "0.123456789:@/a.bin,0.3:@/b.bin");
    check_blend(spec, 2, 0);
    /* random weights of 3 decimals over 2 to 9 parts */
    for (int trial = 0; trial < 5; trial++) {
        const int parts = 2 + (int)(rng_u64(3, 1, (uint64_t)trial) % 8);
        char fmt[1024];
        size_t k = 0;
        for (int d = 0; d < parts; d++)
            k += (size_t)snprintf(fmt + k, sizeof fmt - k, "%s%.3f:@/%c.bin", d ? "," : "",
                                  0.001 + rng_uniform(3, 2, (uint64_t)(trial * 16 + d)),
                                  "abc"[d % 3]);
        spec_in(spec, sizeof spec, fmt);
        check_blend(spec, parts, 1);
    }
}

/* In a blend each dataset's epochs are its own: within each, every one of
 * its sequences once; the next epoch of each dataset in another order. */
static void test_blend_epochs(void) {
    char spec[1024];
    spec_in(spec, sizeof spec, "0.7:@/g_*.bin,0.3:@/a.bin,0.2:@/c.bin");
    Dataset ds;
    Err e;
    const int T = 10;
    CU_ASSERT_EQUAL_FATAL(ds_open(&ds, spec, T, 5, &e), 0);
    CU_ASSERT_EQUAL_FATAL(ds.n_parts, 3);
    int ok = 1, reshuffled = 0;
    for (int d = 0; d < ds.n_parts; d++) {
        const uint64_t n = ds.parts[d].n_seqs;
        uint64_t *order = xcalloc(3 * n, sizeof *order);
        int *seen = xcalloc(3 * n, sizeof *seen);
        uint64_t got = 0;
        for (uint64_t g = 0; got < 3 * n && g < 1000000; g++) {
            DsSample s;
            ds_locate(&ds, g, &s);
            if (s.part != d) continue;
            /* the dataset's samples counted in order, its epochs in turn */
            if (s.index != got || s.epoch != got / n || s.seq >= n) ok = 0;
            else seen[s.epoch * n + s.seq]++, order[got] = s.seq;
            got++;
        }
        if (got != 3 * n) ok = 0;
        for (uint64_t k = 0; k < 3 * n; k++) ok &= seen[k] == 1;
        /* epoch 0 against 1, and 1 against 2: each reorders */
        int d01 = 0, d12 = 0;
        for (uint64_t k = 0; k < n; k++) {
            d01 |= order[k] != order[n + k];
            d12 |= order[n + k] != order[2 * n + k];
        }
        reshuffled += d01 && d12;
        free(order);
        free(seen);
    }
    CU_ASSERT(ok);
    CU_ASSERT_EQUAL(reshuffled, 3);
    ds_free(&ds);
}

/* Every sample of a glob of three shards against a naive reference: the
 * dataset's sequences in shard order, each epoch's permutation, the
 * tokens read. Each epoch visits every sequence once and the next epoch
 * reorders them. */
static void test_locate_and_read(void) {
    char spec[1024];
    spec_in(spec, sizeof spec, "@/g_*.bin");
    Dataset ds;
    Err e;
    const int T = 10;
    CU_ASSERT_EQUAL_FATAL(ds_open(&ds, spec, T, 9, &e), 0);
    /* g_0: 41 tokens = 4 sequences, g_1: 10 = none, g_2: 100 = 9 */
    CU_ASSERT_EQUAL(ds.parts[0].n_shards, 3);
    CU_ASSERT_EQUAL(ds.parts[0].n_seqs, 13);
    CU_ASSERT_EQUAL(ds_tokens(&ds), 151);
    const uint64_t n = 13, first[3] = {0, 4, 4};
    const int adds[3] = {0, 50, 100};
    int seen[2][13] = {{0}}, ok = 1, same_order = 1;
    uint64_t order[2][13];
    for (uint64_t g = 0; g < 2 * n; g++) {
        DsSample s;
        ds_locate(&ds, g, &s);
        const uint64_t epoch = g / n;
        if (s.epoch != epoch || s.index != g || s.seq >= n) ok = 0;
        else seen[epoch][s.seq]++;
        order[epoch][g % n] = s.seq;
        /* the naive mapping of a dataset sequence to (shard, offset) */
        const int shard = s.seq < 4 ? 0 : 2;
        if (s.shard != shard || s.offset != (s.seq - first[shard]) * T) ok = 0;
        int in[10], tg[10];
        CU_ASSERT_EQUAL(ds_read(&ds, &s, 256, in, tg, &e), 0);
        for (int t = 0; t < T; t++) {
            const uint64_t i = s.offset + (uint64_t)t;
            if (in[t] != (int)((i * 3 + (uint64_t)adds[shard]) % 251) ||
                tg[t] != (int)(((i + 1) * 3 + (uint64_t)adds[shard]) % 251))
                ok = 0;
        }
    }
    for (uint64_t k = 0; k < n; k++) {
        if (seen[0][k] != 1 || seen[1][k] != 1) ok = 0;
        same_order &= order[0][k] == order[1][k];
    }
    CU_ASSERT(ok);
    CU_ASSERT(!same_order); /* epochs reshuffle */
    /* another seed, another order; the same seed, the same */
    Dataset other;
    CU_ASSERT_EQUAL_FATAL(ds_open(&other, spec, T, 10, &e), 0);
    int differ = 0;
    for (uint64_t g = 0; g < n; g++) {
        DsSample a, b;
        ds_locate(&ds, g, &a);
        ds_locate(&other, g, &b);
        differ += a.seq != b.seq;
    }
    CU_ASSERT(differ > 0);
    ds_free(&other);
    /* a token outside the vocabulary names the shard and the offset */
    DsSample s;
    ds_locate_seq(&ds, 0, 12, &s);
    int in[10], tg[10];
    CU_ASSERT_EQUAL(ds_read(&ds, &s, 5, in, tg, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "g_2.bin"));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "at offset 80"));
    ds_free(&ds);
}

/* uint32 shards: the samples of the same tokens as uint16 ones, ids up to
 * 2^32 - 1 checked against the vocabulary */
static void test_uint32(void) {
    CU_ASSERT_EQUAL_FATAL(make_shard_w("w16.bin", 300, 7, 1, 2, 0, 256), 0);
    CU_ASSERT_EQUAL_FATAL(make_shard_w("w32.bin", 300, 7, 1, 4, 0, 256), 0);
    const uint32_t base = 200019 - 251; /* o200k's last ids */
    CU_ASSERT_EQUAL_FATAL(make_shard_w("w32big.bin", 300, 7, 1, 4, base, 200019), 0);
    Dataset a, b, c;
    char sa[1024], sb[1024], sc[1024];
    spec_in(sa, sizeof sa, "@/w16.bin");
    spec_in(sb, sizeof sb, "@/w32.bin");
    spec_in(sc, sizeof sc, "@/w32big.bin");
    Err e;
    CU_ASSERT_EQUAL_FATAL(ds_open(&a, sa, 16, 3, &e), 0);
    CU_ASSERT_EQUAL_FATAL(ds_open(&b, sb, 16, 3, &e), 0);
    CU_ASSERT_EQUAL_FATAL(ds_open(&c, sc, 16, 3, &e), 0);
    CU_ASSERT_EQUAL(ds_meta(&b)->width, 4);
    CU_ASSERT_EQUAL(ds_tokens(&b), 300);
    int same = 1;
    for (uint64_t g = 0; g < 40; g++) {
        DsSample s, t, u;
        ds_locate(&a, g, &s);
        ds_locate(&b, g, &t);
        ds_locate(&c, g, &u);
        int in[3][16], tg[3][16];
        CU_ASSERT_EQUAL(ds_read(&a, &s, 256, in[0], tg[0], &e), 0);
        CU_ASSERT_EQUAL(ds_read(&b, &t, 256, in[1], tg[1], &e), 0);
        CU_ASSERT_EQUAL(ds_read(&c, &u, 200019, in[2], tg[2], &e), 0);
        same &= s.offset == t.offset && t.offset == u.offset;
        for (int k = 0; k < 16; k++)
            same &= in[0][k] == in[1][k] && tg[0][k] == tg[1][k] &&
                    in[2][k] == in[0][k] + (int)base && tg[2][k] == tg[0][k] + (int)base;
    }
    CU_ASSERT(same);
    ds_free(&a), ds_free(&b), ds_free(&c);
    /* the largest id a shard holds, and the vocabulary's first id past its end */
    const uint32_t past[2] = {UINT32_MAX, 200019};
    for (int k = 0; k < 2; k++) {
        uint32_t tok[40] = {0};
        tok[15] = past[k];
        char p[512];
        snprintf(p, sizeof p, "%s/past.bin", dir);
        const ShardMeta meta = {.width = 4, .vocab = 200019, .tokenizer = SHARD_TOK_BYTE};
        CU_ASSERT_EQUAL_FATAL(shard_write(p, tok, 40, &meta, NULL), 0);
        spec_in(sa, sizeof sa, "@/past.bin");
        CU_ASSERT_EQUAL_FATAL(ds_open(&a, sa, 16, 3, &e), 0);
        DsSample s;
        ds_locate_seq(&a, 0, 0, &s);
        int in[16], tg[16];
        CU_ASSERT_EQUAL(ds_read(&a, &s, 200019, in, tg, &e), -1);
        char want[128];
        snprintf(want, sizeof want, "holds token %u at offset 15, outside vocab_size = 200019",
                 past[k]);
        CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, want));
        ds_free(&a);
    }
}

typedef struct {
    struct {
        char key[64], value[256];
    } * kv;
    int n;
} CkKVList;
static const char *look_kv(void *ctx, const char *key);
static void collect(void *ctx, const char *key, const char *value);

/* What rank 0 packs, another rank unpacks: the same samples, the same
 * identity; a cut buffer is refused. */
static void test_pack(void) {
    char spec[1024];
    spec_in(spec, sizeof spec, "0.7:@/g_*.bin,0.3:@/a.bin");
    Dataset a, b;
    Err e;
    CU_ASSERT_EQUAL_FATAL(ds_open(&a, spec, 10, 3, &e), 0);
    size_t len;
    uint8_t *buf = ds_pack(&a, &len);
    CU_ASSERT_EQUAL_FATAL(ds_unpack(&b, buf, len, 10, 3, &e), 0);
    int same = b.n_parts == a.n_parts && ds_tokens(&a) == ds_tokens(&b);
    for (uint64_t g = 0; g < 5000 && same; g += 7) {
        DsSample x, y;
        ds_locate(&a, g, &x);
        ds_locate(&b, g, &y);
        same = x.part == y.part && x.shard == y.shard && x.offset == y.offset &&
               x.epoch == y.epoch && !strcmp(a.parts[x.part].shards[x.shard].path,
                                             b.parts[y.part].shards[y.shard].path);
    }
    CU_ASSERT(same);
    CkKVList had = {NULL, 0};
    ds_identity(&a, collect, &had);
    CU_ASSERT_EQUAL(ds_identity_compare(&b, look_kv, &had, &e), 0);
    free(had.kv);
    ds_free(&b);
    for (size_t cut = 0; cut < len; cut += len / 7 + 1) {
        CU_ASSERT_EQUAL(ds_unpack(&b, buf, cut, 10, 3, &e), -1);
    }
    free(buf);
    ds_free(&a);
}

/* A shard cut short after opening: a read past its end is an error that
 * names it and the byte, never garbage. */
static void test_truncated_while_open(void) {
    CU_ASSERT_EQUAL(make_shard("t.bin", 200, 1, 0), 0);
    char p[512];
    snprintf(p, sizeof p, "%s/t.bin", dir);
    Dataset ds;
    Err e;
    CU_ASSERT_EQUAL_FATAL(ds_open(&ds, p, 10, 1, &e), 0);
    CU_ASSERT_EQUAL(truncate(p, 1024 + 100), 0); /* 50 tokens left */
    DsSample s;
    ds_locate_seq(&ds, 0, 15, &s);
    int in[10], tg[10];
    CU_ASSERT_EQUAL(ds_read(&ds, &s, 256, in, tg, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "ends at byte 1124"));
    ds_locate_seq(&ds, 0, 2, &s); /* what is still there reads */
    CU_ASSERT_EQUAL(ds_read(&ds, &s, 256, in, tg, &e), 0);
    ds_free(&ds);
}

static const char *look_kv(void *ctx, const char *key) {
    const CkKVList *l = ctx;
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->kv[i].key, key) == 0) return l->kv[i].value;
    return NULL;
}

static void collect(void *ctx, const char *key, const char *value) {
    CkKVList *l = ctx;
    l->kv = xrealloc(l->kv, ((size_t)l->n + 1) * sizeof *l->kv);
    snprintf(l->kv[l->n].key, sizeof l->kv[0].key, "%s", key);
    snprintf(l->kv[l->n].value, sizeof l->kv[0].value, "%s", value);
    l->n++;
}

/* The identity of a glob: equal to itself, and each change named. */
static void test_identity(void) {
    CU_ASSERT_EQUAL(make_shard("i_0.bin", 50, 1, 1), 0);
    CU_ASSERT_EQUAL(make_shard("i_1.bin", 60, 1, 2), 0);
    char spec[1024];
    spec_in(spec, sizeof spec, "@/i_*.bin");
    Dataset ds;
    Err e;
    CU_ASSERT_EQUAL_FATAL(ds_open(&ds, spec, 8, 1, &e), 0);
    CkKVList had = {NULL, 0};
    ds_identity(&ds, collect, &had);
    CU_ASSERT_EQUAL(had.n, 4); /* parts, p0, p0.s0, p0.s1 */
    CU_ASSERT_EQUAL(ds_identity_compare(&ds, look_kv, &had, &e), 0);
    ds_free(&ds);
    CkKVList none = {NULL, 0};
    CU_ASSERT_EQUAL_FATAL(ds_open(&ds, spec, 8, 1, &e), 0);
    CU_ASSERT_EQUAL(ds_identity_compare(&ds, look_kv, &none, &e), 1); /* an older checkpoint */
    ds_free(&ds);
    CU_ASSERT_EQUAL(make_shard("i_2.bin", 60, 1, 3), 0); /* added */
    CU_ASSERT_EQUAL_FATAL(ds_open(&ds, spec, 8, 1, &e), 0);
    CU_ASSERT_EQUAL(ds_identity_compare(&ds, look_kv, &had, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "added"));
    ds_free(&ds);
    char p[512];
    snprintf(p, sizeof p, "%s/i_2.bin", dir);
    unlink(p);
    CU_ASSERT_EQUAL(make_shard("i_1.bin", 60, 1, 9), 0); /* rewritten: the same size, other tokens */
    CU_ASSERT_EQUAL_FATAL(ds_open(&ds, spec, 8, 1, &e), 0);
    CU_ASSERT_EQUAL(ds_identity_compare(&ds, look_kv, &had, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "shard 1 of dataset 0"));
    ds_free(&ds);
    snprintf(p, sizeof p, "%s/i_1.bin", dir);
    unlink(p); /* removed */
    CU_ASSERT_EQUAL_FATAL(ds_open(&ds, spec, 8, 1, &e), 0);
    CU_ASSERT_EQUAL(ds_identity_compare(&ds, look_kv, &had, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "removed"));
    ds_free(&ds);
    free(had.kv);
}

/* Each bad spec: refused with one line naming what is wrong. */
static void test_bad_specs(void) {
    struct {
        const char *fmt, *says;
    } bad[] = {
        {"@/nothing_*.bin", "matches no file"},
        {"@/missing.bin", "missing.bin"},
        {"0:@/a.bin", "not a positive number"},
        {"-1:@/a.bin", "not a positive number"},
        {"0.5:@/a.bin,@/b.bin", "has no weight"},
        {"abc:@/a.bin,0.5:@/b.bin", "has no weight"},
        {"0.5:", "names no shard"},
        {"", "empty"},
        {"0.5:@/a.bin,1e-9:@/b.bin", "less than one sample"},
        {"@/short.bin", "no sequence"},
        {"@/mixed_*.bin", "one tokenizer"},
        {"@/cut.bin", "truncated or corrupt"},
        {"@/mixw_*.bin", "holds uint32 tokens, but"},
    };
    CU_ASSERT_EQUAL(make_shard("mixw_0.bin", 50, 1, 0), 0);
    CU_ASSERT_EQUAL(make_shard_w("mixw_1.bin", 50, 1, 0, 4, 0, 256), 0);
    CU_ASSERT_EQUAL(make_shard("short.bin", 5, 1, 0), 0);
    CU_ASSERT_EQUAL(make_shard("mixed_0.bin", 50, 1, 0), 0);
    uint32_t tok[50] = {1};
    char p[512];
    snprintf(p, sizeof p, "%s/mixed_1.bin", dir);
    const ShardMeta gpt = {.vocab = 50257, .tokenizer = SHARD_TOK_GPT2, .vocab_hash = 7};
    CU_ASSERT_EQUAL(shard_write(p, tok, 50, &gpt, NULL), 0);
    CU_ASSERT_EQUAL(make_shard("cut.bin", 50, 1, 0), 0);
    snprintf(p, sizeof p, "%s/cut.bin", dir);
    CU_ASSERT_EQUAL(truncate(p, 1024 + 20), 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char spec[1024];
        spec_in(spec, sizeof spec, bad[i].fmt);
        Dataset ds;
        Err e = {""};
        CU_ASSERT_EQUAL(ds_open(&ds, spec, 8, 1, &e), -1);
        if (!strstr(e.msg, bad[i].says)) {
            fprintf(stderr, "spec '%s': expected '%s' in: %s\n", spec, bad[i].says, e.msg);
            CU_FAIL("the error does not say what is wrong");
        }
        CU_ASSERT_PTR_NULL(strchr(e.msg, '\n'));
    }
}

int main(void) {
    if (!mkdtemp(dir)) return 99;
    if (make_shard("a.bin", 400, 1, 0) || make_shard("b.bin", 300, 7, 1) ||
        make_shard("c.bin", 200, 13, 2) || make_shard("g_0.bin", 41, 3, 0) ||
        make_shard("g_1.bin", 10, 3, 50) || make_shard("g_2.bin", 100, 3, 100))
        return 99;
    CU_TestInfo tests[] = {
        {"keyed permutation: a bijection for any n, new for another key", test_permute},
        {"blend: every window of 1 to 10,000 samples within 2 of its share", test_blend},
        {"samples to shards and offsets, reads, epochs reshuffle", test_locate_and_read},
        {"a blend: each dataset's epochs whole and reshuffled", test_blend_epochs},
        {"uint32 shards: uint16's samples, ids to 2^32 - 1 checked", test_uint32},
        {"a shard truncated after opening: a named error", test_truncated_while_open},
        {"packed on one rank, unpacked on another: the same order", test_pack},
        {"identity: equal, older, shard added, rewritten, removed", test_identity},
        {"bad specs: one line each", test_bad_specs},
        CU_TEST_INFO_NULL};
    int rc = run_suite("dataset", tests);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) rc = rc ? rc : 99;
    return rc;
}
