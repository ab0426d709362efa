/*
 * model: dims, the parameter registry, activations, initialisation, and
 * forward and backward of the GPT over a micro-batch. Its routing (MoD and
 * the experts' router) is in routing.c, the MLP branch (dense or experts)
 * in mlp.c, decoding in decode.c.
 *
 * The tensor-parallel collectives sit exactly where Megatron puts them: an
 * all-reduce after each row-parallel product, one on the input gradient of
 * each column-parallel product, and the vocab-parallel lookup and loss.
 * Routing reads only the replicated residual stream, so every tp rank
 * chooses the same tokens without talking to the others.
 */
#include "src/model/model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <assert.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "mpi/check.h"
#include "src/config/config.h"
#include "src/kernels/kernels.h"
#include "src/kernels/kernels_impl.h"
#include "src/base/rng.h"
#include "src/base/util.h"

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
    d->ek = 1;
    d->moe_every = 1;
    d->cf = 1.0;
    d->ep = 1;
    model_dims_whole(d);
    d->head_rows = HEAD_ROWS;
}

void model_dims_whole(ModelDims *d) {
    d->pp = 1, d->pp_rank = 0, d->nchunk = 1;
    d->c0[0] = 0, d->c1[0] = d->L;
}

int model_stage_starts(const ModelDims *d, int pp, int vs, const int *layers, int *starts) {
    if (vs < 1 || vs > MODEL_MAX_CHUNKS || pp < 1) return -1;
    const int nv = pp * vs;
    starts[0] = 0;
    for (int t = 0; t < nv; t++) { /* virtual stage t = chunk * pp + rank */
        const int n = layers ? layers[t] : d->L / nv + (t < d->L % nv);
        if (n < 1 || n > d->L - starts[t]) return -1;
        starts[t + 1] = starts[t] + n;
    }
    return starts[nv] == d->L ? 0 : -1;
}

void model_dims_stage_at(ModelDims *d, int pp, int vs, int pp_rank, const int *starts) {
    for (int k = 0; k < vs; k++) {
        d->c0[k] = starts[k * pp + pp_rank];
        d->c1[k] = starts[k * pp + pp_rank + 1];
    }
    d->pp = pp;
    d->pp_rank = pp_rank;
    d->nchunk = vs;
}

int model_dims_stage(ModelDims *d, int pp, int vs, int pp_rank, const int *layers) {
    if (vs < 1 || vs > MODEL_MAX_CHUNKS || pp < 1) return -1;
    int *starts = xmalloc(((size_t)pp * vs + 1) * sizeof(int));
    const int rc = model_stage_starts(d, pp, vs, layers, starts);
    if (rc == 0) model_dims_stage_at(d, pp, vs, pp_rank, starts);
    free(starts);
    return rc;
}

/* The first block at or after l this rank holds, or L: a loop over the
 * held blocks costs their count, not L (the planner measures stages of
 * models of thousands of blocks). */
static int next_held(const ModelDims *d, int l) {
    int best = d->L;
    for (int k = 0; k < d->nchunk; k++)
        if (d->c1[k] > l) {
            const int at = d->c0[k] > l ? d->c0[k] : l;
            best = at < best ? at : best;
        }
    return best;
}

int model_holds(const ModelDims *d, int l) {
    for (int k = 0; k < d->nchunk; k++)
        if (l >= d->c0[k] && l < d->c1[k]) return 1;
    return 0;
}

int model_stage_blocks(const ModelDims *d) {
    int n = 0;
    for (int k = 0; k < d->nchunk; k++) n += d->c1[k] - d->c0[k];
    return n;
}

void model_dims_mod(ModelDims *d, int route_every, double capacity, RouterGate gate, int predictor,
                    int H) {
    d->route_every = route_every;
    d->capacity = capacity;
    d->gate = gate;
    d->predictor = route_every > 0 && predictor;
    d->H = H;
}

void model_dims_moe(ModelDims *d, int n_expert, int n_noop, int top_k, int expert_d_ff,
                    double capacity_factor, int moe_every) {
    d->E = n_expert;
    d->Nn = n_expert > 0 ? n_noop : 0;
    d->ek = top_k;
    d->Fe = n_expert > 0 ? (expert_d_ff > 0 ? expert_d_ff : 4 * d->C) : 0;
    d->Fel = d->Fe / d->tp;
    d->cf = capacity_factor;
    d->moe_every = moe_every > 0 ? moe_every : 1;
    model_dims_ep(d, d->ep, d->ep_rank);
}

void model_dims_ep(ModelDims *d, int ep, int ep_rank) {
    d->ep = ep;
    d->ep_rank = ep_rank;
    d->El = d->E / ep;
    d->e0 = ep_rank * d->El;
}

