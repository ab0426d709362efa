/*
 * bpe_hf: a vocabulary from a Hugging Face tokenizer.json of a byte-level
 * BPE model (GPT-2's, Llama 3's): the model's vocabulary and merges in
 * GPT-2's byte alphabet (merges as "A B" strings or [A, B] pairs, as
 * tokenizers 0.20 and later write them), ignore_merges, the added tokens,
 * and the pre-tokenisation: ByteLevel's own pattern (GPT-2's) or a Split
 * pattern before a ByteLevel that only maps bytes. Whatever else would
 * change the ids (a normalizer, another model or pre-tokeniser, a
 * template adding more than one token before the text) is refused in one
 * line naming it.
 */
#include "src/tokenizer/bpe_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's pattern, which ByteLevel applies when its use_regex is set. */
static const char BYTELEVEL_PATTERN[] =
    "'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* What a file may say besides its vocabulary and merges. */
typedef struct {
    char *pattern;         /* the pre-tokenisation */
    const char *separator; /* the token before each text: the template's, else
                              <|endoftext|> or <|begin_of_text|> where the vocabulary has one */
    int ignore_merges;
} HfPlan;

static const char *type_of(const json_t *o) {
    const json_t *t = json_object_get(o, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* A member that must be false, null or missing (or "" for a string). */
static int unset(const json_t *o, const char *key) {
    const json_t *x = json_object_get(o, key);
    return !x || json_is_null(x) || json_is_false(x) ||
           (json_is_string(x) && json_string_length(x) == 0) ||
           (json_is_number(x) && json_number_value(x) == 0);
}

static int unsupported(Err *err, const char *part, const char *what) {
    return err_set(err,
                   "tokenizer.json: %s %s is not supported; modtrain reads byte-level BPE "
                   "(model BPE, pre_tokenizer ByteLevel or Split then ByteLevel, decoder "
                   "ByteLevel, no normalizer)",
                   part, what);
}

/* ByteLevel as a pre-tokeniser: no prefix space; its pattern, or none
 * after a Split (*regex says which it has). */
static int byte_level(const json_t *p, int *regex, Err *err) {
    if (!unset(p, "add_prefix_space"))
        return unsupported(err, "pre_tokenizer", "ByteLevel with add_prefix_space");
    const json_t *r = json_object_get(p, "use_regex");
    *regex = !r || json_is_true(r);
    return 0;
}

/* A PCRE2 pattern matching the string s literally. */
static char *quoted(const char *s) {
    char *q = xmalloc(2 * strlen(s) + 1), *o = q;
    for (; *s; s++) {
        if (strchr("\\^$.|?*+()[]{}-/#", *s)) *o++ = '\\';
        *o++ = *s;
    }
    *o = '\0';
    return q;
}

static int split(const json_t *p, HfPlan *plan, Err *err) {
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    const json_t *behavior = json_object_get(p, "behavior");
    if (!json_is_string(re) && !json_is_string(str))
        return err_set(err, "tokenizer.json: a Split without pattern.Regex or pattern.String");
    if (!json_is_string(behavior) || strcmp(json_string_value(behavior), "Isolated") != 0 ||
        !unset(p, "invert"))
        return unsupported(err, "pre_tokenizer", "Split other than Isolated, not inverted");
    if (json_string_length(re ? re : str) != strlen(json_string_value(re ? re : str)))
        return err_set(err, "tokenizer.json: a Split pattern with U+0000");
    plan->pattern = re ? xstrdup(json_string_value(re)) : quoted(json_string_value(str));
    return 0;
}

static int pre_tokenizer(const json_t *p, HfPlan *plan, Err *err) {
    const char *type = type_of(p);
    int regex = 0;
    if (!type)
        return unsupported(err, "pre_tokenizer", json_is_null(p) ? "null" : "without a type");
    if (strcmp(type, "ByteLevel") == 0) {
        if (byte_level(p, &regex, err) != 0) return -1;
        if (!regex) return unsupported(err, "pre_tokenizer", "ByteLevel without use_regex alone");
        plan->pattern = xstrdup(BYTELEVEL_PATTERN);
        return 0;
    }
    const json_t *seq = json_object_get(p, "pretokenizers");
    if (strcmp(type, "Sequence") != 0 || !json_is_array(seq))
        return unsupported(err, "pre_tokenizer", type);
    const char *first = type_of(json_array_get(seq, 0)), *second = type_of(json_array_get(seq, 1));
    if (json_array_size(seq) != 2 || !first || strcmp(first, "Split") != 0 || !second ||
        strcmp(second, "ByteLevel") != 0)
        return unsupported(err, "pre_tokenizer", "Sequence other than [Split, ByteLevel]");
    if (byte_level(json_array_get(seq, 1), &regex, err) != 0) return -1;
    if (regex) return unsupported(err, "pre_tokenizer", "Split then ByteLevel with use_regex");
    return split(json_array_get(seq, 0), plan, err);
}

/* TemplateProcessing's single template: [one special token] then $A. */
static int template(const json_t *p, HfPlan *plan, Err *err) {
    const json_t *single = json_object_get(p, "single");
    const size_t n = json_array_size(single);
    const json_t *last = json_object_get(json_array_get(single, n ? n - 1 : 0), "Sequence");
    const json_t *first = json_object_get(json_array_get(single, 0), "SpecialToken");
    const json_t *id = json_object_get(first, "id");
    if (!json_is_object(last) || n > 2 || (n == 2 && !json_is_string(id)))
        return unsupported(err, "post_processor",
                           "TemplateProcessing other than \"[SPECIAL] $A\" (modtrain puts one "
                           "token before each document)");
    if (n == 2) plan->separator = json_string_value(id);
    return 0;
}

static int post_processor(const json_t *p, HfPlan *plan, Err *err) {
    const char *type = type_of(p);
    if (!p || json_is_null(p)) return 0;
    if (type && strcmp(type, "ByteLevel") == 0) return 0; /* offsets only */
    if (type && strcmp(type, "TemplateProcessing") == 0) return template(p, plan, err);
    const json_t *seq = json_object_get(p, "processors");
    if (!type || strcmp(type, "Sequence") != 0 || !json_is_array(seq))
        return unsupported(err, "post_processor", type ? type : "without a type");
    for (size_t i = 0; i < json_array_size(seq); i++) {
        const char *t = type_of(json_array_get(seq, i));
        if (t && strcmp(t, "Sequence") == 0) return unsupported(err, "post_processor", "nested");
        if (post_processor(json_array_get(seq, i), plan, err) != 0) return -1;
    }
    return 0;
}

/* The model: BPE, nothing that changes byte-level merging. */
static int model(const json_t *m, HfPlan *plan, Err *err) {
    const char *type = type_of(m);
    if (!json_is_object(m)) return err_set(err, "tokenizer.json: no model object");
    if (!type || strcmp(type, "BPE") != 0)
        return unsupported(err, "model", type ? type : "without a type");
    static const char *const off[] = {"dropout", "byte_fallback", "continuing_subword_prefix",
                                      "end_of_word_suffix"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if (!unset(m, off[i])) {
            char what[64];
            snprintf(what, sizeof what, "BPE with %s", off[i]);
            return unsupported(err, "model", what);
        }
    if (!json_is_object(json_object_get(m, "vocab")) ||
        !json_is_array(json_object_get(m, "merges")))
        return err_set(err, "tokenizer.json: model.vocab (an object) or model.merges (an array) "
                            "is missing");
    plan->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    return 0;
}

static int check_parts(const json_t *root, HfPlan *plan, Err *err) {
    if (!json_is_object(root)) return err_set(err, "tokenizer.json: not a JSON object");
    const json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm))
        return unsupported(err, "normalizer", type_of(norm) ? type_of(norm) : "without a type");
    const char *dec = type_of(json_object_get(root, "decoder"));
    if (!dec || strcmp(dec, "ByteLevel") != 0)
        return unsupported(err, "decoder", dec ? dec : "other than ByteLevel");
    if (model(json_object_get(root, "model"), plan, err) != 0 ||
        pre_tokenizer(json_object_get(root, "pre_tokenizer"), plan, err) != 0)
        return -1;
    return post_processor(json_object_get(root, "post_processor"), plan, err);
}

/* The added tokens (their own bytes, not the alphabet's): an id the model
 * has must be that token; the others extend the vocabulary. */
static int added_tokens(Vocab *v, const json_t *list, int model_vocab, int *vocab, Err *err) {
    *vocab = model_vocab;
    if (list && !json_is_array(list))
        return err_set(err, "tokenizer.json: added_tokens is not an array");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *t = json_array_get(list, i);
        const json_t *c = json_object_get(t, "content"), *idv = json_object_get(t, "id");
        const json_int_t id = json_is_integer(idv) ? json_integer_value(idv) : -1;
        if (!json_is_string(c) || json_string_length(c) == 0 || id < 0 || id >= BPE_MAX_VOCAB)
            return err_set(err,
                           "tokenizer.json: added_tokens[%zu]: expected a non-empty content and "
                           "an integer id in [0, %d)",
                           i, BPE_MAX_VOCAB);
        const uint8_t *bytes = (const uint8_t *)json_string_value(c);
        const size_t len = json_string_length(c);
        const int64_t had = strmap_get(&v->tokens, bytes, len, -1);
        char tok[200];
        token_text((const char *)bytes, len, tok, sizeof tok);
        if (id < model_vocab ? had != id : had >= 0 && had != id)
            return err_set(err,
                           "tokenizer.json: added_tokens[%zu]: %s with id %lld, but the "
                           "vocabulary gives %s the id %lld",
                           i, tok, (long long)id, had >= 0 ? "it" : "that id another token",
                           (long long)(had >= 0 ? had : id));
        if (had < 0) strmap_put(&v->tokens, bytes, len, id);
        if (id + 1 > *vocab) *vocab = (int)id + 1;
    }
    return 0;
}

