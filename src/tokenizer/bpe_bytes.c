/*
 * bpe_bytes: what GPT-2's files and a Hugging Face tokenizer.json share:
 * tokens written in GPT-2's byte alphabet (a character for each byte)
 * read back as bytes, a JSON object of such tokens to ids, merges of two
 * such tokens, and JSON parsed within a memory budget.
 */
#include "src/tokenizer/bpe_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ the alphabet */

void alphabet_code_points(int cp[256]) {
    int extra = 0;
    /* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for
     * themselves, the other bytes for code points 256 and up, in byte order */
    for (int b = 0; b < 256; b++) {
        const int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = printable ? b : 256 + extra++;
    }
}

void alphabet_init(Vocab *v) {
    int cp[256];
    alphabet_code_points(cp);
    for (int i = 0; i < 512; i++) v->inverse[i] = -1;
    for (int b = 0; b < 256; b++) v->inverse[cp[b]] = (int16_t)b;
}

int32_t utf8_next(const uint8_t *s, size_t n, size_t *i) {
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

long alphabet_bytes(const Vocab *v, const char *s, size_t n, uint8_t *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        const int32_t cp = utf8_next((const uint8_t *)s, n, &i);
        if (cp < 0 || cp >= 512 || v->inverse[cp] < 0) return -1;
        out[k++] = (uint8_t)v->inverse[cp];
    }
    return k ? (long)k : -1;
}

