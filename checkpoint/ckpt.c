/*
 * ckpt: simple safetensors-based checkpoints (the collective, compressed
 * format of DESIGN.md section 6 replaces the storage later; the registry-
 * driven naming and checks stay).
 */
#define _GNU_SOURCE
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/util.h"
#include "safetensors.h"

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The safetensors shape of a registry row: the real vocabulary, never the
 * padded one, and 1-D tensors as 1-D. */
static void export_shape(const Model *m, const ParamInfo *p, StOut *o) {
    o->ndim = p->ndim;
    o->shape[0] = strcmp(p->name, "wte.weight") == 0 ? m->d.V : p->shape[0];
    o->shape[1] = p->shape[1];
}

static int meta_from_config(const Config *cfg, const Model *m, int step, StMeta *meta) {
    int n = 0;
    for (int i = 0; config_model_keys[i]; i++) {
        snprintf(meta[n].key, sizeof meta[n].key, "%s", config_model_keys[i]);
        if (strcmp(config_model_keys[i], "vocab_size") == 0)
            snprintf(meta[n].value, sizeof meta[n].value, "%d", m->d.V);
        else config_get(cfg, config_model_keys[i], meta[n].value, sizeof meta[n].value);
        n++;
    }
    snprintf(meta[n].key, sizeof meta[n].key, "step");
    snprintf(meta[n++].value, sizeof meta[n].value, "%d", step);
    snprintf(meta[n].key, sizeof meta[n].key, "seed");
    snprintf(meta[n++].value, sizeof meta[n].value, "%lld", cfg->seed);
    snprintf(meta[n].key, sizeof meta[n].key, "format");
    snprintf(meta[n++].value, sizeof meta[n].value, "pt");
    return n;
}

static int write_buffer(const char *path, const Model *m, const float *base, const char *prefix,
                        const StMeta *meta, int nmeta) {
    if (m->d.tp != 1) {
        errorf("ckpt: writing safetensors under tp = %d is not built yet", m->d.tp);
        return -1;
    }
    StOut *outs = xcalloc((size_t)m->nreg, sizeof(StOut));
    char (*names)[96] = xcalloc((size_t)m->nreg, 96);
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        snprintf(names[i], 96, "%s%s", prefix, p->name);
        outs[i].name = names[i];
        export_shape(m, p, &outs[i]);
        outs[i].data = base + p->offset;
    }
    int rc = st_write(path, outs, m->nreg, meta, nmeta);
    free(outs);
    free(names);
    return rc;
}

int ckpt_export_safetensors(const char *path, const Model *m, const Config *cfg, int step) {
    StMeta meta[32];
    int nmeta = meta_from_config(cfg, m, step, meta);
    return write_buffer(path, m, m->params, "", meta, nmeta);
}