void model_dims_config(ModelDims *d, const Config *c, int tp, int tp_rank) {
    model_dims(d, c->vocab_size, c->seq_len, c->n_layer, c->n_head, c->d_model, tp, tp_rank);
    model_dims_mod(d, c->route_every, c->capacity, c->router_gate,
                   c->causal_router == CAUSAL_PREDICTOR, c->predictor_hidden);
    model_dims_moe(d, c->n_expert, c->n_noop_expert, c->expert_top_k, c->expert_d_ff,
                   c->capacity_factor, c->moe_every);
}

int model_is_moe(const ModelDims *d, int l) {
    return d->E > 0 && l % d->moe_every == d->moe_every - 1;
}

int model_moe_blocks(const ModelDims *d) { return d->E > 0 ? d->L / d->moe_every : 0; }

int model_is_routed(const ModelDims *d, int l) {
    return d->route_every > 0 && l % d->route_every == d->route_every - 1;
}

/* Blocks l of the stage's chunks with l % g == g - 1 (blocks l < x: x / g
 * of them). */
static int stage_every(const ModelDims *d, long g) {
    int n = 0;
    for (int k = 0; k < d->nchunk; k++) n += (int)(d->c1[k] / g - d->c0[k] / g);
    return n;
}

int model_stage_routed(const ModelDims *d) {
    return d->route_every > 0 ? stage_every(d, d->route_every) : 0;
}

int model_stage_moe(const ModelDims *d, int *routed) {
    *routed = 0;
    if (d->E == 0) return 0;
    const long m = d->moe_every;
    if (d->route_every > 0) { /* both: l + 1 a multiple of lcm(route_every, moe_every) */
        long a = d->route_every, b = m;
        while (b) {
            const long t = a % b;
            a = b, b = t;
        }
        const long g = d->route_every / a * m;
        *routed = stage_every(d, g);
    }
    return stage_every(d, m);
}

int model_capacity_k(const ModelDims *d, int T) {
    long k = lround(d->capacity * T);
    return k < 1 ? 1 : (k > T ? T : (int)k);
}

/* ---------------------------------------------------------------- registry */

typedef struct {
    Model *m;
    int cap;
    int measure; /* only count m->nparams: every row goes to `one`, unnamed */
    ParamInfo one;
} RegBuilder;

static size_t rows_built; /* every registry row built, measured or not */

size_t model_registry_rows_built(void) { return rows_built; }

static ParamInfo *reg_add(RegBuilder *rb, int layer, size_t slot, const char *suffix, int ndim,
                          int d0, int d1, int split_dim, int blocks, InitKind init) {
    Model *m = rb->m;
    rows_built++;
    if (!rb->measure && m->nreg == rb->cap) {
        rb->cap = rb->cap ? 2 * rb->cap : 64;
        m->reg = xrealloc(m->reg, (size_t)rb->cap * sizeof(ParamInfo));
    }
    ParamInfo *p = rb->measure ? &rb->one : &m->reg[m->nreg++];
    memset(p, 0, sizeof *p);
    if (rb->measure) p->name[0] = '\0';
    else if (layer >= 0) snprintf(p->name, sizeof p->name, "h.%d.%s", layer, suffix);
    else snprintf(p->name, sizeof p->name, "%s", suffix);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim == 2 ? d1 : 1;
    p->split_dim = split_dim;
    p->split_blocks = blocks;
    p->layer = layer;
    p->expert = -1;
    p->stage = m->d.pp_rank;
    p->init = init;
    p->decay = ndim == 2;
    p->vocab_rows = d0;
    p->lshape[0] = p->shape[0];
    p->lshape[1] = p->shape[1];
    if (split_dim >= 0) p->lshape[split_dim] /= m->d.tp;
    p->numel = (size_t)p->lshape[0] * p->lshape[1];
    p->offset = m->nparams;
    p->slot = slot;
    /* 16-float alignment keeps every tensor on a cache line. */
    m->nparams += (p->numel + 15) & ~(size_t)15;
    return p;
}

/* This rank's experts of the stage's MoE blocks, after every other row, so
 * that their gradients (reduced over the experts' replicas, not over dp)
 * are one range at the end of the buffer. */
static void expert_rows(RegBuilder *rb) {
    const ModelDims *d = &rb->m->d;
    const int C = d->C, F = d->Fe;
    char n[48];
#define EXP(f) offsetof(ExpertParams, f)
    for (int l = next_held(d, 0); l < d->L; l = next_held(d, l + 1)) {
        if (!model_is_moe(d, l)) continue;
        /* measured: one expert's rows stand for all El (the planner measures
         * thousands of stages, and n_expert goes to 4096) */
        const int n_ex = rb->measure && d->El > 0 ? 1 : d->El;
        const size_t before = rb->m->nparams;
        for (int e = d->e0; e < d->e0 + n_ex; e++) {
            /* each row's expert is set before the next reg_add, which may
             * move the registry (xrealloc) */
            snprintf(n, sizeof n, "mlp.experts.%d.c_fc.weight", e);
            reg_add(rb, l, EXP(fcw), n, 2, C, F, 1, 1, INIT_NORMAL)->expert = e;
            snprintf(n, sizeof n, "mlp.experts.%d.c_fc.bias", e);
            reg_add(rb, l, EXP(fcb), n, 1, F, 0, 0, 1, INIT_ZERO)->expert = e;
            snprintf(n, sizeof n, "mlp.experts.%d.c_proj.weight", e);
            reg_add(rb, l, EXP(projw), n, 2, F, C, 0, 1, INIT_RESID)->expert = e;
            snprintf(n, sizeof n, "mlp.experts.%d.c_proj.bias", e);
            reg_add(rb, l, EXP(projb), n, 1, C, 0, -1, 1, INIT_ZERO)->expert = e;
        }
        if (n_ex < d->El) rb->m->nparams += (size_t)(d->El - 1) * (rb->m->nparams - before);
    }
#undef EXP
}

