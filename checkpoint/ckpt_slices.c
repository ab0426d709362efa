/*
 * ckpt_slices: the model as ckio sees it. Registry rows become slices
 * (this rank's part of each tensor, padded vocabulary rows left out, and
 * who else holds the same data, to share the writing), ZeRO-1's sharded
 * moments become rectangles, and the config, the training state and the
 * layout become the index's key/value lines.
 */
#include "checkpoint/ckpt_impl.h"

#include <stdio.h>
#include <string.h>

/* The holders of registry row p's data on this rank (see CkSlice): the dp
 * replicas of its slice (group 0); for a tensor replicated across tp, also
 * every tp rank (group 1); for the tied embedding, also the other stage's
 * copy (group 2). An expert's replicas are the dp / ep ranks holding it
 * (groups 4 and 5, so that their tallies stay apart from the tensors every
 * dp rank holds). */
static void share_of(const Model *m, const ParamInfo *p, const Replicas *r, CkSlice *s) {
    const ModelDims *d = &m->d;
    if (p->expert >= 0) {
        const int dp = r->dp / d->ep, dp_rank = r->dp_rank / d->ep;
        const int tp = p->split_dim < 0 ? d->tp : 1;
        s->group = p->split_dim < 0 ? 5 : 4;
        s->holders = dp * tp;
        s->holder = dp_rank * tp + (tp > 1 ? d->tp_rank : 0);
    } else if (p->tied) {
        const int copies = d->pp > 1 ? 2 : 1;
        s->group = 2;
        s->holders = r->dp * copies;
        s->holder = r->dp_rank * copies + (copies == 2 && !model_first_stage(d));
    } else if (p->split_dim < 0) {
        s->group = 1;
        s->holders = r->dp * d->tp;
        s->holder = r->dp_rank * d->tp + d->tp_rank;
    } else {
        s->group = 0;
        s->holders = r->dp;
        s->holder = r->dp_rank;
    }
}

/* This rank's pieces of every registry row in buffer `base` (laid out like
 * m->params), named prefix/name, with the real rows only (padded
 * vocabulary rows are not saved); with r, each says who shares its
 * writing. Returns the count; out holds at most 3 * nreg. */
int model_slices(const Model *m, float *base, const char *prefix, const Replicas *r, CkSlice *out) {
    int n = 0;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        int blocks = p->split_dim < 0 ? 1 : p->split_blocks;
        for (int b = 0; b < blocks; b++) {
            CkSlice *s = &out[n];
            memset(s, 0, sizeof *s);
            snprintf(s->name, sizeof s->name, "%s/%s", prefix, p->name);
            s->ndim = p->ndim;
            s->rows = p->vocab_rows;
            s->cols = p->shape[1];
            s->ld = p->lshape[1];
            s->r0 = 0, s->nr = p->shape[0], s->c0 = 0, s->nc = p->shape[1];
            s->data = base + p->offset;
            if (p->split_dim >= 0) { /* block b's local rows or columns */
                long g0, l0, lw;
                param_block(p, b, m->d.tp, &g0, &l0, &lw);
                const int64_t at = g0 + (int64_t)m->d.tp_rank * lw;
                if (p->split_dim == 0) {
                    s->r0 = at, s->nr = lw;
                    s->data = base + p->offset + (size_t)l0 * p->lshape[1];
                } else {
                    s->c0 = at, s->nc = lw;
                    s->data = base + p->offset + l0;
                }
            }
            /* padded vocabulary rows are not saved */
            if (s->r0 >= s->rows) continue;
            if (s->r0 + s->nr > s->rows) s->nr = s->rows - s->r0;
            if (r) share_of(m, p, r, s);
            n++;
        }
    }
    return n;
}

/* A rectangle of registry row p's local rows [i0, i0 + nr) and columns
 * [j0, j1), its first element at `data` (row stride p's local width), as
 * global slices: one per tp block it touches, padded vocabulary rows left
 * out. Returns the count added to out. */
