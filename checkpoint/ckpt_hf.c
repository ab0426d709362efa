/*
 * ckpt_hf: the model in Hugging Face's files. Its weights (or gradients)
 * written as safetensors, or as a folder with GPT-2's config.json; a
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

static void export_shape(const ParamInfo *p, StOut *o) {
    o->ndim = p->ndim;
    o->shape[0] = p->vocab_rows;
    o->shape[1] = p->shape[1];
}

/* A router's or a predictor's tensor: Mixture-of-Depths only, nothing a
 * dense GPT-2 has. */
static int is_mod_tensor(const ParamInfo *p) {
    return strstr(p->name, ".router.") || strstr(p->name, ".predictor.");
}

/* The safetensors file of base (weights or gradients); dense: the dense part
 * alone (no router or predictor tensors, route_every = 0 in the metadata),
 * the model Hugging Face's GPT-2 runs. */
static int write_safetensors(const char *path, const Model *m, const float *base, const Config *cfg,
                             int step, int dense, Err *err) {
    if (m->d.tp != 1)
        return err_set(err, "ckpt: writing safetensors under tp = %d is not built yet", m->d.tp);
    StMeta meta[32];
    int nmeta = 0;
    const char *key;
    for (int i = 0; (key = config_model_key(i)); i++, nmeta++) {
        snprintf(meta[nmeta].key, sizeof meta[nmeta].key, "%s", key);
        model_key_value(cfg, m, key, meta[nmeta].value, sizeof meta[nmeta].value);
        if (dense && strcmp(key, "route_every") == 0)
            snprintf(meta[nmeta].value, sizeof meta[nmeta].value, "0");
    }
    snprintf(meta[nmeta].key, sizeof meta[nmeta].key, "step");
    snprintf(meta[nmeta].value, sizeof meta[nmeta].value, "%d", step);
    nmeta++;
    snprintf(meta[nmeta].key, sizeof meta[nmeta].key, "format");
    snprintf(meta[nmeta].value, sizeof meta[nmeta].value, "pt");
    nmeta++;
    StOut *outs = xcalloc((size_t)m->nreg, sizeof(StOut));
    int n = 0;
    for (int i = 0; i < m->nreg; i++) {
        if (dense && is_mod_tensor(&m->reg[i])) continue;
        outs[n].name = m->reg[i].name;
        export_shape(&m->reg[i], &outs[n]);
        outs[n++].data = base + m->reg[i].offset;
    }
    int rc = st_write(path, outs, n, meta, nmeta, err);
    free(outs);
    return rc;
}

int ckpt_export_safetensors(const char *path, const Model *m, const Config *cfg, int step,
                            Err *err) {
    return write_safetensors(path, m, m->params, cfg, step, 0, err);
}

int ckpt_export_hf(const char *dir, const Model *m, const Config *cfg, int step, int *left_out,
                   Err *err) {
    struct stat st;
    if (m->d.arch != ARCH_GPT2)
        return err_set(err, "ckpt export: --format hf writes GPT-2's folder; an arch = llama "
                            "model's is not built yet (use --format safetensors)");
    if (fp_mkdir("hf.mkdir", dir, 0755) != 0 && errno != EEXIST)
        return err_set(err, "ckpt export: cannot create the folder '%s': %s", dir, strerror(errno));
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return err_set(err, "ckpt export: '%s' exists and is not a folder (--format hf writes a folder)",
                       dir);
    *left_out = 0;
    for (int i = 0; i < m->nreg; i++) *left_out += is_mod_tensor(&m->reg[i]);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (write_safetensors(path, m, m->params, cfg, step, 1, err) != 0) return -1;
    /* GPT-2's config (transformers' GPT2Config): modtrain's block is GPT-2's,
     * with tanh-GELU (gelu_new), LayerNorm eps 1e-5, no dropout and the head
     * tied to wte (or lm_head); V is the real vocabulary, never the padded one */
    const int bos = config_tokenizer_eot(cfg->tokenizer),
              eos = config_tokenizer_eos(cfg->tokenizer);
    char eot_ids[96] = "";
    if (bos >= 0)
        snprintf(eot_ids, sizeof eot_ids, "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n", bos,
                 eos);
    char json[2048];
    const int n = snprintf(json, sizeof json,
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
                           m->d.V, cfg->seq_len, cfg->seq_len, cfg->d_model, cfg->n_layer,
                           cfg->n_head, m->d.F, m->d.tied ? "true" : "false", eot_ids);
    snprintf(path, sizeof path, "%s/config.json", dir);
    return write_file_durable("hf.config", path, json, (size_t)n, err) < 0 ? -1 : 0;
}

int ckpt_export_grads(const char *path, const Model *m, const Config *cfg, Err *err) {
    return write_safetensors(path, m, m->grads, cfg, 0, 0, err);
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

int ckpt_check_safetensors(const StFile *f, const ModelDims *d, Err *err) {
    ParamInfo *reg;
    int n = model_registry(d, &reg), rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
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

int ckpt_load_safetensors(const StFile *f, Model *m, Err *err) {
    ModelDims whole = m->d; /* the file holds every stage: check the whole model */
    model_dims_whole(&whole);
    if (ckpt_check_safetensors(f, &whole, err) != 0) return -1;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
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
