/*
 * bpe_load: a vocabulary from GPT-2's two files, encoder.json (token ->
 * id) and vocab.bpe (the merges), both untrusted and checked; GPT-2's
 * pre-tokenisation pattern; a Bpe made, cloned and freed.
 */
#include "src/tokenizer/bpe_impl.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/base/files.h"

/* GPT-2's pre-tokenisation, as tiktoken's "gpt2" encoding writes it. */
static const char PATTERN[] =
    "'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ----------------------------------------------------------- encoder.json */

/* jansson parses the file; this file checks what it holds. */

/* jansson holds the whole document as a tree, about 140 bytes an entry of
 * a flat object but up to 80 times its input for nested empty arrays and
 * objects ("[[],{},...]"). An encoder.json has no nesting, so any '[', or a
 * '{' after the first, outside a string is refused before jansson builds
 * anything: the tree and the token map stay within about 20 times the
 * file (docs/reliability.md). Returns the offset of the first such byte, or n. */
static size_t nesting_at(const uint8_t *s, size_t n) {
    int in_string = 0, objects = 0;
    for (size_t i = 0; i < n; i++) {
        if (in_string) {
            if (s[i] == '\\') i++;
            else if (s[i] == '"') in_string = 0;
        } else if (s[i] == '"') {
            in_string = 1;
        } else if (s[i] == '[' || (s[i] == '{' && objects++ > 0)) {
            return i;
        }
    }
    return n;
}

/* Fills v->tokens, tok_off/tok_len and vocab from encoder.json. */
static int load_encoder(Vocab *v, const uint8_t *s, size_t n, Err *err) {
    const size_t nest = nesting_at(s, n);
    if (nest < n)
        return err_set(err,
                       "encoder.json: at byte %zu: a '%c' (an array or a second object); "
                       "expected one JSON object of tokens to integer ids, nothing nested",
                       nest, s[nest]);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)s, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        const enum json_error_code code = json_error_code(&jerr);
        const char *what = code == json_error_duplicate_key ? "a token listed twice"
                           : code == json_error_null_byte_in_key
                               ? "a token with U+0000, outside GPT-2's byte alphabet"
                           : code == json_error_end_of_input_expected
                               ? "expected the end of the file after the object"
                               : "not valid JSON";
        return err_set(err, "encoder.json: at byte %d (line %d, column %d): %s (jansson: %s)",
                       jerr.position, jerr.line, jerr.column, what, jerr.text);
    }
    const int rc =
        json_is_object(root)
            ? vocab_tokens_from_json(v, root, "encoder.json", err)
            : err_set(err, "encoder.json: a JSON array; expected one object of tokens to ids");
    json_decref(root);
    return rc;
}

/* id -> bytes, every id in [0, vocab) present once; the end-of-text
 * token's; the tokens' hash. */
static int index_ids(Vocab *v, Err *err) {
    const StrMap *t = &v->tokens;
    int vocab = 0;
    for (size_t e = 0; e < t->n; e++)
        if (t->val[e] + 1 > vocab) vocab = (int)t->val[e] + 1;
    if ((size_t)vocab != t->n)
        return err_set(err,
                       "encoder.json: %zu tokens with ids up to %d; expected the ids 0 to %zu, "
                       "each once",
                       t->n, vocab - 1, t->n - 1);
    if (vocab_index(v, vocab, "encoder.json", err) != 0) return -1;
    v->eot = (int)strmap_get(&v->tokens, (const uint8_t *)"<|endoftext|>", 13, -1);
    vocab_hash_tokens(v);
    return 0;
}

/* ------------------------------------------------------------- vocab.bpe */