static int rect_slices(const Model *m, const ParamInfo *p, float *data, const char *prefix,
                       int64_t i0, int64_t nr, int64_t j0, int64_t j1, CkSlice *out) {
    const int blocks = p->split_dim < 0 ? 1 : p->split_blocks;
    const int64_t ld = p->lshape[1];
    int n = 0;
    for (int b = 0; b < blocks; b++) {
        int64_t r0 = i0, rn = nr, c0 = j0, cn = j1 - j0;
        float *at = data;
        long g0 = 0, l0 = 0, lw = 0;
        if (p->split_dim >= 0) param_block(p, b, m->d.tp, &g0, &l0, &lw);
        const int64_t gat = g0 + (int64_t)m->d.tp_rank * lw; /* block b's local [l0, l0 + lw) */
        if (p->split_dim == 0) {
            const int64_t a = i0 > l0 ? i0 : l0, e = i0 + nr < l0 + lw ? i0 + nr : l0 + lw;
            if (a >= e) continue;
            r0 = gat + (a - l0), rn = e - a;
            at = data + (a - i0) * ld;
        } else if (p->split_dim == 1) {
            const int64_t a = j0 > l0 ? j0 : l0, e = j1 < l0 + lw ? j1 : l0 + lw;
            if (a >= e) continue;
            c0 = gat + (a - l0), cn = e - a;
            at = data + (a - j0);
        }
        if (r0 >= p->vocab_rows) continue; /* padded vocabulary rows are not saved */
        if (r0 + rn > p->vocab_rows) rn = p->vocab_rows - r0;
        CkSlice *s = &out[n++];
        memset(s, 0, sizeof *s);
        snprintf(s->name, sizeof s->name, "%s/%s", prefix, p->name);
        s->ndim = p->ndim;
        s->rows = p->vocab_rows;
        s->cols = p->shape[1];
        s->ld = ld;
        s->r0 = r0, s->nr = rn, s->c0 = c0, s->nc = cn;
        s->data = at;
    }
    return n;
}

/* This rank's pieces of a buffer sharded as sh (ZeRO-1's moments: sh's
 * ranges of the flat buffer back to back in `base`), named prefix/name:
 * each range's part of each tensor as rectangles (a partial first row,
 * whole rows, a partial last row), with w, each says who shares its
 * writing: nobody over dp (the shards are disjoint), the tp ranks of a
 * replicated tensor and the tied embedding's two copies as usual. Returns
 * the count; out holds at most shard_slices_cap. */
int shard_slices(const Model *m, float *base, const char *prefix, const ZeroShard *sh,
                 int with_share, CkSlice *out) {
    int n = 0;
    size_t at = 0;
    for (int k = 0; k < sh->n; k++) {
        for (int i = 0; i < m->nreg; i++) {
            const ParamInfo *p = &m->reg[i];
            const size_t a = p->offset > sh->lo[k] ? p->offset : sh->lo[k];
            const size_t e = p->offset + p->numel < sh->hi[k] ? p->offset + p->numel : sh->hi[k];
            if (a >= e) continue;
            const int64_t ld = p->lshape[1], x0 = (int64_t)(a - p->offset), x1 = (int64_t)(e - p->offset);
            float *d = base + at + (a - sh->lo[k]);
            const int first = n;
            int64_t x = x0;
            if (x % ld) { /* the partial first row */
                const int64_t j1 = x1 - x / ld * ld < ld ? x1 - x / ld * ld : ld;
                n += rect_slices(m, p, d, prefix, x / ld, 1, x % ld, j1, out + n);
                d += j1 - x % ld, x += j1 - x % ld;
            }
            if (x1 / ld > x / ld) { /* whole rows */
                const int64_t rows = x1 / ld - x / ld;
                n += rect_slices(m, p, d, prefix, x / ld, rows, 0, ld, out + n);
                d += rows * ld, x += rows * ld;
            }
            if (x < x1) n += rect_slices(m, p, d, prefix, x / ld, 1, 0, x1 - x, out + n);
            const Replicas solo = sh->dp > 1 ? (Replicas){sh->dp, sh->dp_rank}
                                             : (Replicas){p->expert >= 0 ? m->d.ep : 1, 0};
            for (int q = first; q < n && with_share; q++) share_of(m, p, &solo, &out[q]);
        }
        at += sh->hi[k] - sh->lo[k];
    }
    return n;
}

