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
#include "src/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <assert.h>

#include "mpi/check.h"
#include "mpi/pipeline.h"
#include "src/config.h"
#include "src/kernels.h"
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

void model_dims_mod(ModelDims *d, int route_every, double capacity, RouterGate gate, int predictor,
                    int H) {
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

int model_stage_routed(const ModelDims *d) {
    /* blocks l < x with l % r == r - 1: x / r of them */
    return d->route_every > 0 ? d->l1 / d->route_every - d->l0 / d->route_every : 0;
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

/* The registry of m->d's stage into m->reg (measure: only m->nparams). */
static void build_registry(Model *m, int measure) {
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

/* ------------------------------------------------------------- allocation */

/* The activation size table (after llm.c's act_sizes): one row per buffer,
 * naming the field that points at it, its element size, its element count
 * as a function of the dims, and where it exists. An activation set is one
 * allocation laid out row by row, every buffer on a 64-byte boundary. */
typedef enum {
    SZ_N,    /* B*T: one per token */
    SZ_NC,   /* B*T*C */
    SZ_N3CL, /* B*T*3Cl: q, k, v of this rank's heads */
    SZ_NCL,  /* B*T*Cl */
    SZ_NFL,  /* B*T*Fl: this rank's MLP columns */
    SZ_NH,   /* B*T*H: the predictor's hidden layer */
    SZ_ATT,  /* B*NHl*T*T: attention probabilities */
    SZ_OFF,  /* B+1: sequence offsets */
    SZ_NVL,  /* B*T*Vl: this rank's logits */
    SZ_3N,   /* 3*B*T: per-row max, sum and target logit of the loss */
    SZ_2NH   /* 2*B*T*H: the predictor's hidden gradients (one H when no predictor) */
} SizeKind;
typedef enum { IN_ANY, IN_ROUTED, IN_PREDICTOR, IN_LAST_STAGE } Where;
typedef struct {
    size_t field; /* offset of the pointer in its struct */
    size_t elem;  /* bytes per element */
    SizeKind n;
    Where where;
} ActRow;

#define F sizeof(float)
#define BA(f) offsetof(BlockActs, f)
static const ActRow block_rows[] = {
    {BA(ln1), F, SZ_NC, IN_ANY},
    {BA(ln1_mean), F, SZ_N, IN_ANY},
    {BA(ln1_rstd), F, SZ_N, IN_ANY},
    {BA(qkv), F, SZ_N3CL, IN_ANY},
    {BA(att), F, SZ_ATT, IN_ANY},
    {BA(atty), F, SZ_NCL, IN_ANY},
    {BA(res2), F, SZ_NC, IN_ANY},
    {BA(ln2), F, SZ_NC, IN_ANY},
    {BA(ln2_mean), F, SZ_N, IN_ANY},
    {BA(ln2_rstd), F, SZ_N, IN_ANY},
    {BA(fch), F, SZ_NFL, IN_ANY},
    {BA(fch_gelu), F, SZ_NFL, IN_ANY},
    {BA(res3), F, SZ_NC, IN_ANY},
    {BA(r), F, SZ_N, IN_ROUTED},
    {BA(topk), 1, SZ_N, IN_ROUTED},
    {BA(sel), sizeof(int), SZ_N, IN_ROUTED},
    {BA(off), sizeof(int), SZ_OFF, IN_ROUTED},
    {BA(gate), F, SZ_N, IN_ROUTED},
    {BA(xs), F, SZ_NC, IN_ROUTED},
    {BA(a), F, SZ_NC, IN_ROUTED},
    {BA(mo), F, SZ_NC, IN_ROUTED},
    {BA(plogit), F, SZ_N, IN_PREDICTOR},
    {BA(ph), F, SZ_NH, IN_PREDICTOR},
    {BA(phg), F, SZ_NH, IN_PREDICTOR},
};
#define AS(f) offsetof(ActSet, f)
static const ActRow set_rows[] = {
    {AS(enc), F, SZ_NC, IN_ANY},
    {AS(lnf), F, SZ_NC, IN_LAST_STAGE},
    {AS(lnf_mean), F, SZ_N, IN_LAST_STAGE},
    {AS(lnf_rstd), F, SZ_N, IN_LAST_STAGE},
    {AS(logits), F, SZ_NVL, IN_LAST_STAGE},
    {AS(losses), F, SZ_N, IN_LAST_STAGE},
    {AS(inputs), sizeof(int), SZ_N, IN_ANY},
    {AS(targets), sizeof(int), SZ_N, IN_ANY},
};
#define SC(f) offsetof(Scratch, f)
static const ActRow scratch_rows[] = {
    {SC(dres), F, SZ_NC, IN_ANY},    {SC(dln), F, SZ_NC, IN_ANY},
    {SC(scratch), F, SZ_NC, IN_ANY}, {SC(scratch2), F, SZ_NC, IN_ANY},
    {SC(dqkv), F, SZ_N3CL, IN_ANY},  {SC(datty), F, SZ_NCL, IN_ANY},
    {SC(dfch), F, SZ_NFL, IN_ANY},   {SC(dfchg), F, SZ_NFL, IN_ANY},
    {SC(rowbuf), F, SZ_3N, IN_ANY},  {SC(dr), F, SZ_N, IN_ANY},
    {SC(dph), F, SZ_2NH, IN_ANY},    {SC(off_dense), sizeof(int), SZ_OFF, IN_ANY},
};
#undef F
#undef BA
#undef AS
#undef SC
#define NROWS(t) (sizeof(t) / sizeof((t)[0]))

/* Saturating (SIZE_MAX: more than can exist), so that model_memory() can
 * measure any config before anything is allocated. */
static size_t size_of(const Model *m, SizeKind k) {
    const ModelDims *d = &m->d;
    const size_t B = (size_t)m->maxB, N = sat_mul(B, (size_t)d->maxT), C = (size_t)d->C;
    switch (k) {
    case SZ_N: return N;
    case SZ_NC: return sat_mul(N, C);
    case SZ_N3CL: return sat_mul(N, 3 * (size_t)d->Cl);
    case SZ_NCL: return sat_mul(N, (size_t)d->Cl);
    case SZ_NFL: return sat_mul(N, (size_t)d->Fl);
    case SZ_NH: return sat_mul(N, (size_t)d->H);
    case SZ_ATT:
        return sat_mul(sat_mul(B, (size_t)d->NHl), sat_mul((size_t)d->maxT, (size_t)d->maxT));
    case SZ_OFF: return B + 1;
    case SZ_NVL: return sat_mul(N, (size_t)d->Vl);
    case SZ_3N: return sat_mul(3, N);
    case SZ_2NH:
        return sat_mul(2 * N, (size_t)(d->predictor ? d->H : 1)); /* dL/d(hidden), dL/d(gelu) */
    }
    return 0;
}

static int row_exists(const Model *m, Where w, int l) {
    switch (w) {
    case IN_ANY: return 1;
    case IN_ROUTED: return model_is_routed(&m->d, l);
    case IN_PREDICTOR: return model_is_routed(&m->d, l) && m->d.predictor;
    case IN_LAST_STAGE: return model_last_stage(&m->d);
    }
    return 0;
}

static size_t round64(size_t bytes) {
    return bytes > SIZE_MAX - 63 ? SIZE_MAX : (bytes + 63) & ~(size_t)63;
}

/* Lays the rows out from byte `at` of base, pointing owner's fields into it
 * (base NULL: only measures); returns the next free byte. l: the block. */
static size_t lay_out(const Model *m, const ActRow *rows, size_t n, int l, void *owner, char *base,
                      size_t at) {
    for (size_t i = 0; i < n; i++) {
        if (!row_exists(m, rows[i].where, l)) continue;
        if (base) {
            void *p = base + at;
            memcpy((char *)owner + rows[i].field, &p, sizeof p);
        }
        at = sat_add(at, round64(sat_mul(size_of(m, rows[i].n), rows[i].elem)));
    }
    return at;
}

/* One activation set in base (NULL: measures it): the BlockActs array,
 * the set's own buffers, then this stage's blocks. Returns its bytes. */
static size_t actset_layout(const Model *m, ActSet *s, char *base) {
    size_t at = round64((size_t)m->d.L * sizeof(BlockActs));
    if (base) s->acts = (BlockActs *)(void *)base;
    at = lay_out(m, set_rows, NROWS(set_rows), -1, s, base, at);
    for (int l = m->d.l0; l < m->d.l1; l++)
        at = lay_out(m, block_rows, NROWS(block_rows), l, base ? &s->acts[l] : NULL, base, at);
    return at;
}

int model_registry(const ModelDims *d, ParamInfo **reg) {
    Model m;
    memset(&m, 0, sizeof m);
    m.d = *d;
    build_registry(&m, 0);
    *reg = m.reg;
    return m.nreg;
}

/* Floats of the registry of a stage of d holding blocks [l0, l1), the first
 * and/or the last stage as said (measured, not built). */
static size_t stage_floats(const ModelDims *d, int first, int last, int l0, int l1) {
    Model m;
    memset(&m, 0, sizeof m);
    m.d = *d;
    m.d.pp = 3, m.d.pp_rank = first ? 0 : last ? 2 : 1; /* first, last or a middle stage */
    if (first && last) m.d.pp = 1;
    m.d.l0 = l0, m.d.l1 = l1;
    build_registry(&m, 1);
    return m.nparams;
}

void model_units(const ModelDims *d, int maxB, ModelUnits *u) {
    memset(u, 0, sizeof *u);
    for (int first = 0; first < 2; first++)
        for (int last = 0; last < 2; last++)
            u->top_floats[first][last] = stage_floats(d, first, last, 0, 0);
    /* block 0 is dense unless every block is routed; block route_every - 1 is routed */
    const int dense = model_is_routed(d, 0) ? -1 : 0, routed = d->route_every - 1;
    Model m;
    memset(&m, 0, sizeof m);
    m.d = *d;
    m.maxB = maxB;
    for (int k = 0; k < 2; k++) {
        const int l = k ? routed : dense;
        if (l < 0) continue;
        u->block_floats[k] = stage_floats(d, 0, 0, l, l + 1);
        u->block_acts[k] = lay_out(&m, block_rows, NROWS(block_rows), l, NULL, NULL, 0);
    }
    for (int last = 0; last < 2; last++) {
        m.d.pp = last ? 1 : 2, m.d.pp_rank = 0; /* the set's rows depend on the last stage only */
        u->set_bytes[last] = lay_out(&m, set_rows, NROWS(set_rows), -1, NULL, NULL,
                                     round64((size_t)d->L * sizeof(BlockActs)));
    }
    m.d = *d;
    u->scratch = lay_out(&m, scratch_rows, NROWS(scratch_rows), -1, NULL, NULL, 0);
}

void model_memory_units(const ModelUnits *u, const ModelDims *d, int slots, int optimizer,
                        ModelMemory *mm) {
    const size_t n = (size_t)(d->l1 - d->l0);
    const size_t routed = (size_t)model_stage_routed(d);
    const size_t nparams = u->top_floats[model_first_stage(d)][model_last_stage(d)] +
                           (n - routed) * u->block_floats[0] + routed * u->block_floats[1];
    const size_t param_bytes = sat_mul(nparams, sizeof(float));
    const size_t set =
        sat_add(u->set_bytes[model_last_stage(d)],
                sat_add(sat_mul(n - routed, u->block_acts[0]), sat_mul(routed, u->block_acts[1])));
    memset(mm, 0, sizeof *mm);
    mm->params = param_bytes;
    mm->grads = param_bytes;
    mm->moments = optimizer ? sat_mul(2, param_bytes) : 0;
    mm->acts = sat_mul((size_t)slots, set);
    mm->scratch = u->scratch;
    mm->total = sat_add(sat_add(sat_add(mm->params, mm->grads), sat_add(mm->moments, mm->acts)),
                        mm->scratch);
}

void model_memory(const ModelDims *d, int maxB, int slots, int optimizer, ModelMemory *mm) {
    ModelUnits u;
    model_units(d, maxB, &u);
    model_memory_units(&u, d, slots, optimizer, mm);
}

int model_memory_check(const ModelMemory *mm, size_t budget, int ranks, Err *err) {
    if (mm->total <= budget) return 0;
    char tot[32], b[32], p[32], mo[32], a[32];
    format_bytes(tot, sizeof tot, mm->total);
    format_bytes(b, sizeof b, budget);
    format_bytes(p, sizeof p, sat_add(mm->params, mm->grads));
    format_bytes(mo, sizeof mo, mm->moments);
    format_bytes(a, sizeof a, sat_add(mm->acts, mm->scratch));
    char st[128] = "", sb[32];
    if (mm->staging) {
        format_bytes(sb, sizeof sb, mm->staging);
        snprintf(st, sizeof st, ", checkpoint staging copy %s", sb);
    }
    if (mm->data) {
        format_bytes(sb, sizeof sb, mm->data);
        snprintf(st + strlen(st), sizeof st - strlen(st), ", data path %s", sb);
    }
    return err_set(err,
                   "the model needs %s per rank (parameters and gradients %s, AdamW moments %s, "
                   "activations %s%s), more than the %s each of the %d rank%s on this node can "
                   "have; lower micro_batch, seq_len, d_model or n_layer, or split the model over "
                   "more ranks (tp, pp)%s",
                   tot, p, mo, a, st, b, ranks, ranks == 1 ? "" : "s",
                   mm->staging ? ", or save synchronously (ckpt_async 0)" : "");
}

static void actset_alloc(const Model *m, ActSet *s) {
    memset(s, 0, sizeof *s);
    s->mem = xcalloc(1, actset_layout(m, s, NULL));
    actset_layout(m, s, s->mem);
}

void model_set_slots(Model *m, int n) {
    for (int k = n; k < m->nslots; k++) free(m->slots[k].mem);
    m->slots = xrealloc(m->slots, (size_t)n * sizeof(ActSet));
    for (int k = m->nslots; k < n; k++) actset_alloc(m, &m->slots[k]);
    m->nslots = n;
    m->cur = &m->slots[0];
}

void model_use_slot(Model *m, int k) { m->cur = &m->slots[k]; }

void model_init(Model *m, const ModelDims *d, int maxB, const TpGroup *tp) {
    memset(m, 0, sizeof *m);
    m->d = *d;
    if (tp) m->tp = *tp;
    else m->tp = (TpGroup){MPI_COMM_NULL, 1, 0};
    build_registry(m, 0);
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
    model_set_slots(m, 1);
    m->s.mem = xcalloc(1, lay_out(m, scratch_rows, NROWS(scratch_rows), -1, &m->s, NULL, 0));
    lay_out(m, scratch_rows, NROWS(scratch_rows), -1, &m->s, m->s.mem, 0);
}

void model_free(Model *m) {
    for (int k = 0; k < m->nslots; k++) free(m->slots[k].mem);
    void *bufs[] = {m->params, m->grads, m->s.mem, m->slots,
                    m->P.h,    m->G.h,   m->reg,   m->stats.processed};
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

void model_zero_grad(Model *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

void model_stats_reset(Model *m) {
    long long *p = m->stats.processed;
    memset(p, 0, (size_t)m->d.L * sizeof(long long));
    memset(&m->stats, 0, sizeof m->stats);
    m->stats.processed = p;
}

void route_stats_to_vec(const RouteStats *st, int L, double *v) {
    v[0] = st->aux_sum, v[1] = st->pred_sum, v[2] = (double)st->decisions;
    v[3] = (double)st->agree, v[4] = (double)st->tokens;
    for (int l = 0; l < L; l++) v[ROUTE_STATS_FIXED + l] = (double)st->processed[l];
}

void route_stats_from_vec(RouteStats *st, int L, const double *v) {
    st->aux_sum = v[0], st->pred_sum = v[1], st->decisions = (long long)v[2];
    st->agree = (long long)v[3], st->tokens = (long long)v[4];
    for (int l = 0; l < L; l++) st->processed[l] = (long long)v[ROUTE_STATS_FIXED + l];
}

void model_grad_sumsq(const Model *m, double *split, double *replicated) {
    /* the last stage's copy of the tied wte is counted on the first */
    const int tied_elsewhere = m->d.pp > 1 && !model_first_stage(&m->d);
    double s[2] = {0, 0}; /* replicated, split: a fixed order of sums */
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        if (tied_elsewhere && p->tied) continue;
        const float *g = m->grads + p->offset;
        double t = 0;
        for (size_t j = 0; j < p->numel; j++) t += (double)g[j] * g[j];
        s[p->split_dim >= 0] += t;
    }
    *replicated = s[0];
    *split = s[1];
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

static float gate_value(RouterGate gate, float r) {
    return gate == GATE_SIGMOID ? 1.f / (1.f + expf(-r)) : r;
}
static float gate_grad(RouterGate gate, float r) {
    if (gate != GATE_SIGMOID) return 1.f;
    float s = 1.f / (1.f + expf(-r));
    return s * (1.f - s);
}

/* The causal decision of a token: the predictor's logit, or the router's
 * own, above zero. */
static int causal_decision(const ModelDims *d, float r, float plogit) {
    return d->predictor ? plogit > 0.f : r > 0.f;
}

float model_gate(const ModelDims *d, float r) { return gate_value(d->gate, r); }

int model_causal(const ModelDims *d, float r, float plogit) {
    return causal_decision(d, r, plogit);
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

/* Router logits r (and the predictor's) of block l for N rows of x, into
 * the block's activations. The predictor reads x but never sends gradient
 * into it. */
static void router_forward(Model *m, int l, const float *x, int N) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C;
    mm(0, 0, N, 1, C, 1.f, x, C, p->rw, 1, 0.f, A->r, 1);
    for (int i = 0; i < N; i++) A->r[i] += p->rb[0];
    if (!d->predictor) return;
    linear_forward(A->ph, x, p->pw1, p->pb1, N, C, d->H);
    gelu_forward(A->phg, A->ph, (size_t)N * d->H);
    mm(0, 0, N, 1, d->H, 1.f, A->phg, d->H, p->pw2, 1, 0.f, A->plogit, 1);
    for (int i = 0; i < N; i++) A->plogit[i] += p->pb2[0];
}

/* With debug checks: every tp rank routes from the same replicated stream,
 * so the chosen positions must agree bit for bit. Returns 0, or -1 with the
 * model faulted (on every rank of the tp group alike). */
static int routing_agrees(Model *m, int l, const BlockActs *a, int K) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < K; i++) h = (h ^ (uint64_t)a->sel[i]) * 1099511628211ULL;
    h = (h ^ (uint64_t)K) * 1099511628211ULL;
    if (tp_agree_u64(h, &m->tp)) return 0;
    m->faulted = 1;
    return err_set(&m->fault,
                   "routing: tensor-parallel ranks chose different tokens in block %d (rank %d of "
                   "its tp group)",
                   l, m->tp.rank);
}

/* Chooses the tokens routed block l processes, fills sel/off/gate, and
 * accumulates the BCE losses and the agreement of the causal decision with
 * top-k membership. Returns 0, or -1 when the debug check faulted. */
static int route_select(Model *m, int l, int B, int T) {
    const ModelDims *d = &m->d;
    BlockActs *a = &m->cur->acts[l];
    const int k = model_capacity_k(d, T);
    Score *buf = xmalloc((size_t)T * sizeof(Score));
    double aux = 0, pred = 0;
    long long agree = 0;
    int K = 0;
    a->off[0] = 0;
    for (int b = 0; b < B; b++) {
        const float *r = a->r + (size_t)b * T;
        const float *z = d->predictor ? a->plogit + (size_t)b * T : NULL;
        unsigned char *tk = a->topk + (size_t)b * T;
        topk_mark(tk, r, T, k, buf);
        for (int t = 0; t < T; t++) {
            int causal = causal_decision(d, r[t], z ? z[t] : 0.f);
            agree += causal == tk[t];
            aux += bce_logit(r[t], tk[t]);
            if (z) pred += bce_logit(z[t], tk[t]);
            if (m->route == ROUTE_TOPK ? tk[t] : causal) {
                a->sel[K] = b * T + t;
                a->gate[K] = gate_value(d->gate, r[t]);
                K++;
            }
        }
        a->off[b + 1] = K;
    }
    free(buf);
    if (m->check_routing && routing_agrees(m, l, a, K) != 0) return -1;
    m->stats.aux_sum += aux;
    m->stats.pred_sum += pred;
    m->stats.agree += agree;
    m->stats.decisions += (long long)B * T;
    m->cur->aux_loss += (float)aux;
    m->cur->pred_loss += (float)pred;
    return 0;
}

/* ---------------------------------------------------------- forward/backward */

/* Vocab-parallel cross-entropy: each rank holds logits for Vl vocabulary
 * rows; maxima and sums are all-reduced, never the logits. Turns logits into
 * probabilities in place and returns the mean loss. */
static float crossentropy_forward(Model *m, int N) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    int Vl = d->Vl, v0 = d->v0;
    int valid = d->V - v0 < Vl ? d->V - v0 : Vl; /* local columns that are real tokens */
    if (valid < 0) valid = 0;
    float *mx = m->s.rowbuf, *sum = m->s.rowbuf + N, *tl = m->s.rowbuf + 2 * N;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *row = S->logits + (size_t)i * Vl;
        float v = -INFINITY;
        for (int j = 0; j < valid; j++) v = row[j] > v ? row[j] : v;
        mx[i] = v;
    }
    tp_allreduce_max(mx, (size_t)N, &m->tp);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = S->logits + (size_t)i * Vl;
        int t = S->targets[i] - v0;
        tl[i] = t >= 0 && t < valid ? row[t] : 0.f;
        float sm = 0.f;
        for (int j = 0; j < valid; j++) {
            row[j] = expf(row[j] - mx[i]);
            sm += row[j];
        }
        for (int j = valid; j < Vl; j++) row[j] = 0.f;
        sum[i] = sm;
    }
    tp_allreduce_sum(sum, (size_t)N, &m->tp);
    tp_allreduce_sum(tl, (size_t)N, &m->tp);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = S->logits + (size_t)i * Vl;
        float inv = 1.f / sum[i];
        for (int j = 0; j < valid; j++) row[j] *= inv;
        S->losses[i] = logf(sum[i]) + mx[i] - tl[i];
    }
    double total = 0;
    for (int i = 0; i < N; i++) total += S->losses[i];
    return (float)(total / N);
}

