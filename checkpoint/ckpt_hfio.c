/*
 * ckpt_hfio: Hugging Face model folders both ways. The names and layout of
 * each registry row there (hf_parts): GPT-2's are modtrain's own (Conv1D's
 * [in, out]); llama's are LlamaForCausalLM's, nn.Linear's [out, in], with
 * c_attn split into q_proj, k_proj and v_proj and c_fc into gate_proj and
 * up_proj. A folder is read whole (hf_open): config.json gives the model
 * keys (one line naming a key modtrain cannot build), and the weights are
 * model.safetensors or the shards model.safetensors.index.json names,
 * F32, BF16 or F16.
 */
#include "checkpoint/ckpt_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/base/files.h"
#include "src/base/util.h"

#define HF_MAX_SHARDS 4096
#define HF_MAX_JSON (16 << 20) /* config.json and the index: bytes (an 8B model's index: 24 KB) */

/* ------------------------------------------------------------- the names */

int hf_parts(const ModelDims *d, const ParamInfo *p, HfPart *out) {
    const int cols = p->shape[1];
    if (param_is_routing(p->name) || strstr(p->name, ".experts."))
        return 0; /* Mixture-of-Depths and -Experts: nothing Hugging Face's models have */
    if (d->arch == ARCH_GPT2) {
        out[0] = (HfPart){.c0 = 0, .c1 = cols, .tr = 0};
        snprintf(out[0].name, sizeof out[0].name, "%s", p->name);
        return 1;
    }
    const char *whole = strcmp(p->name, "wte.weight") == 0       ? "model.embed_tokens.weight"
                        : strcmp(p->name, "ln_f.weight") == 0    ? "model.norm.weight"
                        : strcmp(p->name, "lm_head.weight") == 0 ? "lm_head.weight"
                                                                 : NULL;
    if (whole) {
        out[0] = (HfPart){.c0 = 0, .c1 = cols, .tr = 0};
        snprintf(out[0].name, sizeof out[0].name, "%s", whole);
        return 1;
    }
    int l;
    char rest[64];
    if (sscanf(p->name, "h.%d.%63s", &l, rest) != 2) return 0;
    static const struct {
        const char *ours, *theirs[3];
        int tr;
    } map[] = {
        {"ln_1.weight", {"input_layernorm.weight"}, 0},
        {"ln_2.weight", {"post_attention_layernorm.weight"}, 0},
        {"attn.c_attn.weight",
         {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}, 1},
        {"attn.c_proj.weight", {"self_attn.o_proj.weight"}, 1},
        {"mlp.c_fc.weight", {"mlp.gate_proj.weight", "mlp.up_proj.weight"}, 1},
        {"mlp.c_proj.weight", {"mlp.down_proj.weight"}, 1},
    };
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
        if (strcmp(rest, map[k].ours) != 0) continue;
        int n = 0, c0 = 0;
        for (; n < 3 && map[k].theirs[n]; n++) {
            /* the blocks along the columns: q|k|v, gate|up */
            const int w = p->split_blocks > 1 ? p->block_w[n] : cols;
            out[n] = (HfPart){.c0 = c0, .c1 = c0 + w, .tr = map[k].tr};
            snprintf(out[n].name, sizeof out[n].name, "model.layers.%d.%s", l, map[k].theirs[n]);
            c0 += w;
        }
        return n;
    }
    return 0;
}

/* The shape part q of row p has in the folder. */
static void part_shape(const ParamInfo *p, const HfPart *q, int *ndim, int64_t shape[2]) {
    *ndim = p->ndim;
    if (p->ndim == 1) {
        shape[0] = p->vocab_rows, shape[1] = 1;
    } else if (q->tr) {
        shape[0] = q->c1 - q->c0, shape[1] = p->vocab_rows;
    } else {
        shape[0] = p->vocab_rows, shape[1] = q->c1 - q->c0;
    }
}

/* ------------------------------------------------------------- writing */