void model_build_registry(Model *m, int measure) {
    const ModelDims *d = &m->d;
    int C = d->C;
    RegBuilder rb = {.m = m, .measure = measure};
#define TOP(f) offsetof(ParamPtrs, f)
#define BLK(f) offsetof(BlockParams, f)
    /* a stage holds only its own rows; wte sits on the first stage (lookup)
     * and on the last (tied head) */
    if (model_first_stage(d) || model_last_stage(d)) {
        ParamInfo *wte = reg_add(&rb, -1, TOP(wte), "wte.weight", 2, d->Vp, C, 0, 1, INIT_NORMAL);
        wte->tied = 1;
        wte->vocab_rows = d->V;
    }
    if (model_first_stage(d))
        reg_add(&rb, -1, TOP(wpe), "wpe.weight", 2, d->maxT, C, -1, 1, INIT_NORMAL);
    for (int l = next_held(d, 0); l < d->L; l = next_held(d, l + 1)) {
        reg_add(&rb, l, BLK(ln1w), "ln_1.weight", 1, C, 0, -1, 1, INIT_ONE);
        reg_add(&rb, l, BLK(ln1b), "ln_1.bias", 1, C, 0, -1, 1, INIT_ZERO);
        reg_add(&rb, l, BLK(qkvw), "attn.c_attn.weight", 2, C, 3 * C, 1, 3, INIT_NORMAL);
        reg_add(&rb, l, BLK(qkvb), "attn.c_attn.bias", 1, 3 * C, 0, 0, 3, INIT_ZERO);
        reg_add(&rb, l, BLK(attprojw), "attn.c_proj.weight", 2, C, C, 0, 1, INIT_RESID);
        reg_add(&rb, l, BLK(attprojb), "attn.c_proj.bias", 1, C, 0, -1, 1, INIT_ZERO);
        reg_add(&rb, l, BLK(ln2w), "ln_2.weight", 1, C, 0, -1, 1, INIT_ONE);
        reg_add(&rb, l, BLK(ln2b), "ln_2.bias", 1, C, 0, -1, 1, INIT_ZERO);
        if (model_is_moe(d, l)) { /* the experts come last (expert_rows) */
            reg_add(&rb, l, BLK(mrw), "mlp.router.weight", 2, C, d->E + d->Nn, -1, 1, INIT_NORMAL);
        } else {
            reg_add(&rb, l, BLK(fcw), "mlp.c_fc.weight", 2, C, 4 * C, 1, 1, INIT_NORMAL);
            reg_add(&rb, l, BLK(fcb), "mlp.c_fc.bias", 1, 4 * C, 0, 0, 1, INIT_ZERO);
            reg_add(&rb, l, BLK(fcprojw), "mlp.c_proj.weight", 2, 4 * C, C, 0, 1, INIT_RESID);
            reg_add(&rb, l, BLK(fcprojb), "mlp.c_proj.bias", 1, C, 0, -1, 1, INIT_ZERO);
        }
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
    const size_t shared = m->nparams;
    expert_rows(&rb);
    m->expert_floats = m->nparams - shared;
#undef TOP
#undef BLK
}

void model_point(const Model *m, ParamPtrs *pp, float *base) {
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        char *owner = p->layer < 0     ? (char *)pp
                      : p->expert >= 0 ? (char *)&pp->h[p->layer].ex[p->expert - m->d.e0]
                                       : (char *)&pp->h[p->layer];
        *(float **)(owner + p->slot) = base + p->offset;
    }
}

const ParamInfo *model_find_param(const Model *m, const char *name) {
    for (int i = 0; i < m->nreg; i++)
        if (strcmp(m->reg[i].name, name) == 0) return &m->reg[i];
    return NULL;
}