static int merges(Vocab *v, const json_t *list, Err *err) {
    Merging m;
    merges_begin(v, json_array_size(list), &m);
    int rc = 0;
    for (size_t i = 0; i < json_array_size(list) && rc == 0; i++) {
        const json_t *e = json_array_get(list, i);
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if (json_is_string(e)) { /* "A B" */
            a = json_string_value(e);
            const char *sp = memchr(a, ' ', json_string_length(e));
            if (sp && !memchr(sp + 1, ' ', json_string_length(e) - (size_t)(sp + 1 - a)))
                al = (size_t)(sp - a), b = sp + 1, bl = json_string_length(e) - al - 1;
        } else if (json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) { /* ["A", "B"] */
            a = json_string_value(json_array_get(e, 0)),
            al = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1)),
            bl = json_string_length(json_array_get(e, 1));
        }
        const int added = b ? merge_add(v, &m, a, al, b, bl) : -1;
        if (added == -1)
            rc = err_set(err,
                         "tokenizer.json: model.merges[%zu]: expected \"A B\" or [\"A\", \"B\"], "
                         "two tokens of model.vocab whose concatenation is one too",
                         i);
        else if (added == -2)
            rc = err_set(err, "tokenizer.json: model.merges[%zu]: a merge listed twice", i);
    }
    merges_end(&m);
    return rc;
}