int ckpt_export_grads(const char *path, const Model *m, const Config *cfg) {
    StMeta meta[32];
    int nmeta = meta_from_config(cfg, m, 0, meta);
    return write_buffer(path, m, m->grads, "", meta, nmeta);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Removes all but the newest `keep` step-* directories. */
static void prune(const char *dir, int keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    char **names = NULL;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "step-", 5) != 0 || len != 13) continue;
        names = realloc(names, (size_t)(n + 1) * sizeof(char *));
        names[n++] = xstrdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof(char *), cmp_str);
    for (int i = 0; i < n - keep; i++) {
        char p[1024];
        const char *files[] = {"model.safetensors", "optim.safetensors"};
        for (int k = 0; k < 2; k++) {
            snprintf(p, sizeof p, "%s/%s/%s", dir, names[i], files[k]);
            unlink(p);
        }
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        rmdir(p);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

int ckpt_save(const char *ckpt_dir, const Model *m, const AdamW *opt, const Config *cfg, int step,
              int keep) {
    char tmp[1024], fin[1024], p[1200];
    snprintf(tmp, sizeof tmp, "%s/step-%08d.tmp", ckpt_dir, step);
    snprintf(fin, sizeof fin, "%s/step-%08d", ckpt_dir, step);
    if (mkdirs(tmp) != 0) {
        errorf("ckpt: cannot create '%s': %s", tmp, strerror(errno));
        return -1;
    }
    StMeta meta[32];
    int nmeta = meta_from_config(cfg, m, step, meta);
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    if (write_buffer(p, m, m->params, "", meta, nmeta) != 0) return -1;
    if (opt) {
        snprintf(p, sizeof p, "%s/optim.safetensors", tmp);
        /* one file, two prefixes: written as two buffers would need two
         * files; keep m and v side by side instead */
        StOut *outs = xcalloc((size_t)2 * m->nreg, sizeof(StOut));
        char (*names)[96] = xcalloc((size_t)2 * m->nreg, 96);
        for (int i = 0; i < 2 * m->nreg; i++) {
            const ParamInfo *pi = &m->reg[i % m->nreg];
            snprintf(names[i], 96, "%s.%s", i < m->nreg ? "m" : "v", pi->name);
            outs[i].name = names[i];
            outs[i].ndim = 1;
            outs[i].shape[0] = (int64_t)pi->numel;
            outs[i].data = (i < m->nreg ? opt->m : opt->v) + pi->offset;
        }
        int rc = st_write(p, outs, 2 * m->nreg, meta, nmeta);
        free(outs);
        free(names);
        if (rc != 0) return -1;
    }
    fsync_dir(tmp);
    if (is_dir(fin)) {
        /* a checkpoint of this step exists (a resumed run saving again):
         * replace it only after the new one is complete */
        char old[1100];
        snprintf(old, sizeof old, "%s.old", fin);
        if (rename(fin, old) == 0) {
            snprintf(p, sizeof p, "%s/model.safetensors", old);
            unlink(p);
            snprintf(p, sizeof p, "%s/optim.safetensors", old);
            unlink(p);
            rmdir(old);
        }
    }
    if (rename(tmp, fin) != 0) {
        errorf("ckpt: cannot rename '%s' to '%s': %s", tmp, fin, strerror(errno));
        return -1;
    }
    fsync_dir(ckpt_dir);
    char latest[1024], name[32];
    snprintf(latest, sizeof latest, "%s/latest", ckpt_dir);
    int len = snprintf(name, sizeof name, "step-%08d\n", step);
    if (write_file_atomic(latest, name, (size_t)len) != 0) return -1;
    prune(ckpt_dir, keep);
    return 0;
}

int ckpt_resolve(const char *path, char *out, size_t n) {
    char p[1100];
    snprintf(p, sizeof p, "%s/model.safetensors", path);
    if (is_file(p)) {
        snprintf(out, n, "%s", path);
        return 0;
    }
    snprintf(p, sizeof p, "%s/latest", path);
    char *latest = read_file(p, NULL);
    if (!latest) {
        errorf("ckpt: '%s' is neither a checkpoint directory (model.safetensors) nor a ckpt_dir "
               "with a 'latest' file",
               path);
        return -1;
    }
    latest[strcspn(latest, "\r\n")] = '\0';
    snprintf(out, n, "%s/%s", path, latest);
    free(latest);
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    if (!is_file(p)) {
        errorf("ckpt: '%s/latest' names '%s', which holds no model.safetensors", path, out);
        return -1;
    }
    return 0;
}

int ckpt_read_config(const char *stepdir, Config *cfg, int *step) {
    char p[1100];
    snprintf(p, sizeof p, "%s/model.safetensors", stepdir);
    StFile f;
    if (st_read(&f, p) != 0) return -1;
    int rc = 0;
    for (int i = 0; config_model_keys[i] && rc == 0; i++) {
        const char *v = st_meta(&f, config_model_keys[i]);
        if (!v) {
            errorf("ckpt: '%s' has no metadata key '%s' (was it written by modtrain?)", p,
                   config_model_keys[i]);
            rc = -1;
        } else if (config_set(cfg, config_model_keys[i], v, p) != 0) rc = -1;
    }
    const char *s = st_meta(&f, "step");
    if (step) *step = s ? atoi(s) : 0;
    st_free(&f);
    return rc;
}

int ckpt_load_weights(const char *file, Model *m) {
    StFile f;
    if (st_read(&f, file) != 0) return -1;
    int rc = -1;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        const StTensor *t = st_find(&f, p->name);
        StOut want;
        export_shape(m, p, &want);
        if (!t) {
            errorf("ckpt: '%s' lacks tensor '%s'", file, p->name);
            goto done;
        }
        if (strcmp(t->dtype, "F32") != 0 || t->ndim != want.ndim || t->shape[0] != want.shape[0] ||
            (want.ndim == 2 && t->shape[1] != want.shape[1])) {
            errorf("ckpt: '%s': tensor '%s' is %s [%lld%s%lld], expected F32 [%lld%s%lld]", file,
                   p->name, t->dtype, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                   t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)want.shape[0],
                   want.ndim > 1 ? ", " : "", want.ndim > 1 ? (long long)want.shape[1] : 0LL);
            goto done;
        }
        const float *src = (const float *)(f.data + t->begin);
        size_t limit = st_numel(t);
        float *dst = m->params + p->offset;
        for (size_t j = 0; j < p->numel; j++) {
            size_t g = param_global_index(p, m->d.tp, m->d.tp_rank, j);
            dst[j] = g < limit ? src[g] : 0.f; /* padded vocabulary rows are zero */
        }
    }
    rc = 0;
