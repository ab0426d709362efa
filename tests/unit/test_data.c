/*
 * test_data: shard round trips, every way a shard can be bad, and prep
 * (the document split, shards, the set).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/data/data.h"
#include "src/prep/prep.h"
#include "src/base/util.h"
#include "testutil.h"

static char dir[] = "/tmp/modtrain-data-XXXXXX";

static void path_in(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

/* Token i of the round trip at a width: below the vocabulary, the widest
 * near its top. */
static uint32_t tok_at(int i, int vocab) {
    return (uint32_t)((i * 7919u + 65530u) % (unsigned)vocab);
}

static void test_roundtrip(void) {
    Err e;
    /* uint16 (vocabulary 300) and uint32 (o200k's 200,019 ids) */
    const int vocabs[2] = {300, 200019};
    for (int k = 0; k < 2; k++) {
        const int vocab = vocabs[k], width = shard_width(vocab);
        CU_ASSERT_EQUAL(width, k ? 4 : 2);
        uint32_t tok[100];
        for (int i = 0; i < 100; i++) tok[i] = tok_at(i, vocab);
        char p[256];
        path_in(p, sizeof p, "a.bin");
        const ShardMeta meta = {.width = width,
                                .vocab = vocab,
                                .tokenizer = SHARD_TOK_GPT2,
                                .vocab_hash = 0xfedcba9876543210ull};
        CU_ASSERT_EQUAL(shard_write(p, tok, 100, &meta, NULL), 0);
        /* the file as llm.c writes it: magic, version, count; little-endian tokens */
        uint8_t raw[1024 + 400];
        FILE *f = fopen(p, "rb");
        CU_ASSERT_EQUAL_FATAL(fread(raw, 1, sizeof raw, f), 1024 + 100 * (size_t)width);
        fclose(f);
        int32_t h[3];
        memcpy(h, raw, sizeof h);
        CU_ASSERT_EQUAL(h[0], k ? 20240801 : 20240520);
        CU_ASSERT_EQUAL(h[1], k ? 7 : 1);
        CU_ASSERT_EQUAL(h[2], 100);
        for (int i = 0; i < 100; i++) {
            uint32_t t = 0;
            for (int b = width - 1; b >= 0; b--) t = t << 8 | raw[1024 + i * width + b];
            CU_ASSERT_EQUAL(t, tok[i]);
        }
        Shard s;
        CU_ASSERT_EQUAL_FATAL(shard_load(&s, p, &e), 0);
        CU_ASSERT_EQUAL(s.n_tokens, 100);
        CU_ASSERT_EQUAL(s.meta.width, width);
        CU_ASSERT_EQUAL(s.meta.vocab, vocab);
        CU_ASSERT_EQUAL(s.meta.tokenizer, SHARD_TOK_GPT2);
        CU_ASSERT_EQUAL(s.meta.vocab_hash, 0xfedcba9876543210ull); /* both halves, no sign spill */
        CU_ASSERT_EQUAL(memcmp(s.tokens, tok, sizeof tok), 0);
        CU_ASSERT_EQUAL(shard_num_seqs(&s, 10), 9); /* windows need T+1 tokens */
        int in[10], tg[10];
        shard_get_seq(&s, 2, 10, in, tg);
        CU_ASSERT_EQUAL(in[0], (int)tok[20]);
        CU_ASSERT_EQUAL(tg[9], (int)tok[30]);
        shard_free(&s);
    }
    /* an id past 65535 does not fit a uint16 shard: refused, not wrapped */
    uint32_t wide[4] = {1, 2, 65536, 3};
    char p[256];
    path_in(p, sizeof p, "wide.bin");
    const ShardMeta narrow = {.width = 2, .vocab = 300, .tokenizer = SHARD_TOK_BYTE};
    CU_ASSERT_EQUAL(shard_write(p, wide, 4, &narrow, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "token 65536 at offset 2 does not fit"));
    CU_ASSERT_EQUAL(access(p, F_OK), -1);
}