/* jansson's tree of a tokenizer.json may take this many bytes: Llama 3's
 * (9 MB: 128,256 tokens, 280,147 merges) takes 57 MiB, 131 MiB with its
 * merges as pairs. */
#define HF_JSON_BUDGET ((size_t)256 << 20)

Vocab *bpe_vocab_from_hf(const char *text, size_t n, Err *err) {
    json_error_t jerr;
    int over = 0;
    json_t *root = json_load_budget(text, n, HF_JSON_BUDGET, &jerr, &over);
    if (!root) {
        if (over)
            err_set(err,
                    "tokenizer.json: its JSON would take more than %zu MiB to hold (Llama 3's "
                    "9 MB takes 57 MiB); expected a tokenizer.json of a real vocabulary",
                    HF_JSON_BUDGET >> 20);
        else
            err_set(err, "tokenizer.json: at byte %d (line %d, column %d): not valid JSON (%s)",
                    jerr.position, jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    HfPlan plan = {0};
    Vocab *v = xcalloc(1, sizeof *v);
    alphabet_init(v);
    const json_t *m = json_object_get(root, "model");
    int model_vocab = 0, vocab = 0;
    if (check_parts(root, &plan, err) != 0 ||
        vocab_tokens_from_json(v, json_object_get(m, "vocab"), "tokenizer.json: model.vocab",
                               err) != 0)
        goto fail;
    for (size_t e = 0; e < v->tokens.n; e++)
        if (v->tokens.val[e] + 1 > model_vocab) model_vocab = (int)v->tokens.val[e] + 1;
    if ((size_t)model_vocab != v->tokens.n) {
        err_set(err,
                "tokenizer.json: model.vocab has %zu tokens with ids up to %d; expected the "
                "ids 0 to %zu, each once",
                v->tokens.n, model_vocab - 1, v->tokens.n - 1);
        goto fail;
    }
    if (added_tokens(v, json_object_get(root, "added_tokens"), model_vocab, &vocab, err) != 0 ||
        vocab_index(v, vocab, "tokenizer.json", err) != 0)
        goto fail;
    vocab_hash_tokens(v);
    if (merges(v, json_object_get(m, "merges"), err) != 0) goto fail;
    if (plan.separator) {
        v->eot = (int)strmap_get(&v->tokens, (const uint8_t *)plan.separator,
                                 strlen(plan.separator), -1);
        if (v->eot < 0) {
            err_set(err, "tokenizer.json: post_processor's template names %.60s, not a token",
                    plan.separator);
            goto fail;
        }
    } else {
        static const char *const seps[] = {"<|endoftext|>", "<|begin_of_text|>"};
        v->eot = -1, plan.separator = "";
        for (int i = 0; i < 2 && v->eot < 0; i++) {
            v->eot = (int)strmap_get(&v->tokens, (const uint8_t *)seps[i], strlen(seps[i]), -1);
            if (v->eot >= 0) plan.separator = seps[i];
        }
    }
    v->ranks = model_vocab;
    v->whole_first = plan.ignore_merges;
    v->pattern = v->own_pattern = plan.pattern;
    plan.pattern = NULL;
    v->encoding = "hf";
    /* what GPT-2's files leave implied is hashed when it differs from
     * theirs: GPT-2's tokenizer.json hashes as its two files do */
    if (strcmp(v->pattern, BYTELEVEL_PATTERN) != 0 || v->whole_first ||
        strcmp(plan.separator, "<|endoftext|>") != 0) {
        v->hash = fnv1a(v->hash, (const uint8_t *)v->pattern, strlen(v->pattern) + 1);
        v->hash = fnv1a(v->hash, (const uint8_t *)plan.separator, strlen(plan.separator) + 1);
        v->hash = fnv1a_u32(v->hash, (uint32_t)v->whole_first);
    }
    json_decref(root);
    return v;
fail:
    free(plan.pattern);
    bpe_vocab_free(v);
    json_decref(root);
    return NULL;
}
