/*
 * ckpt_hf: the model in Hugging Face's files. Its weights (or gradients)
 * written as safetensors under the registry's names, or as a folder with
 * GPT-2's or Llama's config.json (the names there: ckpt_hfio.c); a
 * safetensors file checked against the model's registry and loaded.
 */
#include "checkpoint/ckpt_impl.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/safetensors.h"
#include "src/base/fault.h"
#include "src/base/files.h"
#include "src/base/util.h"

#define EXPORT_META 48 /* the model keys, the step, the format */

static void export_shape(const ParamInfo *p, StOut *o) {
    o->ndim = p->ndim;
    o->shape[0] = p->vocab_rows;
    o->shape[1] = p->shape[1];
}

/* The metadata of an export: the model keys (route_every 0 for a Hugging
 * Face folder, dense), the step, the format. Returns the count. */
static int export_meta(StMeta *meta, const Model *m, const Config *cfg, int step, int dense) {
    int n = 0;
    const char *key;
    for (int i = 0; (key = config_model_key(i)) && n < EXPORT_META - 2; i++, n++) {
        snprintf(meta[n].key, sizeof meta[n].key, "%s", key);
        model_key_value(cfg, m, key, meta[n].value, sizeof meta[n].value);
        if (dense && strcmp(key, "route_every") == 0)
            snprintf(meta[n].value, sizeof meta[n].value, "0");
    }
    snprintf(meta[n].key, sizeof meta[n].key, "step");
    snprintf(meta[n++].value, sizeof meta[0].value, "%d", step);
    snprintf(meta[n].key, sizeof meta[n].key, "format");
    snprintf(meta[n++].value, sizeof meta[0].value, "pt");
    return n;
}

/* The safetensors file of base (weights or gradients) under the registry's
 * names, every tensor. */
static int write_safetensors(const char *path, const Model *m, const float *base, const Config *cfg,
                             int step, Err *err) {
    if (m->d.tp != 1)
        return err_set(err, "ckpt: writing safetensors under tp = %d is not built yet", m->d.tp);
    StMeta meta[EXPORT_META];
    const int nmeta = export_meta(meta, m, cfg, step, 0);
    StOut *outs = xcalloc((size_t)m->nreg, sizeof(StOut));
    for (int i = 0; i < m->nreg; i++) {
        outs[i].name = m->reg[i].name;
        export_shape(&m->reg[i], &outs[i]);
        outs[i].data = base + m->reg[i].offset;
    }
    int rc = st_write(path, outs, m->nreg, meta, nmeta, err);
    free(outs);
    return rc;
}

int ckpt_export_safetensors(const char *path, const Model *m, const Config *cfg, int step,
                            Err *err) {
    return write_safetensors(path, m, m->params, cfg, step, err);
}

/* GPT-2's config.json (transformers' GPT2Config): modtrain's block is
 * GPT-2's, with tanh-GELU (gelu_new), LayerNorm eps 1e-5 and no dropout. */
static int gpt2_config(char *json, size_t cap, const Model *m, const Config *cfg,
                       const char *eot_ids) {
    return snprintf(json, cap,
                    "{\n"
                    "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
                    "  \"model_type\": \"gpt2\",\n"
                    "  \"vocab_size\": %d,\n"
                    "  \"n_positions\": %d,\n"
                    "  \"n_ctx\": %d,\n"
                    "  \"n_embd\": %d,\n"
                    "  \"n_layer\": %d,\n"
                    "  \"n_head\": %d,\n"
                    "  \"n_inner\": %d,\n"
                    "  \"activation_function\": \"gelu_new\",\n"
                    "  \"layer_norm_epsilon\": 1e-05,\n"
                    "  \"initializer_range\": 0.02,\n"
                    "  \"resid_pdrop\": 0.0,\n"
                    "  \"embd_pdrop\": 0.0,\n"
                    "  \"attn_pdrop\": 0.0,\n"
                    "  \"scale_attn_weights\": true,\n"
                    "  \"tie_word_embeddings\": %s,\n"
                    "  \"use_cache\": true,\n"
                    "%s"
                    "  \"torch_dtype\": \"float32\"\n"
                    "}\n",
                    m->d.V, cfg->seq_len, cfg->seq_len, cfg->d_model, cfg->n_layer, cfg->n_head,
                    m->d.F, m->d.tied ? "true" : "false", eot_ids);
}

/* Llama's config.json (transformers' LlamaConfig): SwiGLU (silu), RMSNorm,
 * unscaled rotary positions, no biases, no dropout. */
static int llama_config(char *json, size_t cap, const Model *m, const Config *cfg,
                        const char *eot_ids) {
    return snprintf(json, cap,
                    "{\n"
                    "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                    "  \"model_type\": \"llama\",\n"
                    "  \"vocab_size\": %d,\n"
                    "  \"hidden_size\": %d,\n"
                    "  \"intermediate_size\": %d,\n"
                    "  \"num_hidden_layers\": %d,\n"
                    "  \"num_attention_heads\": %d,\n"
                    "  \"num_key_value_heads\": %d,\n"
                    "  \"head_dim\": %d,\n"
                    "  \"max_position_embeddings\": %d,\n"
                    "  \"hidden_act\": \"silu\",\n"
                    "  \"rms_norm_eps\": %.17g,\n"
                    "  \"rope_theta\": %.17g,\n"
                    "  \"rope_scaling\": null,\n"
                    "  \"attention_bias\": false,\n"
                    "  \"mlp_bias\": false,\n"
                    "  \"attention_dropout\": 0.0,\n"
                    "  \"pretraining_tp\": 1,\n"
                    "  \"initializer_range\": 0.02,\n"
                    "  \"tie_word_embeddings\": %s,\n"
                    "  \"use_cache\": true,\n"
                    "%s"
                    "  \"torch_dtype\": \"float32\"\n"
                    "}\n",
                    m->d.V, m->d.C, m->d.F, m->d.L, m->d.NH, m->d.KV, m->d.hs, cfg->seq_len,
                    cfg->norm_eps, cfg->rope_theta, m->d.tied ? "true" : "false", eot_ids);
}