static void write_raw(const char *p, const void *data, size_t n) {
    FILE *f = fopen(p, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

static void test_bad_shards(void) {
    Err e;
    int32_t hdr[256] = {SHARD_MAGIC, SHARD_VERSION, 50};
    uint16_t tok[50] = {0};
    char buf[sizeof hdr + sizeof tok];
    memcpy(buf, hdr, sizeof hdr);
    memcpy(buf + sizeof hdr, tok, sizeof tok);
    char p[256];
    path_in(p, sizeof p, "bad.bin");
    Shard s;
    write_raw(p, buf, sizeof buf);
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), 0); /* the good one, made by hand like llm.c */
    CU_ASSERT_EQUAL(s.meta.vocab, 0);
    CU_ASSERT_EQUAL(s.meta.tokenizer, SHARD_TOK_UNKNOWN);
    shard_free(&s);
    write_raw(p, buf, sizeof buf - 2); /* truncated */
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), -1);
    write_raw(p, buf, 100); /* shorter than the header */
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), -1);
    ((int32_t *)buf)[0] = 12345; /* wrong magic */
    write_raw(p, buf, sizeof buf);
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "has magic 12345, expected 20240520"));
    ((int32_t *)buf)[0] = SHARD_MAGIC;
    ((int32_t *)buf)[1] = 2; /* wrong version */
    write_raw(p, buf, sizeof buf);
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), -1);
    path_in(p, sizeof p, "missing.bin");
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), -1);
    ((int32_t *)buf)[1] = SHARD_VERSION;
    ((int32_t *)buf)[3] = 1; /* a vocabulary of one token: no model to train */
    path_in(p, sizeof p, "bad.bin");
    write_raw(p, buf, sizeof buf);
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "says its vocabulary has 1 tokens"));
    ((int32_t *)buf)[3] = -7;
    write_raw(p, buf, sizeof buf);
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), -1);
    ((int32_t *)buf)[3] = 0;
    ((int32_t *)buf)[4] = SHARD_TOK_LAST + 1; /* a tokenizer modtrain does not know */
    write_raw(p, buf, sizeof buf);
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), -1);
    char unknown[32];
    snprintf(unknown, sizeof unknown, "names tokenizer %d", SHARD_TOK_LAST + 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, unknown));
    CU_ASSERT_EQUAL(shard_load(&s, dir, &e), -1); /* a directory */
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "is a directory, not a file"));
    /* uint32 shards: the same 100 bytes of tokens are 25 of them */
    int32_t *h = (int32_t *)buf;
    memset(buf, 0, sizeof buf);
    h[0] = SHARD_MAGIC_U32, h[1] = SHARD_VERSION_U32, h[2] = 25;
    write_raw(p, buf, sizeof buf);
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), 0);
    CU_ASSERT_EQUAL(s.n_tokens, 25);
    CU_ASSERT_EQUAL(s.meta.width, 4);
    shard_free(&s);
    const struct {
        int32_t magic, version, count, vocab;
        const char *says;
    } bad[] = {
        {SHARD_MAGIC_U32, 50, 25, 0, "has magic 20240801 and version 50, expected version 7"},
        {SHARD_MAGIC_U32, SHARD_VERSION, 25, 0, "version 1, expected version 7 (uint32"},
        {SHARD_MAGIC, SHARD_VERSION_U32, 50, 0, "version 7, expected version 1 (uint16"},
        {SHARD_MAGIC_U32, SHARD_VERSION_U32, 50, 0, "promises 50 tokens (1224 bytes)"},
        {SHARD_MAGIC, SHARD_VERSION, 50, 65537,
         "has 65537 tokens (expected 0 for unknown, or 2 to 65536 for uint16"},
        {SHARD_MAGIC_U32, SHARD_VERSION_U32, 25, MODTRAIN_MAX_VOCAB + 1,
         "or 2 to 16777216 for uint32"},
        {SHARD_MAGIC_U32, SHARD_VERSION_U32, 25, INT32_MAX, "has 2147483647 tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        h[0] = bad[i].magic, h[1] = bad[i].version, h[2] = bad[i].count, h[3] = bad[i].vocab;
        write_raw(p, buf, sizeof buf);
        CU_ASSERT_EQUAL(shard_load(&s, p, &e), -1);
        if (!strstr(e.msg, bad[i].says)) {
            fprintf(stderr, "case %zu: expected '%s' in: %s\n", i, bad[i].says, e.msg);
            CU_FAIL("the error does not say what is wrong");
        }
    }
}

