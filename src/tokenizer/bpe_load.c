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

/* ------------------------------------------------------------ the alphabet */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other bytes for code points 256 and up, in byte order. */
static void byte_alphabet(int cp[256]) {
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        const int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = printable ? b : 256 + extra++;
    }
}

/* One UTF-8 code point from s[*i..n); -1 when it is not valid UTF-8. */
static int32_t utf8_next(const uint8_t *s, size_t n, size_t *i) {
    const uint8_t c = s[*i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || *i + (size_t)len > n) return -1;
    int32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((s[*i + k] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (s[*i + k] & 0x3F);
    }
    static const int32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *i += (size_t)len;
    return cp;
}

/* Code points of the alphabet -> bytes into out (one byte each). Returns
 * 0, or -1 at a code point outside the alphabet. */
static int alphabet_bytes(const Vocab *v, const int32_t *cps, size_t n, uint8_t *out) {
    for (size_t i = 0; i < n; i++) {
        if (cps[i] < 0 || cps[i] >= 512 || v->inverse[cps[i]] < 0) return -1;
        out[i] = (uint8_t)v->inverse[cps[i]];
    }
    return 0;
}

/* ----------------------------------------------------------- encoder.json */

/* jansson parses the file; this file checks what it holds. */

/* jansson holds the whole document as a tree, about 140 bytes an entry of
 * a flat object but up to 80 times its input for nested empty arrays and
 * objects ("[[],{},...]"). An encoder.json has no nesting, so any '[', or a
 * '{' after the first, outside a string is refused before jansson builds
 * anything: the tree and the token map stay within about 20 times the
 * file (README: Hostile input). Returns the offset of the first such byte, or n. */
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

/* A token for a message: quoted, at most 40 bytes, other than printable
 * ASCII as \xNN. */
static void token_text(const char *k, size_t len, char *out, size_t cap) {
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < len && o + 8 < cap; i++) {
        const uint8_t c = (uint8_t)k[i];
        if (i == 40) {
            o += (size_t)snprintf(out + o, cap - o, "...");
            break;
        }
        if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    snprintf(out + o, cap - o, "\"");
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
    int rc = -1;
    uint8_t *bytes = NULL;
    int32_t *cps = NULL;
    char tok[200];
    strmap_init(&v->tokens, json_is_object(root) ? json_object_size(root) + 1 : 1);
    if (!json_is_object(root)) {
        err_set(err, "encoder.json: a JSON array; expected one object of tokens to ids");
        goto done;
    }
    for (void *it = json_object_iter(root); it; it = json_object_iter_next(root, it)) {
        const char *key = json_object_iter_key(it);
        const size_t klen = json_object_iter_key_len(it);
        const json_t *val = json_object_iter_value(it);
        /* jansson checked the UTF-8 and the escapes: code points, then bytes */
        bytes = xrealloc(bytes, klen + 1);
        cps = xrealloc(cps, (klen + 1) * sizeof *cps);
        size_t ncp = 0;
        for (size_t i = 0; i < klen;) {
            const int32_t cp = utf8_next((const uint8_t *)key, klen, &i);
            if (cp < 0) break; /* cannot happen after jansson; refused below */
            cps[ncp++] = cp;
        }
        int bad = ncp == 0 || alphabet_bytes(v, cps, ncp, bytes) != 0;
        if (!bad) { /* every code point decoded, none lost */
            size_t enc = 0;
            for (size_t i = 0; i < ncp; i++) enc += cps[i] < 0x80 ? 1 : cps[i] < 0x800 ? 2 : 3;
            bad = enc != klen;
        }
        token_text(key, klen, tok, sizeof tok);
        if (bad) {
            err_set(err,
                    "encoder.json: the token %s: a character outside GPT-2's byte alphabet (or "
                    "empty); expected the file GPT-2 was released with",
                    tok);
            goto done;
        }
        const json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= BPE_MAX_VOCAB) {
            err_set(err, "encoder.json: the token %s: expected an integer id in [0, %d)", tok,
                    BPE_MAX_VOCAB);
            goto done;
        }
        if (strmap_put(&v->tokens, bytes, ncp, (int64_t)id) != 0) {
            err_set(err, "encoder.json: the token %s: listed twice", tok);
            goto done;
        }
    }
    rc = 0;
done:
    free(bytes);
    free(cps);
    json_decref(root);
    return rc;
}

/* id -> bytes, every id in [0, vocab) present once; the bytes' ids; the
 * end-of-text token's. */