/* Decoding's view of a block's attention: one new token against the
 * block's KV cache instead of whole sequences. */
typedef struct {
    float *k, *v; /* (maxT, Cl) keys and values of the tokens cached */
    int *len;     /* tokens cached; the new one is appended */
    float *p;     /* (maxT) scratch */
} KvCache;

/* Block l's two branches on N rows x (B sequences, rows off[b]..off[b+1];
 * or, with kv, one token attending to its cache): a = attention branch
 * (projected, all-reduced, biased), mo = MLP branch, with res2 = x + a
 * inside. Internals stay in the current set's acts[l] for backward. The one
 * block implementation: training, evaluation and decoding all run it. */
static void block_branches_forward(Model *m, int l, const float *x, int N, int B, const int *off,
                                   const KvCache *kv, float *a, float *mo) {
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
        attention_forward(A->atty, A->att, A->qkv, B, off, d->NHl, d->hs);
    }
    linear_forward(a, A->atty, p->attprojw, NULL, N, Cl, C);
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

/* A routed block's output row: y += g*a + g*mo, computed as (y + g*a) + g*mo
 * so that capacity 1 with g = 1 reproduces a dense block bit for bit. */
static inline void gated_add(float *y, const float *a, const float *mo, float g, int C) {
    for (int c = 0; c < C; c++) {
        float h = y[c] + g * a[c];
        y[c] = h + g * mo[c];
    }
}