const ParamInfo *model_tied_param(const Model *m) {
    for (int i = 0; i < m->nreg; i++)
        if (m->reg[i].tied) return &m->reg[i];
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

void model_init(Model *m, const ModelDims *d, int maxB, const TpGroup *tp) {
    memset(m, 0, sizeof *m);
    m->d = *d;
    if (tp) m->tp = *tp;
    else m->tp = (TpGroup){MPI_COMM_NULL, 1, 0};
    model_build_registry(m, 0);
    m->params = xcalloc(m->nparams, sizeof(float));
    m->grads = xcalloc(m->nparams, sizeof(float));
    m->P.h = xcalloc((size_t)d->L, sizeof(BlockParams));
    m->G.h = xcalloc((size_t)d->L, sizeof(BlockParams));
    for (int l = next_held(d, 0); l < d->L; l = next_held(d, l + 1))
        if (model_is_moe(d, l)) {
            m->P.h[l].ex = xcalloc((size_t)d->El, sizeof(ExpertParams));
            m->G.h[l].ex = xcalloc((size_t)d->El, sizeof(ExpertParams));
        }
    model_point(m, &m->P, m->params);
    model_point(m, &m->G, m->grads);
    m->predictor_on = 1;
    RouteStats *st[2] = {&m->stats, &m->restats};
    for (int i = 0; i < 2; i++) {
        st[i]->processed = xcalloc((size_t)d->L, sizeof(long long));
        st[i]->moe = xcalloc((size_t)d->L * (d->E + d->Nn + 2), sizeof(long long));
        st[i]->expert_rows = xcalloc((size_t)d->L * d->El + 1, sizeof(long long));
    }
    m->ep = (EpGroup){MPI_COMM_NULL, 1, 0};
    m->maxB = maxB;
    m->pp_comm = MPI_COMM_NULL;
    model_alloc_work(m);
    model_set_slots(m, 1);
    model_alloc_scratch(m);
}

void model_free(Model *m) {
    for (int k = 0; k < m->nslots; k++) free(m->slots[k].mem);
    for (int l = 0; m->P.h && l < m->d.L; l++) {
        free(m->P.h[l].ex);
        free(m->G.h[l].ex);
    }
    void *bufs[] = {m->params, m->grads, m->s.mem,           m->slots,     m->P.h,
                    m->G.h,    m->reg,   m->stats.processed, m->stats.moe, m->stats.expert_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(m->work);
    free(m->restats.processed), free(m->restats.moe), free(m->restats.expert_rows);
    memset(m, 0, sizeof *m);
}

void model_init_weights(Model *m, uint64_t seed) {
    const ModelDims *d = &m->d;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        float *w = m->params + p->offset;
        uint64_t stream = rng_hash_str(p->name);
        double std = p->init == INIT_RESID ? 0.02 / sqrt(2.0 * d->L) : 0.02;
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < p->numel; j++) {
            size_t g = param_global_index(p, d->tp, d->tp_rank, j);
            switch (p->init) {
            case INIT_ZERO: w[j] = 0.f; break;
            case INIT_ONE: w[j] = 1.f; break;
            default:
                /* padded vocabulary rows stay zero: they are never a target */
                if (g / (size_t)p->shape[1] >= (size_t)p->vocab_rows) w[j] = 0.f;
                else w[j] = (float)(std * rng_normal(seed, stream, g));
            }
        }
    }
}

void model_zero_grad(Model *m) {
    if (!m->grads_zeroed) memset(m->grads, 0, m->nparams * sizeof(float));
    m->grads_zeroed = 0; /* the step's backward writes them next */
}

void model_stats_reset(Model *m) {
    const ModelDims *d = &m->d;
    RouteStats keep = m->stats;
    memset(keep.processed, 0, (size_t)d->L * sizeof(long long));
    memset(keep.moe, 0, (size_t)d->L * (d->E + d->Nn + 2) * sizeof(long long));
    memset(keep.expert_rows, 0, ((size_t)d->L * d->El + 1) * sizeof(long long));
    memset(&m->stats, 0, sizeof m->stats);
    m->stats.processed = keep.processed;
    m->stats.moe = keep.moe;
    m->stats.expert_rows = keep.expert_rows;
}

int route_stats_len(const ModelDims *d) {
    return ROUTE_STATS_FIXED + d->L + d->L * (d->E > 0 ? d->E + d->Nn + 2 : 0);
}

void route_stats_to_vec(const RouteStats *st, const ModelDims *d, double *v) {
    v[0] = st->aux_sum, v[1] = st->pred_sum, v[2] = (double)st->decisions;
    v[3] = (double)st->agree, v[4] = (double)st->tokens;
    v[5] = st->moe_aux_sum, v[6] = (double)st->moe_forwards;
    for (int l = 0; l < d->L; l++) v[ROUTE_STATS_FIXED + l] = (double)st->processed[l];
    const int n = d->E > 0 ? d->L * (d->E + d->Nn + 2) : 0;
    for (int i = 0; i < n; i++) v[ROUTE_STATS_FIXED + d->L + i] = (double)st->moe[i];
}

