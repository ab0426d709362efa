/*
 * ckpt_load: reading a checkpoint back. --ckpt resolved to a step
 * directory; the model config, the training state and the run line it
 * records; this rank's slices of the weights and moments; and a model
 * opened for inference.
 */
#include "checkpoint/ckpt_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/files.h"
#include "src/base/util.h"
#include "src/kernels/kernels.h"

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int ckpt_resolve(const char *path, char *out, size_t n, Err *err) {
    char p[1200], q[1200];
    snprintf(p, sizeof p, "%s/index", path);
    snprintf(q, sizeof q, "%s/data.bin", path);
    if (is_file(p) || is_file(q)) { /* a step directory, perhaps a broken one */
        snprintf(out, n, "%s", path);
        return 0;
    }
    snprintf(p, sizeof p, "%s/latest", path);
    Err e;
    char *latest = read_file(p, 4096, NULL, &e);
    if (!latest && access(p, F_OK) == 0) return err_set(err, "ckpt: %s", e.msg);
    if (latest) {
        latest[strcspn(latest, "\r\n")] = '\0';
        snprintf(out, n, "%s/%s", path, latest);
        snprintf(p, sizeof p, "%s/index", out);
        int rc = is_file(p) ? 0
                            : err_set(err,
                                      "ckpt: '%s/latest' names '%s', which is not a checkpoint "
                                      "(see 'modtrain ckpt list --ckpt %s'; pass a step "
                                      "directory instead)",
                                      path, latest, path);
        free(latest);
        return rc;
    }
    char **names;
    int k = ckpt_list_steps(path, &names);
    if (k > 0) snprintf(out, n, "%s/%s", path, names[0]);
    for (int i = 0; i < k; i++) free(names[i]);
    free(names);
    if (k > 0) return 0;
    return err_set(err,
                   "ckpt: '%s' is neither a checkpoint directory (with an index) nor a ckpt_dir "
                   "holding checkpoints",
                   path);
}

int ckpt_read_config(const char *stepdir, Config *cfg, int *step, Err *err) {
    CkIndex ix;
    if (ck_index_read(stepdir, &ix, err) != 0) return -1;
    int rc = 0;
    const char *key;
    for (int i = 0; (key = config_model_key(i)) && rc == 0; i++) {
        char k[80];
        snprintf(k, sizeof k, "config.%s", key);
        const char *v = ck_kv(&ix, k);
        if (!v && config_model_key_optional(key)) continue; /* older: see below */
        if (!v) rc = err_set(err, "ckpt: '%s/index' lacks '%s'", stepdir, k);
        else if (config_set(cfg, key, v, stepdir, NULL) != 0)
            rc = err_set(err, "ckpt: '%s/index' has a bad value for '%s'", stepdir, k);
    }
    /* A checkpoint from before the tokenizer was recorded: its vocabulary
     * says which (the byte tokenizer's 256 tokens, as they all were). */
    if (rc == 0 && !ck_kv(&ix, "config.tokenizer")) {
        cfg->tokenizer = config_tokenizer_for_vocab(cfg->vocab_size);
        cfg->tokenizer_hash[0] = '\0';
    }
    if (rc == 0 && cfg->tokenizer == TOK_AUTO)
        rc =
            err_set(err, "ckpt: '%s/index' has config.tokenizer = auto (expected the one resolved)",
                    stepdir);
    const char *s = ck_kv(&ix, "state.step");
    long long v = 0;
    if (rc == 0 && (!s || parse_i64(s, 0, CONFIG_MAX_STEP, &v) != 0))
        rc = err_set(err,
                     "ckpt: '%s/index' has state.step = '%.32s' (expected an integer in [0, %d])",
                     stepdir, s ? s : "", CONFIG_MAX_STEP);
    if (rc == 0 && step) *step = (int)v;
    ck_index_free(&ix);
    return rc;
}

/* The schedule keys of a checkpoint's index into rs (-1 where one is
 * absent or malformed: a checkpoint from before they were recorded). */
