/*
 * model: registry, initialisation, forward and backward of the dense GPT.
 * The tensor-parallel collectives sit exactly where Megatron puts them: an
 * all-reduce after each row-parallel product, one on the input gradient of
 * each column-parallel product, and the vocab-parallel lookup and loss.
 */
#define _GNU_SOURCE
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rng.h"
#include "util.h"

void model_dims(ModelDims *d, int V, int maxT, int L, int NH, int C, int tp, int tp_rank) {
    memset(d, 0, sizeof *d);
    d->V = V;
    d->Vp = (V + tp - 1) / tp * tp;
    d->maxT = maxT;
    d->L = L;
    d->NH = NH;
    d->C = C;
    d->tp = tp;
    d->tp_rank = tp_rank;
    d->NHl = NH / tp;
    d->hs = C / NH;
    d->Cl = d->NHl * d->hs;
    d->Fl = 4 * C / tp;
    d->Vl = d->Vp / tp;
    d->v0 = tp_rank * d->Vl;
}

/* ---------------------------------------------------------------- registry */

typedef struct {
    Model *m;
    int cap;
} RegBuilder;

static void reg_add(RegBuilder *rb, int layer, size_t slot, const char *suffix, int ndim, int d0,
                    int d1, int split_dim, int blocks, InitKind init) {
    Model *m = rb->m;
    if (m->nreg == rb->cap) {
        rb->cap = rb->cap ? 2 * rb->cap : 64;
        m->reg = realloc(m->reg, (size_t)rb->cap * sizeof(ParamInfo));
    }
    ParamInfo *p = &m->reg[m->nreg++];
    memset(p, 0, sizeof *p);
    if (layer >= 0) snprintf(p->name, sizeof p->name, "h.%d.%s", layer, suffix);
    else snprintf(p->name, sizeof p->name, "%s", suffix);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim == 2 ? d1 : 1;
    p->split_dim = split_dim;
    p->split_blocks = blocks;
    p->layer = layer;
    p->stage = 0;
    p->init = init;
    p->decay = ndim == 2;
    p->lshape[0] = p->shape[0];
    p->lshape[1] = p->shape[1];
    if (split_dim >= 0) p->lshape[split_dim] /= m->d.tp;
    p->numel = (size_t)p->lshape[0] * p->lshape[1];
    p->offset = m->nparams;
    p->slot = slot;
    /* 16-float alignment keeps every tensor on a cache line. */
    m->nparams += (p->numel + 15) & ~(size_t)15;
}

static void build_registry(Model *m) {
    const ModelDims *d = &m->d;
    int C = d->C;
    RegBuilder rb = {m, 0};
#define TOP(f) offsetof(ParamPtrs, f)
#define BLK(f) offsetof(BlockParams, f)
    reg_add(&rb, -1, TOP(wte), "wte.weight", 2, d->Vp, C, 0, 1, INIT_NORMAL);
    reg_add(&rb, -1, TOP(wpe), "wpe.weight", 2, d->maxT, C, -1, 1, INIT_NORMAL);
    for (int l = 0; l < d->L; l++) {
        reg_add(&rb, l, BLK(ln1w), "ln_1.weight", 1, C, 0, -1, 1, INIT_ONE);
        reg_add(&rb, l, BLK(ln1b), "ln_1.bias", 1, C, 0, -1, 1, INIT_ZERO);
        reg_add(&rb, l, BLK(qkvw), "attn.c_attn.weight", 2, C, 3 * C, 1, 3, INIT_NORMAL);
        reg_add(&rb, l, BLK(qkvb), "attn.c_attn.bias", 1, 3 * C, 0, 0, 3, INIT_ZERO);
        reg_add(&rb, l, BLK(attprojw), "attn.c_proj.weight", 2, C, C, 0, 1, INIT_RESID);
        reg_add(&rb, l, BLK(attprojb), "attn.c_proj.bias", 1, C, 0, -1, 1, INIT_ZERO);
        reg_add(&rb, l, BLK(ln2w), "ln_2.weight", 1, C, 0, -1, 1, INIT_ONE);
        reg_add(&rb, l, BLK(ln2b), "ln_2.bias", 1, C, 0, -1, 1, INIT_ZERO);
        reg_add(&rb, l, BLK(fcw), "mlp.c_fc.weight", 2, C, 4 * C, 1, 1, INIT_NORMAL);
        reg_add(&rb, l, BLK(fcb), "mlp.c_fc.bias", 1, 4 * C, 0, 0, 1, INIT_ZERO);
        reg_add(&rb, l, BLK(fcprojw), "mlp.c_proj.weight", 2, 4 * C, C, 0, 1, INIT_RESID);
        reg_add(&rb, l, BLK(fcprojb), "mlp.c_proj.bias", 1, C, 0, -1, 1, INIT_ZERO);
    }
    reg_add(&rb, -1, TOP(lnfw), "ln_f.weight", 1, C, 0, -1, 1, INIT_ONE);
    reg_add(&rb, -1, TOP(lnfb), "ln_f.bias", 1, C, 0, -1, 1, INIT_ZERO);
#undef TOP
#undef BLK
}

