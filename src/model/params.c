/*
 * params: the parameter registry (every tensor's name, shape, offset, how
 * it splits over tp and how it is initialised), pointing the parameter and
 * gradient structs into their buffers, the initial weights, the gradients'
 * sums of squares in a fixed order, and the embedding's sparse gradient
 * rows.
 */
#include "src/model/model_impl.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "src/kernels/kernels.h"
#include "src/kernels/kernels_impl.h"
#include "src/base/rng.h"
#include "src/base/util.h"

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
    for (int b = 0; b < blocks && split_dim >= 0; b++)
        p->block_w[b] = (split_dim ? d1 : d0) / blocks;
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
    /* llama: gate|up in one matrix (its two halves split over tp apart), no biases */
    const int gu = d->arch == ARCH_LLAMA ? 2 : 1, bias = d->arch == ARCH_GPT2;
    char n[48];
#define EXP(f) offsetof(ExpertParams, f)
    for (int l = model_next_held(d, 0); l < d->L; l = model_next_held(d, l + 1)) {
        if (!model_is_moe(d, l)) continue;
        /* measured: one expert's rows stand for all El (the planner measures
         * thousands of stages, and n_expert goes to 4096) */
        const int n_ex = rb->measure && d->El > 0 ? 1 : d->El;
        const size_t before = rb->m->nparams;
        for (int e = d->e0; e < d->e0 + n_ex; e++) {
            /* each row's expert is set before the next reg_add, which may
             * move the registry (xrealloc) */
            snprintf(n, sizeof n, "mlp.experts.%d.c_fc.weight", e);
            reg_add(rb, l, EXP(fcw), n, 2, C, gu * F, 1, gu, INIT_NORMAL)->expert = e;
            if (bias) {
                snprintf(n, sizeof n, "mlp.experts.%d.c_fc.bias", e);
                reg_add(rb, l, EXP(fcb), n, 1, F, 0, 0, 1, INIT_ZERO)->expert = e;
            }
            snprintf(n, sizeof n, "mlp.experts.%d.c_proj.weight", e);
            reg_add(rb, l, EXP(projw), n, 2, F, C, 0, 1, INIT_RESID)->expert = e;
            if (bias) {
                snprintf(n, sizeof n, "mlp.experts.%d.c_proj.bias", e);
                reg_add(rb, l, EXP(projb), n, 1, C, 0, -1, 1, INIT_ZERO)->expert = e;
            }
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
     * and, tied, on the last (the head) */
    const int llama = d->arch == ARCH_LLAMA, gu = llama ? 2 : 1;
    if (model_first_stage(d) || (d->tied && model_last_stage(d))) {
        ParamInfo *wte = reg_add(&rb, -1, TOP(wte), "wte.weight", 2, d->Vp, C, 0, 1, INIT_NORMAL);
        wte->tied = d->tied;
        wte->vocab_rows = d->V;
    }
    if (model_first_stage(d) && !llama)
        reg_add(&rb, -1, TOP(wpe), "wpe.weight", 2, d->maxT, C, -1, 1, INIT_NORMAL);
    for (int l = model_next_held(d, 0); l < d->L; l = model_next_held(d, l + 1)) {
        reg_add(&rb, l, BLK(ln1w), "ln_1.weight", 1, C, 0, -1, 1, INIT_ONE);
        if (!llama) reg_add(&rb, l, BLK(ln1b), "ln_1.bias", 1, C, 0, -1, 1, INIT_ZERO);
        /* q, k and v split over tp apart: q of NH heads, k and v of KV */
        ParamInfo *qkv = reg_add(&rb, l, BLK(qkvw), "attn.c_attn.weight", 2, C,
                                 (d->NH + 2 * d->KV) * d->hs, 1, 3, INIT_NORMAL);
        qkv->block_w[0] = d->NH * d->hs;
        qkv->block_w[1] = qkv->block_w[2] = d->KV * d->hs;
        if (!llama) reg_add(&rb, l, BLK(qkvb), "attn.c_attn.bias", 1, 3 * C, 0, 0, 3, INIT_ZERO);
        reg_add(&rb, l, BLK(attprojw), "attn.c_proj.weight", 2, C, C, 0, 1, INIT_RESID);
        if (!llama) reg_add(&rb, l, BLK(attprojb), "attn.c_proj.bias", 1, C, 0, -1, 1, INIT_ZERO);
        reg_add(&rb, l, BLK(ln2w), "ln_2.weight", 1, C, 0, -1, 1, INIT_ONE);
        if (!llama) reg_add(&rb, l, BLK(ln2b), "ln_2.bias", 1, C, 0, -1, 1, INIT_ZERO);
        if (model_is_moe(d, l)) { /* the experts come last (expert_rows) */
            reg_add(&rb, l, BLK(mrw), "mlp.router.weight", 2, C, d->E + d->Nn, -1, 1, INIT_NORMAL);
        } else { /* llama: gate|up in one matrix, its halves split over tp apart */
            reg_add(&rb, l, BLK(fcw), "mlp.c_fc.weight", 2, C, gu * d->F, 1, gu, INIT_NORMAL);
            if (!llama) reg_add(&rb, l, BLK(fcb), "mlp.c_fc.bias", 1, d->F, 0, 0, 1, INIT_ZERO);
            reg_add(&rb, l, BLK(fcprojw), "mlp.c_proj.weight", 2, d->F, C, 0, 1, INIT_RESID);
            if (!llama) reg_add(&rb, l, BLK(fcprojb), "mlp.c_proj.bias", 1, C, 0, -1, 1, INIT_ZERO);
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
        if (!llama) reg_add(&rb, -1, TOP(lnfb), "ln_f.bias", 1, C, 0, -1, 1, INIT_ZERO);
        if (!d->tied)
            reg_add(&rb, -1, TOP(lmw), "lm_head.weight", 2, d->Vp, C, 0, 1, INIT_NORMAL)
                ->vocab_rows = d->V;
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

int param_is_routing(const char *name) {
    return strstr(name, ".router.") || strstr(name, ".predictor.");
}

const ParamInfo *model_tied_param(const Model *m) {
    for (int i = 0; i < m->nreg; i++)
        if (m->reg[i].tied) return &m->reg[i];
    return NULL;
}

const ParamInfo *model_embed_param(const Model *m) {
    return model_first_stage(&m->d) ? model_find_param(m, "wte.weight") : NULL;
}

const ParamInfo *model_head_param(const Model *m) {
    if (!model_last_stage(&m->d)) return NULL;
    return model_find_param(m, m->d.tied ? "wte.weight" : "lm_head.weight");
}

size_t param_global_index(const ParamInfo *p, int tp, int tp_rank, size_t i) {
    size_t r = i / (size_t)p->lshape[1], c = i % (size_t)p->lshape[1];
    if (p->split_dim >= 0) {
        size_t *x = p->split_dim == 0 ? &r : &c;
        long g0 = 0, l0 = 0, lw = 0;
        for (int b = 0; b < p->split_blocks; b++) { /* the block local x falls in */
            param_block(p, b, tp, &g0, &l0, &lw);
            if (*x < (size_t)(l0 + lw)) break;
        }
        *x = (size_t)g0 + (size_t)tp_rank * (size_t)lw + (*x - (size_t)l0);
    }
    return r * (size_t)p->shape[1] + c;
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
