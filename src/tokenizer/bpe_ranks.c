/*
 * bpe_ranks: a vocabulary from a tiktoken rank file (a token's bytes in
 * base64, a space, its rank, a line each; the rank is the id) and the
 * named encoding it belongs to, which gives what the file does not hold:
 * the pre-tokenisation pattern and the special tokens.
 *
 * tiktoken merges the adjacent pair whose concatenation has the lowest
 * rank; every part is a token, so the pairs are exactly the two-token
 * splits of each token, and they go into the same merge table GPT-2's
 * merges do (rank and merged id). A piece that is a token whole is that
 * token (tiktoken looks it up before merging).
 */
#include "src/tokenizer/bpe_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/files.h"

/* The encodings whose rank files are read: pattern, special tokens (any
 * id in [reserved_from, reserved_to) not among them is Llama 3's
 * <|reserved_special_token_K|>, K counting up), the token before each
 * document, and the count of ranks. An id between them holds no token. */
typedef struct {
    const char *name, *pattern;
    const char *specials[6];
    int special_ids[6];
    int reserved_from, reserved_to;
    const char *separator;
    int ranks;
} Encoding;

/* tiktoken's cl100k_base pattern, which Llama 3 took */
#define CL100K_PATTERN                                                         \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| " \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const Encoding ENCODINGS[] = {
    {"r50k_base", /* GPT-2's: its files' vocabulary as ranks */
     "'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
     {"<|endoftext|>"},
     {50256},
     0,
     0,
     "<|endoftext|>",
     50256},
    {"cl100k_base",
     CL100K_PATTERN,
     {"<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>"},
     {100257, 100258, 100259, 100260, 100276},
     0,
     0,
     "<|endoftext|>",
     100256},
    {"o200k_base",
     "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
     "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     {"<|endoftext|>", "<|endofprompt|>"},
     {199999, 200018},
     0,
     0,
     "<|endoftext|>",
     199998},
    {"llama3", /* Llama 3's tokenizer.model; each document begins with <|begin_of_text|> */
     CL100K_PATTERN,
     {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
      "<|eot_id|>"},
     {128000, 128001, 128006, 128007, 128009},
     128000,
     128256,
     "<|begin_of_text|>",
     128000},
};

const char *bpe_encoding_names(void) { return "r50k_base, cl100k_base, o200k_base, llama3"; }

static const Encoding *encoding_named(const char *name) {
    for (size_t i = 0; i < sizeof ENCODINGS / sizeof ENCODINGS[0]; i++)
        if (strcmp(ENCODINGS[i].name, name) == 0) return &ENCODINGS[i];
    return NULL;
}

/* One base64 character's value, -1 for any other byte. */
static int b64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 with its padding, strictly (no spaces, nothing after
 * the padding, no bits left over): the bytes into out, their count, or -1. */
static long b64_decode(const uint8_t *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4 != 0) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        const int pad = (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=');
        if (pad && i + 4 != n) return -1;
        int v[4];
        for (int k = 0; k < 4 - pad; k++)
            if ((v[k] = b64_value(s[i + k])) < 0) return -1;
        const uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
                           (uint32_t)(pad < 2 ? v[2] : 0) << 6 | (uint32_t)(pad < 1 ? v[3] : 0);
        if ((pad == 1 && (w & 0xFF)) || (pad == 2 && (w & 0xFFFF))) return -1;
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2) out[o++] = (uint8_t)(w >> 8);
        if (pad < 1) out[o++] = (uint8_t)w;
    }
    return (long)o;
}

/* The rank file's tokens into v->tokens (bytes -> rank). Returns the count
 * or -1 with err naming the line. */
static long load_ranks(Vocab *v, const uint8_t *s, size_t n, Err *err) {
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += s[i] == '\n';
    strmap_init(&v->tokens, lines + 16);
    uint8_t *bytes = xmalloc(n / 4 * 3 + 4);
    long count = 0;
    size_t line = 0;
    for (size_t at = 0; at < n; line++) {
        const uint8_t *nl = memchr(s + at, '\n', n - at);
        const size_t len = nl ? (size_t)(nl - (s + at)) : n - at, from = at;
        at += len + 1;
        if (len == 0 && !nl) break; /* the file's last newline */
        const uint8_t *sp = memchr(s + from, ' ', len);
        const size_t bl = sp ? (size_t)(sp - (s + from)) : len;
        char num[16];
        long long rank = -1;
        long nb = -1;
        if (sp && len - bl - 1 > 0 && len - bl - 1 < sizeof num) {
            memcpy(num, sp + 1, len - bl - 1);
            num[len - bl - 1] = '\0';
            if (parse_i64(num, 0, BPE_MAX_VOCAB - 1, &rank) != 0) rank = -1;
            nb = b64_decode(s + from, bl, bytes);
        }
        if (nb <= 0 || rank < 0) {
            free(bytes);
            return err_set(err,
                           "line %zu: expected a token in base64, a space and its rank (an "
                           "integer in [0, %d)), as tiktoken's rank files hold",
                           line + 1, BPE_MAX_VOCAB);
        }
        if (strmap_put(&v->tokens, bytes, (size_t)nb, rank) != 0) {
            free(bytes);
            return err_set(err, "line %zu: a token listed twice", line + 1);
        }
        count++;
    }
    free(bytes);
    return count;
}