/* Backward of the branches: dres holds dL/d(res2 + mo) on entry (the
 * gradient reaching the MLP branch and the residual) and dL/dx on exit. */
static void block_branches_backward(Model *m, int l, const float *x, int N, int B, const int *off,
                                    float *dres) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockParams *g = &m->G.h[l];
    BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int C = d->C;
    const size_t NC = (size_t)N * C, NF = (size_t)N * d->Fl;
    memset(S->dfchg, 0, NF * sizeof(float));
    linear_backward(S->dfchg, g->fcprojw, g->fcprojb, dres, A->fch_gelu, p->fcprojw, N, d->Fl, C);
    memset(S->dfch, 0, NF * sizeof(float));
    gelu_backward(S->dfch, A->fch, S->dfchg, NF);
    memset(S->dln, 0, NC * sizeof(float));
    linear_backward(S->dln, g->fcw, g->fcb, S->dfch, A->ln2, p->fcw, N, C, d->Fl);
    tp_allreduce_sum(S->dln, NC, &m->tp);
    layernorm_backward(dres, g->ln2w, g->ln2b, S->dln, A->res2, p->ln2w, A->ln2_mean, A->ln2_rstd,
                       N, C);
    memset(S->datty, 0, (size_t)N * d->Cl * sizeof(float));
    linear_backward(S->datty, g->attprojw, g->attprojb, dres, A->atty, p->attprojw, N, d->Cl, C);
    attention_backward(S->dqkv, S->datty, A->qkv, A->att, B, off, d->NHl, d->hs);
    memset(S->dln, 0, NC * sizeof(float));
    linear_backward(S->dln, g->qkvw, g->qkvb, S->dqkv, A->ln1, p->qkvw, N, C, 3 * d->Cl);
    tp_allreduce_sum(S->dln, NC, &m->tp);
    layernorm_backward(dres, g->ln1w, g->ln1b, S->dln, x, p->ln1w, A->ln1_mean, A->ln1_rstd, N, C);
}