void model_point(const Model *m, ParamPtrs *pp, float *base) {
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        char *owner = p->layer < 0 ? (char *)pp : (char *)&pp->h[p->layer];
        *(float **)(owner + p->slot) = base + p->offset;
    }
}

const ParamInfo *model_find_param(const Model *m, const char *name) {
    for (int i = 0; i < m->nreg; i++)
        if (strcmp(m->reg[i].name, name) == 0) return &m->reg[i];
    return NULL;
}

size_t param_global_index(const ParamInfo *p, int tp, int tp_rank, size_t i) {
    size_t r = i / (size_t)p->lshape[1], c = i % (size_t)p->lshape[1];
    if (p->split_dim >= 0) {
        size_t *x = p->split_dim == 0 ? &r : &c;
        size_t gblock = (size_t)p->shape[p->split_dim] / p->split_blocks;
        size_t lblock = gblock / tp;
        size_t blk = *x / lblock, within = *x % lblock;
        *x = blk * gblock + (size_t)tp_rank * lblock + within;
    }
    return r * (size_t)p->shape[1] + c;
}

/* ------------------------------------------------------------- allocation */

static float *act(size_t n) { return xcalloc(n, sizeof(float)); }

void model_init(Model *m, const ModelDims *d, int maxB, const TpGroup *tp) {
    memset(m, 0, sizeof *m);
    m->d = *d;
    if (tp) m->tp = *tp;
    else m->tp = (TpGroup){MPI_COMM_NULL, 1, 0};
    build_registry(m);
    m->params = xcalloc(m->nparams, sizeof(float));
    m->grads = xcalloc(m->nparams, sizeof(float));
    m->P.h = xcalloc((size_t)d->L, sizeof(BlockParams));
    m->G.h = xcalloc((size_t)d->L, sizeof(BlockParams));
    model_point(m, &m->P, m->params);
    model_point(m, &m->G, m->grads);

    m->maxB = maxB;
    size_t N = (size_t)maxB * d->maxT, C = d->C;
    m->acts = xcalloc((size_t)d->L, sizeof(BlockActs));
    m->enc = act(N * C);
    for (int l = 0; l < d->L; l++) {
        BlockActs *a = &m->acts[l];
        a->ln1 = act(N * C);
        a->ln1_mean = act(N);
        a->ln1_rstd = act(N);
        a->qkv = act(N * 3 * d->Cl);
        a->att = act((size_t)maxB * d->NHl * d->maxT * d->maxT);
        a->atty = act(N * d->Cl);
        a->res2 = act(N * C);
        a->ln2 = act(N * C);
        a->ln2_mean = act(N);
        a->ln2_rstd = act(N);
        a->fch = act(N * d->Fl);
        a->fch_gelu = act(N * d->Fl);
        a->res3 = act(N * C);
    }
    m->lnf = act(N * C);
    m->lnf_mean = act(N);
    m->lnf_rstd = act(N);
    m->logits = act(N * d->Vl);
    m->losses = act(N);
    m->inputs = xcalloc(N, sizeof(int));
    m->targets = xcalloc(N, sizeof(int));
    m->dres = act(N * C);
    m->dln = act(N * C);
    m->scratch = act(N * C);
    m->dqkv = act(N * 3 * d->Cl);
    m->datty = act(N * d->Cl);
    m->dfch = act(N * d->Fl);
    m->dfchg = act(N * d->Fl);
    m->rowbuf = act(3 * N);
}

void model_free(Model *m) {
    for (int l = 0; l < m->d.L; l++) {
        BlockActs *a = &m->acts[l];
        float *bufs[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att, a->atty, a->res2,
                         a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu, a->res3};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    }
    float *bufs[] = {m->params, m->grads, m->enc, m->lnf, m->lnf_mean, m->lnf_rstd, m->logits,
                     m->losses, m->dres, m->dln, m->scratch, m->dqkv, m->datty, m->dfch,
                     m->dfchg, m->rowbuf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(m->acts);
    free(m->inputs);
    free(m->targets);
    free(m->P.h);
    free(m->G.h);
    free(m->reg);
    memset(m, 0, sizeof *m);
}

void model_init_weights(Model *m, uint64_t seed) {
    const ModelDims *d = &m->d;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        float *w = m->params + p->offset;
        uint64_t stream = rng_hash_str(p->name);
        double std = p->init == INIT_RESID ? 0.02 / sqrt(2.0 * d->L) : 0.02;
        int is_wte = strcmp(p->name, "wte.weight") == 0;
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < p->numel; j++) {
            size_t g = param_global_index(p, d->tp, d->tp_rank, j);
            switch (p->init) {
            case INIT_ZERO: w[j] = 0.f; break;
            case INIT_ONE: w[j] = 1.f; break;
            default:
                /* padded vocabulary rows stay zero: they are never a target */
                if (is_wte && g / (size_t)d->C >= (size_t)d->V) w[j] = 0.f;
                else w[j] = (float)(std * rng_normal(seed, stream, g));
            }
        }
    }
}