int ckpt_export_hf(const char *dir, const Model *m, const Config *cfg, int step, int *left_out,
                   Err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    StMeta meta[EXPORT_META];
    const int nmeta = export_meta(meta, m, cfg, step, 1);
    if (hf_write_weights(path, m, meta, nmeta, left_out, err) != 0) return -1;
    /* V is the real vocabulary, never the padded one */
    const int bos = config_tokenizer_eot(cfg->tokenizer),
              eos = config_tokenizer_eos(cfg->tokenizer);
    char eot_ids[96] = "";
    if (bos >= 0)
        snprintf(eot_ids, sizeof eot_ids, "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n", bos,
                 eos);
    char json[2048];
    const int n = m->d.arch == ARCH_LLAMA ? llama_config(json, sizeof json, m, cfg, eot_ids)
                                          : gpt2_config(json, sizeof json, m, cfg, eot_ids);
    snprintf(path, sizeof path, "%s/config.json", dir);
    return write_file_durable("hf.config", path, json, (size_t)n, err) < 0 ? -1 : 0;
}

int ckpt_export_grads(const char *path, const Model *m, const Config *cfg, Err *err) {
    return write_safetensors(path, m, m->grads, cfg, 0, err);
}

/* Whether tensor t of the file has the shape registry row p exports. */
static int same_shape(const StTensor *t, const ParamInfo *p) {
    StOut want;
    export_shape(p, &want);
    return t->ndim == want.ndim && t->shape[0] == want.shape[0] &&
           (want.ndim == 1 || t->shape[1] == want.shape[1]);
}

static void shape_text(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Hugging Face's GPT-2 files carry each block's causal mask as a buffer
 * (h.N.attn.bias, h.N.attn.masked_bias): not a parameter, nothing to load.
 * Whether name is one of those, for a block the model has. */
static int is_mask_buffer(const char *name, int L) {
    if (strncmp(name, "h.", 2) != 0) return 0;
    const char *p = name + 2, *dot = strchr(p, '.');
    char num[12];
    long long l;
    if (!dot || dot - p >= (ptrdiff_t)sizeof num) return 0;
    memcpy(num, p, (size_t)(dot - p));
    num[dot - p] = '\0';
    if (parse_i64(num, 0, L - 1, &l) != 0) return 0;
    return strcmp(dot, ".attn.bias") == 0 || strcmp(dot, ".attn.masked_bias") == 0;
}

int ckpt_check_safetensors(const StFile *f, const ModelDims *d, int fresh_routing, Err *err) {
    ParamInfo *reg;
    int n = model_registry(d, &reg), rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (fresh_routing && param_is_routing(reg[i].name)) continue;
        const StTensor *t = st_find(f, reg[i].name);
        StOut want;
        export_shape(&reg[i], &want);
        char got[96], exp[96];
        if (!t) {
            rc = err_set(err, "ckpt: '%s' lacks tensor '%s'", f->path, reg[i].name);
        } else if (!same_shape(t, &reg[i])) {
            shape_text(got, sizeof got, t->ndim, t->shape);
            shape_text(exp, sizeof exp, want.ndim, want.shape);
            rc = err_set(err, "ckpt: '%s': tensor '%s' has shape %s, the model needs %s", f->path,
                         reg[i].name, got, exp);
        }
    }
    for (int i = 0; i < f->nt && rc == 0; i++) {
        int found = is_mask_buffer(f->t[i].name, d->L);
        for (int k = 0; k < n && !found; k++) found = strcmp(reg[k].name, f->t[i].name) == 0;
        if (!found)
            rc = err_set(err,
                         "ckpt: '%s': tensor '%s' is not part of the model its metadata describes "
                         "(n_layer = %d, route_every = %d)",
                         f->path, f->t[i].name, d->L, d->route_every);
    }
    free(reg);
    return rc;
}

int ckpt_load_safetensors(const StFile *f, Model *m, int fresh_routing, Err *err) {
    ModelDims whole = m->d; /* the file holds every stage: check the whole model */
    model_dims_whole(&whole);
    if (ckpt_check_safetensors(f, &whole, fresh_routing, err) != 0) return -1;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        if (fresh_routing && param_is_routing(p->name)) continue; /* as initialised */
        const StTensor *t = st_find(f, p->name);
        size_t limit = st_numel(t);
        float *dst = m->params + p->offset;
        for (size_t j = 0; j < p->numel; j++) {
            size_t g = param_global_index(p, m->d.tp, m->d.tp_rank, j);
            dst[j] = g < limit ? st_float(t, f, g) : 0.f; /* padded vocabulary rows are zero */
            if (!isfinite(dst[j]))
                return err_set(err, "ckpt: '%s': tensor '%s' holds %f at element %zu", f->path,
                               p->name, (double)dst[j], g);
        }
    }
    return 0;
}