static void read_schedule(const CkIndex *ix, CkptRunState *rs) {
    const char *lr = ck_kv(ix, "state.lr"), *min_lr = ck_kv(ix, "state.min_lr");
    const char *ints[3] = {ck_kv(ix, "state.warmup_steps"), ck_kv(ix, "state.steps"),
                           ck_kv(ix, "state.batch_size")};
    int *to[3] = {&rs->warmup_steps, &rs->steps, &rs->batch_size};
    rs->lr = rs->min_lr = -1;
    if (lr && parse_f64(lr, &rs->lr) != 0) rs->lr = -1;
    if (min_lr && parse_f64(min_lr, &rs->min_lr) != 0) rs->min_lr = -1;
    for (int i = 0; i < 3; i++) {
        long long v = -1;
        if (!ints[i] || parse_i64(ints[i], 0, INT32_MAX, &v) != 0) v = -1;
        *to[i] = (int)v;
    }
}

int ckpt_read_run_state(const char *stepdir, CkptRunState *rs, Err *err) {
    CkIndex ix;
    memset(rs, 0, sizeof *rs);
    rs->seed = -1;
    if (ck_index_read(stepdir, &ix, err) != 0) return -1;
    const char *o = ck_kv(&ix, "state.batch_offset"), *b = ck_kv(&ix, "state.rollbacks");
    const char *s = ck_kv(&ix, "state.samples"), *dc = ck_kv(&ix, "state.data_cursor");
    const char *sd = ck_kv(&ix, "state.seed");
    long long ov = 0, bv = 0, sv = 0, seed = -1;
    int rc = 0;
    if (!s) s = dc;
    if ((o && parse_i64(o, 0, 1LL << 50, &ov) != 0) || (b && parse_i64(b, 0, 1 << 20, &bv) != 0) ||
        (s && parse_i64(s, 0, 1LL << 62, &sv) != 0) || (sd && parse_i64(sd, 0, INT64_MAX, &seed) != 0))
        rc = err_set(err,
                     "ckpt: '%s/index' has state.batch_offset = '%.32s', state.rollbacks = "
                     "'%.32s', state.samples = '%.32s', state.seed = '%.32s' (expected integers "
                     ">= 0)",
                     stepdir, o ? o : "", b ? b : "", s ? s : "", sd ? sd : "");
    const char *id = ck_kv(&ix, "state.run_id"), *ps = ck_kv(&ix, "state.parent_step");
    long long pv = -1;
    if (rc == 0 && id && !run_id_ok(id))
        rc = err_set(err, "ckpt: '%s/index' has state.run_id = '%.40s' (expected 1 to %d hex digits)",
                     stepdir, id, CKPT_RUN_ID - 1);
    if (rc == 0 && ps && parse_i64(ps, -1, CONFIG_MAX_STEP, &pv) != 0)
        rc = err_set(err,
                     "ckpt: '%s/index' has state.parent_step = '%.32s' (expected an integer in "
                     "[-1, %d])",
                     stepdir, ps, CONFIG_MAX_STEP);
    if (rc == 0 && id) snprintf(rs->run_id, sizeof rs->run_id, "%s", id);
    rs->parent_step = (int)pv;
    rs->batch_offset = ov;
    rs->rollbacks = (int)bv;
    rs->samples = sv;
    rs->seed = seed;
    read_schedule(&ix, rs);
    for (int i = 0; i < ix.nkv; i++)
        if (strncmp(ix.kv[i].key, "data.", 5) == 0) {
            if (rs->n_data % 64 == 0)
                rs->data = xrealloc(rs->data, ((size_t)rs->n_data + 64) * sizeof(CkKV));
            rs->data[rs->n_data++] = ix.kv[i];
        }
    ck_index_free(&ix);
    return rc;
}

void ckpt_run_state_free(CkptRunState *rs) {
    free(rs->data);
    rs->data = NULL;
    rs->n_data = 0;
}