void model_zero_grad(Model *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

size_t model_num_params(const Model *m) {
    size_t n = 0;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        size_t rows = strcmp(p->name, "wte.weight") == 0 ? (size_t)m->d.V : (size_t)p->shape[0];
        n += rows * p->shape[1];
    }
    return n;
}

double model_flops_per_token(const ModelDims *d, int T) {
    /* 6 FLOPs per matmul weight per token (forward 2, backward 4), plus the
     * attention products (q@k^T and p@v, 4TC forward, 8TC backward). */
    double C = d->C;
    double n_mm = d->L * 12.0 * C * C + (double)d->V * C;
    return 6.0 * n_mm + 12.0 * d->L * (double)T * C;
}

/* ---------------------------------------------------------- forward/backward */

/* Vocab-parallel cross-entropy: each rank holds logits for Vl vocabulary
 * rows; maxima and sums are all-reduced, never the logits. Turns logits into
 * probabilities in place and returns the mean loss. */
static float crossentropy_forward(Model *m, int N) {
    const ModelDims *d = &m->d;
    int Vl = d->Vl, v0 = d->v0;
    int valid = d->V - v0 < Vl ? d->V - v0 : Vl; /* local columns that are real tokens */
    if (valid < 0) valid = 0;
    float *mx = m->rowbuf, *sum = m->rowbuf + N, *tl = m->rowbuf + 2 * N;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *row = m->logits + (size_t)i * Vl;
        float v = -INFINITY;
        for (int j = 0; j < valid; j++) v = row[j] > v ? row[j] : v;
        mx[i] = v;
    }
    tp_allreduce_max(mx, (size_t)N, &m->tp);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = m->logits + (size_t)i * Vl;
        int t = m->targets[i] - v0;
        tl[i] = t >= 0 && t < valid ? row[t] : 0.f;
        float s = 0.f;
        for (int j = 0; j < valid; j++) {
            row[j] = expf(row[j] - mx[i]);
            s += row[j];
        }
        for (int j = valid; j < Vl; j++) row[j] = 0.f;
        sum[i] = s;
    }
    tp_allreduce_sum(sum, (size_t)N, &m->tp);
    tp_allreduce_sum(tl, (size_t)N, &m->tp);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = m->logits + (size_t)i * Vl;
        float inv = 1.f / sum[i];
        for (int j = 0; j < valid; j++) row[j] *= inv;
        m->losses[i] = logf(sum[i]) + mx[i] - tl[i];
    }
    double total = 0;
    for (int i = 0; i < N; i++) total += m->losses[i];
    return (float)(total / N);
}

float model_forward(Model *m, const int *inputs, const int *targets, int B, int T) {
    const ModelDims *d = &m->d;
    if (B > m->maxB || T > d->maxT || B < 1 || T < 1) {
        errorf("model: forward of %d x %d tokens exceeds the allocated %d x %d", B, T, m->maxB,
               d->maxT);
        abort();
    }
    const int N = B * T, C = d->C;
    m->B = B;
    m->T = T;
    memcpy(m->inputs, inputs, (size_t)N * sizeof(int));
    if (targets) memcpy(m->targets, targets, (size_t)N * sizeof(int));

    embed_forward(m->enc, m->inputs, m->P.wte, d->v0, d->Vl, N, C);
    tp_allreduce_sum(m->enc, (size_t)N * C, &m->tp);
    pos_forward(m->enc, m->P.wpe, B, T, C);

    const float *x = m->enc;
    for (int l = 0; l < d->L; l++) {
        const BlockParams *p = &m->P.h[l];
        BlockActs *a = &m->acts[l];
        layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
        linear_forward(a->qkv, a->ln1, p->qkvw, p->qkvb, N, C, 3 * d->Cl);
        attention_forward(a->atty, a->att, a->qkv, B, T, d->NHl, d->hs);
        linear_forward(m->scratch, a->atty, p->attprojw, NULL, N, d->Cl, C);
        tp_allreduce_sum(m->scratch, (size_t)N * C, &m->tp);
        bias_add(m->scratch, p->attprojb, N, C);
        residual_forward(a->res2, x, m->scratch, (size_t)N * C);
        layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C);
        linear_forward(a->fch, a->ln2, p->fcw, p->fcb, N, C, d->Fl);
        gelu_forward(a->fch_gelu, a->fch, (size_t)N * d->Fl);
        linear_forward(m->scratch, a->fch_gelu, p->fcprojw, NULL, N, d->Fl, C);
        tp_allreduce_sum(m->scratch, (size_t)N * C, &m->tp);
        bias_add(m->scratch, p->fcprojb, N, C);
        residual_forward(a->res3, a->res2, m->scratch, (size_t)N * C);
        x = a->res3;
    }
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, x, m->P.lnfw, m->P.lnfb, N, C);
    /* tied head: logits(N,Vl) = lnf(N,C) @ wte(Vl,C)^T */
    mm(0, 1, N, d->Vl, C, 1.f, m->lnf, C, m->P.wte, C, 0.f, m->logits, d->Vl);
    if (!targets) return 0.f;
    return crossentropy_forward(m, N);
}