void route_stats_from_vec(RouteStats *st, const ModelDims *d, const double *v) {
    st->aux_sum = v[0], st->pred_sum = v[1], st->decisions = (long long)v[2];
    st->agree = (long long)v[3], st->tokens = (long long)v[4];
    st->moe_aux_sum = v[5], st->moe_forwards = (long long)v[6];
    for (int l = 0; l < d->L; l++) st->processed[l] = (long long)v[ROUTE_STATS_FIXED + l];
    const int n = d->E > 0 ? d->L * (d->E + d->Nn + 2) : 0;
    for (int i = 0; i < n; i++) st->moe[i] = (long long)v[ROUTE_STATS_FIXED + d->L + i];
}

/* Sum of squares of a block of at most SUMSQ_BLOCK floats in 16 lanes of
 * doubles, added up in a fixed order: lane k sums elements k, k + 16, ...
 * in turn, then the lanes meet pairwise, so the result depends on the
 * block alone. */
#define SUMSQ_BLOCK 8192
#define SUMSQ_LANES 16
/* The lanes' tail (the last n mod 16 elements from g) and their pairwise
 * sum. */
static double sumsq_lanes_end(double *lane, const float *g, size_t n) {
    for (size_t k = 0; k < n; k++) lane[k] += (double)g[k] * g[k];
    for (int w = SUMSQ_LANES / 2; w >= 1; w /= 2) /* pairwise, in a fixed order */
        for (int k = 0; k < w; k++) lane[k] += lane[k + w];
    return lane[0];
}
static double block_sumsq_base(const float *g, size_t n) {
    double lane[SUMSQ_LANES] = {0};
    size_t j = 0;
    for (; j + SUMSQ_LANES <= n; j += SUMSQ_LANES)
        for (int k = 0; k < SUMSQ_LANES; k++) lane[k] += (double)g[j + (size_t)k] * g[j + (size_t)k];
    return sumsq_lanes_end(lane, g + j, n - j);
}
#if defined(__x86_64__) && defined(__GNUC__)
/* The same lanes as four AVX2 registers of four doubles. Left to the
 * compiler (an array of lanes under omp simd), they lived on the stack, a
 * store and a load an addition: the gradients' norm took 39 ms of a GPT-2
 * small step, these 22.5 (reading the gradients alone takes 19). No FMA:
 * nothing is fused, so the bits are the base's. */
VEC_TARGET_NOFMA static inline __m256d sumsq_add4(__m256d a, const float *g) {
    const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(g));
    return _mm256_add_pd(a, _mm256_mul_pd(d, d));
}
VEC_TARGET_NOFMA static double block_sumsq_avx2(const float *g, size_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0; /* lanes 0-3, ..., 12-15 */
    size_t j = 0;
    for (; j + SUMSQ_LANES <= n; j += SUMSQ_LANES) {
        a0 = sumsq_add4(a0, g + j);
        a1 = sumsq_add4(a1, g + j + 4);
        a2 = sumsq_add4(a2, g + j + 8);
        a3 = sumsq_add4(a3, g + j + 12);
    }
    double lane[SUMSQ_LANES];
    _mm256_storeu_pd(lane, a0);
    _mm256_storeu_pd(lane + 4, a1);
    _mm256_storeu_pd(lane + 8, a2);
    _mm256_storeu_pd(lane + 12, a3);
    return sumsq_lanes_end(lane, g + j, n - j);
}
#endif
static double block_sumsq(const float *g, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (kernels_avx2) return block_sumsq_avx2(g, n);
#endif
    return block_sumsq_base(g, n);
}

void model_grad_sumsq(const Model *m, double split[2], double replicated[2]) {
    model_grad_sumsq_ranges(m, NULL, NULL, -1, split, replicated);
}

/* A piece of a tensor the sums of squares cover: [lo, hi) of the buffer. */
typedef struct {
    size_t lo, hi;
    int tensor, expert, split;
} SumsqPiece;

void model_grad_sumsq_ranges(const Model *m, const size_t *rlo, const size_t *rhi, int nr,
                             double split[2], double replicated[2]) {
    /* the last stage's copy of the tied wte is counted on the first */
    const int tied_elsewhere = m->d.pp > 1 && !model_first_stage(&m->d);
    /* each tensor's pieces (the whole of it, or its parts in the ranges) in
     * blocks of SUMSQ_BLOCK, summed on all threads, then the blocks in
     * order: the same bits on any thread count */
    size_t cap = 0, np = 0;
    for (int i = 0; i < m->nreg; i++)
        cap += (m->reg[i].numel + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK + (nr > 0 ? (size_t)nr : 1);
    SumsqPiece *piece = xmalloc((cap + 1) * sizeof *piece);
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        if (tied_elsewhere && p->tied) continue;
        const size_t t0 = p->offset, t1 = p->offset + p->numel;
        for (int k = 0; k < (nr < 0 ? 1 : nr); k++) {
            const size_t a = nr < 0 || rlo[k] < t0 ? t0 : rlo[k];
            const size_t b = nr < 0 || rhi[k] > t1 ? t1 : rhi[k];
            for (size_t x = a; x < b; x += SUMSQ_BLOCK)
                piece[np++] = (SumsqPiece){x, b - x < SUMSQ_BLOCK ? b : x + SUMSQ_BLOCK, i,
                                           p->expert >= 0, p->split_dim >= 0};
        }
    }
    double *part = xmalloc((np + 1) * sizeof(double));
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < np; b++)
        part[b] = block_sumsq(m->grads + piece[b].lo, piece[b].hi - piece[b].lo);
    double s[2][2] = {{0, 0}, {0, 0}}; /* [expert][split]: a fixed order of sums */
    for (size_t b = 0; b < np;) { /* a tensor's blocks in order, then into its class */
        const size_t b0 = b;
        double t = 0;
        while (b < np && piece[b].tensor == piece[b0].tensor) t += part[b++];
        s[piece[b0].expert][piece[b0].split] += t;
    }
    free(part);
    free(piece);
    for (int e = 0; e < 2; e++) {
        replicated[e] = s[e][0];
        split[e] = s[e][1];
    }
}

