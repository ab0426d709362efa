/*
 * model: registry, initialisation, forward and backward of the GPT with
 * Mixture-of-Depths blocks, and incremental decoding.
 *
 * The tensor-parallel collectives sit exactly where Megatron puts them: an
 * all-reduce after each row-parallel product, one on the input gradient of
 * each column-parallel product, and the vocab-parallel lookup and loss.
 * Routing reads only the replicated residual stream, so every tp rank
 * chooses the same tokens without talking to the others.
 */
#define _GNU_SOURCE
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpi/grid.h"
#include "config.h"
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
    d->capacity = 1.0;
    d->pp = 1;
    d->l0 = 0;
    d->l1 = L;
}

int model_dims_stage(ModelDims *d, int pp, int pp_rank, const int *layers) {
    int l0 = 0;
    for (int s = 0; s < pp; s++) {
        int n = layers ? layers[s] : d->L / pp + (s < d->L % pp);
        if (n < 1) return -1;
        if (s == pp_rank) {
            d->l0 = l0;
            d->l1 = l0 + n;
        }
        l0 += n;
    }
    if (l0 != d->L) return -1;
    d->pp = pp;
    d->pp_rank = pp_rank;
    return 0;
}

void model_dims_mod(ModelDims *d, int route_every, double capacity, int gate, int predictor, int H) {
    d->route_every = route_every;
    d->capacity = capacity;
    d->gate = gate;
    d->predictor = route_every > 0 && predictor;
    d->H = H;
}

void model_dims_config(ModelDims *d, const Config *c, int tp, int tp_rank) {
    model_dims(d, c->vocab_size, c->seq_len, c->n_layer, c->n_head, c->d_model, tp, tp_rank);
    model_dims_mod(d, c->route_every, c->capacity, c->router_gate,
                   c->causal_router == CAUSAL_PREDICTOR, c->predictor_hidden);
}

int model_is_routed(const ModelDims *d, int l) {
    return d->route_every > 0 && l % d->route_every == d->route_every - 1;
}