done:
    st_free(&f);
    return rc;
}

int ckpt_load_optim(const char *stepdir, const Model *m, AdamW *opt) {
    char p[1100];
    snprintf(p, sizeof p, "%s/optim.safetensors", stepdir);
    StFile f;
    if (st_read(&f, p) != 0) return -1;
    int rc = -1;
    for (int i = 0; i < 2 * m->nreg; i++) {
        const ParamInfo *pi = &m->reg[i % m->nreg];
        char name[96];
        snprintf(name, sizeof name, "%s.%s", i < m->nreg ? "m" : "v", pi->name);
        const StTensor *t = st_find(&f, name);
        if (!t || st_numel(t) != pi->numel || strcmp(t->dtype, "F32") != 0) {
            errorf("ckpt: '%s' lacks tensor '%s' of %zu floats", p, name, pi->numel);
            goto done;
        }
        memcpy((i < m->nreg ? opt->m : opt->v) + pi->offset, f.data + t->begin,
               pi->numel * sizeof(float));
    }
    rc = 0;
done:
    st_free(&f);
    return rc;
}

int ckpt_check_model_config(const Config *ck, const Config *run, const char *stepdir) {
    for (int i = 0; config_model_keys[i]; i++) {
        char a[128], b[128];
        config_get(ck, config_model_keys[i], a, sizeof a);
        config_get(run, config_model_keys[i], b, sizeof b);
        if (strcmp(a, b) != 0) {
            errorf("resume: checkpoint '%s' has %s = %s but this run has %s = %s (use the "
                   "checkpoint's value, or resume = never with a new ckpt_dir)",
                   stepdir, config_model_keys[i], a, config_model_keys[i], b);
            return -1;
        }
    }
    return 0;
}

int ckpt_open_model(const char *ckpt_arg, Model *m, Config *cfg, int maxB, int *step) {
    char dir[1024], file[1100];
    if (ckpt_resolve(ckpt_arg, dir, sizeof dir) != 0) return -1;
    if (ckpt_read_config(dir, cfg, step) != 0) return -1;
    ModelDims d;
    model_dims_config(&d, cfg, 1, 0);
    model_init(m, &d, maxB, NULL);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    if (ckpt_load_weights(file, m) != 0) {
        model_free(m);
        return -1;
    }
    return 0;
}