/* A prep of files into out with the byte tokenizer: 0, or -1 with e. The
 * test holds no vocabulary: 1 MiB held, whatever the process's RSS (under
 * AddressSanitizer its shadow alone passes half of the 16 MiB bound). */
static int prep_files(char **files, int n, const char *out, double f, size_t shard_tokens,
                      int force, PrepStats *st, Err *e) {
    PrepOptions o = {.out = out,
                     .inputs = files,
                     .ninputs = n,
                     .doc_sep = "%",
                     .val_fraction = f,
                     .threads = 1,
                     .mem = PREP_MEM_MIN,
                     .held = 1 << 20,
                     .shard_tokens = shard_tokens,
                     .force = force};
    return prep_run(&o, NULL, st, e);
}

static void test_prep_split(void) {
    Err e;
    char txt[256], out[256], p[300];
    path_in(txt, sizeof txt, "t.txt");
    path_in(out, sizeof out, "prep");
    /* 10 documents of 101 bytes ("aaa...a\n", "bbb...b\n", ...) between % lines */
    char text[10 * 103];
    size_t n = 0;
    for (int d = 0; d < 10; d++) {
        memset(text + n, 'a' + d, 100);
        n += 100;
        text[n++] = '\n';
        if (d < 9) text[n++] = '%', text[n++] = '\n';
    }
    write_raw(txt, text, n);
    char *files[] = {txt};
    PrepStats st;
    /* documents 4 and 9 go to val (f = 0.2), whole; the train remainder of
     * one token joins the shard before it (808 = 807 + 1) */
    CU_ASSERT_EQUAL_FATAL(prep_files(files, 1, out, 0.2, 807, 0, &st, &e), 0);
    CU_ASSERT_EQUAL(st.docs, 10);
    CU_ASSERT_EQUAL(st.tokens[0], 8 * 101);
    CU_ASSERT_EQUAL(st.tokens[1], 2 * 101);
    CU_ASSERT_EQUAL(st.shards[0], 1);
    CU_ASSERT_EQUAL(st.shards[1], 1);
    Shard tr, va;
    snprintf(p, sizeof p, "%s/train_000000.bin", out);
    CU_ASSERT_EQUAL_FATAL(shard_load(&tr, p, &e), 0);
    snprintf(p, sizeof p, "%s/val_000000.bin", out);
    CU_ASSERT_EQUAL_FATAL(shard_load(&va, p, &e), 0);
    CU_ASSERT_EQUAL(tr.n_tokens, 808);
    CU_ASSERT_EQUAL(tr.meta.has_crc, 1);
    CU_ASSERT_EQUAL(tr.meta.tokenizer, SHARD_TOK_BYTE);
    CU_ASSERT_EQUAL(va.n_tokens, 202);
    CU_ASSERT_EQUAL(va.tokens[0], 'e'); /* documents 4 and 9, spread out */
    CU_ASSERT_EQUAL(va.tokens[101], 'j');
    CU_ASSERT_EQUAL(tr.tokens[4 * 101], 'f');
    shard_free(&tr), shard_free(&va);
    snprintf(p, sizeof p, "%s/train_000001.bin", out);
    CU_ASSERT_NOT_EQUAL(access(p, F_OK), 0);
    /* a set in place: refused, then replaced whole by --force (8 shards of 101) */
    CU_ASSERT_EQUAL(prep_files(files, 1, out, 0.2, 101, 0, &st, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "already holds a shard set"));
    CU_ASSERT_EQUAL_FATAL(prep_files(files, 1, out, 0.2, 101, 1, &st, &e), 0);
    CU_ASSERT_EQUAL(st.shards[0], 8);
    snprintf(p, sizeof p, "%s/train_000007.bin", out);
    CU_ASSERT_EQUAL_FATAL(shard_load(&tr, p, &e), 0);
    CU_ASSERT_EQUAL(tr.n_tokens, 101);
    CU_ASSERT_EQUAL(tr.tokens[0], 'i');
    shard_free(&tr);
    /* too few documents for a val one; an empty file */
    write_raw(txt, "one document\n", 13);
    CU_ASSERT_EQUAL(prep_files(files, 1, out, 0.2, 100, 1, &st, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "gives none to val"));
    write_raw(txt, "", 0);
    CU_ASSERT_EQUAL(prep_files(files, 1, out, 0.2, 100, 1, &st, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "is empty"));
    snprintf(p, sizeof p, "%s/train_000007.bin", out); /* the set stays as it was */
    CU_ASSERT_EQUAL(access(p, F_OK), 0);
}