/* ckpt_load, and ckpt_load_weights (opt NULL) under fresh_routing. */
static int load(const char *stepdir, Model *m, AdamW *opt, int *had_moments, int fresh_routing,
                Err *err) {
    CkIndex ix;
    if (ck_index_read(stepdir, &ix, err) != 0) return -1;
    int have_m = 0;
    for (int i = 0; i < ix.nchunks && !have_m; i++)
        have_m = strncmp(ix.chunks[i].name, "adam_m/", 7) == 0;
    const size_t cap = (size_t)(3 * 3 * m->nreg) + (opt && opt->shard ? 2 * shard_slices_cap(m, opt->shard) : 0);
    int n = 0;
    CkSlice *slices = xcalloc(cap, sizeof(CkSlice));
    /* padded vocabulary rows are in no chunk: they start at zero (a fresh
     * router and predictor keep their values) */
    for (int i = 0; i < m->nreg; i++)
        if (!fresh_routing || !param_is_routing(m->reg[i].name))
            memset(m->params + m->reg[i].offset, 0, m->reg[i].numel * sizeof(float));
    n += model_slices(m, m->params, "param", NULL, slices + n);
    if (fresh_routing) { /* the checkpoint has none: leave their slices out */
        int k = 0;
        for (int i = 0; i < n; i++)
            if (!param_is_routing(slices[i].name)) slices[k++] = slices[i];
        n = k;
    }
    if (opt) {
        memset(opt->m, 0, opt->n * sizeof(float));
        memset(opt->v, 0, opt->n * sizeof(float));
        if (have_m && opt->shard) {
            n += shard_slices(m, opt->m, "adam_m", opt->shard, 0, slices + n);
            n += shard_slices(m, opt->v, "adam_v", opt->shard, 0, slices + n);
        } else if (have_m) {
            n += model_slices(m, opt->m, "adam_m", NULL, slices + n);
            n += model_slices(m, opt->v, "adam_v", NULL, slices + n);
        }
    }
    int rc = ck_read_slices(&ix, slices, n, err);
    if (had_moments) *had_moments = have_m;
    free(slices);
    ck_index_free(&ix);
    return rc;
}

int ckpt_load(const char *stepdir, Model *m, AdamW *opt, int *had_moments, Err *err) {
    return load(stepdir, m, opt, had_moments, 0, err);
}

int ckpt_load_weights(const char *stepdir, Model *m, int fresh_routing, Err *err) {
    return load(stepdir, m, NULL, NULL, fresh_routing, err);
}

int ckpt_check_model_config(const Config *ck, const Config *run, const char *stepdir, Err *err) {
    const char *key;
    for (int i = 0; (key = config_model_key(i)); i++) {
        char a[128], b[128];
        config_model_value(ck, key, a, sizeof a);
        config_model_value(run, key, b, sizeof b);
        if (strcmp(a, b) != 0)
            return err_set(err,
                           "resume: checkpoint '%s' has %s = %s but this run has %s = %s (use the "
                           "checkpoint's value, or resume = never with a new ckpt_dir)",
                           stepdir, key, a, key, b);
    }
    return 0;
}

int ckpt_open_model(const char *ckpt_arg, Model *m, Config *cfg, int maxB, int *step,
                    const TpGroup *tp, int pp, int pp_rank, int local_ranks, Err *err) {
    char dir[1024];
    if (ckpt_resolve(ckpt_arg, dir, sizeof dir, err) != 0) return -1;
    if (ckpt_read_config(dir, cfg, step, err) != 0 || config_validate(cfg, err) != 0) return -1;
    if (tp && cfg->n_head % tp->size != 0) {
        char alts[256] = "";
        for (int k = 1; k <= cfg->n_head; k++)
            if (cfg->n_head % k == 0)
                snprintf(alts + strlen(alts), sizeof alts - strlen(alts), "%s%d",
                         alts[0] ? ", " : "", k * pp);
        return err_set(err,
                       "ckpt: the model has n_head = %d, not divisible by tp = %d (the ranks "
                       "over pp = %d stages; run %s ranks with pp = %d)",
                       cfg->n_head, tp->size, pp, alts, pp);
    }
    ModelDims d;
    model_dims_config(&d, cfg, tp ? tp->size : 1, tp ? tp->rank : 0);
    if (pp > d.L || model_dims_stage(&d, pp, 1, pp_rank, NULL) != 0)
        return err_set(err,
                       "ckpt: the model's n_layer = %d blocks cannot be split over pp = %d "
                       "stages (choose pp <= %d)",
                       d.L, pp, d.L);
    ModelMemory mm;
    model_memory(&d, maxB, 1, 0, &mm);
    model_memory_threads(&mm, &d, kernels_threads());
    if (model_memory_check(&mm, machine_memory() / (size_t)local_ranks, local_ranks, err) != 0) {
        Err why = *err;
        return err_set(err, "ckpt: '%s': %s", dir, why.msg);
    }
    model_init(m, &d, maxB, tp);
    if (ckpt_load(dir, m, NULL, NULL, err) != 0) {
        model_free(m);
        return -1;
    }
    return 0;
}