int hf_write_weights(const char *path, const Model *m, const StMeta *meta, int nmeta,
                     int *left_out, Err *err) {
    if (m->d.tp != 1 || m->d.pp != 1)
        return err_set(err, "ckpt: a Hugging Face folder is written from the whole model (tp 1, pp 1)");
    StOut *outs = xcalloc((size_t)m->nreg * 3 + 1, sizeof(StOut));
    float **owned = xcalloc((size_t)m->nreg * 3 + 1, sizeof(float *));
    int n = 0;
    *left_out = 0;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        HfPart q[3];
        const int np = hf_parts(&m->d, p, q);
        *left_out += np == 0;
        const float *src = m->params + p->offset;
        for (int k = 0; k < np; k++, n++) {
            StOut *o = &outs[n];
            o->name = xstrdup(q[k].name);
            int nd;
            part_shape(p, &q[k], &nd, o->shape);
            o->ndim = nd;
            if (!q[k].tr && q[k].c0 == 0 && q[k].c1 == p->shape[1]) {
                o->data = src; /* as it is (a vocabulary's real rows) */
                continue;
            }
            const size_t rows = (size_t)p->vocab_rows, w = (size_t)(q[k].c1 - q[k].c0);
            float *t = owned[n] = xmalloc(rows * w * sizeof(float));
            for (size_t r = 0; r < rows; r++)
                for (size_t c = 0; c < w; c++) {
                    const float v = src[r * (size_t)p->shape[1] + (size_t)q[k].c0 + c];
                    if (q[k].tr) t[c * rows + r] = v;
                    else t[r * w + c] = v;
                }
            o->data = t;
        }
    }
    const int rc = st_write(path, outs, n, meta, nmeta, err);
    for (int i = 0; i < n; i++) {
        free((char *)outs[i].name);
        free(owned[i]);
    }
    free(owned);
    free(outs);
    return rc;
}

/* ------------------------------------------------------------- reading */

/* A JSON file of at most HF_MAX_JSON bytes, parsed: NULL with err set. */
static json_t *read_json(const char *path, Err *err) {
    Err e;
    size_t len = 0;
    char *text = read_file(path, HF_MAX_JSON, &len, &e);
    if (!text) {
        err_set(err, "%s", e.msg);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!j) err_set(err, "'%s' is not JSON: %s (line %d)", path, je.text, je.line);
    else if (!json_is_object(j)) {
        json_decref(j);
        j = NULL;
        err_set(err, "'%s' is not a JSON object", path);
    }
    return j;
}

typedef struct {
    json_t *j;
    const char *path;
    Config *cfg;
    Err *err;
} CfgReader;

/* An integer key of config.json into the model key `to` (a default when
 * the file lacks it: def >= 0). 0, or -1 with err set. */
static int get_int(CfgReader *r, const char *key, const char *to, long long def) {
    json_t *v = json_object_get(r->j, key);
    long long x = def;
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v))
            return err_set(r->err, "ckpt: '%s': %s is not an integer", r->path, key);
        x = json_integer_value(v);
    } else if (def < 0) {
        return err_set(r->err, "ckpt: '%s' lacks %s", r->path, key);
    }
    char text[32];
    snprintf(text, sizeof text, "%lld", x);
    Err e;
    if (config_set(r->cfg, to, text, r->path, &e) != 0)
        return err_set(r->err, "ckpt: '%s': %s = %lld cannot be modtrain's %s: %s", r->path, key,
                       x, to, e.msg);
    return 0;
}

static int get_float(CfgReader *r, const char *key, const char *to, double def) {
    json_t *v = json_object_get(r->j, key);
    double x = def;
    if (v && !json_is_null(v)) {
        if (!json_is_number(v)) return err_set(r->err, "ckpt: '%s': %s is not a number", r->path, key);
        x = json_number_value(v);
    }
    char text[40];
    snprintf(text, sizeof text, "%.17g", x);
    Err e;
    if (config_set(r->cfg, to, text, r->path, &e) != 0)
        return err_set(r->err, "ckpt: '%s': %s = %g cannot be modtrain's %s: %s", r->path, key, x,
                       to, e.msg);
    return 0;
}

/* A boolean key (def when absent or null). */
static int get_bool(CfgReader *r, const char *key, int def, int *out) {
    json_t *v = json_object_get(r->j, key);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return err_set(r->err, "ckpt: '%s': %s is not true or false", r->path, key);
    *out = json_is_true(v);
    return 0;
}