size_t model_num_params(const Model *m) {
    size_t n = 0;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        n += (size_t)p->vocab_rows * p->shape[1];
    }
    return n;
}

double model_flops_per_token(const ModelDims *d, int T, const double *frac) {
    return model_flops_per_token_moe(d, T, frac, NULL);
}

double model_flops_per_token_moe(const ModelDims *d, int T, const double *frac,
                                 const double *slots) {
    /* 6 FLOPs per matmul weight per token (forward 2, backward 4), plus the
     * attention products (q@k^T and p@v, 4TC forward, 8TC backward, over the
     * whole causal square as is customary). A routed block does that work
     * for the fraction of tokens it processes, over a sequence of as many;
     * its router (and predictor) run on every token. An MoE block's MLP
     * costs one expert (2 C Fe weights) per slot kept, and its router
     * C (E + Nn) on every token it processes. */
    double C = d->C, flops = 6.0 * d->V * C;
    for (int l = 0; l < d->L; l++) {
        double f = frac ? frac[l] : 1.0;
        double mlp = 8.0 * C * C;
        if (model_is_moe(d, l))
            mlp = (slots ? slots[l] : d->ek) * 2.0 * C * d->Fe + C * (d->E + d->Nn);
        flops += f * (6.0 * (4.0 * C * C + mlp) + 12.0 * (f * T) * C);
        if (frac && model_is_routed(d, l))
            flops += 6.0 * C + (d->predictor ? 6.0 * (C * d->H + d->H) : 0.0);
    }
    return flops;
}

/* ---------------------------------------------------------- forward/backward */

/* The attention branch of block l up to its projection: ln1, qkv, and the
 * heads' output atty (with each row's lse). Under recompute = attention the
 * backward runs it again, the same code on the same x: the same bits. */
static void attention_heads_forward(Model *m, int l, const float *x, int N, int B, const int *off,
                                    const KvCache *kv) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C, Cl = d->Cl;
    layernorm_forward(A->ln1, A->ln1_mean, A->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
    linear_forward(A->qkv, A->ln1, p->qkvw, p->qkvb, N, C, 3 * Cl);
    if (kv) {
        int n = (*kv->len)++;
        memcpy(kv->k + (size_t)n * Cl, A->qkv + Cl, (size_t)Cl * sizeof(float));
        memcpy(kv->v + (size_t)n * Cl, A->qkv + 2 * Cl, (size_t)Cl * sizeof(float));
        attention_decode(A->atty, kv->p, A->qkv, kv->k, kv->v, n + 1, d->NHl, d->hs, Cl);
    } else {
        attention_forward(A->atty, A->lse, A->qkv, B, off, d->NHl, d->hs);
    }
}

/* Block l's two branches on N rows x (B sequences, rows off[b]..off[b+1];
 * or, with kv, one token attending to its cache): a = attention branch
 * (projected, all-reduced, biased), mo = MLP branch, with res2 = x + a
 * inside. Internals stay in the current set's acts[l] for backward. The one
 * block implementation: training, evaluation and decoding all run it. */
void block_branches_forward(Model *m, int l, const float *x, int N, int B, const int *off,
                            const KvCache *kv, float *a, float *mo) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C, Cl = d->Cl;
    attention_heads_forward(m, l, x, N, B, off, kv);
    linear_forward(a, A->atty, p->attprojw, NULL, N, Cl, C);
    tp_allreduce_sum(a, (size_t)N * C, &m->tp);
    bias_residual_layernorm_forward(a, A->res2, A->ln2, A->ln2_mean, A->ln2_rstd, x, p->attprojb,
                                    p->ln2w, p->ln2b, N, C);
    mlp_forward(m, l, A->ln2, N, mo, kv == NULL);
}

/* Backward of the branches: dres holds dL/d(res2 + mo) on entry (the
 * gradient reaching the MLP branch and the residual) and dL/dx on exit. */