/* Routed block l on x(B,T,C): router (and predictor) on every token, the
 * branches on the chosen K tokens only, y = x + g(r) * (a + mo) on those and
 * y = x elsewhere. Returns 0, or -1 when the debug routing check faulted. */
static int routed_forward(Model *m, int l, const float *x, float *y, int B, int T) {
    BlockActs *A = &m->cur->acts[l];
    const int N = B * T, C = m->d.C;
    router_forward(m, l, x, N);
    if (route_select(m, l, B, T) != 0) return -1;
    const int K = A->off[B];
    m->stats.processed[l] += K;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < K; i++)
        memcpy(A->xs + (size_t)i * C, x + (size_t)A->sel[i] * C, (size_t)C * sizeof(float));
    if (K > 0) block_branches_forward(m, l, A->xs, K, B, A->off, NULL, A->a, A->mo);
    memcpy(y, x, (size_t)N * C * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int i = 0; i < K; i++)
        gated_add(y + (size_t)A->sel[i] * C, A->a + (size_t)i * C, A->mo + (size_t)i * C,
                  A->gate[i], C);
    return 0;
}

/* The gradients of the router's BCE (aux_loss) and the predictor's own BCE
 * for routed block l; m->s.dr holds the gate's gradient on entry and is
 * spent on exit. dres gets the router's share of dL/dx. */
