/*
 * bpe_impl: what the tokenizer's files share and nothing else includes:
 * the hash tables, the vocabulary a Bpe and its clones share, the Bpe.
 *
 * The room from the top down; a file calls only the files below it:
 *   bpe.c         encode and decode, the accessors of a loaded Bpe
 *   bpe_export.c  a loaded vocabulary written as a tokenizer.json
 *   bpe_load.c    encoder.json and vocab.bpe read and checked, a Bpe made
 *                 from a vocabulary of either kind
 *   bpe_hf.c      a Hugging Face tokenizer.json read and checked
 *   bpe_ranks.c   a tiktoken rank file read and checked, with its encoding
 *   bpe_bytes.c   GPT-2's byte alphabet, vocabularies and merges written in
 *                 it (GPT-2's files', tokenizer.json's), JSON in a budget
 *   bpe_tables.c  the keyed hash tables, a vocabulary freed
 */
#ifndef MODTRAIN_BPE_IMPL_H
#define MODTRAIN_BPE_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"
#include "src/tokenizer/bpe.h"

/* A table's key (bpe_tables.c: every table keyed by input hashes under a
 * key of its own). */
typedef struct {
    uint64_t k0, k1;
} HashKey;

/* A fresh key for a new table. */
HashKey table_key(void);

/* An open-addressing map from byte strings (kept in an arena) to a value,
 * at most half full. */
typedef struct {
    uint32_t *slot; /* entry index + 1, 0 = empty */
    size_t mask;
    HashKey key;
    BpeProbes probes; /* lookups and the slots they looked at */
    uint8_t *arena;
    size_t alen, acap;
    size_t *off;   /* entry -> key offset in arena */
    uint32_t *len; /* entry -> key length */
    int64_t *val;
    size_t n, cap;
} StrMap;

/* FNV-1a, 64 bits, continued from h: the vocabulary's hash. */
uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n);
uint64_t fnv1a_u32(uint64_t h, uint32_t x);

void strmap_init(StrMap *m, size_t want);
void strmap_free(StrMap *m);
int64_t strmap_get(StrMap *m, const uint8_t *k, size_t n, int64_t missing);
/* strmap_get without counting its probes: safe on a map threads share. */
int64_t strmap_peek(const StrMap *m, const uint8_t *k, size_t n, int64_t missing);
/* Adds key -> v; returns 0, or -1 when the key is there already. */
int strmap_put(StrMap *m, const uint8_t *k, size_t n, int64_t v);

/* The merges: (left id, right id) -> rank and merged id, at most half
 * full. */
typedef struct {
    uint64_t *key; /* (left << 32 | right) + 1, 0 = empty */
    int32_t *rank, *to;
    size_t mask;
    HashKey hkey;
    BpeProbes probes; /* of the load (lookups while encoding are not counted: shared) */
} PairMap;

/* A pair's home slot, and the slot that holds it or the empty one where it
 * would go. */
size_t pair_home(const PairMap *p, uint64_t key);
size_t pair_find(const PairMap *p, uint64_t key);
/* pair_find, counted in p's probes (while a vocabulary loads). */
size_t pair_find_counted(PairMap *p, uint64_t key);
/* An empty table for up to entries pairs (at most half full), keyed anew. */
void pair_init(PairMap *p, size_t entries);

/* Shared by a Bpe and its clones. */
typedef struct {
    int refs;
    StrMap tokens;   /* bytes -> id */
    size_t *tok_off; /* id -> offset of its bytes in tokens.arena (SIZE_MAX: none) */
    uint32_t *tok_len;
    int vocab, eot;
    int32_t byte_id[256];
    int16_t inverse[512]; /* alphabet code point -> byte, -1: none */
    PairMap merges;
    uint64_t hash; /* bpe_hash */
    pcre2_code *re;
    const char *pattern; /* the pre-tokenisation, before it is compiled */
    char *own_pattern;   /* pattern, when a tokenizer.json gave it */
    int ranks;           /* a rank file's tokens (ids below: mergeable); 0 for GPT-2's files */
    int whole_first;     /* a piece that is a token whole is that token (tiktoken's) */
    const char *encoding; /* a rank file's encoding, "hf" for a tokenizer.json; NULL for
                             GPT-2's files */
} Vocab;

/* The largest vocabulary a file may give. */
#define BPE_MAX_VOCAB MODTRAIN_MAX_VOCAB

/* A vocabulary from a tiktoken rank file of the named encoding (its
 * pattern and specials); NULL with err saying what is wrong. */
Vocab *bpe_vocab_from_ranks(const char *text, size_t n, const char *encoding, Err *err);
/* A vocabulary from a Hugging Face tokenizer.json (NULL with err). */
Vocab *bpe_vocab_from_hf(const char *text, size_t n, Err *err);
/* Frees a vocabulary (its tables, its compiled pattern). */
void bpe_vocab_free(Vocab *v);

/* bpe_bytes.c: GPT-2's byte alphabet, byte -> code point. */
void alphabet_code_points(int cp[256]);
/* The same into v->inverse (code point -> byte). */
void alphabet_init(Vocab *v);
/* One UTF-8 code point from s[*i..n); -1 when it is not valid UTF-8. */
int32_t utf8_next(const uint8_t *s, size_t n, size_t *i);
/* A token written in the alphabet (UTF-8) -> its bytes into out (at most
 * n): their count, or -1 for a character outside it or an empty token. */
long alphabet_bytes(const Vocab *v, const char *s, size_t n, uint8_t *out);
/* A token for a message: quoted, at most 40 bytes, other than printable
 * ASCII as \xNN. */
void token_text(const char *k, size_t len, char *out, size_t cap);
/* A JSON object of alphabet tokens to integer ids into v->tokens; 0, or -1
 * with err "WHERE: the token ...". */
int vocab_tokens_from_json(Vocab *v, const json_t *obj, const char *where, Err *err);
/* Ids [0, vocab) -> bytes (each given once at most; the tokens' ids at or
 * past vocab are left out), and the 256 bytes' ids; 0 or -1 with err. */
int vocab_index(Vocab *v, int vocab, const char *where, Err *err);
/* v->hash from every token in id order (an id with no token: length 0). */
void vocab_hash_tokens(Vocab *v);

/* Merges added in rank order, each hashed into v->hash after the tokens. */
typedef struct {
    uint8_t *bytes; /* scratch: two tokens */
    size_t longest; /* bytes of the longest token */
    int32_t rank;   /* of the next merge */
} Merging;
void merges_begin(Vocab *v, size_t count, Merging *m);
/* The merge of the tokens written a and b: 0, -1 when either is not a
 * token or their concatenation is not one, -2 when listed before. */
int merge_add(Vocab *v, Merging *m, const char *a, size_t al, const char *b, size_t bl);
void merges_end(Merging *m);

/* json_loadb (duplicate keys refused) with jansson's tree held to budget
 * bytes; past it, NULL with *over set. */
json_t *json_load_budget(const char *s, size_t n, size_t budget, json_error_t *jerr, int *over);

struct Bpe {
    Vocab *v;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
    StrMap cache; /* word -> offset into cache_ids (low 40 bits) and count (high) */
    int32_t *cache_ids;
    size_t cache_n, cache_cap;
    /* scratch of the merge: symbols as a linked list and a heap of pairs */
    int32_t *tok, *prev, *next;
    uint64_t *heap; /* rank << 32 | left position */
    size_t scratch;
};

#endif