void block_branches_backward(Model *m, int l, const float *x, int N, int B, const int *off,
                             float *dres) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockParams *g = &m->G.h[l];
    BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int C = d->C;
    const size_t NC = (size_t)N * C;
    mlp_backward(m, l, A->ln2, N, dres, S->dln, m->moe_scale);
    layernorm_backward(dres, g->ln2w, g->ln2b, S->dln, A->res2, p->ln2w, A->ln2_mean, A->ln2_rstd,
                       N, C);
    /* (no communication: the qkv product is column-parallel) */
    if (d->recompute == RECOMPUTE_ATTENTION) attention_heads_forward(m, l, x, N, B, off, NULL);
    linear_backward_set(S->datty, g->attprojw, g->attprojb, dres, A->atty, p->attprojw, N, d->Cl,
                        C);
    attention_backward(S->dqkv, S->datty, A->qkv, A->atty, A->lse, B, off, d->NHl, d->hs);
    linear_backward_set(S->dln, g->qkvw, g->qkvb, S->dqkv, A->ln1, p->qkvw, N, C, 3 * d->Cl);
    tp_allreduce_sum(S->dln, NC, &m->tp);
    layernorm_backward(dres, g->ln1w, g->ln1b, S->dln, x, p->ln1w, A->ln1_mean, A->ln1_rstd, N, C);
}

/* Block l, routed or dense, on x (B,T,C) into y. Returns 0, or -1 when
 * the debug routing check faulted. */
static int block_forward(Model *m, int l, const float *x, float *y, int B, int T) {
    const int N = B * T;
    if (model_is_routed(&m->d, l)) return routed_forward(m, l, x, y, B, T);
    block_branches_forward(m, l, x, N, B, m->s.off_dense, NULL, m->s.scratch, m->s.scratch2);
    residual_forward(y, m->cur->acts[l].res2, m->s.scratch2, (size_t)N * m->d.C);
    m->stats.processed[l] += N;
    return 0;
}

/* recompute = block: block l's forward again, from its input x, into the
 * working copy, just before its backward reads it. The first forward
 * counted its routing and losses: this one's counts go to m->restats and
 * the set's losses are put back. The output, the same bits as res3, is
 * dropped into m->s.scratch. Under ep > 1 an MoE block repeats its
 * all-to-alls: every rank of the group runs the same blocks' backwards in
 * the same order, so they meet. */
static void block_recompute(Model *m, int l, const float *x, int B, int T) {
    ActSet *S = m->cur;
    const float aux = S->aux_loss, pred = S->pred_loss, moe = S->moe_aux;
    const RouteStats counted = m->stats;
    m->stats = m->restats;
    /* the forward's routing check passed on these very inputs */
    (void)block_forward(m, l, x, m->s.scratch, B, T);
    m->restats = m->stats;
    m->stats = counted;
    S->aux_loss = aux, S->pred_loss = pred, S->moe_aux = moe;
}

/* The first stage's input: token and position embeddings of the set's
 * inputs, into its enc. */
static void embed_stage_input(Model *m, int B, int T) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    const int N = B * T;
    embed_forward(S->enc, S->inputs, m->P.wte, d->v0, d->Vl, N, d->C);
    tp_allreduce_sum(S->enc, (size_t)N * d->C, &m->tp);
    pos_forward(S->enc, m->P.wpe, B, T, d->C);
}

float model_forward(Model *m, const int *inputs, const int *targets, int B, int T) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    /* the callers size micro-batches from maxB and maxT: a mismatch is a bug */
    assert(B >= 1 && B <= m->maxB && T >= 1 && T <= d->maxT);
    const int N = B * T;
    S->B = B;
    S->T = T;
    S->aux_loss = S->pred_loss = S->moe_aux = 0.f;
    /* model_expect_backward's promise holds for this forward alone */
    const int fused = m->expect && targets && !m->ref_logits;
    m->expect = 0;
    S->head_fused = 0;
    memcpy(S->inputs, inputs, (size_t)N * sizeof(int));
    if (targets) memcpy(S->targets, targets, (size_t)N * sizeof(int));
    for (int b = 0; b <= B; b++) m->s.off_dense[b] = b * T;
    /* later stages: the caller put the previous stage's output in S->enc */
    const int embeds = model_set_embeds(m), c0 = d->c0[S->chunk], c1 = d->c1[S->chunk];
    if (embeds) embed_stage_input(m, B, T);

    const float *x = S->enc;
    int routed = 0, moe = 0;
    for (int l = c0; l < c1; l++) {
        if (block_forward(m, l, x, S->acts[l].res3, B, T) != 0) return NAN;
        routed += model_is_routed(d, l);
        moe += model_is_moe(d, l);
        x = S->acts[l].res3;
    }
    if (embeds) m->stats.tokens += N; /* counted once per pipeline */
    /* the load-balancing loss, as the objective weighs it: per micro-batch
     * by its tokens */
    m->stats.moe_aux_sum += (double)S->moe_aux * N;
    m->stats.moe_forwards += (long long)moe * N;
    if (routed) {
        S->aux_loss /= (float)N * routed;
        S->pred_loss /= (float)N * routed;
    }
    /* the mean over the model's MoE blocks (a chunk's share of it), as
     * model_backward weighs each block's load-balancing loss */
    if (model_moe_blocks(d) > 0) S->moe_aux /= (float)model_moe_blocks(d);
    if (!model_set_heads(m)) return 0.f; /* the output is model_stage_output() */
    head_forward(m, x, N);
    if (m->ref_logits) return head_reference_forward(m, N, targets != NULL);
    if (!targets) return 0.f; /* the logits are model_logits()'s to make */
    return head_loss_forward(m, N, fused, m->expect_dloss);
}