static void router_backward(Model *m, int l, const float *x, float *dres, int N, float aux_scale,
                            float pred_scale) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockParams *g = &m->G.h[l];
    const BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int C = d->C;
    /* the router's BCE toward top-k membership (causal_router = aux_loss) */
    if (!d->predictor && aux_scale != 0.f)
        for (int t = 0; t < N; t++)
            S->dr[t] += aux_scale * (1.f / (1.f + expf(-A->r[t])) - (float)A->topk[t]);
    /* router: r = x . w + b */
    mm(1, 0, C, 1, N, 1.f, x, C, S->dr, 1, 1.f, g->rw, 1);
    double db = 0;
    for (int t = 0; t < N; t++) db += S->dr[t];
    g->rb[0] += (float)db;
    mm(0, 0, N, C, 1, 1.f, S->dr, 1, p->rw, C, 1.f, dres, C);
    if (!d->predictor || !m->predictor_on) return;
    /* predictor: its own BCE, into its own weights only */
    float *dl = S->dr; /* reused: the router's gradient is spent */
    for (int t = 0; t < N; t++)
        dl[t] = pred_scale * (1.f / (1.f + expf(-A->plogit[t])) - (float)A->topk[t]);
    mm(1, 0, d->H, 1, N, 1.f, A->phg, d->H, dl, 1, 1.f, g->pw2, 1);
    double db2 = 0;
    for (int t = 0; t < N; t++) db2 += dl[t];
    g->pb2[0] += (float)db2;
    memset(S->dph, 0, (size_t)N * d->H * sizeof(float));
    float *dphg = S->dph + (size_t)N * d->H;
    mm(0, 0, N, d->H, 1, 1.f, dl, 1, p->pw2, 1, 0.f, dphg, d->H);
    gelu_backward(S->dph, A->ph, dphg, (size_t)N * d->H);
    linear_backward(NULL, g->pw1, g->pb1, S->dph, x, p->pw1, N, C, d->H);
}

