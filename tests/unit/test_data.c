/*
 * test_data: shard round trips, every way a shard can be bad, and the
 * prep split.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/data.h"
#include "src/prep.h"
#include "src/base/util.h"
#include "testutil.h"

static char dir[] = "/tmp/modtrain-data-XXXXXX";

static void path_in(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

static void test_roundtrip(void) {
    Err e;
    uint16_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = (uint16_t)(i * 37 % 300);
    char p[256];
    path_in(p, sizeof p, "a.bin");
    const ShardMeta meta = {.vocab = 300, .tokenizer = SHARD_TOK_GPT2, .vocab_hash = 0xfedcba9876543210ull};
    CU_ASSERT_EQUAL(shard_write(p, tok, 100, &meta, NULL), 0);
    Shard s;
    CU_ASSERT_EQUAL_FATAL(shard_load(&s, p, &e), 0);
    CU_ASSERT_EQUAL(s.n_tokens, 100);
    CU_ASSERT_EQUAL(s.meta.vocab, 300);
    CU_ASSERT_EQUAL(s.meta.tokenizer, SHARD_TOK_GPT2);
    CU_ASSERT_EQUAL(s.meta.vocab_hash, 0xfedcba9876543210ull); /* both halves, no sign spill */
    CU_ASSERT_EQUAL(memcmp(s.tokens, tok, sizeof tok), 0);
    CU_ASSERT_EQUAL(shard_num_seqs(&s, 10), 9); /* windows need T+1 tokens */
    int in[10], tg[10];
    shard_get_seq(&s, 2, 10, in, tg);
    CU_ASSERT_EQUAL(in[0], tok[20]);
    CU_ASSERT_EQUAL(tg[9], tok[30]);
    shard_free(&s);
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
    ((int32_t *)buf)[4] = 3; /* a tokenizer modtrain does not know */
    write_raw(p, buf, sizeof buf);
    CU_ASSERT_EQUAL(shard_load(&s, p, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "names tokenizer 3"));
    CU_ASSERT_EQUAL(shard_load(&s, dir, &e), -1); /* a directory */
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "is a directory, not a file"));
}

static void test_prep_split(void) {
    Err e;
    char txt[256], out[256];
    path_in(txt, sizeof txt, "t.txt");
    path_in(out, sizeof out, "prep");
    size_t n = 10 * 4096;
    char *text = xmalloc(n);
    for (size_t i = 0; i < n; i++) text[i] = (char)('a' + (i / 4096));
    write_raw(txt, text, n);
    char *files[] = {txt};
    size_t counts[2];
    CU_ASSERT_EQUAL_FATAL(prep_byte_files(files, 1, out, 0.2, counts, &e), 0);
    CU_ASSERT_EQUAL(counts[0], 8 * 4096);
    CU_ASSERT_EQUAL(counts[1], 2 * 4096);
    char p[300];
    Shard tr, va;
    snprintf(p, sizeof p, "%s/train.bin", out);
    CU_ASSERT_EQUAL_FATAL(shard_load(&tr, p, &e), 0);
    snprintf(p, sizeof p, "%s/val.bin", out);
    CU_ASSERT_EQUAL_FATAL(shard_load(&va, p, &e), 0);
    CU_ASSERT_EQUAL(va.n_tokens, 2 * 4096); /* 2 of 10 chunks */
    CU_ASSERT_EQUAL(tr.n_tokens + va.n_tokens, n);
    CU_ASSERT_EQUAL(va.tokens[0], 'e');   /* chunks 4 and 9, spread out */
    CU_ASSERT_EQUAL(va.tokens[4096], 'j');
    shard_free(&tr), shard_free(&va);
    write_raw(txt, "", 0); /* an empty file is an error */
    CU_ASSERT_EQUAL(prep_byte_files(files, 1, out, 0.2, counts, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "is empty"));
    free(text);
}

int main(void) {
    if (!mkdtemp(dir)) return 99;
    CU_TestInfo tests[] = {
        {"shard round trip", test_roundtrip},
        {"truncated, short, wrong magic, wrong version, missing, vocabulary 1, a directory",
         test_bad_shards},
        {"prep splits a fraction of chunks evenly", test_prep_split},
        CU_TEST_INFO_NULL};
    int rc = run_suite("data", tests);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) rc = rc ? rc : 99;
    return rc;
}
