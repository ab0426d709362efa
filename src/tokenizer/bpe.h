/*
 * bpe: GPT-2's byte-level BPE tokenizer, loaded from the two files GPT-2
 * was released with (encoder.json: token -> id; vocab.bpe: the merges in
 * rank order), or any vocabulary in that format.
 *
 * Encoding splits the text with GPT-2's pre-tokenisation pattern (PCRE2,
 * Unicode letter/number/space classes; bytes that are not valid UTF-8 are
 * pieces of their own), then merges each piece's bytes by rank. Any bytes
 * encode, and decode(encode(x)) == x.
 */
#ifndef MODTRAIN_BPE_H
#define MODTRAIN_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"

typedef struct Bpe Bpe;

/* Loads DIR/encoder.json and DIR/vocab.bpe. Both are untrusted: a file
 * that is not what GPT-2's are (bad JSON, an id twice or out of range, a
 * merge naming a token the encoder lacks, a token that is not in the byte
 * alphabet) gives NULL and a one-line err naming the file, the line and
 * what was expected. */
Bpe *bpe_load(const char *dir, Err *err);
/* The same from the files' contents (for tests and the fuzz harness). */
Bpe *bpe_from_memory(const char *encoder_json, size_t elen, const char *vocab_bpe, size_t vlen,
                     Err *err);
/* A vocabulary from a tiktoken rank file (a token in base64, a space, its
 * rank, a line each) and the encoding it belongs to, which gives the
 * pattern and the special tokens: r50k_base, cl100k_base, o200k_base or
 * llama3 (Llama 3's tokenizer.model). A piece that
 * is a token whole is that token, as tiktoken encodes. */
Bpe *bpe_from_ranks(const char *text, size_t n, const char *encoding, Err *err);
/* A vocabulary from a Hugging Face tokenizer.json of a byte-level BPE
 * model (GPT-2's, Llama 3's); anything else in it that would change the
 * ids is refused in one line naming it. */
Bpe *bpe_from_hf(const char *text, size_t n, Err *err);
/* b written to path as a Hugging Face tokenizer.json that Hugging Face's
 * tokenizers encodes to b's ids; 0, or -1 with err. */
int bpe_write_hf(const Bpe *b, const char *path, Err *err);
/* The vocabulary at path: a folder (bpe_load), a tokenizer.json (a name
 * ending .json, or encoding "hf") or a rank file of encoding
 * (NULL or "": taken from a file named ENCODING.tiktoken). */
Bpe *bpe_open(const char *path, const char *encoding, Err *err);
/* A rank file's encoding ("cl100k_base"), "hf" for a tokenizer.json,
 * NULL for GPT-2's files. */
const char *bpe_encoding(const Bpe *b);
/* The encodings a rank file may belong to, for messages. */
const char *bpe_encoding_names(void);
void bpe_free(Bpe *b);

/* One more than the largest id. */
int bpe_vocab_size(const Bpe *b);
/* The id of the token before each document: "<|endoftext|>" (Llama 3's
 * rank file: "<|begin_of_text|>"), or -1 when the vocabulary has none. */
int bpe_eot(const Bpe *b);

/* The vocabulary's identity: FNV-1a (64 bits) of every token's length
 * (uint32, little-endian) and bytes in id order, then each merge's two ids
 * (uint32 each) in rank order. Files that differ only in how their JSON is
 * written hash the same; any change to a token or a merge changes it. */
uint64_t bpe_hash(const Bpe *b);

/* How hard a hash table worked: lookups (inserts included) and the slots
 * they looked at, at least one each. Every table is keyed with a random
 * key of its own and at most half full, so probes stay below 2.5 a lookup
 * on average whatever the input (for tests: a vocabulary or text crafted
 * to collide must not raise them). */
typedef struct {
    uint64_t lookups, probes;
} BpeProbes;
/* The merge table's and the token map's while the vocabulary loaded, the
 * word cache's since b was made (NULL: not wanted). */
void bpe_probes(const Bpe *b, BpeProbes *merges, BpeProbes *tokens, BpeProbes *words);

/* A growable array of token ids. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} BpeIds;

/* Appends the ids of n bytes of text to out. Not thread-safe on one Bpe
 * (its cache of words seen); give each thread its own (bpe_clone). */
void bpe_encode(Bpe *b, const char *text, size_t n, BpeIds *out);
/* Another Bpe sharing the vocabulary, with a cache of its own (NULL when
 * out of memory). Clone on one thread, then use each on its own. */
Bpe *bpe_clone(const Bpe *b);

/* The bytes of token id: *len of them, NULL for an id outside the
 * vocabulary or one that holds no token (between special tokens). */
const uint8_t *bpe_token(const Bpe *b, int id, size_t *len);

/* A growable array of bytes. */
typedef struct {
    uint8_t *bytes;
    size_t n, cap;
} BpeBytes;

/* The reader of decode input (`tokenize --decode`): token ids in decimal,
 * separated by whitespace (space, tab, newline, carriage return), fed in
 * chunks of any size; an id may be split between two. Every id is parsed
 * whole and must be one of the vocabulary's; any other byte (a NUL, a
 * sign, a letter) is an error naming its offset. Nothing is held but the
 * id being read, so input of any length streams through. */
typedef struct {
    char digits[24]; /* of the id being read */
    size_t len;
    uint64_t at, id_at, line; /* bytes fed, where the id began, its line (from 1) */
} BpeDecoder;

void bpe_decoder_init(BpeDecoder *d);
/* Appends the bytes of every id that ends in buf[0..n) to out. Returns 0,
 * or -1 with err "byte N (line L): ..." at the first bad id or byte (out
 * then holds the bytes of the ids before it). */
int bpe_decode_feed(const Bpe *b, BpeDecoder *d, const char *buf, size_t n, BpeBytes *out,
                    Err *err);
/* The end of the input: the id it ends in, if any. */
int bpe_decode_end(const Bpe *b, BpeDecoder *d, BpeBytes *out, Err *err);

#endif