/* Backward of routed_forward: dres holds dL/dy on entry, dL/dx on exit. */
static void routed_backward(Model *m, int l, const float *x, float *dres, int B, int T,
                            float aux_scale, float pred_scale) {
    const ModelDims *d = &m->d;
    const BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int N = B * T, C = d->C, K = A->off[B];
    float *ds = S->scratch; /* (K,C) gradient of the gathered rows */
    /* gate: dL/dr = g'(r) * <dy, a + mo>; the branches see g * dy */
    memset(S->dr, 0, (size_t)N * sizeof(float));
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
        S->dr[t] = dot * gate_grad(d->gate, A->r[t]);
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
    router_backward(m, l, x, dres, N, aux_scale, pred_scale);
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

/* The last stage's head on the residual stream x: ln_f, then the tied head
 * logits(N,Vl) = lnf(N,C) @ wte(Vl,C)^T. */
static void head_forward(Model *m, const float *x, int N) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    layernorm_forward(S->lnf, S->lnf_mean, S->lnf_rstd, x, m->P.lnfw, m->P.lnfb, N, d->C);
    mm(0, 1, N, d->Vl, d->C, 1.f, S->lnf, d->C, m->P.wte, d->C, 0.f, S->logits, d->Vl);
}

float model_forward(Model *m, const int *inputs, const int *targets, int B, int T) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    /* the callers size micro-batches from maxB and maxT: a mismatch is a bug */
    assert(B >= 1 && B <= m->maxB && T >= 1 && T <= d->maxT);
    const int N = B * T, C = d->C;
    S->B = B;
    S->T = T;
    S->aux_loss = S->pred_loss = 0.f;
    memcpy(S->inputs, inputs, (size_t)N * sizeof(int));
    if (targets) memcpy(S->targets, targets, (size_t)N * sizeof(int));
    for (int b = 0; b <= B; b++) m->s.off_dense[b] = b * T;
    /* later stages: the caller put the previous stage's output in S->enc */
    if (model_first_stage(d)) embed_stage_input(m, B, T);

    const float *x = S->enc;
    int routed = 0;
    for (int l = d->l0; l < d->l1; l++) {
        BlockActs *a = &S->acts[l];
        if (model_is_routed(d, l)) {
            if (routed_forward(m, l, x, a->res3, B, T) != 0) return NAN;
            routed++;
        } else {
            block_branches_forward(m, l, x, N, B, m->s.off_dense, NULL, m->s.scratch,
                                   m->s.scratch2);
            residual_forward(a->res3, a->res2, m->s.scratch2, (size_t)N * C);
            m->stats.processed[l] += N;
        }
        x = a->res3;
    }
    if (model_first_stage(d)) m->stats.tokens += N; /* counted once per pipeline */
    if (routed) {
        S->aux_loss /= (float)N * routed;
        S->pred_loss /= (float)N * routed;
    }
    if (!model_last_stage(d)) return 0.f; /* the output is model_stage_output() */
    head_forward(m, x, N);
    if (!targets) return 0.f;
    return crossentropy_forward(m, N);
}