static int load_merges(Vocab *v, const uint8_t *s, size_t n, Err *err) {
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += s[i] == '\n';
    Merging m;
    merges_begin(v, lines, &m);
    int rc = 0;
    size_t line = 0;
    for (size_t at = 0; at < n && rc == 0; line++) {
        const uint8_t *nl = memchr(s + at, '\n', n - at);
        const size_t len = nl ? (size_t)(nl - (s + at)) : n - at, from = at;
        at += len + 1;
        if (len == 0 || (line == 0 && len >= 8 && memcmp(s + from, "#version", 8) == 0)) continue;
        const uint8_t *sp = memchr(s + from, ' ', len);
        const size_t ll = sp ? (size_t)(sp - (s + from)) : len, rl = sp ? len - ll - 1 : 0;
        const int added = sp && !memchr(sp + 1, ' ', rl) ? merge_add(v, &m, (const char *)s + from,
                                                                     ll, (const char *)sp + 1, rl)
                                                         : -1;
        if (added == -1)
            rc = err_set(err,
                         "vocab.bpe: line %zu: expected 'A B', two tokens of encoder.json "
                         "whose concatenation is one too",
                         line + 1);
        else if (added == -2)
            rc = err_set(err, "vocab.bpe: line %zu: a merge listed twice", line + 1);
    }
    merges_end(&m);
    return rc;
}

/* ------------------------------------------------------------------ load */

enum { HF_MATCH_LIMIT = 1000000 };

static Bpe *bpe_on(Vocab *v) {
    Bpe *b = xcalloc(1, sizeof *b);
    b->v = v;
    __atomic_add_fetch(&v->refs, 1, __ATOMIC_RELAXED);
    b->md = pcre2_match_data_create_from_pattern(v->re, NULL);
    b->mctx = pcre2_match_context_create(NULL);
    b->stack = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    if (!b->md || !b->mctx || !b->stack) {
        bpe_free(b);
        return NULL;
    }
    pcre2_jit_stack_assign(b->mctx, NULL, b->stack);
    /* a tokenizer.json's own pattern may backtrack without end: a piece
     * that takes more steps than this is its first byte alone */
    if (v->own_pattern) pcre2_set_match_limit(b->mctx, HF_MATCH_LIMIT);
    strmap_init(&b->cache, 1024);
    return b;
}