static void test_prep_parts(void) {
    size_t v = 0;
    CU_ASSERT(prep_parse_size("512M", &v) == 0 && v == (size_t)512 << 20);
    CU_ASSERT(prep_parse_size("2G", &v) == 0 && v == (size_t)2 << 30);
    CU_ASSERT(prep_parse_size("4k", &v) == 0 && v == 4096);
    CU_ASSERT(prep_parse_size("123", &v) == 0 && v == 123);
    const char *bad[] = {"", "M", "1.5G", " 1M", "1M ", "-1", "+1", "1MB", "99999999999T", "0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CU_ASSERT_EQUAL(prep_parse_size(bad[i], &v), -1);
    int nval = 0, last = -1, gap_ok = 1;
    for (int d = 0; d < 1000; d++)
        if (prep_doc_is_val((uint64_t)d, 0.1)) {
            gap_ok &= d - last == 10;
            last = d, nval++;
        }
    CU_ASSERT_EQUAL(nval, 100); /* every 10th: 9, 19, ... */
    CU_ASSERT(gap_ok);
    CU_ASSERT(!prep_doc_is_val(0, 0.99)); /* the first document always trains */
    CU_ASSERT(!prep_doc_is_val(5, 0));
    CU_ASSERT_EQUAL(prep_doc_cap((size_t)512 << 20), (size_t)32 << 20);
}

/* jansson's memory at its peak, in glibc's chunks (the request and 8 bytes
 * of header, rounded up to 16, at least 32): what a parse leaves resident */
static size_t j_live, j_peak;
static void *j_malloc(size_t n) {
    size_t *h = malloc(n + 16);
    if (!h) return NULL;
    h[0] = n < 24 ? 32 : (n + 8 + 15) & ~(size_t)15;
    if ((j_live += h[0]) > j_peak) j_peak = j_live;
    return h + 2;
}
static void j_free(void *p) {
    if (!p) return;
    size_t *h = (size_t *)p - 2;
    j_live -= h[0];
    free(h);
}

/* s: pre, then k copies of unit joined by sep, then post (k >= 1) */
static char *repeat(const char *pre, const char *unit, const char *sep, size_t k,
                    const char *post) {
    const size_t lu = strlen(unit), ls = strlen(sep);
    char *s = malloc(strlen(pre) + k * (lu + ls) + strlen(post) + 1), *q = s;
    q += sprintf(q, "%s", pre);
    for (size_t i = 0; i < k; i++, q += lu) {
        if (i) memcpy(q, sep, ls), q += ls;
        memcpy(q, unit, lu);
    }
    strcpy(q, post);
    return s;
}

/* prep's estimate of a JSON Lines line's parse is at least what jansson
 * takes, for each kind of value, nested, many keys, long and escaped text,
 * and for lines that are not JSON; and, where the values are many, at most
 * twice it, so that lines that would fit are not refused */
static void test_prep_estimate(void) {
    const size_t K = 20000;
    struct {
        char *s;
        int tight; /* made of many small values: the estimate within 2x */
    } lines[] = {
        {repeat("{\"text\":\"x\",\"a\":[", "[]", ",", K, "]}"), 1},
        {repeat("{\"text\":\"x\",\"a\":[", "{}", ",", K, "]}"), 1},
        {repeat("{\"text\":\"x\",\"a\":[", "\"\"", ",", K, "]}"), 1},
        {repeat("{\"text\":\"x\",\"a\":[", "0", ",", K, "]}"), 1},
        {repeat("{\"text\":\"x\",\"a\":[", "-1.5e3", ",", K, "]}"), 1},
        {repeat("{\"text\":\"x\",\"a\":[", "[0]", ",", K, "]}"), 1},
        {repeat("{\"text\":\"x\",\"a\":[", "{\"a\":0}", ",", K, "]}"), 1},
        {repeat("{\"text\":\"x\",\"a\":[", "{\"a\":{}}", ",", K, "]}"), 1},
        {repeat("{\"text\":\"x\",\"a\":[", "[[[[[[[[[[]]]]]]]]]]", ",", K / 10, "]}"), 1},
        {repeat("{\"text\":\"x\",\"a\":", "[", "", 2000, ""), 0}, /* jansson's depth limit */
        {repeat("{\"text\":\"", "some text ", "", 100 * K, "\"}"), 0},
        {repeat("{\"text\":\"", "\\u00e9\\n\\\"\\\\", "", 10 * K, "\"}"), 0},
        {repeat("{\"text\":\"", "x", "", (size_t)1 << 20, "\"}"), 0}, /* the lexer's doubling */
        {repeat("{\"text\":\"x\",\"a\":[", "null", ",", K, "]}"), 0},
        {repeat("{\"text\":\"x\",\"a\":[", "[]", ",", K, "], \"text\":\"y\"}"), 0},
        {repeat("{\"text\":\"x\",\"a\":[", "[]", ",", K, "]"), 0}, /* cut */
        {repeat("{\"text\":\"", "x", "", K, ""), 0},               /* cut in a string */
    };
    char *keys = malloc(K * 16 + 32), *q = keys; /* an object of many keys */
    q += sprintf(q, "{\"text\":\"x\"");
    for (size_t i = 0; i < K; i++) q += sprintf(q, ",\"%zx\":%zu", i, i);
    strcpy(q, "}");
    json_set_alloc_funcs(j_malloc, j_free);
    for (size_t i = 0; i <= sizeof lines / sizeof *lines; i++) {
        const char *s = i < sizeof lines / sizeof *lines ? lines[i].s : keys;
        const int tight = i < sizeof lines / sizeof *lines ? lines[i].tight : 1;
        const size_t n = strlen(s);
        j_live = j_peak = 0;
        json_error_t je;
        json_decref(json_loadb(s, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je));
        const size_t est = prep_jsonl_estimate(s, n);
        if (est < j_peak || (tight && est > 2 * j_peak))
            printf("\nline %zu (%.40s...): estimate %zu, jansson's peak %zu\n", i, s, est, j_peak);
        CU_ASSERT(est >= j_peak);
        if (tight) CU_ASSERT(est <= 2 * j_peak);
        CU_ASSERT_EQUAL(j_live, 0);
    }
    json_set_alloc_funcs(malloc, free);
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) free(lines[i].s);
    free(keys);
    /* quotes escaped by an odd run of backslashes do not end a string: its brackets are text */
    const char *esc = "{\"text\":\"\\\\\\\"[[[[\"}", *plain = "{\"text\":\"\\\\\\\\\"}";
    CU_ASSERT_EQUAL(prep_jsonl_estimate(esc, strlen(esc)) - 3 * strlen(esc),
                    prep_jsonl_estimate(plain, strlen(plain)) - 3 * strlen(plain));
}

int main(void) {
    if (!mkdtemp(dir)) return 99;
    CU_TestInfo tests[] = {
        {"shard round trip, uint16 and uint32", test_roundtrip},
        {"truncated, short, wrong magic, wrong version, missing, vocabulary 1, a directory",
         test_bad_shards},
        {"prep: whole documents to val, shards, a set replaced only by force", test_prep_split},
        {"prep: sizes, the val rule, the document cap", test_prep_parts},
        {"prep: a JSON line's estimate against jansson's allocations", test_prep_estimate},
        CU_TEST_INFO_NULL};
    int rc = run_suite("data", tests);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) rc = rc ? rc : 99;
    return rc;
}