/* Backward of the head and the loss into m->s.dres: dlogits = (p -
 * onehot(target)) * dloss, in place over the probabilities. */
static void head_backward(Model *m, float dloss, int N) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    const int C = d->C, Vl = d->Vl;
    const size_t NC = (size_t)N * C;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = S->logits + (size_t)i * Vl;
        for (int j = 0; j < Vl; j++) row[j] *= dloss;
        int t = S->targets[i] - d->v0;
        if (t >= 0 && t < Vl) row[t] -= dloss;
    }
    mm(0, 0, N, C, Vl, 1.f, S->logits, Vl, m->P.wte, C, 0.f, m->s.dln, C);
    tp_allreduce_sum(m->s.dln, NC, &m->tp);
    mm(1, 0, Vl, C, N, 1.f, S->logits, Vl, S->lnf, C, 1.f, m->G.wte, C);
    memset(m->s.dres, 0, NC * sizeof(float));
    layernorm_backward(m->s.dres, m->G.lnfw, m->G.lnfb, m->s.dln, model_stage_output(m), m->P.lnfw,
                       S->lnf_mean, S->lnf_rstd, N, C);
}

void model_backward(Model *m, float dloss, float aux_weight) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    const int B = S->B, T = S->T, N = B * T;
    int routed = 0; /* over the whole model: the BCEs are means over all routed blocks */
    for (int l = 0; l < d->L; l++) routed += model_is_routed(d, l);
    const float aux_scale = routed ? aux_weight * dloss / routed : 0.f;
    const float pred_scale = routed ? dloss / routed : 0.f;

    /* earlier stages: the caller put the next stage's input gradient in dres */
    if (model_last_stage(d)) head_backward(m, dloss, N);
    /* m->s.dres holds dL/d(residual stream) and moves back block by block */
    for (int l = d->l1 - 1; l >= d->l0; l--) {
        const float *x = l == d->l0 ? S->enc : S->acts[l - 1].res3;
        if (model_is_routed(d, l)) routed_backward(m, l, x, m->s.dres, B, T, aux_scale, pred_scale);
        else block_branches_backward(m, l, x, N, B, m->s.off_dense, m->s.dres);
    }
    if (model_first_stage(d)) {
        embed_backward(m->G.wte, m->s.dres, S->inputs, d->v0, d->Vl, N, d->C);
        pos_backward(m->G.wpe, m->s.dres, B, T, d->C);
    } /* later stages: m->s.dres is dL/d(stage input), for the previous stage */
}