/* The merge table: every split of a token into two tokens, with the
 * token's rank and id. */
static void derive_merges(Vocab *v, int ranks) {
    size_t pairs = 0;
    for (int i = 0; i < ranks; i++) pairs += v->tok_len[i] > 1 ? v->tok_len[i] - 1 : 0;
    PairMap *p = &v->merges;
    pair_init(p, pairs);
    for (int t = 0; t < ranks; t++) {
        const uint8_t *w = v->tokens.arena + v->tok_off[t];
        for (uint32_t k = 1; k < v->tok_len[t]; k++) {
            const int64_t a = strmap_get(&v->tokens, w, k, -1);
            const int64_t b = strmap_get(&v->tokens, w + k, v->tok_len[t] - k, -1);
            if (a < 0 || b < 0 || a >= ranks || b >= ranks) continue;
            const uint64_t key = ((uint64_t)a << 32 | (uint64_t)b) + 1;
            const size_t slot = pair_find_counted(p, key);
            p->key[slot] = key, p->rank[slot] = t, p->to[slot] = t; /* one token per pair */
        }
    }
}

Vocab *bpe_vocab_from_ranks(const char *text, size_t n, const char *encoding, Err *err) {
    const Encoding *enc = encoding_named(encoding);
    if (!enc) {
        err_set(err, "'%s' is not an encoding modtrain knows (expected %s)", encoding,
                bpe_encoding_names());
        return NULL;
    }
    Vocab *v = xcalloc(1, sizeof *v);
    for (int i = 0; i < 512; i++) v->inverse[i] = -1;
    const long ranks = load_ranks(v, (const uint8_t *)text, n, err);
    if (ranks < 0) goto fail;
    if (ranks != enc->ranks) {
        err_set(err, "%ld tokens; %s's rank file has %d (is it another encoding's?)", ranks,
                enc->name, enc->ranks);
        goto fail;
    }
    int vocab = (int)ranks;
    for (int i = 0; enc->specials[i]; i++) {
        strmap_put(&v->tokens, (const uint8_t *)enc->specials[i], strlen(enc->specials[i]),
                   enc->special_ids[i]);
        if (enc->special_ids[i] + 1 > vocab) vocab = enc->special_ids[i] + 1;
    }
    for (int id = enc->reserved_from, k = 0; id < enc->reserved_to; id++) {
        int named = 0;
        for (int i = 0; enc->specials[i]; i++) named |= enc->special_ids[i] == id;
        if (named) continue;
        char name[48];
        const int len = snprintf(name, sizeof name, "<|reserved_special_token_%d|>", k++);
        strmap_put(&v->tokens, (const uint8_t *)name, (size_t)len, id);
        if (id + 1 > vocab) vocab = id + 1;
    }
    v->vocab = vocab;
    v->tok_off = xcalloc((size_t)vocab, sizeof *v->tok_off);
    v->tok_len = xcalloc((size_t)vocab, sizeof *v->tok_len);
    for (int i = 0; i < vocab; i++) v->tok_off[i] = SIZE_MAX;
    const StrMap *t = &v->tokens;
    for (size_t e = 0; e < t->n; e++) {
        if (t->val[e] < ranks && v->tok_off[t->val[e]] != SIZE_MAX) {
            err_set(err, "the rank %lld is given to two tokens; expected each rank once",
                    (long long)t->val[e]);
            goto fail;
        }
        v->tok_off[t->val[e]] = t->off[e], v->tok_len[t->val[e]] = t->len[e];
    }
    for (long i = 0; i < ranks; i++)
        if (v->tok_off[i] == SIZE_MAX) {
            err_set(err, "%ld tokens, but no token has the rank %ld; expected the ranks 0 to %ld",
                    ranks, i, ranks - 1);
            goto fail;
        }
    for (int b = 0; b < 256; b++) {
        const uint8_t byte = (uint8_t)b;
        v->byte_id[b] = (int32_t)strmap_get(&v->tokens, &byte, 1, -1);
        if (v->byte_id[b] < 0) {
            err_set(err, "no token for the byte 0x%02x; a byte-level vocabulary has each of the 256",
                    b);
            goto fail;
        }
    }
    v->ranks = (int)ranks;
    v->whole_first = 1;
    v->eot =
        (int)strmap_get(&v->tokens, (const uint8_t *)enc->separator, strlen(enc->separator), -1);
    /* the hash: every token (the rank files' and the specials, in id order),
     * then the encoding's name, which names its pattern */
    v->hash = 14695981039346656037ull;
    for (int i = 0; i < vocab; i++) {
        const size_t len = v->tok_off[i] == SIZE_MAX ? 0 : v->tok_len[i];
        v->hash = fnv1a(fnv1a_u32(v->hash, (uint32_t)len), t->arena + (len ? v->tok_off[i] : 0), len);
    }
    v->hash = fnv1a(v->hash, (const uint8_t *)enc->name, strlen(enc->name));
    derive_merges(v, (int)ranks);
    v->pattern = enc->pattern;
    v->encoding = enc->name;
    return v;
fail:
    bpe_vocab_free(v);
    return NULL;
}