/* v's pattern compiled, and a Bpe on v (NULL with err, v freed). */
static Bpe *bpe_on_vocab(Vocab *v, Err *err) {
    int ec;
    PCRE2_SIZE eo;
    v->re = pcre2_compile((PCRE2_SPTR)v->pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
    if (!v->re) {
        err_set(err,
                "bpe: PCRE2 could not compile the pre-tokenisation pattern (error %d at %zu); is "
                "it built with Unicode support?",
                ec, (size_t)eo);
        bpe_vocab_free(v);
        return NULL;
    }
    pcre2_jit_compile(v->re, PCRE2_JIT_COMPLETE); /* the interpreter where JIT is missing */
    Bpe *b = bpe_on(v);
    if (!b) err_set(err, "bpe: out of memory for PCRE2's match data");
    return b;
}

Bpe *bpe_from_memory(const char *encoder_json, size_t elen, const char *vocab_bpe, size_t vlen,
                     Err *err) {
    Vocab *v = xcalloc(1, sizeof *v);
    alphabet_init(v);
    if (load_encoder(v, (const uint8_t *)encoder_json, elen, err) != 0 || index_ids(v, err) != 0 ||
        load_merges(v, (const uint8_t *)vocab_bpe, vlen, err) != 0) {
        bpe_vocab_free(v);
        return NULL;
    }
    v->pattern = PATTERN;
    return bpe_on_vocab(v, err);
}

Bpe *bpe_from_ranks(const char *text, size_t n, const char *encoding, Err *err) {
    Vocab *v = bpe_vocab_from_ranks(text, n, encoding, err);
    return v ? bpe_on_vocab(v, err) : NULL;
}

Bpe *bpe_from_hf(const char *text, size_t n, Err *err) {
    Vocab *v = bpe_vocab_from_hf(text, n, err);
    return v ? bpe_on_vocab(v, err) : NULL;
}

/* A tokenizer file read whole, its size checked first, and parsed: a rank
 * file of the encoding (at most 64 MiB; o200k_base's is 3.6 MB) or, with
 * encoding "hf", a tokenizer.json (at most 32 MiB; Llama 3's is 9 MB). */
static Bpe *open_file(const char *path, const char *encoding, Err *err) {
    const int hf = strcmp(encoding, "hf") == 0;
    const unsigned mib = hf ? 32 : 64;
    size_t n = 0;
    Err e;
    char *text = read_file(path, (size_t)mib << 20, &n, &e);
    if (!text) {
        err_set(err, "bpe: %s (%s of at most %u MiB)", e.msg,
                hf ? "a tokenizer.json" : "a tiktoken rank file", mib);
        return NULL;
    }
    Bpe *b = hf ? bpe_from_hf(text, n, &e) : bpe_from_ranks(text, n, encoding, &e);
    if (!b) err_set(err, "bpe: %s: %s", path, e.msg);
    free(text);
    return b;
}

static int ends_with(const char *s, const char *tail) {
    const size_t n = strlen(s), t = strlen(tail);
    return n >= t && strcmp(s + n - t, tail) == 0;
}

/* A vocabulary file's bytes, bounded before they are read: vocab.bpe at
 * most 64 MiB, encoder.json at most 8 MiB (GPT-2's is 1 MB), since jansson's
 * tree of it and the token map take up to about 20 times the file: an 8 MiB
 * file of short tokens peaks at 171 MiB (docs/reliability.md). */
static char *read_vocab_file(const char *dir, const char *name, unsigned mib, size_t *len,
                             Err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    Err e;
    char *s = read_file(path, (size_t)mib << 20, len, &e);
    if (!s)
        err_set(err,
                "bpe: %s (%s is at most %u MiB; jobs/get_gpt2_vocab.sh DIR places GPT-2's "
                "files)",
                e.msg, name, mib);
    return s;
}

Bpe *bpe_load(const char *dir, Err *err) {
    size_t elen = 0, vlen = 0;
    char *e = read_vocab_file(dir, "encoder.json", 8, &elen, err), *m = NULL;
    if (e) m = read_vocab_file(dir, "vocab.bpe", 64, &vlen, err);
    Bpe *b = e && m ? bpe_from_memory(e, elen, m, vlen, err) : NULL;
    if (e && m && !b) { /* name the folder too */
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        err_set(err, "bpe: %s/%s", dir, msg);
    }
    free(e);
    free(m);
    return b;
}

Bpe *bpe_open(const char *path, const char *encoding, Err *err) {
    struct stat st;
    if (stat(path, &st) != 0) {
        err_set(err,
                "bpe: cannot open '%s': %s (expected a folder of GPT-2's encoder.json and "
                "vocab.bpe, a tiktoken rank file or a tokenizer.json)",
                path, strerror(errno));
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        if (encoding && *encoding) {
            err_set(err,
                    "bpe: '%s' is a folder (GPT-2's encoder.json and vocab.bpe), which takes "
                    "no encoding; give a rank file with --encoding %s",
                    path, encoding);
            return NULL;
        }
        return bpe_load(path, err);
    }
    if ((encoding && strcmp(encoding, "hf") == 0) || ends_with(path, ".json"))
        return open_file(path, "hf", err);
    char named[64] = "";
    if (!encoding || !*encoding) { /* the file's name: cl100k_base.tiktoken */
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        const char *dot = strstr(base, ".tiktoken");
        if (dot && !dot[9] && (size_t)(dot - base) < sizeof named)
            snprintf(named, sizeof named, "%.*s", (int)(dot - base), base);
        encoding = named;
    }
    if (!*encoding) {
        err_set(err,
                "bpe: '%s': a rank file needs its encoding (--encoding %s, or a file named "
                "ENCODING.tiktoken; a tokenizer.json: --encoding hf, or a name ending .json)",
                path, bpe_encoding_names());
        return NULL;
    }
    return open_file(path, encoding, err);
}

Bpe *bpe_clone(const Bpe *b) { return bpe_on(b->v); }

void bpe_free(Bpe *b) {
    if (!b) return;
    if (__atomic_sub_fetch(&b->v->refs, 1, __ATOMIC_ACQ_REL) == 0) bpe_vocab_free(b->v);
    pcre2_match_data_free(b->md);
    pcre2_match_context_free(b->mctx);
    pcre2_jit_stack_free(b->stack);
    strmap_free(&b->cache);
    free(b->cache_ids);
    free(b->tok);
    free(b->prev);
    free(b->next);
    free(b->heap);
    free(b);
}