int model_capacity_k(const ModelDims *d, int T) {
    long k = lround(d->capacity * T);
    return k < 1 ? 1 : (k > T ? T : (int)k);
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
    p->stage = m->d.pp_rank;
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
    /* a stage holds only its own rows; wte sits on the first stage (lookup)
     * and on the last (tied head) */
    if (model_first_stage(d) || model_last_stage(d))
        reg_add(&rb, -1, TOP(wte), "wte.weight", 2, d->Vp, C, 0, 1, INIT_NORMAL);
    if (model_first_stage(d)) reg_add(&rb, -1, TOP(wpe), "wpe.weight", 2, d->maxT, C, -1, 1, INIT_NORMAL);
    for (int l = d->l0; l < d->l1; l++) {
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
        if (!model_is_routed(d, l)) continue;
        /* router and predictor are replicated across tp: routing is local */
        reg_add(&rb, l, BLK(rw), "router.weight", 1, C, 0, -1, 1, INIT_NORMAL);
        reg_add(&rb, l, BLK(rb), "router.bias", 1, 1, 0, -1, 1, INIT_ZERO);
        if (!d->predictor) continue;
        reg_add(&rb, l, BLK(pw1), "predictor.c_fc.weight", 2, C, d->H, -1, 1, INIT_NORMAL);
        reg_add(&rb, l, BLK(pb1), "predictor.c_fc.bias", 1, d->H, 0, -1, 1, INIT_ZERO);
        reg_add(&rb, l, BLK(pw2), "predictor.c_proj.weight", 2, d->H, 1, -1, 1, INIT_NORMAL);
        reg_add(&rb, l, BLK(pb2), "predictor.c_proj.bias", 1, 1, 0, -1, 1, INIT_ZERO);
    }
    if (model_last_stage(d)) {
        reg_add(&rb, -1, TOP(lnfw), "ln_f.weight", 1, C, 0, -1, 1, INIT_ONE);
        reg_add(&rb, -1, TOP(lnfb), "ln_f.bias", 1, C, 0, -1, 1, INIT_ZERO);
    }
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

/* One micro-batch's activations for this stage's blocks. */
static void actset_alloc(const Model *m, ActSet *s) {
    const ModelDims *d = &m->d;
    size_t N = (size_t)m->maxB * d->maxT, C = d->C;
    memset(s, 0, sizeof *s);
    s->acts = xcalloc((size_t)d->L, sizeof(BlockActs));
    s->enc = act(N * C);
    for (int l = d->l0; l < d->l1; l++) {
        BlockActs *a = &s->acts[l];
        a->ln1 = act(N * C);
        a->ln1_mean = act(N);
        a->ln1_rstd = act(N);
        a->qkv = act(N * 3 * d->Cl);
        a->att = act((size_t)m->maxB * d->NHl * d->maxT * d->maxT);
        a->atty = act(N * d->Cl);
        a->res2 = act(N * C);
        a->ln2 = act(N * C);
        a->ln2_mean = act(N);
        a->ln2_rstd = act(N);
        a->fch = act(N * d->Fl);
        a->fch_gelu = act(N * d->Fl);
        a->res3 = act(N * C);
        if (!model_is_routed(d, l)) continue;
        a->r = act(N);
        a->topk = xcalloc(N, 1);
        a->sel = xcalloc(N, sizeof(int));
        a->off = xcalloc((size_t)m->maxB + 1, sizeof(int));
        a->gate = act(N);
        a->xs = act(N * C);
        a->a = act(N * C);
        a->mo = act(N * C);
        if (d->predictor) {
            a->plogit = act(N);
            a->ph = act(N * d->H);
            a->phg = act(N * d->H);
        }
    }
    if (model_last_stage(d)) {
        s->lnf = act(N * C);
        s->lnf_mean = act(N);
        s->lnf_rstd = act(N);
        s->logits = act(N * d->Vl);
        s->losses = act(N);
    }
    s->inputs = xcalloc(N, sizeof(int));
    s->targets = xcalloc(N, sizeof(int));
}

static void actset_free(const Model *m, ActSet *s) {
    for (int l = 0; l < m->d.L; l++) {
        BlockActs *a = &s->acts[l];
        void *bufs[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att, a->atty, a->res2,
                        a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu, a->res3,
                        a->r, a->plogit, a->ph, a->phg, a->topk, a->sel, a->off, a->gate,
                        a->xs, a->a, a->mo};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    }
    void *bufs[] = {s->acts, s->enc, s->lnf, s->lnf_mean, s->lnf_rstd, s->logits, s->losses,
                    s->inputs, s->targets};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

void model_set_slots(Model *m, int n) {
    model_use_slot(m, 0);
    for (int k = n; k < m->nslots; k++) actset_free(m, &m->slots[k]);
    m->slots = realloc(m->slots, (size_t)n * sizeof(ActSet));
    for (int k = m->nslots; k < n; k++) actset_alloc(m, &m->slots[k]);
    m->nslots = n;
    model_use_slot(m, 0);
}

void model_use_slot(Model *m, int k) {
    ActSet *c = &m->slots[m->cur];
    /* keep what the current slot's forward left, then switch */
    c->B = m->B, c->T = m->T, c->aux_loss = m->aux_loss, c->pred_loss = m->pred_loss;
    const ActSet *s = &m->slots[k];
    m->enc = s->enc, m->acts = s->acts, m->lnf = s->lnf, m->lnf_mean = s->lnf_mean;
    m->lnf_rstd = s->lnf_rstd, m->logits = s->logits, m->losses = s->losses;
    m->inputs = s->inputs, m->targets = s->targets;
    m->B = s->B, m->T = s->T, m->aux_loss = s->aux_loss, m->pred_loss = s->pred_loss;
    m->cur = k;
}

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
    m->predictor_on = 1;
    m->stats.processed = xcalloc((size_t)d->L, sizeof(long long));

    m->maxB = maxB;
    m->pp_comm = MPI_COMM_NULL;
    size_t N = (size_t)maxB * d->maxT, C = d->C;
    m->nslots = 1;
    m->slots = xcalloc(1, sizeof(ActSet));
    actset_alloc(m, &m->slots[0]);
    m->cur = 0;
    model_use_slot(m, 0);
    m->dres = act(N * C);
    m->dln = act(N * C);
    m->scratch = act(N * C);
    m->scratch2 = act(N * C);
    m->dqkv = act(N * 3 * d->Cl);
    m->datty = act(N * d->Cl);
    m->dfch = act(N * d->Fl);
    m->dfchg = act(N * d->Fl);
    m->rowbuf = act(3 * N);
    m->dr = act(N);
    m->dph = act(2 * N * (d->predictor ? d->H : 1)); /* dL/d(hidden), dL/d(gelu) */
    m->off_dense = xcalloc((size_t)maxB + 1, sizeof(int));
}

void model_free(Model *m) {
    for (int k = 0; k < m->nslots; k++) actset_free(m, &m->slots[k]);
    void *bufs[] = {m->params, m->grads, m->dres, m->dln, m->scratch, m->scratch2, m->dqkv,
                    m->datty, m->dfch, m->dfchg, m->rowbuf, m->dr, m->dph, m->off_dense,
                    m->slots, m->P.h, m->G.h, m->reg, m->stats.processed};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
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

void model_stats_reset(Model *m) {
    long long *p = m->stats.processed;
    memset(p, 0, (size_t)m->d.L * sizeof(long long));
    memset(&m->stats, 0, sizeof m->stats);
    m->stats.processed = p;
}

size_t model_num_params(const Model *m) {
    size_t n = 0;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        size_t rows = strcmp(p->name, "wte.weight") == 0 ? (size_t)m->d.V : (size_t)p->shape[0];
        n += rows * p->shape[1];
    }
    return n;
}

double model_flops_per_token(const ModelDims *d, int T, const double *frac) {
    /* 6 FLOPs per matmul weight per token (forward 2, backward 4), plus the
     * attention products (q@k^T and p@v, 4TC forward, 8TC backward, over the
     * whole causal square as is customary). A routed block does that work
     * for the fraction of tokens it processes, over a sequence of as many;
     * its router (and predictor) run on every token. */
    double C = d->C, flops = 6.0 * d->V * C;
    for (int l = 0; l < d->L; l++) {
        double f = frac ? frac[l] : 1.0;
        flops += f * (6.0 * 12.0 * C * C + 12.0 * (f * T) * C);
        if (frac && model_is_routed(d, l))
            flops += 6.0 * C + (d->predictor ? 6.0 * (C * d->H + d->H) : 0.0);
    }
    return flops;
}

/* ---------------------------------------------------------------- routing */

static float gate_value(int gate, float r) { return gate == 1 ? 1.f / (1.f + expf(-r)) : r; }
static float gate_grad(int gate, float r) {
    if (gate != 1) return 1.f;
    float s = 1.f / (1.f + expf(-r));
    return s * (1.f - s);
}

/* BCE of a logit z against a 0/1 target, in a form that never overflows. */
static double bce_logit(float z, int target) {
    return (z > 0 ? z : 0) - (double)z * target + log1p(exp(-fabs((double)z)));
}

typedef struct {
    float r;
    int t;
} Score;

/* Larger score first; ties to the lower position. */
static int score_cmp(const void *a, const void *b) {
    const Score *x = a, *y = b;
    if (x->r != y->r) return x->r > y->r ? -1 : 1;
    return x->t - y->t;
}

static void topk_mark(unsigned char *member, const float *r, int T, int k, Score *buf) {
    for (int t = 0; t < T; t++) buf[t] = (Score){r[t], t};
    qsort(buf, (size_t)T, sizeof(Score), score_cmp);
    memset(member, 0, (size_t)T);
    for (int i = 0; i < k && i < T; i++) member[buf[i].t] = 1;
}

void model_topk(unsigned char *member, const float *r, int T, int k) {
    Score *buf = xmalloc((size_t)T * sizeof(Score));
    topk_mark(member, r, T, k, buf);
    free(buf);
}

/* Chooses the tokens routed block l processes, fills sel/off/gate, and
 * accumulates the BCE losses and the agreement of the causal decision with
 * top-k membership. */
static void route_select(Model *m, int l, int B, int T) {
    const ModelDims *d = &m->d;
    BlockActs *a = &m->acts[l];
    const int k = model_capacity_k(d, T);
    Score *buf = xmalloc((size_t)T * sizeof(Score));
    double aux = 0, pred = 0;
    long long agree = 0;
    int K = 0;
    a->off[0] = 0;
    for (int b = 0; b < B; b++) {
        const float *r = a->r + (size_t)b * T;
        unsigned char *tk = a->topk + (size_t)b * T;
        topk_mark(tk, r, T, k, buf);
        for (int t = 0; t < T; t++) {
            int causal = d->predictor ? a->plogit[(size_t)b * T + t] > 0.f : r[t] > 0.f;
            agree += causal == tk[t];
            aux += bce_logit(r[t], tk[t]);
            if (d->predictor) pred += bce_logit(a->plogit[(size_t)b * T + t], tk[t]);
            if (m->route == ROUTE_TOPK ? tk[t] : causal) {
                a->sel[K] = b * T + t;
                a->gate[K] = gate_value(d->gate, r[t]);
                K++;
            }
        }
        a->off[b + 1] = K;
    }
    free(buf);
    if (m->check_routing) {
        /* every tp rank routes from the same replicated stream: the chosen
         * positions must agree bit for bit */
        uint64_t h = 1469598103934665603ULL;
        for (int i = 0; i < K; i++) h = (h ^ (uint64_t)a->sel[i]) * 1099511628211ULL;
        h = (h ^ (uint64_t)K) * 1099511628211ULL;
        if (!tp_agree_u64(h, &m->tp)) {
            errorf("routing: tensor-parallel ranks chose different tokens in block %d "
                   "(rank %d of its tp group)", l, m->tp.rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    m->stats.aux_sum += aux;
    m->stats.pred_sum += pred;
    m->stats.agree += agree;
    m->stats.decisions += (long long)B * T;
    m->aux_loss += (float)aux;
    m->pred_loss += (float)pred;
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

/* Block l's two branches on N rows x (B sequences, rows off[b]..off[b+1]):
 * a = attention branch (projected, all-reduced, biased), mo = MLP branch,
 * with res2 = x + a inside. Internals stay in m->acts[l] for backward. */
static void block_branches_forward(Model *m, int l, const float *x, int N, int B, const int *off,
                                   float *a, float *mo) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->acts[l];
    const int C = d->C;
    layernorm_forward(A->ln1, A->ln1_mean, A->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
    linear_forward(A->qkv, A->ln1, p->qkvw, p->qkvb, N, C, 3 * d->Cl);
    attention_forward(A->atty, A->att, A->qkv, B, off, d->NHl, d->hs);
    linear_forward(a, A->atty, p->attprojw, NULL, N, d->Cl, C);
    tp_allreduce_sum(a, (size_t)N * C, &m->tp);
    bias_add(a, p->attprojb, N, C);
    residual_forward(A->res2, x, a, (size_t)N * C);
    layernorm_forward(A->ln2, A->ln2_mean, A->ln2_rstd, A->res2, p->ln2w, p->ln2b, N, C);
    linear_forward(A->fch, A->ln2, p->fcw, p->fcb, N, C, d->Fl);
    gelu_forward(A->fch_gelu, A->fch, (size_t)N * d->Fl);
    linear_forward(mo, A->fch_gelu, p->fcprojw, NULL, N, d->Fl, C);
    tp_allreduce_sum(mo, (size_t)N * C, &m->tp);
    bias_add(mo, p->fcprojb, N, C);
}

/* Backward of the branches: dres holds dL/d(res2 + mo) on entry (the
 * gradient reaching the MLP branch and the residual) and dL/dx on exit. */
static void block_branches_backward(Model *m, int l, const float *x, int N, int B, const int *off,
                                    float *dres) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockParams *g = &m->G.h[l];
    BlockActs *A = &m->acts[l];
    const int C = d->C;
    const size_t NC = (size_t)N * C, NF = (size_t)N * d->Fl;
    memset(m->dfchg, 0, NF * sizeof(float));
    linear_backward(m->dfchg, g->fcprojw, g->fcprojb, dres, A->fch_gelu, p->fcprojw, N, d->Fl, C);
    memset(m->dfch, 0, NF * sizeof(float));
    gelu_backward(m->dfch, A->fch, m->dfchg, NF);
    memset(m->dln, 0, NC * sizeof(float));
    linear_backward(m->dln, g->fcw, g->fcb, m->dfch, A->ln2, p->fcw, N, C, d->Fl);
    tp_allreduce_sum(m->dln, NC, &m->tp);
    layernorm_backward(dres, g->ln2w, g->ln2b, m->dln, A->res2, p->ln2w, A->ln2_mean, A->ln2_rstd,
                       N, C);
    memset(m->datty, 0, (size_t)N * d->Cl * sizeof(float));
    linear_backward(m->datty, g->attprojw, g->attprojb, dres, A->atty, p->attprojw, N, d->Cl, C);
    attention_backward(m->dqkv, m->datty, A->qkv, A->att, B, off, d->NHl, d->hs);
    memset(m->dln, 0, NC * sizeof(float));
    linear_backward(m->dln, g->qkvw, g->qkvb, m->dqkv, A->ln1, p->qkvw, N, C, 3 * d->Cl);
    tp_allreduce_sum(m->dln, NC, &m->tp);
    layernorm_backward(dres, g->ln1w, g->ln1b, m->dln, x, p->ln1w, A->ln1_mean, A->ln1_rstd, N, C);
}

/* Routed block l on x(B,T,C): router (and predictor) on every token, the
 * branches on the chosen K tokens only, y = x + g(r) * (a + mo) on those and
 * y = x elsewhere. y is computed as (x + g*a) + g*mo so that capacity 1 with
 * g = 1 reproduces a dense block bit for bit. */
static void routed_forward(Model *m, int l, const float *x, float *y, int B, int T) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->acts[l];
    const int N = B * T, C = d->C;
    mm(0, 0, N, 1, C, 1.f, x, C, p->rw, 1, 0.f, A->r, 1);
    for (int i = 0; i < N; i++) A->r[i] += p->rb[0];
    if (d->predictor) {
        /* the predictor reads x but never sends gradient into it */
        linear_forward(A->ph, x, p->pw1, p->pb1, N, C, d->H);
        gelu_forward(A->phg, A->ph, (size_t)N * d->H);
        mm(0, 0, N, 1, d->H, 1.f, A->phg, d->H, p->pw2, 1, 0.f, A->plogit, 1);
        for (int i = 0; i < N; i++) A->plogit[i] += p->pb2[0];
    }
    route_select(m, l, B, T);
    const int K = A->off[B];
    m->stats.processed[l] += K;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < K; i++)
        memcpy(A->xs + (size_t)i * C, x + (size_t)A->sel[i] * C, (size_t)C * sizeof(float));
    if (K > 0) block_branches_forward(m, l, A->xs, K, B, A->off, A->a, A->mo);
    memcpy(y, x, (size_t)N * C * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int i = 0; i < K; i++) {
        float *yr = y + (size_t)A->sel[i] * C;
        const float *ar = A->a + (size_t)i * C, *mr = A->mo + (size_t)i * C;
        const float g = A->gate[i];
        for (int c = 0; c < C; c++) {
            float h = yr[c] + g * ar[c];
            yr[c] = h + g * mr[c];
        }
    }
}

/* Backward of routed_forward: dres holds dL/dy on entry, dL/dx on exit. */
static void routed_backward(Model *m, int l, const float *x, float *dres, int B, int T,
                            float aux_scale, float pred_scale) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockParams *g = &m->G.h[l];
    BlockActs *A = &m->acts[l];
    const int N = B * T, C = d->C, K = A->off[B];
    float *ds = m->scratch; /* (K,C) gradient of the gathered rows */
    /* gate: dL/dr = g'(r) * <dy, a + mo>; the branches see g * dy */
    memset(m->dr, 0, (size_t)N * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int i = 0; i < K; i++) {
        int t = A->sel[i];
        const float *dy = dres + (size_t)t * C;
        const float *ar = A->a + (size_t)i * C, *mr = A->mo + (size_t)i * C;
        float *dsr = ds + (size_t)i * C, dot = 0.f, gi = A->gate[i];
        for (int c = 0; c < C; c++) {
            dot += dy[c] * (ar[c] + mr[c]);
            dsr[c] = gi * dy[c];
        }
        m->dr[t] = dot * gate_grad(d->gate, A->r[t]);
    }
    if (K > 0) {
        block_branches_backward(m, l, A->xs, K, B, A->off, ds);
        /* ds now includes the residual's g * dy; the gathered rows' own
         * gradient is the rest */
#pragma omp parallel for schedule(static)
        for (int i = 0; i < K; i++) {
            float *dy = dres + (size_t)A->sel[i] * C;
            const float *dsr = ds + (size_t)i * C, gi = A->gate[i];
            for (int c = 0; c < C; c++) dy[c] += dsr[c] - gi * dy[c];
        }
    }
    /* the router's BCE toward top-k membership (causal_router = aux_loss) */
    if (!d->predictor && aux_scale != 0.f)
        for (int t = 0; t < N; t++)
            m->dr[t] += aux_scale * (1.f / (1.f + expf(-A->r[t])) - (float)A->topk[t]);
    /* router: r = x . w + b */
    mm(1, 0, C, 1, N, 1.f, x, C, m->dr, 1, 1.f, g->rw, 1);
    double db = 0;
    for (int t = 0; t < N; t++) db += m->dr[t];
    g->rb[0] += (float)db;
    mm(0, 0, N, C, 1, 1.f, m->dr, 1, p->rw, C, 1.f, dres, C);
    /* predictor: its own BCE, into its own weights only */
    if (d->predictor && m->predictor_on) {
        float *dl = m->dr; /* reused: the router's gradient is spent */
        for (int t = 0; t < N; t++)
            dl[t] = pred_scale * (1.f / (1.f + expf(-A->plogit[t])) - (float)A->topk[t]);
        mm(1, 0, d->H, 1, N, 1.f, A->phg, d->H, dl, 1, 1.f, g->pw2, 1);
        double db2 = 0;
        for (int t = 0; t < N; t++) db2 += dl[t];
        g->pb2[0] += (float)db2;
        memset(m->dph, 0, (size_t)N * d->H * sizeof(float));
        float *dphg = m->dph + (size_t)N * d->H;
        mm(0, 0, N, d->H, 1, 1.f, dl, 1, p->pw2, 1, 0.f, dphg, d->H);
        gelu_backward(m->dph, A->ph, dphg, (size_t)N * d->H);
        linear_backward(NULL, g->pw1, g->pb1, m->dph, x, p->pw1, N, C, d->H);
    }
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
    m->aux_loss = m->pred_loss = 0.f;
    memcpy(m->inputs, inputs, (size_t)N * sizeof(int));
    if (targets) memcpy(m->targets, targets, (size_t)N * sizeof(int));
    for (int b = 0; b <= B; b++) m->off_dense[b] = b * T;

    if (model_first_stage(d)) {
        embed_forward(m->enc, m->inputs, m->P.wte, d->v0, d->Vl, N, C);
        tp_allreduce_sum(m->enc, (size_t)N * C, &m->tp);
        pos_forward(m->enc, m->P.wpe, B, T, C);
    } /* later stages: the caller put the previous stage's output in m->enc */

    const float *x = m->enc;
    int routed = 0;
    for (int l = d->l0; l < d->l1; l++) {
        BlockActs *a = &m->acts[l];
        if (model_is_routed(d, l)) {
            routed_forward(m, l, x, a->res3, B, T);
            routed++;
        } else {
            block_branches_forward(m, l, x, N, B, m->off_dense, m->scratch, m->scratch2);
            residual_forward(a->res3, a->res2, m->scratch2, (size_t)N * C);
            m->stats.processed[l] += N;
        }
        x = a->res3;
    }
    if (model_first_stage(d)) m->stats.tokens += N; /* counted once per pipeline */
    if (routed) {
        m->aux_loss /= (float)N * routed;
        m->pred_loss /= (float)N * routed;
    }
    if (!model_last_stage(d)) return 0.f; /* the output is model_stage_output() */
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, x, m->P.lnfw, m->P.lnfb, N, C);
    /* tied head: logits(N,Vl) = lnf(N,C) @ wte(Vl,C)^T */
    mm(0, 1, N, d->Vl, C, 1.f, m->lnf, C, m->P.wte, C, 0.f, m->logits, d->Vl);
    if (!targets) return 0.f;
    return crossentropy_forward(m, N);
}