void model_backward(Model *m, float dloss, float aux_weight) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    const int B = S->B, T = S->T, N = B * T;
    int routed = 0; /* over the whole model: the BCEs are means over all routed blocks */
    for (int l = 0; l < d->L; l++) routed += model_is_routed(d, l);
    const float aux_scale = routed ? aux_weight * dloss / routed : 0.f;
    const float pred_scale = routed ? dloss / routed : 0.f;
    /* each MoE block's load-balancing loss, weighted by the micro-batch's
     * tokens (as the LM loss is) and averaged over the MoE blocks */
    const int moe = model_moe_blocks(d);
    m->moe_scale = moe ? m->moe_aux_weight * dloss * (float)N / moe : 0.f;

    /* earlier stages: the caller put the next stage's input gradient in dres */
    if (model_set_heads(m)) {
        head_backward(m, dloss, N);
        if (m->block_done) m->block_done(m->block_done_ctx, d->L);
    }
    /* m->s.dres holds dL/d(residual stream) and moves back block by block */
    const int c0 = d->c0[S->chunk], c1 = d->c1[S->chunk];
    for (int l = c1 - 1; l >= c0; l--) {
        const float *x = l == c0 ? S->enc : S->acts[l - 1].res3;
        if (d->recompute == RECOMPUTE_BLOCK) block_recompute(m, l, x, B, T);
        if (model_is_routed(d, l)) routed_backward(m, l, x, m->s.dres, B, T, aux_scale, pred_scale);
        else block_branches_backward(m, l, x, N, B, m->s.off_dense, m->s.dres);
        if (m->block_done) m->block_done(m->block_done_ctx, l);
    }
    if (model_set_embeds(m)) {
        if (m->emb_rows) emb_rows_add(m->emb_rows, m->s.dres, S->inputs, d->v0, N);
        else embed_backward(m->G.wte, m->s.dres, S->inputs, d->v0, d->Vl, N, d->C);
        pos_backward(m->G.wpe, m->s.dres, B, T, d->C);
    } /* later stages: m->s.dres is dL/d(stage input), for the previous stage */
}

void emb_rows_init(EmbRows *e, int Vl, int C, int cap) {
    e->Vl = Vl, e->C = C, e->cap = cap < Vl ? cap : Vl, e->n = 0;
    e->slot = xmalloc((size_t)Vl * sizeof(int));
    for (int v = 0; v < Vl; v++) e->slot[v] = -1;
    e->id = xmalloc((size_t)e->cap * sizeof(int));
    e->rows = xcalloc((size_t)e->cap * C, sizeof(float));
}

void emb_rows_add(EmbRows *e, const float *dout, const int *tokens, int v0, int N) {
    const int C = e->C;
    for (int i = 0; i < N; i++) {
        const int v = tokens[i] - v0;
        if (v < 0 || v >= e->Vl) continue;
        if (e->slot[v] < 0) {
            assert(e->n < e->cap); /* the caller sized it for a step's tokens */
            e->id[e->n] = v;
            e->slot[v] = e->n++;
        }
        float *d = e->rows + (size_t)e->slot[v] * C;
        const float *g = dout + (size_t)i * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
    }
}

void emb_rows_clear(EmbRows *e) {
    for (int s = 0; s < e->n; s++) e->slot[e->id[s]] = -1;
    memset(e->rows, 0, (size_t)e->n * e->C * sizeof(float));
    e->n = 0;
}

void emb_rows_free(EmbRows *e) {
    free(e->slot), free(e->id), free(e->rows);
    memset(e, 0, sizeof *e);
}

float *model_stage_output(const Model *m) {
    const int c0 = m->d.c0[m->cur->chunk], c1 = m->d.c1[m->cur->chunk];
    return c1 > c0 ? m->cur->acts[c1 - 1].res3 : m->cur->enc;
}

int model_set_embeds(const Model *m) { return model_first_stage(&m->d) && m->cur->chunk == 0; }

int model_set_heads(const Model *m) {
    return model_last_stage(&m->d) && m->cur->chunk == m->d.nchunk - 1;
}