/* Room for shard_slices of sh: 3 rectangles of 3 blocks a range's part of a tensor. */
size_t shard_slices_cap(const Model *m, const ZeroShard *sh) {
    return 9 * ((size_t)m->nreg + (size_t)sh->n);
}

static int add_kv(CkKV *kv, int n, const char *key, const char *value) {
    snprintf(kv[n].key, sizeof kv[n].key, "%.63s", key);
    snprintf(kv[n].value, sizeof kv[n].value, "%s", value);
    return n + 1;
}

/* The value a checkpoint records for model key `key`: the config's, but the
 * vocabulary the model was built with (the config may say 0 = the data's). */
void model_key_value(const Config *cfg, const Model *m, const char *key, char *v, size_t n) {
    if (strcmp(key, "vocab_size") == 0) snprintf(v, n, "%d", m->d.V);
    else config_get(cfg, key, v, n);
}

int state_kv(const Config *cfg, const Model *m, int step, const CkptRunState *rs, int world,
             CkKV *kv) {
    const CkptRunState none = {0};
    if (!rs) rs = &none;
    int n = 0;
    char v[256], k[80];
    const char *key;
    for (int i = 0; (key = config_model_key(i)); i++) {
        snprintf(k, sizeof k, "config.%s", key);
        model_key_value(cfg, m, key, v, sizeof v);
        n = add_kv(kv, n, k, v);
    }
    snprintf(v, sizeof v, "%d", step);
    n = add_kv(kv, n, "state.step", v);
    const long long samples =
        rs->samples ? rs->samples : ((long long)step + rs->batch_offset) * cfg->batch_size;
    snprintf(v, sizeof v, "%lld", samples);
    n = add_kv(kv, n, "state.data_cursor", v);
    n = add_kv(kv, n, "state.samples", v);
    snprintf(v, sizeof v, "%lld", rs->batch_offset);
    n = add_kv(kv, n, "state.batch_offset", v);
    snprintf(v, sizeof v, "%d", rs->rollbacks);
    n = add_kv(kv, n, "state.rollbacks", v);
    snprintf(v, sizeof v, "%lld", cfg->seed);
    n = add_kv(kv, n, "state.seed", v);
    if (rs->run_id[0]) n = add_kv(kv, n, "state.run_id", rs->run_id);
    snprintf(v, sizeof v, "%d", rs->parent_step);
    n = add_kv(kv, n, "state.parent_step", v);
    snprintf(v, sizeof v, "%d", cfg->batch_size);
    n = add_kv(kv, n, "state.batch_size", v);
    /* the schedule the run trained under, which a resume compares with its own */
    snprintf(v, sizeof v, "%.17g", cfg->lr);
    n = add_kv(kv, n, "state.lr", v);
    snprintf(v, sizeof v, "%.17g", cfg->min_lr);
    n = add_kv(kv, n, "state.min_lr", v);
    snprintf(v, sizeof v, "%d", cfg->warmup_steps);
    n = add_kv(kv, n, "state.warmup_steps", v);
    snprintf(v, sizeof v, "%d", cfg->steps);
    n = add_kv(kv, n, "state.steps", v);
    snprintf(v, sizeof v, "%d", world);
    n = add_kv(kv, n, "layout.world", v);
    snprintf(v, sizeof v, "%d", m->d.tp);
    n = add_kv(kv, n, "layout.tp", v);
    snprintf(v, sizeof v, "%d", m->d.pp);
    n = add_kv(kv, n, "layout.pp", v);
    snprintf(v, sizeof v, "%d", m->d.ep);
    n = add_kv(kv, n, "layout.ep", v);
    for (int i = 0; i < rs->n_data; i++) n = add_kv(kv, n, rs->data[i].key, rs->data[i].value);
    return n;
}