void model_backward(Model *m, float dloss, float aux_weight) {
    const ModelDims *d = &m->d;
    const int B = m->B, T = m->T, N = B * T, C = d->C, Vl = d->Vl;
    const size_t NC = (size_t)N * C;
    int routed = 0; /* over the whole model: the BCEs are means over all routed blocks */
    for (int l = 0; l < d->L; l++) routed += model_is_routed(d, l);
    const float aux_scale = routed ? aux_weight * dloss / routed : 0.f;
    const float pred_scale = routed ? dloss / routed : 0.f;

    if (model_last_stage(d)) {
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

    const float *xL = model_stage_output(m);
    memset(m->dres, 0, NC * sizeof(float));
    layernorm_backward(m->dres, m->G.lnfw, m->G.lnfb, m->dln, xL, m->P.lnfw, m->lnf_mean,
                       m->lnf_rstd, N, C);
    } /* earlier stages: the caller put the next stage's input gradient in m->dres */

    /* m->dres holds dL/d(residual stream) and moves back block by block */
    for (int l = d->l1 - 1; l >= d->l0; l--) {
        const float *x = l == d->l0 ? m->enc : m->acts[l - 1].res3;
        if (model_is_routed(d, l)) routed_backward(m, l, x, m->dres, B, T, aux_scale, pred_scale);
        else block_branches_backward(m, l, x, N, B, m->off_dense, m->dres);
    }
    if (model_first_stage(d)) {
        embed_backward(m->G.wte, m->dres, m->inputs, d->v0, Vl, N, C);
        pos_backward(m->G.wpe, m->dres, B, T, C);
    } /* later stages: m->dres is dL/d(stage input), for the previous stage */
}