/* A key whose value must be what modtrain builds: a string `want` (or
 * absent), false (want NULL: absent, null or false). */
static int must_be(CfgReader *r, const char *key, const char *want, const char *what) {
    json_t *v = json_object_get(r->j, key);
    if (!v || json_is_null(v)) return 0;
    if (want ? json_is_string(v) && strcmp(json_string_value(v), want) == 0 : json_is_false(v))
        return 0;
    char text[96];
    if (json_is_string(v)) snprintf(text, sizeof text, "'%.80s'", json_string_value(v));
    else if (json_is_number(v)) snprintf(text, sizeof text, "%g", json_number_value(v));
    else snprintf(text, sizeof text, "%s", json_is_true(v) ? "true" : "set");
    return err_set(r->err, "ckpt: '%s': %s is %s, but %s", r->path, key, text, what);
}

int hf_read_config(const char *dir, Config *cfg, Err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *j = read_json(path, err);
    if (!j) {
        Err why = *err;
        return err_set(err, "ckpt: %s (a Hugging Face folder's config.json)", why.msg);
    }
    config_defaults(cfg);
    cfg->route_every = 0; /* a Hugging Face model is dense */
    CfgReader r = {j, path, cfg, err};
    const char *type = json_string_value(json_object_get(j, "model_type"));
    int rc = 0, tied = 0;
    if (type && strcmp(type, "gpt2") == 0) {
        const json_t *inner = json_object_get(j, "n_inner");
        rc = get_int(&r, "n_embd", "d_model", -1) || get_int(&r, "n_layer", "n_layer", -1) ||
             get_int(&r, "n_head", "n_head", -1) || get_int(&r, "n_positions", "seq_len", -1) ||
             get_int(&r, "vocab_size", "vocab_size", -1) ||
             (inner && !json_is_null(inner) && get_int(&r, "n_inner", "d_ff", 0)) ||
             must_be(&r, "activation_function", "gelu_new",
                     "modtrain's GPT-2 uses the tanh GELU (gelu_new)") ||
             get_bool(&r, "tie_word_embeddings", 1, &tied);
        const json_t *eps = json_object_get(j, "layer_norm_epsilon");
        if (!rc && eps && (!json_is_number(eps) || fabs(json_number_value(eps) - 1e-5) > 1e-12))
            rc = err_set(err, "ckpt: '%s': layer_norm_epsilon is not 1e-5, GPT-2's (and modtrain's)",
                         path);
    } else if (type && strcmp(type, "llama") == 0) {
        cfg->arch = ARCH_LLAMA;
        rc = get_int(&r, "hidden_size", "d_model", -1) ||
             get_int(&r, "num_hidden_layers", "n_layer", -1) ||
             get_int(&r, "num_attention_heads", "n_head", -1) ||
             get_int(&r, "num_key_value_heads", "n_kv_head", 0) ||
             get_int(&r, "intermediate_size", "d_ff", -1) ||
             get_int(&r, "max_position_embeddings", "seq_len", -1) ||
             get_int(&r, "vocab_size", "vocab_size", -1) ||
             get_float(&r, "rms_norm_eps", "norm_eps", 1e-6) ||
             get_float(&r, "rope_theta", "rope_theta", 10000.0) ||
             must_be(&r, "hidden_act", "silu", "modtrain's SwiGLU uses silu") ||
             must_be(&r, "rope_scaling", NULL, "modtrain's rotary positions are unscaled") ||
             must_be(&r, "attention_bias", NULL, "modtrain's attention has no biases") ||
             must_be(&r, "mlp_bias", NULL, "modtrain's MLP has no biases") ||
             get_bool(&r, "tie_word_embeddings", 0, &tied);
        const json_t *hd = json_object_get(j, "head_dim");
        if (!rc && hd && !json_is_null(hd) &&
            (!json_is_integer(hd) || cfg->n_head <= 0 ||
             json_integer_value(hd) * cfg->n_head != cfg->d_model))
            rc = err_set(err,
                         "ckpt: '%s': head_dim is not hidden_size / num_attention_heads = %d / %d "
                         "(modtrain's heads split the model's width)",
                         path, cfg->d_model, cfg->n_head);
    } else {
        rc = err_set(err, "ckpt: '%s': model_type is %s%s%s, not one modtrain builds (gpt2, llama)",
                     path, type ? "'" : "", type ? type : "missing", type ? "'" : "");
    }
    json_decref(j);
    if (rc) return -1;
    cfg->tie_embeddings = tied ? TIE_YES : TIE_NO;
    cfg->tokenizer = config_tokenizer_for_vocab(cfg->vocab_size);
    Err why;
    if (config_validate(cfg, &why) != 0)
        return err_set(err, "ckpt: '%s' describes a model modtrain cannot build: %s", path, why.msg);
    return 0;
}