float *model_stage_output(const Model *m) {
    return m->d.l1 > m->d.l0 ? m->cur->acts[m->d.l1 - 1].res3 : m->cur->enc;
}

/* --------------------------------------------------------------- decoding */

void decode_init(DecodeState *s, const Model *m) {
    const ModelDims *d = &m->d;
    memset(s, 0, sizeof *s);
    s->k = xcalloc((size_t)d->L, sizeof(float *));
    s->v = xcalloc((size_t)d->L, sizeof(float *));
    for (int l = 0; l < d->L; l++) {
        s->k[l] = xcalloc((size_t)d->maxT * d->Cl, sizeof(float));
        s->v[l] = xcalloc((size_t)d->maxT * d->Cl, sizeof(float));
    }
    s->len = xcalloc((size_t)d->L, sizeof(int));
    s->processed = xcalloc((size_t)d->L, sizeof(long long));
    s->x = xcalloc((size_t)d->C, sizeof(float));
    s->att = xcalloc((size_t)d->maxT, sizeof(float));
}

void decode_free(DecodeState *s, const Model *m) {
    for (int l = 0; l < m->d.L; l++) {
        free(s->k[l]);
        free(s->v[l]);
    }
    void *bufs[] = {s->k, s->v, s->len, s->processed, s->x, s->att};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    memset(s, 0, sizeof *s);
}

void decode_reset(DecodeState *s, const Model *m) {
    memset(s->len, 0, (size_t)m->d.L * sizeof(int));
}

const float *decode_step(Model *m, DecodeState *s, int tok, int pos) {
    const ModelDims *d = &m->d;
    const int C = d->C;
    float *x = s->x, *a = m->s.scratch, *mo = m->s.scratch2;
    if (model_first_stage(d)) {
        embed_forward(x, &tok, m->P.wte, d->v0, d->Vl, 1, C);
        tp_allreduce_sum(x, (size_t)C, &m->tp);
        for (int c = 0; c < C; c++) x[c] += m->P.wpe[(size_t)pos * C + c];
    } else { /* a pipeline: the token's residual stream from the previous stage */
        pp_recv_prev(x, (size_t)C, PP_TAG_DECODE, m->pp_comm);
    }
    s->steps++;
    for (int l = d->l0; l < d->l1; l++) {
        const BlockActs *A = &m->cur->acts[l];
        const int routed = model_is_routed(d, l);
        if (routed) {
            router_forward(m, l, x, 1);
            /* skipped: costs nothing more, and leaves nothing in the cache */
            if (!causal_decision(d, A->r[0], d->predictor ? A->plogit[0] : 0.f)) continue;
        }
        s->processed[l]++;
        const KvCache kv = {s->k[l], s->v[l], &s->len[l], s->att};
        block_branches_forward(m, l, x, 1, 1, NULL, &kv, a, mo);
        if (routed) gated_add(x, a, mo, gate_value(d->gate, A->r[0]), C);
        else residual_forward(x, A->res2, mo, (size_t)C);
    }
    if (!model_last_stage(d)) {
        pp_send_next(x, (size_t)C, PP_TAG_DECODE, m->pp_comm);
        return NULL;
    }
    head_forward(m, x, 1);
    return m->cur->logits;
}
