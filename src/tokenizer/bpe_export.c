/*
 * bpe_export: any vocabulary written as a Hugging Face tokenizer.json
 * that Hugging Face's tokenizers encodes to the same ids: the mergeable
 * tokens in GPT-2's byte alphabet, the merges in rank order as pairs (a
 * rank file's: every split of each token, by the token's rank), the
 * pattern (GPT-2's as ByteLevel's own, any other as a Split before it),
 * ignore_merges for a vocabulary that looks a piece up whole, the special
 * tokens as added tokens, and the document token as the template's where
 * it goes before the text (<|begin_of_text|>).
 */
#include "src/tokenizer/bpe_impl.h"

#include "src/base/files.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char GPT2_PATTERN[] =
    "'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* A token's bytes in the alphabet (UTF-8 of each byte's code point). */
static json_t *alphabet_string(const Vocab *v, const int cp[256], int id) {
    const uint8_t *t = v->tokens.arena + v->tok_off[id];
    char *s = xmalloc(2 * v->tok_len[id] + 1);
    size_t o = 0;
    for (uint32_t i = 0; i < v->tok_len[id]; i++) {
        const int c = cp[t[i]];
        if (c < 0x80) s[o++] = (char)c;
        else s[o++] = (char)(0xC0 | c >> 6), s[o++] = (char)(0x80 | (c & 0x3F));
    }
    json_t *j = json_stringn(s, o);
    free(s);
    return j;
}

typedef struct {
    int32_t rank, a, b;
} Merge;

static int merge_order(const void *x, const void *y) {
    const Merge *p = x, *q = y;
    if (p->rank != q->rank) return p->rank < q->rank ? -1 : 1;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return (p->b > q->b) - (p->b < q->b);
}

static json_t *byte_level(int regex) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 1, "use_regex", regex);
}

/* The pairs of the merge table in rank order (the first split of a rank
 * file's token first). */
static json_t *merge_list(const Vocab *v, const int cp[256]) {
    const PairMap *p = &v->merges;
    size_t n = 0;
    for (size_t i = 0; i <= p->mask; i++) n += p->key[i] != 0;
    Merge *m = xmalloc((n ? n : 1) * sizeof *m);
    n = 0;
    for (size_t i = 0; i <= p->mask; i++)
        if (p->key[i])
            m[n++] = (Merge){p->rank[i], (int32_t)((p->key[i] - 1) >> 32),
                             (int32_t)((p->key[i] - 1) & 0xFFFFFFFFu)};
    qsort(m, n, sizeof *m, merge_order);
    json_t *list = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(list, json_pack("[o, o]", alphabet_string(v, cp, m[i].a),
                                              alphabet_string(v, cp, m[i].b)));
    free(m);
    return list;
}

int bpe_write_hf(const Bpe *b, const char *path, Err *err) {
    const Vocab *v = b->v;
    int cp[256];
    alphabet_code_points(cp);
    const int model = v->ranks ? v->ranks : v->vocab; /* the ids merging can make */
    json_t *vocab = json_object(), *added = json_array();
    for (int id = 0; id < v->vocab; id++) {
        if (v->tok_off[id] == SIZE_MAX) continue;
        if (id < model) {
            json_t *key = alphabet_string(v, cp, id);
            json_object_setn_new(vocab, json_string_value(key), json_string_length(key),
                                 json_integer(id));
            json_decref(key);
        }
        if (id >= model || id == v->eot)
            json_array_append_new(
                added, json_pack("{s:i, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", id, "content",
                                 (const char *)v->tokens.arena + v->tok_off[id],
                                 (size_t)v->tok_len[id], "single_word", 0, "lstrip", 0, "rstrip",
                                 0, "normalized", 0, "special", 1));
    }
    const int gpt2 = strcmp(v->pattern, GPT2_PATTERN) == 0;
    json_t *pre = gpt2 ? byte_level(1)
                       : json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence",
                                   "pretokenizers", "type", "Split", "pattern", "Regex",
                                   v->pattern, "behavior", "Isolated", "invert", 0, byte_level(0));
    const uint8_t *sep = v->eot >= 0 ? v->tokens.arena + v->tok_off[v->eot] : NULL;
    json_t *post = sep && v->tok_len[v->eot] == 17 && memcmp(sep, "<|begin_of_text|>", 17) == 0
                       ? json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[{s:{s:s, s:i}}, "
                                   "{s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, "
                                   "s:[i], s:[s]}}}",
                                   "type", "TemplateProcessing", "single", "SpecialToken", "id",
                                   "<|begin_of_text|>", "type_id", 0, "Sequence", "id", "A",
                                   "type_id", 0, "pair", "SpecialToken", "id",
                                   "<|begin_of_text|>", "type_id", 0, "Sequence", "id", "A",
                                   "type_id", 0, "SpecialToken", "id", "<|begin_of_text|>",
                                   "type_id", 1, "Sequence", "id", "B", "type_id", 1,
                                   "special_tokens", "<|begin_of_text|>", "id",
                                   "<|begin_of_text|>", "ids", v->eot, "tokens",
                                   "<|begin_of_text|>")
                       : byte_level(1);
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:o, s:n, s:o, s:o, s:o, s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, "
        "s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
        "pre_tokenizer", pre, "post_processor", post, "decoder", byte_level(1), "model", "type",
        "BPE", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
        "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", v->whole_first, "vocab", vocab,
        "merges", merge_list(v, cp));
    /* the write protocol of every file modtrain keeps: a temp file,
     * fsync, rename, fsync of the folder, each a fault point hf.tokenizer.* */
    const size_t n = root ? json_dumpb(root, NULL, 0, JSON_COMPACT) : 0;
    char *text = n ? malloc(n) : NULL; /* json_dumps's would be jansson's to free */
    int rc = text && json_dumpb(root, text, n, JSON_COMPACT) == n
                 ? write_file_durable("hf.tokenizer", path, text, n, err)
                 : err_set(err, "cannot write '%s': out of memory", path);
    if (rc > 0) rc = 0; /* written; only the folder's fsync failed (as config.json's) */
    free(text);
    json_decref(root);
    return rc;
}