void hf_close(HfFolder *h) {
    for (int i = 0; i < h->nf; i++) st_free(&h->f[i]);
    free(h->f);
    memset(h, 0, sizeof *h);
}

/* A shard's name from the index: a file of the folder, not a path. */
static int plain_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

int hf_open(HfFolder *h, const char *dir, Err *err) {
    memset(h, 0, sizeof *h);
    snprintf(h->dir, sizeof h->dir, "%s", dir);
    if (hf_read_config(dir, &h->cfg, err) != 0) return -1;
    char path[4600];
    struct stat st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (stat(path, &st) == 0) {
        h->f = xcalloc(1, sizeof(StFile));
        h->nf = 1;
        if (st_read(&h->f[0], path, err) == 0) return 0;
        hf_close(h);
        return -1;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_t *ix = read_json(path, err);
    if (!ix) {
        Err why = *err;
        return err_set(err, "ckpt: '%s' holds neither model.safetensors nor a readable index (%s)",
                       dir, why.msg);
    }
    json_t *map = json_object_get(ix, "weight_map");
    int rc = json_is_object(map) ? 0 : err_set(err, "ckpt: '%s' has no weight_map object", path);
    /* the distinct shards, in the order the map first names them */
    const char *names[HF_MAX_SHARDS];
    int nn = 0;
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        if (rc) break;
        const char *s = json_string_value(v);
        if (!s || !plain_name(s)) {
            rc = err_set(err, "ckpt: '%s': tensor '%.100s' maps to %s, not a file of the folder",
                         path, key, s ? s : "no string");
            break;
        }
        int k = 0;
        while (k < nn && strcmp(names[k], s) != 0) k++;
        if (k < nn) continue;
        if (nn == HF_MAX_SHARDS) {
            rc = err_set(err, "ckpt: '%s' names more than %d shards", path, HF_MAX_SHARDS);
            break;
        }
        names[nn++] = s;
    }
    if (!rc) { /* h->nf counts the shards read: what hf_close frees */
        h->f = xcalloc((size_t)nn + 1, sizeof(StFile));
        for (int k = 0; k < nn && !rc; k++) {
            char shard[4600];
            snprintf(shard, sizeof shard, "%s/%s", dir, names[k]);
            rc = st_read(&h->f[k], shard, err);
            if (!rc) h->nf++;
        }
    }
    json_object_foreach(map, key, v) { /* every tensor where the index says */
        if (rc) break;
        const StFile *f = NULL;
        const char *s = json_string_value(v);
        for (int k = 0; k < h->nf && !f; k++)
            if (strcmp(names[k], s) == 0) f = &h->f[k];
        if (!f || !st_find(f, key))
            rc = err_set(err, "ckpt: '%s' puts tensor '%.100s' in %s, which lacks it", path, key, s);
    }
    json_decref(ix);
    if (rc) hf_close(h);
    return rc ? -1 : 0;
}

/* Tensor `name` of the folder (GPT-2's may carry transformers' prefix). */
static const StTensor *hf_find(const HfFolder *h, const char *name, const StFile **file) {
    char alt[160];
    snprintf(alt, sizeof alt, "transformer.%s", name);
    for (int k = 0; k < h->nf; k++) {
        const StTensor *t = st_find(&h->f[k], name);
        if (!t) t = st_find(&h->f[k], alt);
        if (t) {
            *file = &h->f[k];
            return t;
        }
    }
    return NULL;
}