float *model_stage_output(const Model *m) {
    return m->d.l1 > m->d.l0 ? m->acts[m->d.l1 - 1].res3 : m->enc;
}

/* --------------------------------------------------------------- decoding */

void decode_init(DecodeState *s, const Model *m) {
    const ModelDims *d = &m->d;
    memset(s, 0, sizeof *s);
    s->k = xcalloc((size_t)d->L, sizeof(float *));
    s->v = xcalloc((size_t)d->L, sizeof(float *));
    for (int l = 0; l < d->L; l++) {
        s->k[l] = act((size_t)d->maxT * d->Cl);
        s->v[l] = act((size_t)d->maxT * d->Cl);
    }
    s->len = xcalloc((size_t)d->L, sizeof(int));
    s->processed = xcalloc((size_t)d->L, sizeof(long long));
    s->x = act((size_t)d->C);
    s->xa = act((size_t)d->C);
    s->att = act((size_t)d->maxT);
}

void decode_free(DecodeState *s, const Model *m) {
    for (int l = 0; l < m->d.L; l++) {
        free(s->k[l]);
        free(s->v[l]);
    }
    void *bufs[] = {s->k, s->v, s->len, s->processed, s->x, s->xa, s->att};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    memset(s, 0, sizeof *s);
}

void decode_reset(DecodeState *s, const Model *m) {
    memset(s->len, 0, (size_t)m->d.L * sizeof(int));
}

