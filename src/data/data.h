/*
 * data: llm.c token shards.
 *
 * A shard is a 256-int32 header (magic, version, token count; slots 3-8
 * are modtrain's ShardMeta, zero in llm.c's shards) followed by the
 * tokens, in one of llm.c's two formats: magic 20240520, version 1, uint16
 * tokens (GPT-2's), or magic 20240801, version 7, uint32 tokens (Llama
 * 3's: any vocabulary past 65,536 ids). A sequence is a window of T+1
 * tokens starting at a multiple of T. Training reads shards through
 * src/data/dataset.h (headers, then the sequences it needs); shard_load
 * reads a whole one, for tools and tests.
 */
#ifndef MODTRAIN_DATA_H
#define MODTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"

#define SHARD_MAGIC 20240520 /* uint16 tokens */
#define SHARD_VERSION 1
#define SHARD_MAGIC_U32 20240801 /* uint32 tokens */
#define SHARD_VERSION_U32 7
#define SHARD_U16_VOCAB 65536 /* the largest vocabulary uint16 tokens hold */
#define SHARD_HEADER_INTS 256

/* The tokenizer that wrote a shard (header slot 4): GPT-2's files, or a
 * tiktoken rank file of one of three encodings. */
enum {
    SHARD_TOK_UNKNOWN = 0,
    SHARD_TOK_BYTE = 1,
    SHARD_TOK_GPT2 = 2,
    SHARD_TOK_R50K = 3,
    SHARD_TOK_CL100K = 4,
    SHARD_TOK_O200K = 5,
    SHARD_TOK_LLAMA3 = 6,
    SHARD_TOK_HF = 7, /* a Hugging Face tokenizer.json: the vocabulary's hash tells which */
    SHARD_TOK_LAST = SHARD_TOK_HF
};

/* What modtrain records in a shard's header beyond the count; zero where
 * llm.c's shards leave it: slot 3 the vocabulary size, slot 4 the
 * tokenizer, slots 5 and 6 the low and high halves of the vocabulary's
 * hash (bpe_hash; 0 for the byte tokenizer), slot 7 the CRC-32 (zlib's) of
 * the token bytes and slot 8 1 when slot 7 holds it (the shard's content
 * hash, which a checkpoint records to know its data again). The width
 * comes from the magic. */
typedef struct {
    int width; /* bytes a token: 2 (uint16) or 4 (uint32) */
    int vocab;
    int tokenizer;
    uint64_t vocab_hash;
    int has_crc;
    uint32_t crc;
} ShardMeta;

typedef struct {
    char path[512];
    uint32_t *tokens; /* (n_tokens), whatever the shard's width */
    size_t n_tokens;
    ShardMeta meta;
    uint32_t max_token;
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
/* The width of the tokens of a vocabulary of vocab ids: 2 up to 65,536,
 * else 4. */
int shard_width(int vocab);
/* The header of a shard of n tokens (n <= INT32_MAX) described by meta
 * (its width, and its crc when meta->has_crc). */
void shard_header_fill(int32_t hdr[SHARD_HEADER_INTS], size_t n, const ShardMeta *meta);
/* Packs n tokens into out as a shard of the given width stores them
 * (little-endian; each below 2^16 where width is 2). */
void shard_pack_tokens(const uint32_t *tokens, size_t n, int width, uint8_t *out);
/* The reverse: n tokens of the given width from in. */
void shard_unpack_tokens(const uint8_t *in, size_t n, int width, uint32_t *out);
/* Writes tokens as a shard of meta->width, atomically, with their CRC-32
 * in the header. Returns 0 or -1 with err set (a token too wide). */
int shard_write(const char *path, const uint32_t *tokens, size_t n, const ShardMeta *meta,
                Err *err);
/* The tokenizer's name ("byte", "gpt2", "cl100k_base", ..., "unknown");
 * the code of a name (SHARD_TOK_UNKNOWN for none of them). */
const char *shard_tokenizer_name(int tokenizer);
int shard_tokenizer_code(const char *name);
/* What wrote a shard, for messages: "the byte tokenizer", "the gpt2
 * tokenizer (vocabulary 0123456789abcdef)", "an unknown tokenizer". */
void shard_describe_tokenizer(const ShardMeta *m, char *buf, size_t n);

/* Sequence windows of length T (plus one target) in a shard. */
size_t shard_num_seqs(const Shard *s, int T);
/* Copies window w: inputs (T) and targets (T) (every token below the
 * vocabulary, checked by the caller against max_token). */
void shard_get_seq(const Shard *s, size_t w, int T, int *inputs, int *targets);


#endif