void token_text(const char *k, size_t len, char *out, size_t cap) {
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

/* ---------------------------------------------------------- the vocabulary */

int vocab_tokens_from_json(Vocab *v, const json_t *obj, const char *where, Err *err) {
    strmap_init(&v->tokens, json_object_size(obj) + 1);
    uint8_t *bytes = NULL;
    size_t cap = 0;
    char tok[200];
    int rc = 0;
    for (void *it = json_object_iter((json_t *)obj); it && rc == 0;
         it = json_object_iter_next((json_t *)obj, it)) {
        const char *key = json_object_iter_key(it);
        const size_t klen = json_object_iter_key_len(it);
        const json_t *val = json_object_iter_value(it);
        if (klen + 1 > cap) bytes = xrealloc(bytes, cap = 2 * klen + 16);
        const long nb = alphabet_bytes(v, key, klen, bytes);
        const json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        token_text(key, klen, tok, sizeof tok);
        if (nb < 0)
            rc = err_set(err,
                         "%s: the token %s: a character outside GPT-2's byte alphabet (or "
                         "empty); expected a byte-level BPE vocabulary",
                         where, tok);
        else if (id < 0 || id >= BPE_MAX_VOCAB)
            rc = err_set(err, "%s: the token %s: expected an integer id in [0, %d)", where, tok,
                         BPE_MAX_VOCAB);
        else if (strmap_put(&v->tokens, bytes, (size_t)nb, (int64_t)id) != 0)
            rc = err_set(err, "%s: the token %s: listed twice", where, tok);
    }
    free(bytes);
    return rc;
}

int vocab_index(Vocab *v, int vocab, const char *where, Err *err) {
    const StrMap *t = &v->tokens;
    v->vocab = vocab;
    v->tok_off = xcalloc((size_t)vocab, sizeof *v->tok_off);
    v->tok_len = xcalloc((size_t)vocab, sizeof *v->tok_len);
    for (int i = 0; i < vocab; i++) v->tok_off[i] = SIZE_MAX;
    for (size_t e = 0; e < t->n; e++) {
        if (t->val[e] >= vocab) continue;
        if (v->tok_off[t->val[e]] != SIZE_MAX)
            return err_set(err, "%s: id %lld given to two tokens; expected each id once", where,
                           (long long)t->val[e]);
        v->tok_off[t->val[e]] = t->off[e], v->tok_len[t->val[e]] = t->len[e];
    }
    for (int b = 0; b < 256; b++) {
        const uint8_t byte = (uint8_t)b;
        v->byte_id[b] = (int32_t)strmap_get(&v->tokens, &byte, 1, -1);
        if (v->byte_id[b] < 0)
            return err_set(err,
                           "%s: no token for the byte 0x%02x; a byte-level vocabulary has one "
                           "for each of the 256",
                           where, b);
    }
    return 0;
}

void vocab_hash_tokens(Vocab *v) {
    v->hash = 14695981039346656037ull;
    for (int i = 0; i < v->vocab; i++) {
        const uint32_t len = v->tok_off[i] == SIZE_MAX ? 0 : v->tok_len[i];
        v->hash = fnv1a(fnv1a_u32(v->hash, len), v->tokens.arena + (len ? v->tok_off[i] : 0), len);
    }
}

/* --------------------------------------------------------------- merges */

void merges_begin(Vocab *v, size_t count, Merging *m) {
    pair_init(&v->merges, count);
    m->longest = 0;
    for (int i = 0; i < v->vocab; i++)
        if (v->tok_off[i] != SIZE_MAX && v->tok_len[i] > m->longest) m->longest = v->tok_len[i];
    m->bytes = xmalloc(2 * m->longest + 2);
    m->rank = 0;
}

void merges_end(Merging *m) { free(m->bytes); }

/* One side of a merge: the id of the token it writes, or -1. A side of
 * more than twice the longest token's bytes (a byte is at most two bytes
 * of UTF-8 in the alphabet) is no token. */
static int32_t merge_side(Vocab *v, Merging *m, const char *s, size_t n) {
    if (n > 2 * m->longest) return -1;
    const long nb = alphabet_bytes(v, s, n, m->bytes);
    return nb < 0 ? -1 : (int32_t)strmap_get(&v->tokens, m->bytes, (size_t)nb, -1);
}

int merge_add(Vocab *v, Merging *m, const char *a, size_t al, const char *b, size_t bl) {
    const int32_t l = merge_side(v, m, a, al), r = l >= 0 ? merge_side(v, m, b, bl) : -1;
    if (r < 0) return -1;
    memcpy(m->bytes, v->tokens.arena + v->tok_off[l], v->tok_len[l]);
    memcpy(m->bytes + v->tok_len[l], v->tokens.arena + v->tok_off[r], v->tok_len[r]);
    const int32_t to = (int32_t)strmap_get(&v->tokens, m->bytes, v->tok_len[l] + v->tok_len[r], -1);
    if (to < 0) return -1;
    PairMap *p = &v->merges;
    const uint64_t key = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
    const size_t slot = pair_find_counted(p, key);
    if (p->key[slot] != 0) return -2;
    p->key[slot] = key, p->rank[slot] = m->rank++, p->to[slot] = to;
    v->hash = fnv1a_u32(fnv1a_u32(v->hash, (uint32_t)l), (uint32_t)r);
    return 0;
}

/* ----------------------------------------------------- JSON within budget */

/* jansson allocates through these: each block carries its size in a
 * header, and while a thread parses under a budget its blocks are counted
 * against it; past it, the allocation fails and so does the parse. Other
 * threads' and other parses' blocks pass through uncounted. */
static _Thread_local size_t *json_budget;
static _Thread_local int json_refused; /* an allocation past the budget */

typedef union {
    size_t size;
    max_align_t align;
} BlockHeader;

static void *json_block_alloc(size_t n) {
    if (json_budget) {
        if (n + sizeof(BlockHeader) > *json_budget) {
            json_refused = 1;
            return NULL;
        }
        *json_budget -= n + sizeof(BlockHeader);
    }
    BlockHeader *h = malloc(sizeof *h + n);
    if (!h) return NULL;
    h->size = n;
    return h + 1;
}

static void json_block_free(void *p) {
    if (!p) return;
    BlockHeader *h = (BlockHeader *)p - 1;
    if (json_budget) *json_budget += h->size + sizeof *h;
    free(h);
}

/* Before main: jansson's blocks are then all of this kind. */
__attribute__((constructor)) static void json_allocator(void) {
    json_set_alloc_funcs(json_block_alloc, json_block_free);
}

json_t *json_load_budget(const char *s, size_t n, size_t budget, json_error_t *jerr, int *over) {
    size_t left = budget;
    json_budget = &left, json_refused = 0;
    json_t *root = json_loadb(s, n, JSON_REJECT_DUPLICATES, jerr);
    json_budget = NULL;
    *over = !root && json_refused;
    return root; /* its blocks are freed uncounted */
}