static int index_ids(Vocab *v, Err *err) {
    StrMap *t = &v->tokens;
    v->vocab = 0;
    for (size_t e = 0; e < t->n; e++)
        if (t->val[e] + 1 > v->vocab) v->vocab = (int)t->val[e] + 1;
    if ((size_t)v->vocab != t->n)
        return err_set(err,
                       "encoder.json: %zu tokens with ids up to %d; expected the ids 0 to %zu, "
                       "each once",
                       t->n, v->vocab - 1, t->n - 1);
    v->tok_off = xcalloc((size_t)v->vocab, sizeof *v->tok_off);
    v->tok_len = xcalloc((size_t)v->vocab, sizeof *v->tok_len);
    for (int i = 0; i < v->vocab; i++) v->tok_off[i] = SIZE_MAX;
    for (size_t e = 0; e < t->n; e++) {
        if (v->tok_off[t->val[e]] != SIZE_MAX)
            return err_set(err, "encoder.json: id %lld given to two tokens; expected each id once",
                           (long long)t->val[e]);
        v->tok_off[t->val[e]] = t->off[e], v->tok_len[t->val[e]] = t->len[e];
    }
    for (int b = 0; b < 256; b++) {
        const uint8_t byte = (uint8_t)b;
        v->byte_id[b] = (int32_t)strmap_get(t, &byte, 1, -1);
        if (v->byte_id[b] < 0)
            return err_set(err,
                           "encoder.json: no token for the byte 0x%02x; a byte-level vocabulary "
                           "has one for each of the 256",
                           b);
    }
    v->eot = (int)strmap_get(t, (const uint8_t *)"<|endoftext|>", 13, -1);
    v->hash = 14695981039346656037ull;
    for (int i = 0; i < v->vocab; i++)
        v->hash = fnv1a(fnv1a_u32(v->hash, v->tok_len[i]), t->arena + v->tok_off[i], v->tok_len[i]);
    return 0;
}

/* ------------------------------------------------------------- vocab.bpe */

/* One side of a merge line: UTF-8 of alphabet characters -> its id. */
static int32_t merge_side(Vocab *v, const uint8_t *s, size_t n, uint8_t *bytes, int32_t *cps) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        const int32_t cp = utf8_next(s, n, &i);
        if (cp < 0) return -1;
        cps[k++] = cp;
    }
    if (k == 0 || alphabet_bytes(v, cps, k, bytes) != 0) return -1;
    return (int32_t)strmap_get(&v->tokens, bytes, k, -1);
}

static int load_merges(Vocab *v, const uint8_t *s, size_t n, Err *err) {
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += s[i] == '\n';
    PairMap *p = &v->merges;
    pair_init(p, lines);
    size_t longest = 0;
    for (int i = 0; i < v->vocab; i++)
        if (v->tok_len[i] > longest) longest = v->tok_len[i];
    uint8_t *bytes = xmalloc(n + 2 * longest + 2);
    int32_t *cps = xcalloc(n + 1, sizeof *cps);
    int32_t rank = 0, rc = 0;
    size_t line = 0;
    for (size_t at = 0; at < n && rc == 0; line++) {
        const uint8_t *nl = memchr(s + at, '\n', n - at);
        const size_t len = nl ? (size_t)(nl - (s + at)) : n - at, from = at;
        at += len + 1;
        if (len == 0 || (line == 0 && len >= 8 && memcmp(s + from, "#version", 8) == 0)) continue;
        const uint8_t *sp = memchr(s + from, ' ', len);
        const size_t ll = sp ? (size_t)(sp - (s + from)) : len, rl = sp ? len - ll - 1 : 0;
        int32_t a = -1, b = -1, to = -1;
        if (sp && !memchr(sp + 1, ' ', rl)) {
            a = merge_side(v, s + from, ll, bytes, cps);
            b = merge_side(v, sp + 1, rl, bytes, cps);
        }
        if (a >= 0 && b >= 0) {
            memcpy(bytes, v->tokens.arena + v->tok_off[a], v->tok_len[a]);
            memcpy(bytes + v->tok_len[a], v->tokens.arena + v->tok_off[b], v->tok_len[b]);
            to = (int32_t)strmap_get(&v->tokens, bytes, v->tok_len[a] + v->tok_len[b], -1);
        }
        const uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
        const size_t slot = to >= 0 ? pair_find_counted(p, key) : 0;
        if (to < 0)
            rc = err_set(err,
                         "vocab.bpe: line %zu: expected 'A B', two tokens of encoder.json "
                         "whose concatenation is one too",
                         line + 1);
        else if (p->key[slot] != 0)
            rc = err_set(err, "vocab.bpe: line %zu: a merge listed twice", line + 1);
        else {
            p->key[slot] = key, p->rank[slot] = rank++, p->to[slot] = to;
            v->hash = fnv1a_u32(fnv1a_u32(v->hash, (uint32_t)a), (uint32_t)b);
        }
    }
    free(bytes);
    free(cps);
    return rc;
}

/* ------------------------------------------------------------------ load */

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
    int cp[256];
    byte_alphabet(cp);
    for (int i = 0; i < 512; i++) v->inverse[i] = -1;
    for (int b = 0; b < 256; b++) v->inverse[cp[b]] = (int16_t)b;
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

/* A vocabulary file's bytes, bounded before they are read: vocab.bpe at
 * most 64 MiB, encoder.json at most 8 MiB (GPT-2's is 1 MB), since jansson's
 * tree of it and the token map take up to about 20 times the file: an 8 MiB
 * file of short tokens peaks at 171 MiB (README: Hostile input). */
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
                "vocab.bpe, or a tiktoken rank file)",
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
                "ENCODING.tiktoken)",
                path, bpe_encoding_names());
        return NULL;
    }
    size_t n = 0;
    Err e;
    char *text = read_file(path, (size_t)64 << 20, &n, &e);
    if (!text) {
        err_set(err, "bpe: %s (a tiktoken rank file of at most 64 MiB)", e.msg);
        return NULL;
    }
    Bpe *b = bpe_from_ranks(text, n, encoding, &e);
    if (!b) err_set(err, "bpe: %s: %s", path, e.msg);
    free(text);
    return b;
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