void model_backward(Model *m, float dloss) {
    const ModelDims *d = &m->d;
    const int B = m->B, T = m->T, N = B * T, C = d->C, Vl = d->Vl;
    const size_t NC = (size_t)N * C;

    /* dlogits = (p - onehot(target)) * dloss, in place over the probabilities */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = m->logits + (size_t)i * Vl;
        for (int j = 0; j < Vl; j++) row[j] *= dloss;
        int t = m->targets[i] - d->v0;
        if (t >= 0 && t < Vl) row[t] -= dloss;
    }
    mm(0, 0, N, C, Vl, 1.f, m->logits, Vl, m->P.wte, C, 0.f, m->dln, C);
    tp_allreduce_sum(m->dln, NC, &m->tp);
    mm(1, 0, Vl, C, N, 1.f, m->logits, Vl, m->lnf, C, 1.f, m->G.wte, C);

    const float *xL = d->L > 0 ? m->acts[d->L - 1].res3 : m->enc;
    memset(m->dres, 0, NC * sizeof(float));
    layernorm_backward(m->dres, m->G.lnfw, m->G.lnfb, m->dln, xL, m->P.lnfw, m->lnf_mean,
                       m->lnf_rstd, N, C);

    /* m->dres holds dL/d(residual stream) and is updated in place as it moves
     * back through each block's two residual branches. */
    for (int l = d->L - 1; l >= 0; l--) {
        const BlockParams *p = &m->P.h[l];
        BlockParams *g = &m->G.h[l];
        BlockActs *a = &m->acts[l];
        const float *x = l == 0 ? m->enc : m->acts[l - 1].res3;
        const size_t NF = (size_t)N * d->Fl;

        memset(m->dfchg, 0, NF * sizeof(float));
        linear_backward(m->dfchg, g->fcprojw, g->fcprojb, m->dres, a->fch_gelu, p->fcprojw, N,
                        d->Fl, C);
        memset(m->dfch, 0, NF * sizeof(float));
        gelu_backward(m->dfch, a->fch, m->dfchg, NF);
        memset(m->dln, 0, NC * sizeof(float));
        linear_backward(m->dln, g->fcw, g->fcb, m->dfch, a->ln2, p->fcw, N, C, d->Fl);
        tp_allreduce_sum(m->dln, NC, &m->tp);
        layernorm_backward(m->dres, g->ln2w, g->ln2b, m->dln, a->res2, p->ln2w, a->ln2_mean,
                           a->ln2_rstd, N, C);

        memset(m->datty, 0, (size_t)N * d->Cl * sizeof(float));
        linear_backward(m->datty, g->attprojw, g->attprojb, m->dres, a->atty, p->attprojw, N,
                        d->Cl, C);
        attention_backward(m->dqkv, m->datty, a->qkv, a->att, B, T, d->NHl, d->hs);
        memset(m->dln, 0, NC * sizeof(float));
        linear_backward(m->dln, g->qkvw, g->qkvb, m->dqkv, a->ln1, p->qkvw, N, C, 3 * d->Cl);
        tp_allreduce_sum(m->dln, NC, &m->tp);
        layernorm_backward(m->dres, g->ln1w, g->ln1b, m->dln, x, p->ln1w, a->ln1_mean,
                           a->ln1_rstd, N, C);
    }
    embed_backward(m->G.wte, m->dres, m->inputs, d->v0, Vl, N, C);
    pos_backward(m->G.wpe, m->dres, B, T, C);
}