/* The causal routing decision for one token at block l, and its gate. */
static int decode_route(Model *m, int l, const float *x, float *gate) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    float r;
    mm(0, 0, 1, 1, d->C, 1.f, x, d->C, p->rw, 1, 0.f, &r, 1);
    r += p->rb[0];
    *gate = gate_value(d->gate, r);
    if (!d->predictor) return r > 0.f;
    BlockActs *A = &m->acts[l];
    float z;
    linear_forward(A->ph, x, p->pw1, p->pb1, 1, d->C, d->H);
    gelu_forward(A->phg, A->ph, (size_t)d->H);
    mm(0, 0, 1, 1, d->H, 1.f, A->phg, d->H, p->pw2, 1, 0.f, &z, 1);
    return z + p->pb2[0] > 0.f;
}

const float *decode_step(Model *m, DecodeState *s, int tok, int pos) {
    const ModelDims *d = &m->d;
    const int C = d->C, Cl = d->Cl;
    float *x = s->x;
    if (model_first_stage(d)) {
        embed_forward(x, &tok, m->P.wte, d->v0, d->Vl, 1, C);
        tp_allreduce_sum(x, (size_t)C, &m->tp);
        for (int c = 0; c < C; c++) x[c] += m->P.wpe[(size_t)pos * C + c];
    } else { /* a pipeline: the token's residual stream from the previous stage */
        MPI_CHECK(MPI_Recv(x, C, MPI_FLOAT, d->pp_rank - 1, 1, m->pp_comm, MPI_STATUS_IGNORE));
    }
    s->steps++;
    for (int l = d->l0; l < d->l1; l++) {
        const BlockParams *p = &m->P.h[l];
        BlockActs *A = &m->acts[l];
        float g = 1.f;
        int routed = model_is_routed(d, l);
        if (routed && !decode_route(m, l, x, &g)) continue; /* skipped: costs nothing more */
        s->processed[l]++;
        /* the same kernels as the full forward, on one row */
        layernorm_forward(A->ln1, A->ln1_mean, A->ln1_rstd, x, p->ln1w, p->ln1b, 1, C);
        linear_forward(A->qkv, A->ln1, p->qkvw, p->qkvb, 1, C, 3 * Cl);
        int n = s->len[l]++;
        memcpy(s->k[l] + (size_t)n * Cl, A->qkv + Cl, (size_t)Cl * sizeof(float));
        memcpy(s->v[l] + (size_t)n * Cl, A->qkv + 2 * Cl, (size_t)Cl * sizeof(float));
        attention_decode(A->atty, s->att, A->qkv, s->k[l], s->v[l], n + 1, d->NHl, d->hs, Cl);
        float *a = s->xa, *mo = m->scratch2;
        linear_forward(a, A->atty, p->attprojw, NULL, 1, Cl, C);
        tp_allreduce_sum(a, (size_t)C, &m->tp);
        bias_add(a, p->attprojb, 1, C);
        residual_forward(A->res2, x, a, (size_t)C);
        layernorm_forward(A->ln2, A->ln2_mean, A->ln2_rstd, A->res2, p->ln2w, p->ln2b, 1, C);
        linear_forward(A->fch, A->ln2, p->fcw, p->fcb, 1, C, d->Fl);
        gelu_forward(A->fch_gelu, A->fch, (size_t)d->Fl);
        linear_forward(mo, A->fch_gelu, p->fcprojw, NULL, 1, d->Fl, C);
        tp_allreduce_sum(mo, (size_t)C, &m->tp);
        bias_add(mo, p->fcprojb, 1, C);
        if (routed)
            for (int c = 0; c < C; c++) {
                float h = x[c] + g * a[c];
                x[c] = h + g * mo[c];
            }
        else
            residual_forward(x, A->res2, mo, (size_t)C);
    }
    if (!model_last_stage(d)) {
        MPI_CHECK(MPI_Send(x, C, MPI_FLOAT, d->pp_rank + 1, 1, m->pp_comm));
        return NULL;
    }
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, x, m->P.lnfw, m->P.lnfb, 1, C);
    mm(0, 1, 1, d->Vl, C, 1.f, m->lnf, C, m->P.wte, C, 0.f, m->logits, d->Vl);
    return m->logits;
}
