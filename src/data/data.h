/*
 * data: llm.c token shards.
 *
 * A shard is a 256-int32 header (magic 20240520, version 1, token count;
 * slots 3-8 are modtrain's ShardMeta, zero in llm.c's shards) followed by
 * uint16 tokens. A sequence is a window of T+1 tokens starting at a
 * multiple of T. Training reads shards through src/data/dataset.h (headers,
 * then the sequences it needs); shard_load reads a whole one, for tools
 * and tests.
 */
#ifndef MODTRAIN_DATA_H
#define MODTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256

/* The tokenizer that wrote a shard (header slot 4). */
enum { SHARD_TOK_UNKNOWN = 0, SHARD_TOK_BYTE = 1, SHARD_TOK_GPT2 = 2 };

/* What modtrain records in a shard's header beyond the count; zero where
 * llm.c's shards leave it: slot 3 the vocabulary size, slot 4 the
 * tokenizer, slots 5 and 6 the low and high halves of the vocabulary's
 * hash (bpe_hash; 0 for the byte tokenizer), slot 7 the CRC-32 (zlib's) of
 * the token bytes and slot 8 1 when slot 7 holds it (the shard's content
 * hash, which a checkpoint records to know its data again). */
typedef struct {
    int vocab;
    int tokenizer;
    uint64_t vocab_hash;
    int has_crc;
    uint32_t crc;
} ShardMeta;

typedef struct {
    char path[512];
    uint16_t *tokens; /* (n_tokens) */
    size_t n_tokens;
    ShardMeta meta;
    int max_token;
} Shard;

/* Loads and checks a whole shard (magic, version, count against file size).
 * Returns 0, or -1 with err naming the file and the problem. */
int shard_load(Shard *s, const char *path, Err *err);
/* Checks a shard's header: the first len bytes of a file of file_size bytes
 * named name (magic, version, the token count against the size, meta).
 * Returns 0 with the count and meta, or -1 with err. */
int shard_parse_header(const uint8_t *buf, size_t len, uint64_t file_size, const char *name,
                       size_t *n_tokens, ShardMeta *meta, Err *err);
void shard_free(Shard *s);
/* The header of a shard of n tokens (n <= INT32_MAX) described by meta
 * (its crc included when meta->has_crc). */
void shard_header_fill(int32_t hdr[SHARD_HEADER_INTS], size_t n, const ShardMeta *meta);
/* Writes tokens as a shard, atomically, with their CRC-32 in the header.
 * Returns 0 or -1 with err set. */
int shard_write(const char *path, const uint16_t *tokens, size_t n, const ShardMeta *meta,
                Err *err);
/* The tokenizer's name ("byte", "gpt2", "unknown"). */
const char *shard_tokenizer_name(int tokenizer);
/* What wrote a shard, for messages: "the byte tokenizer", "the gpt2
 * tokenizer (vocabulary 0123456789abcdef)", "an unknown tokenizer". */
void shard_describe_tokenizer(const ShardMeta *m, char *buf, size_t n);

/* Sequence windows of length T (plus one target) in a shard. */
size_t shard_num_seqs(const Shard *s, int T);
/* Copies window w: inputs (T) and targets (T). */
void shard_get_seq(const Shard *s, size_t w, int T, int *inputs, int *targets);


#endif