/* Whether a tensor of the folder is one modtrain's model does not hold and
 * need not: GPT-2's causal-mask buffers, older Llamas' rotary frequencies. */
static int is_buffer(const char *name) {
    static const char *const tails[] = {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"};
    const size_t n = strlen(name);
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        const size_t k = strlen(tails[i]);
        if (n > k && strcmp(name + n - k, tails[i]) == 0) return 1;
    }
    return 0;
}

int hf_load(const HfFolder *h, Model *m, Err *err) {
    ModelDims whole = m->d; /* the folder holds every stage: check the whole model */
    model_dims_whole(&whole);
    ParamInfo *reg;
    const int nreg = model_registry(&whole, &reg);
    int rc = 0, used = 0;
    for (int i = 0; i < nreg && !rc; i++) { /* every tensor there with its shape */
        HfPart q[3];
        const int np = hf_parts(&whole, &reg[i], q);
        for (int k = 0; k < np && !rc; k++) {
            const StFile *f;
            const StTensor *t = hf_find(h, q[k].name, &f);
            int nd;
            int64_t want[2];
            part_shape(&reg[i], &q[k], &nd, want);
            if (!t)
                rc = err_set(err, "ckpt: '%s' lacks tensor '%s'", h->dir, q[k].name);
            else if (t->ndim != nd || t->shape[0] != want[0] || (nd == 2 && t->shape[1] != want[1]))
                rc = err_set(err,
                             "ckpt: '%s': tensor '%s' has %d dimensions [%lld, %lld], the model "
                             "needs [%lld%s%lld]",
                             h->dir, q[k].name, t->ndim, (long long)t->shape[0],
                             (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)want[0],
                             nd == 2 ? ", " : "", nd == 2 ? (long long)want[1] : 0LL);
            used++;
        }
    }
    free(reg);
    int total = 0;
    for (int k = 0; k < h->nf && !rc; k++)
        for (int i = 0; i < h->f[k].nt && !rc; i++) {
            const char *n = h->f[k].t[i].name;
            if (is_buffer(n)) continue;
            total++;
            const StFile *f;
            if (hf_find(h, n, &f) != &h->f[k].t[i]) /* a name twice, across shards */
                rc = err_set(err, "ckpt: '%s': tensor '%s' appears in two shards", h->dir, n);
        }
    if (!rc && total != used)
        rc = err_set(err,
                     "ckpt: '%s' holds %d tensors, and the model its config.json describes takes "
                     "%d (n_layer = %d, arch = %s): not this model's files",
                     h->dir, total, used, whole.L, whole.arch == ARCH_LLAMA ? "llama" : "gpt2");
    for (int i = 0; i < m->nreg && !rc; i++) { /* this rank's slices */
        const ParamInfo *p = &m->reg[i];
        HfPart q[3];
        const int np = hf_parts(&m->d, p, q);
        if (np == 0) continue; /* routers and predictors start as initialised */
        const StTensor *t[3];
        const StFile *f[3];
        for (int k = 0; k < np; k++) t[k] = hf_find(h, q[k].name, &f[k]);
        float *dst = m->params + p->offset;
        const size_t rows = (size_t)p->vocab_rows, W = (size_t)p->shape[1];
        for (size_t j = 0; j < p->numel && !rc; j++) {
            const size_t g = param_global_index(p, m->d.tp, m->d.tp_rank, j);
            const size_t r = g / W, c = g % W;
            if (r >= rows) { /* a padded vocabulary row */
                dst[j] = 0.f;
                continue;
            }
            int k = 0;
            while (k + 1 < np && c >= (size_t)q[k].c1) k++;
            const size_t w = (size_t)(q[k].c1 - q[k].c0), cc = c - (size_t)q[k].c0;
            dst[j] = st_float(t[k], f[k], q[k].tr ? cc * rows + r : r * w + cc);
            if (!isfinite(dst[j]))
                rc = err_set(err, "ckpt: '%s': tensor '%s' holds %f", h->dir, q[k].name,
                             (double)dst[j]);
        }
    }
    return rc;
}
