/*
 * test_moe: Mixture-of-Experts blocks. Gradients of LM + moe_aux_weight *
 * load-balancing loss against finite differences (top-1, top-2, drops,
 * no-op experts, staged MoDE); the MLP branch against a double-precision
 * reference written from the documented semantics (softmax router, top-k
 * with ties to the lower column, capacity in priority order, the combine,
 * the balance loss); capacity and priority order on forced routers; no-op
 * experts keeping the residual stream bitwise; sparse compute (the experts'
 * GEMMs take the kept slots only); model_memory against what model_init
 * lays out, ep 1 and 2, under each recompute mode; one expert of the dense MLP's shape = the dense
 * model.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/kernels/kernels.h"
#include "src/model/model.h"
#include "src/model/model_impl.h"
#include "src/base/util.h"
#include "testutil.h"

enum { V = 32, T = 8, L = 2, NH = 2, C = 16, B = 2, N = B * T, FE = 8, KMAX = 2 };

static int inputs[N], targets[N];

static void make_batch(uint64_t seed) {
    for (int i = 0; i < N; i++) {
        inputs[i] = (int)(rng_u64(seed, 1, i) % V);
        targets[i] = (int)(rng_u64(seed, 2, i) % V);
    }
}

typedef struct {
    int E, Nn, k, moe_every, route_every;
    double cf;
} MoeCfg;

static void moe_dims(ModelDims *d, const MoeCfg *c, int nl) {
    model_dims(d, V, T, nl, NH, C, 1, 0);
    if (c->route_every) model_dims_mod(d, c->route_every, 0.5, GATE_RAW, 0, 4);
    model_dims_moe(d, c->E, c->Nn, c->k, FE, c->cf, c->moe_every);
}

/* A tiny MoE model with weights large enough that every path carries
 * gradient and the router's choices are spread over the columns. */
static void moe_model(Model *m, const MoeCfg *c, float scale, uint64_t seed) {
    ModelDims d;
    moe_dims(&d, c, L);
    model_init(m, &d, B, NULL);
    model_init_weights(m, seed);
    for (size_t i = 0; i < m->nparams; i++) m->params[i] += scale * (float)rng_normal(seed, 6, i);
}

/* Rows block l's MLP took in the last forward (K when routed). */
static int moe_rows(const Model *m, int l) {
    return model_is_routed(&m->d, l) ? m->cur->acts[l].off[m->cur->B] : m->cur->B * m->cur->T;
}

static long long *moe_stats(const Model *m, int l) {
    return m->stats.moe + (size_t)l * (m->d.E + m->d.Nn + 2);
}

/* ------------------------------------------------- finite differences */

enum { NDEC = L * (N + 1 + 2 * N * KMAX) };

/* Every routing decision of the last forward: the routed blocks' top-k
 * membership, the MoE blocks' rows, choices and slots. */
static size_t decisions(const Model *m, int *out) {
    size_t n = 0;
    for (int l = 0; l < m->d.L; l++) {
        const BlockActs *A = &m->cur->acts[l];
        if (model_is_routed(&m->d, l))
            for (int i = 0; i < N; i++) out[n++] = A->topk[i];
        if (!model_is_moe(&m->d, l)) continue;
        const int rows = moe_rows(m, l);
        out[n++] = rows;
        for (int s = 0; s < rows * m->d.ek; s++) {
            out[n++] = A->mch[s];
            out[n++] = A->mslot[s];
        }
    }
    return n;
}

typedef struct {
    Model *m;
    float aux_w; /* the MoD router BCE's weight */
    int dec[NDEC];
    size_t ndec;
    int moved; /* a perturbation changed a decision */
} FdCtx;

/* What model_backward differentiates: LM + aux_w * MoD BCE + moe_aux_weight *
 * (the mean over MoE blocks of their load-balancing losses). */
static double objective(void *ctx) {
    FdCtx *c = ctx;
    double lm = model_forward(c->m, inputs, targets, B, T);
    double obj = lm + c->aux_w * c->m->cur->aux_loss + c->m->moe_aux_weight * c->m->cur->moe_aux;
    int now[NDEC];
    size_t n = decisions(c->m, now);
    if (n != c->ndec || memcmp(now, c->dec, n * sizeof(int)) != 0) c->moved = 1;
    return obj;
}

static double directional(FdCtx *c, float *w, const float *dir, size_t n, float eps) {
    float *saved = xmalloc(n * 4);
    memcpy(saved, w, n * 4);
    for (size_t i = 0; i < n; i++) w[i] = saved[i] + eps * dir[i];
    double lp = objective(c);
    for (size_t i = 0; i < n; i++) w[i] = saved[i] - eps * dir[i];
    double lm = objective(c);
    memcpy(w, saved, n * 4);
    free(saved);
    return (lp - lm) / (2.0 * eps);
}

/* Whether tensor p must carry gradient: the MoE blocks' router, ln_2 and
 * attention, wte, and the tensors of every expert that took rows. */
static int must_move(const Model *m, const ParamInfo *p) {
    if (strcmp(p->name, "wte.weight") == 0) return 1;
    if (p->layer < 0 || !model_is_moe(&m->d, p->layer)) return 0;
    if (p->expert >= 0)
        return m->stats.expert_rows[(size_t)p->layer * m->d.El + p->expert - m->d.e0] > 0;
    return strstr(p->name, "mlp.router.weight") || strstr(p->name, "ln_2.") ||
           strstr(p->name, "attn.c_attn.weight") || strstr(p->name, "attn.c_proj.weight");
}

/* Each tensor's gradient g against central differences (double) of the
 * float32 objective along g (must give |g|) and along a random unit r (must
 * give g.r), as test_mod does, with the largest step of 4e-3, 2e-3 and 1e-3
 * that changes no routing decision (one must exist).
 * Returns the slots dropped and sent to no-ops in the first forward. */
static void check_gradient(const char *what, const MoeCfg *cfg, uint64_t seed, long long *dropped,
                           long long *noop) {
    Model m;
    moe_model(&m, cfg, 0.3f, seed);
    m.moe_aux_weight = 0.5f;
    make_batch(seed);
    FdCtx *ctx = xcalloc(1, sizeof *ctx);
    ctx->m = &m, ctx->aux_w = cfg->route_every ? 0.5f : 0.f;
    model_zero_grad(&m);
    model_stats_reset(&m);
    model_forward(&m, inputs, targets, B, T);
    ctx->ndec = decisions(&m, ctx->dec);
    *dropped = *noop = 0;
    for (int l = 0; l < L; l++) {
        if (!model_is_moe(&m.d, l)) continue;
        for (int e = m.d.E; e < m.d.E + m.d.Nn; e++) *noop += moe_stats(&m, l)[e];
        *dropped += moe_stats(&m, l)[m.d.E + m.d.Nn];
    }
    model_backward(&m, 1.f / N, ctx->aux_w);
    double worst = 0;
    int missing = 0, moved = 0;
    for (int i = 0; i < m.nreg; i++) {
        const ParamInfo *p = &m.reg[i];
        const float *g = m.grads + p->offset;
        float *dir = xmalloc(p->numel * 4), *rnd = xmalloc(p->numel * 4);
        double gn = 0, rn = 0, gr = 0;
        for (size_t j = 0; j < p->numel; j++) gn += (double)g[j] * g[j];
        gn = sqrt(gn);
        fill_normal(rnd, p->numel, 50 + i, 1.f);
        for (size_t j = 0; j < p->numel; j++) rn += (double)rnd[j] * rnd[j];
        for (size_t j = 0; j < p->numel; j++) {
            rnd[j] /= (float)sqrt(rn);
            dir[j] = gn > 0 ? (float)(g[j] / gn) : rnd[j];
            gr += (double)g[j] * rnd[j];
        }
        /* the largest step that changes no decision: routing is piecewise */
        double along = 0, across = 0, floor_ = 0;
        for (int t = 0; t < 3; t++) {
            const float eps = t == 0 ? 4e-3f : t == 1 ? 2e-3f : 1e-3f;
            ctx->moved = 0;
            along = directional(ctx, m.params + p->offset, dir, p->numel, eps);
            across = directional(ctx, m.params + p->offset, rnd, p->numel, eps);
            /* float32 round-off of a loss near 3.5: 3e-5 over a 2e-2 difference */
            floor_ = 3e-5 * 1e-2 / eps;
            if (!ctx->moved) break;
        }
        if (ctx->moved)
            printf("\n  %s: h.%d %s: every step changed a decision", what, p->layer, p->name);
        moved |= ctx->moved;
        double e = (worse(fabs(along - gn), fabs(across - gr)) - floor_) / fmax(gn, 1e-6);
        if (e > 1e-2)
            printf("\n  %s: h.%d %s: |g| %.4g, along g %.4g, g.r %.4g, along r %.4g", what,
                   p->layer, p->name, gn, along, gr, across);
        if (e > worst) worst = e;
        if (must_move(&m, p) && !(gn > 0)) {
            printf("\n  %s: h.%d %s has no gradient", what, p->layer, p->name);
            missing++;
        }
        free(dir);
        free(rnd);
    }
    CU_ASSERT(!moved);
    CU_ASSERT(worst < 1e-2);
    CU_ASSERT_EQUAL(missing, 0);
    free(ctx);
    model_free(&m);
}

static void test_gradient_top1(void) {
    long long dropped, noop;
    const MoeCfg both = {4, 0, 1, 1, 0, 4.0}; /* both blocks MoE: the mean over blocks */
    check_gradient("top-1", &both, 21, &dropped, &noop);
    CU_ASSERT_EQUAL(dropped, 0);
    const MoeCfg drops = {4, 0, 1, 2, 0, 0.5}; /* cap 2 of 16 rows */
    check_gradient("top-1 drops", &drops, 22, &dropped, &noop);
    CU_ASSERT(dropped > 0);
}

static void test_gradient_top2(void) {
    long long dropped, noop;
    const MoeCfg top2 = {4, 0, 2, 2, 0, 4.0};
    check_gradient("top-2", &top2, 23, &dropped, &noop);
    CU_ASSERT_EQUAL(dropped, 0);
    const MoeCfg drops = {4, 0, 2, 1, 0, 0.75};
    check_gradient("top-2 drops", &drops, 24, &dropped, &noop);
    CU_ASSERT(dropped > 0);
}

static void test_gradient_noop(void) {
    long long dropped, noop;
    const MoeCfg k1 = {4, 2, 1, 1, 0, 1.0};
    check_gradient("top-1 no-ops", &k1, 25, &dropped, &noop);
    CU_ASSERT(noop > 0);
    const MoeCfg k2 = {4, 2, 2, 1, 0, 0.75};
    check_gradient("top-2 no-ops drops", &k2, 26, &dropped, &noop);
    CU_ASSERT(noop > 0);
    CU_ASSERT(dropped > 0);
}

static void test_gradient_staged_mode(void) {
    /* block 1 routed (MoD, capacity 0.5) and MoE on its K rows; block 0 MoE */
    long long dropped, noop;
    const MoeCfg staged = {4, 1, 2, 1, 2, 1.0};
    check_gradient("staged MoDE", &staged, 27, &dropped, &noop);
    const MoeCfg staged1 = {4, 0, 1, 2, 2, 0.5};
    check_gradient("staged MoDE top-1 drops", &staged1, 28, &dropped, &noop);
    CU_ASSERT(dropped > 0);
}

/* ------------------------------------------- the reference MoE MLP */

static double gelu_ref(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

typedef struct {
    int ch[N * KMAX];   /* choices, best first */
    int kind[N * KMAX]; /* 1 kept, MOE_DROPPED, MOE_NOOP */
    double out[N * C];
    double aux;
} Ref;

/* Block l's MoE MLP on n rows u from the documented semantics, in double. */
static void ref_moe(const Model *m, int l, const float *u, int n, int capped, Ref *r) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    const int E = d->E, Et = d->E + d->Nn, k = d->ek;
    double *pr = xcalloc((size_t)n * Et, sizeof(double)), f[16] = {0}, P[16] = {0};
    for (int i = 0; i < n; i++) {
        double *z = pr + (size_t)i * Et, mx = -INFINITY, sum = 0;
        for (int e = 0; e < Et; e++) {
            for (int c = 0; c < C; c++) z[e] += (double)u[i * C + c] * p->mrw[c * Et + e];
            mx = fmax(mx, z[e]);
        }
        for (int e = 0; e < Et; e++) sum += z[e] = exp(z[e] - mx);
        for (int e = 0; e < Et; e++) z[e] /= sum, P[e] += z[e] / n;
        for (int j = 0; j < k; j++) { /* the best column not chosen yet, ties to the lower */
            int best = -1;
            for (int e = 0; e < Et; e++)
                if ((j == 0 || e != r->ch[i * k]) && (best < 0 || z[e] > z[best])) best = e;
            r->ch[i * k + j] = best;
            f[best] += 1.0 / (n * k);
        }
    }
    int cap = capped ? (int)floor(d->cf * n * k / E) : n, cnt[16] = {0};
    if (cap < 1) cap = 1;
    for (int j = 0; j < k; j++) /* every row's first choice, then every row's second */
        for (int i = 0; i < n; i++) {
            const int e = r->ch[i * k + j];
            r->kind[i * k + j] = e >= E ? MOE_NOOP : cnt[e] < cap ? (cnt[e]++, 1) : MOE_DROPPED;
        }
    memset(r->out, 0, sizeof r->out);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) {
            if (r->kind[i * k + j] != 1) continue;
            const int e = r->ch[i * k + j];
            const ExpertParams *x = &p->ex[e];
            double h[FE], y[C];
            for (int o = 0; o < FE; o++) {
                h[o] = x->fcb[o];
                for (int c = 0; c < C; c++) h[o] += (double)u[i * C + c] * x->fcw[c * FE + o];
                h[o] = gelu_ref(h[o]);
            }
            for (int c = 0; c < C; c++) {
                y[c] = x->projb[c];
                for (int o = 0; o < FE; o++) y[c] += h[o] * x->projw[o * C + c];
                r->out[i * C + c] += pr[(size_t)i * Et + e] * y[c];
            }
        }
    r->aux = 0;
    for (int e = 0; e < Et; e++) r->aux += Et * f[e] * P[e];
    free(pr);
}

/* mlp_forward of a MoE block on random rows u (row 3 zero: a tie of every
 * column) against ref_moe: the same choices, kept/dropped/no-op slots, the
 * combined output and the balance loss. */
static void check_reference(const MoeCfg *cfg, int capped, uint64_t seed) {
    Model m;
    moe_model(&m, cfg, 0.3f, seed);
    const int l = L - 1, k = cfg->k;
    float u[N * C], out[N * C];
    fill_normal(u, N * C, seed + 1, 1.f);
    memset(u + 3 * C, 0, C * sizeof(float));
    m.cur->moe_aux = 0.f;
    mlp_forward(&m, l, u, N, out, capped);
    Ref *r = xmalloc(sizeof *r);
    ref_moe(&m, l, u, N, capped, r);
    const BlockActs *A = &m.cur->acts[l];
    int same_ch = 1, same_kind = 1, kinds[3] = {0, 0, 0};
    for (int s = 0; s < N * k; s++) {
        same_ch &= A->mch[s] == r->ch[s];
        const int kind = A->mslot[s] >= 0 ? 1 : A->mslot[s];
        same_kind &= kind == r->kind[s];
        kinds[r->kind[s] == 1 ? 0 : r->kind[s] == MOE_DROPPED ? 1 : 2]++;
    }
    CU_ASSERT(same_ch);
    CU_ASSERT(same_kind);
    CU_ASSERT(A->mch[3 * k] == 0 && (k == 1 || A->mch[3 * k + 1] == 1)); /* ties */
    double e = rel_err(out, r->out, N * C);
    CU_ASSERT(e < 1e-5);
    CU_ASSERT(fabs(m.cur->moe_aux - r->aux) < 1e-5 * r->aux);
    if (!same_ch || !same_kind || e >= 1e-5 || fabs(m.cur->moe_aux - r->aux) >= 1e-5 * r->aux)
        printf("\n  E %d Nn %d k %d cf %g: choices %d, slots %d, output %.3g, aux %.6g vs %.6g",
               cfg->E, cfg->Nn, k, cfg->cf, same_ch, same_kind, e, m.cur->moe_aux, r->aux);
    /* the case covers what it says: kept slots, and drops / no-ops when asked */
    CU_ASSERT(kinds[0] > 0);
    if (!capped) CU_ASSERT_EQUAL(kinds[1], 0);
    if (capped && cfg->cf < 1.0) CU_ASSERT(kinds[1] > 0);
    CU_ASSERT((kinds[2] > 0) == (cfg->Nn > 0));
    free(r);
    model_free(&m);
}

static void test_reference(void) {
    const MoeCfg cases[] = {{4, 0, 1, 1, 0, 1.25}, {4, 0, 2, 1, 0, 0.5}, {4, 2, 2, 1, 0, 0.5},
                            {4, 2, 1, 1, 0, 0.25}, {4, 2, 2, 1, 0, 0.5}, {3, 1, 2, 1, 0, 2.0}};
    for (int i = 0; i < 6; i++) check_reference(&cases[i], i != 4, 40 + i);
}

/* ------------------------------------------------------------ capacity */

static void test_capacity_formula(void) {
    ModelDims d;
    const MoeCfg c = {4, 0, 1, 1, 0, 1.0};
    moe_dims(&d, &c, L);
    CU_ASSERT_EQUAL(model_expert_capacity(&d, 16), 4);
    CU_ASSERT_EQUAL(model_expert_capacity(&d, 7), 1); /* floor(1.75) */
    d.cf = 0.01;
    CU_ASSERT_EQUAL(model_expert_capacity(&d, 16), 1); /* never zero */
    d.cf = 1.25, d.ek = 2;
    CU_ASSERT_EQUAL(model_expert_capacity(&d, 16), 10);
    CU_ASSERT_EQUAL(model_expert_capacity(&d, 13), 8); /* floor(8.125) */
}

/* Top-1, capacity_factor 1, every row of block 1 sent to expert 0 (ln_2
 * makes u about 1 in every channel, the router's column 0 is 2, the others
 * 0): rows 0 .. cap-1 kept in row order, the rest dropped, and the dropped
 * rows keep their residual stream bitwise. */
static void test_capacity_forced_router(void) {
    Model m;
    const MoeCfg cfg = {4, 0, 1, 2, 0, 1.0};
    moe_model(&m, &cfg, 0.3f, 31);
    const int l = 1, Et = 4, cap = 4; /* floor(1 * 16 * 1 / 4) */
    BlockParams *p = &m.P.h[l];
    for (int c = 0; c < C; c++) {
        p->ln2w[c] = 0.05f, p->ln2b[c] = 1.f;
        for (int e = 0; e < Et; e++) p->mrw[c * Et + e] = e == 0 ? 2.f : 0.f;
    }
    make_batch(31);
    model_stats_reset(&m);
    model_forward(&m, inputs, targets, B, T);
    const BlockActs *A = &m.cur->acts[l];
    int ok = 1, residual = 1, moved = 1;
    for (int i = 0; i < N; i++) {
        ok &= A->mch[i] == 0 && A->mslot[i] == (i < cap ? i : MOE_DROPPED);
        int same = memcmp(A->res3 + i * C, A->res2 + i * C, C * sizeof(float)) == 0;
        if (i < cap) moved &= !same;
        else residual &= same;
    }
    CU_ASSERT(ok);
    CU_ASSERT(residual);
    CU_ASSERT(moved);
    const long long *st = moe_stats(&m, l);
    CU_ASSERT(st[0] == cap && st[1] == 0 && st[2] == 0 && st[3] == 0);
    CU_ASSERT_EQUAL(st[Et], N - cap);
    CU_ASSERT_EQUAL(st[Et + 1], N);
    CU_ASSERT_EQUAL(m.stats.expert_rows[l * 4 + 0], cap);
    for (int e = 1; e < 4; e++) CU_ASSERT_EQUAL(m.stats.expert_rows[l * 4 + e], 0);
    model_free(&m);
}

/* Top-2 priority order on crafted rows: even rows choose experts 0 then 1,
 * odd rows 1 then 0. Every first choice goes before every second choice, so
 * with cap 8 expert 0 takes the 8 even rows' first choices and no second
 * choice; with cap 12 also the second choices of odd rows 1, 3, 5, 7. A
 * row-major order (row 0's both, then row 1's ...) would keep others. */
static void test_capacity_priority_order(void) {
    for (int pass = 0; pass < 2; pass++) {
        Model m;
        const MoeCfg cfg = {4, 0, 2, 1, 0, pass ? 1.5 : 1.0};
        moe_model(&m, &cfg, 0.f, 32);
        const int l = 0, Et = 4, cap = pass ? 12 : 8, cnt0 = cap;
        CU_ASSERT_EQUAL(model_expert_capacity(&m.d, N), cap);
        for (int c = 0; c < C; c++)
            for (int e = 0; e < Et; e++) m.P.h[l].mrw[c * Et + e] = c == e ? 1.f : 0.f;
        float u[N * C];
        memset(u, 0, sizeof u);
        for (int i = 0; i < N; i++) {
            u[i * C + (i & 1)] = 4.f;
            u[i * C + !(i & 1)] = 2.f;
        }
        model_stats_reset(&m);
        moe_route(&m, l, u, N, 1);
        const BlockActs *A = &m.cur->acts[l];
        int ok = 1;
        for (int i = 0; i < N; i++) {
            const int first = i & 1, h = i / 2, keep2 = h < cap - 8;
            const int want1 = first == 0 ? h : cnt0 + h;
            const int want2 = !keep2 ? MOE_DROPPED : first == 0 ? cnt0 + 8 + h : 8 + h;
            ok &= A->mch[2 * i] == first && A->mch[2 * i + 1] == !first;
            ok &= A->mslot[2 * i] == want1 && A->mslot[2 * i + 1] == want2;
            if (A->mslot[2 * i] != want1 || A->mslot[2 * i + 1] != want2)
                printf("\n  cap %d row %d: slots %d %d, want %d %d", cap, i, A->mslot[2 * i],
                       A->mslot[2 * i + 1], want1, want2);
        }
        CU_ASSERT(ok);
        CU_ASSERT(A->mcnt[0] == cnt0 && A->mcnt[1] == cnt0 && A->mcnt[2] == 0 && A->mcnt[3] == 0);
        /* the rows sent are the rows' u, at their slots */
        int gathered = 1;
        for (int s = 0; s < 2 * N; s++)
            if (A->mslot[s] >= 0)
                gathered &= memcmp(A->mxs + A->mslot[s] * C, u + s / 2 * C, C * 4) == 0;
        CU_ASSERT(gathered);
        const long long *st = moe_stats(&m, l);
        CU_ASSERT(st[0] == cnt0 && st[1] == cnt0 && st[2] == 0 && st[3] == 0);
        CU_ASSERT_EQUAL(st[Et], 2 * N - 2 * cnt0);
        CU_ASSERT_EQUAL(st[Et + 1], 2 * N);
        model_free(&m);
    }
}

/* -------------------------------------------------------------- no-ops */

/* Every row of both MoE blocks sent to no-op experts (u = ln_2's bias, the
 * router's no-op columns far ahead): each block's output is res2 bitwise,
 * no expert takes a row or gets a gradient. */
static void test_noop_all_rows(void) {
    for (int k = 1; k <= 2; k++) {
        Model m;
        const MoeCfg cfg = {4, 2, k, 1, 0, 1.0};
        moe_model(&m, &cfg, 0.3f, 33);
        m.moe_aux_weight = 0.5f;
        const int Et = 6;
        for (int l = 0; l < L; l++)
            for (int c = 0; c < C; c++) {
                BlockParams *p = &m.P.h[l];
                p->ln2w[c] = 0.f, p->ln2b[c] = c == 0 ? 1.f : 0.f;
                for (int e = 0; e < Et; e++) p->mrw[c * Et + e] = c == 0 && e >= 4 ? 10.f - e : 0.f;
            }
        make_batch(33);
        model_stats_reset(&m);
        model_zero_grad(&m);
        float loss = model_forward(&m, inputs, targets, B, T);
        CU_ASSERT(isfinite(loss));
        for (int l = 0; l < L; l++) {
            const BlockActs *A = &m.cur->acts[l];
            CU_ASSERT(memcmp(A->res3, A->res2, (size_t)N * C * 4) == 0);
            int noop = 1;
            for (int s = 0; s < N * k; s++) noop &= A->mslot[s] == MOE_NOOP && A->mch[s] >= 4;
            CU_ASSERT(noop);
            const long long *st = moe_stats(&m, l);
            CU_ASSERT(st[4] == N && st[5] == (k == 2 ? N : 0) && st[Et] == 0);
            for (int e = 0; e < 4; e++) CU_ASSERT_EQUAL(m.stats.expert_rows[l * 4 + e], 0);
        }
        model_backward(&m, 1.f / N, 0.f);
        int zero = 1;
        for (int i = 0; i < m.nreg; i++)
            if (m.reg[i].expert >= 0)
                for (size_t j = 0; j < m.reg[i].numel; j++)
                    zero &= m.grads[m.reg[i].offset + j] == 0.f;
        CU_ASSERT(zero);
        model_free(&m);
    }
}

/* Generic weights, top-1 with 2 no-ops and room for every row: a row sent
 * to a no-op keeps res2 bitwise, a row sent to an expert does not. */
static void test_noop_some_rows(void) {
    Model m;
    const MoeCfg cfg = {4, 2, 1, 1, 0, 4.0};
    moe_model(&m, &cfg, 0.3f, 34);
    make_batch(34);
    model_forward(&m, inputs, targets, B, T);
    int noop = 0, kept = 0, bad = 0;
    for (int l = 0; l < L; l++) {
        const BlockActs *A = &m.cur->acts[l];
        for (int i = 0; i < N; i++) {
            const int same = memcmp(A->res3 + i * C, A->res2 + i * C, C * 4) == 0;
            CU_ASSERT(A->mslot[i] != MOE_DROPPED);
            if (A->mslot[i] == MOE_NOOP) noop++, bad += !same;
            else kept++, bad += same;
        }
    }
    CU_ASSERT(noop > 0 && kept > 0);
    CU_ASSERT_EQUAL(bad, 0);
    model_free(&m);
}

/* ------------------------------------------------------ sparse compute */

/* For every MoE block: each expert's GEMMs took exactly its kept slots
 * (counted from mch/mslot), the kept slots of expert e are the rows
 * [base_e, base_e + kept_e) in priority order holding the rows' u, and the
 * stats count kept, no-op, dropped and all slots. */
static void check_sparse(const MoeCfg *cfg, uint64_t seed, long long *fewer) {
    Model m;
    moe_model(&m, cfg, 0.3f, seed);
    make_batch(seed);
    model_stats_reset(&m);
    model_forward(&m, inputs, targets, B, T);
    const int E = cfg->E, Et = E + cfg->Nn, k = cfg->k;
    for (int l = 0; l < L; l++) {
        if (!model_is_moe(&m.d, l)) continue;
        const BlockActs *A = &m.cur->acts[l];
        const int n = moe_rows(&m, l);
        long long cols[16] = {0}, dropped = 0, kept = 0;
        int next[16], base = 0, ordered = 1;
        for (int s = 0; s < n * k; s++) {
            if (A->mslot[s] >= 0) cols[A->mch[s]]++;
            else if (A->mslot[s] == MOE_NOOP) cols[A->mch[s]]++, ordered &= A->mch[s] >= E;
            else dropped++, ordered &= A->mslot[s] == MOE_DROPPED && A->mch[s] < E;
        }
        for (int e = 0; e < E; e++) next[e] = base, base += (int)cols[e], kept += cols[e];
        for (int j = 0; j < k; j++) /* priority order: slot s = i*k + j */
            for (int i = 0; i < n; i++) {
                const int s = i * k + j;
                if (A->mslot[s] < 0) continue;
                ordered &= A->mslot[s] == next[A->mch[s]]++;
                ordered &=
                    memcmp(A->mxs + (size_t)A->mslot[s] * C, A->ln2 + (size_t)i * C, C * 4) == 0;
            }
        CU_ASSERT(ordered);
        for (int e = 0; e < E; e++) CU_ASSERT_EQUAL(m.stats.expert_rows[l * E + e], cols[e]);
        CU_ASSERT_EQUAL(A->nrecv, kept);
        const long long *st = moe_stats(&m, l);
        for (int e = 0; e < Et; e++) CU_ASSERT_EQUAL(st[e], cols[e]);
        CU_ASSERT_EQUAL(st[Et], dropped);
        CU_ASSERT_EQUAL(st[Et + 1], (long long)n * k);
        CU_ASSERT(kept <= (long long)n * k);
        *fewer += (long long)n * k - kept;
    }
    model_free(&m);
}

static void test_sparse_compute(void) {
    const MoeCfg cases[] = {{4, 2, 2, 1, 0, 0.5}, {4, 0, 1, 1, 0, 0.5}, {4, 1, 2, 1, 2, 0.75}};
    for (int i = 0; i < 3; i++) {
        long long fewer = 0;
        check_sparse(&cases[i], 60 + i, &fewer);
        CU_ASSERT(fewer > 0); /* drops and no-ops reached no GEMM */
    }
}

/* -------------------------------------------------------------- memory */

typedef struct {
    const void *p;
    size_t bytes;
} Buf;

static int buf_cmp(const void *a, const void *b) {
    const char *x = ((const Buf *)a)->p, *y = ((const Buf *)b)->p;
    return x < y ? -1 : x > y;
}

static void add(Buf *bufs, int *n, const void *p, size_t bytes) {
    if (p) bufs[(*n)++] = (Buf){p, bytes};
}

/* The buffers lie in [mem, mem + bytes) without overlap, each of its
 * documented size, packed (less than 64 bytes between two, and after the
 * last); returns 0 when so. */
static int packed(Buf *bufs, int n, const void *mem, size_t bytes) {
    qsort(bufs, (size_t)n, sizeof(Buf), buf_cmp);
    const char *at = mem, *end = (const char *)mem + bytes;
    for (int i = 0; i < n; i++) {
        const char *p = bufs[i].p;
        if (p < at || p - at >= 64)
            return printf("\n  buffer %d at %td, after %td", i, p - (const char *)mem,
                          at - (const char *)mem),
                   -1;
        at = p + bufs[i].bytes;
    }
    if (at > end || end - at >= 64)
        return printf("\n  last ends at %td of %zu", at - (const char *)mem, bytes), -1;
    return 0;
}

/* The activation set's buffers of model m, sized from model.h's shapes;
 * block l's are [first[l], first[l + 1]) of them. */
static int set_buffers(const Model *m, Buf *b, int *first) {
    const ModelDims *d = &m->d;
    const ActSet *s = m->cur;
    const size_t n = (size_t)m->maxB * d->maxT, F = 4, I = sizeof(int), nc = n * d->C;
    const size_t nk = n * d->ek, R = nk * d->ep;
    int k = 0;
    add(b, &k, s->acts, d->L * sizeof(BlockActs));
    add(b, &k, s->enc, nc * F), add(b, &k, s->lnf, nc * F), add(b, &k, s->lnf_mean, n * F);
    add(b, &k, s->lnf_rstd, n * F), add(b, &k, s->lmax, n * F), add(b, &k, s->lsum, n * F);
    add(b, &k, s->losses, n * F), add(b, &k, s->inputs, n * I), add(b, &k, s->targets, n * I);
    for (int l = 0; l < d->L; l++) {
        first[l] = k;
        const BlockActs *a = &s->acts[l];
        const int moe = model_is_moe(d, l), routed = model_is_routed(d, l);
        CU_ASSERT((a->mp && a->mch && a->mslot && a->mcnt && a->mxs && a->mys && a->mh && a->mhg) ==
                  moe);
        CU_ASSERT((a->mxr && a->myr) == (moe && d->ep > 1));
        CU_ASSERT((a->fch && a->fch_gelu) == !moe);
        CU_ASSERT((a->r && a->xs) == routed);
        add(b, &k, a->ln1, nc * F), add(b, &k, a->ln1_mean, n * F), add(b, &k, a->ln1_rstd, n * F);
        add(b, &k, a->qkv, 3 * nc * F), add(b, &k, a->atty, nc * F), add(b, &k, a->res2, nc * F);
        add(b, &k, a->lse, n * d->NHl * F);
        add(b, &k, a->ln2, nc * F), add(b, &k, a->ln2_mean, n * F), add(b, &k, a->ln2_rstd, n * F);
        add(b, &k, a->fch, n * d->Fl * F), add(b, &k, a->fch_gelu, n * d->Fl * F);
        add(b, &k, a->res3, nc * F), add(b, &k, a->r, n * F), add(b, &k, a->topk, n);
        add(b, &k, a->sel, n * I), add(b, &k, a->off, (m->maxB + 1) * I);
        add(b, &k, a->gate, n * F), add(b, &k, a->xs, nc * F), add(b, &k, a->a, nc * F);
        add(b, &k, a->mo, nc * F), add(b, &k, a->mp, n * (d->E + d->Nn) * F);
        add(b, &k, a->mch, nk * I), add(b, &k, a->mslot, nk * I);
        add(b, &k, a->mcnt, (d->E + d->ep * d->El + d->El + 1) * I);
        add(b, &k, a->mxs, nk * d->C * F), add(b, &k, a->mys, nk * d->C * F);
        add(b, &k, a->mxr, R * d->C * F), add(b, &k, a->myr, R * d->C * F);
        add(b, &k, a->mh, R * d->Fel * F), add(b, &k, a->mhg, R * d->Fel * F);
    }
    first[d->L] = k;
    return k;
}

/* What the set keeps of each block lies packed with its own buffers in
 * [mem, mem + set); the rest of each block packed from the start of the
 * working copy, the largest block's up to its end (work bytes). Block mode
 * keeps res3 alone, attention all but the six buffers ln1 .. atty and the
 * MLP's GELU output, none all but the GELU output (fch_gelu, or an MoE
 * block's mhg: the backward makes it again). Returns 0 when so. */
static int recompute_packed(const Model *m, Buf *bufs, size_t set, size_t work) {
    int first[64 + 1], rc = 0;
    set_buffers(m, bufs, first);
    Buf *left = xmalloc(64 * sizeof(Buf));
    const char *mem = m->cur->mem, *copy = m->work, *end = copy;
    int kept = first[0]; /* the set's own buffers come first */
    for (int l = 0; l < m->d.L; l++) {
        int n = 0;
        const int all = first[l + 1] - first[l];
        for (int i = first[l]; i < first[l + 1]; i++) {
            const char *p = bufs[i].p;
            if (p >= mem && p < mem + set) bufs[kept++] = bufs[i];
            else left[n++] = bufs[i];
        }
        const int want = m->d.recompute == RECOMPUTE_BLOCK       ? all - 1
                         : m->d.recompute == RECOMPUTE_ATTENTION ? 6 + 1
                                                                 : 1;
        if (n != want) rc = printf("\n  block %d leaves %d of %d buffers, not %d", l, n, all, want);
        qsort(left, (size_t)n, sizeof(Buf), buf_cmp);
        const char *at = copy;
        for (int i = 0; i < n; i++) {
            const char *p = left[i].p;
            if (p < at || p - at >= 64) rc = printf("\n  block %d: a gap in the working copy", l);
            at = p + left[i].bytes;
        }
        if (at > copy + work) rc = printf("\n  block %d ends past the working copy", l);
        end = at > end ? at : end;
    }
    if (copy + work - end >= 64)
        rc = printf("\n  the working copy is larger than its largest block");
    free(left);
    return rc || packed(bufs, kept, mem, set) != 0 ? -1 : 0;
}

static int scratch_buffers(const Model *m, Buf *b) {
    const ModelDims *d = &m->d;
    const Scratch *s = &m->s;
    const size_t n = (size_t)m->maxB * d->maxT, F = 4, nc = n * d->C, R = n * d->ek * d->ep;
    int k = 0;
    add(b, &k, s->dres, nc * F), add(b, &k, s->dln, nc * F), add(b, &k, s->scratch, nc * F);
    add(b, &k, s->scratch2, nc * F), add(b, &k, s->dqkv, 3 * nc * F), add(b, &k, s->datty, nc * F);
    add(b, &k, s->dfch, n * d->Fl * F), add(b, &k, s->dfchg, n * d->Fl * F);
    add(b, &k, s->rowbuf, 3 * n * F), add(b, &k, s->dr, n * F), add(b, &k, s->dph, 2 * n * F);
    add(b, &k, s->off_dense, (m->maxB + 1) * sizeof(int));
    add(b, &k, s->mdys, n * d->ek * d->C * F), add(b, &k, s->mdyr, R * d->C * F);
    add(b, &k, s->mdxr, R * d->C * F), add(b, &k, s->mdh, R * d->Fel * F);
    add(b, &k, s->mdhg, R * d->Fel * F), add(b, &k, s->mdp, n * (d->E + d->Nn) * F);
    add(b, &k, s->logits, (n < (size_t)d->head_rows ? n : (size_t)d->head_rows) * d->Vl * F);
    CU_ASSERT((s->mdys && s->mdxr && s->mdh && s->mdhg && s->mdp) == (d->E > 0));
    CU_ASSERT((s->mdyr != NULL) == (d->E > 0 && d->ep > 1));
    return k;
}

/* model_memory of an MoE model = what model_init allocated: the registry's
 * floats (the experts last, exactly this rank's [r*El, (r+1)*El)), the
 * activation set (under recompute rc: what it keeps, and the working copy)
 * and the scratch as laid out, buffer by buffer. */
static void check_memory(const MoeCfg *cfg, int nl, int ep, int r, Recompute rc) {
    ModelDims d;
    moe_dims(&d, cfg, nl);
    model_dims_ep(&d, ep, r);
    d.recompute = rc;
    Model m;
    model_init(&m, &d, B, NULL);
    ModelMemory mm, two;
    model_memory(&d, B, 1, 1, &mm);
    model_memory(&d, B, 2, 1, &two);
    const size_t set = two.acts - mm.acts; /* the rest of acts is the working copy */
    size_t floats = 0, experts = 0;
    int rows = 0, in_range = 1, last = 1;
    for (int i = 0; i < m.nreg; i++) {
        const ParamInfo *p = &m.reg[i];
        const size_t padded = (p->numel + 15) & ~(size_t)15;
        floats += padded;
        if (p->expert < 0) continue;
        experts += padded, rows++;
        in_range &=
            p->expert >= r * d.El && p->expert < (r + 1) * d.El && model_is_moe(&d, p->layer);
        last &= p->offset >= m.nparams - m.expert_floats;
    }
    CU_ASSERT_EQUAL(floats, m.nparams);
    CU_ASSERT_EQUAL(experts, m.expert_floats);
#define PAD16(x) (((size_t)(x) + 15) / 16 * 16)
    const size_t one_expert = PAD16(C * d.Fe) + PAD16(d.Fe) + PAD16(d.Fe * C) + PAD16(C);
#undef PAD16
    CU_ASSERT_EQUAL(m.expert_floats, (size_t)model_moe_blocks(&d) * d.El * one_expert);
    CU_ASSERT_EQUAL(rows, model_moe_blocks(&d) * d.El * 4);
    if (experts != m.expert_floats || rows != model_moe_blocks(&d) * d.El * 4)
        printf(
            "\n  L %d moe_every %d ep %d rank %d: expert rows %d (%zu floats), expert_floats %zu",
            nl, cfg->moe_every, ep, r, rows, experts, m.expert_floats);
    CU_ASSERT(in_range && last);
    CU_ASSERT_EQUAL(mm.params, m.nparams * sizeof(float));
    CU_ASSERT_EQUAL(mm.grads, mm.params);
    CU_ASSERT_EQUAL(mm.moments, 2 * mm.params);
    Buf *bufs = xmalloc(2048 * sizeof(Buf));
    int first[64 + 1];
    (void)first;
    CU_ASSERT(set < mm.acts); /* a working copy in every mode: the GELU outputs at least */
    CU_ASSERT_EQUAL(recompute_packed(&m, bufs, set, mm.acts - set), 0);
    CU_ASSERT_EQUAL(packed(bufs, scratch_buffers(&m, bufs), m.s.mem, mm.scratch), 0);
    CU_ASSERT_EQUAL(mm.total, mm.params * 4 + mm.acts + mm.scratch);
    /* ep 2: a rank's experts are the ep 1 model's experts of the same names */
    if (ep > 1) {
        ModelDims d1;
        moe_dims(&d1, cfg, nl);
        Model one;
        model_init(&one, &d1, 1, NULL);
        model_init_weights(&one, 8);
        model_init_weights(&m, 8);
        int same = 1;
        for (int i = 0; i < m.nreg; i++) {
            const ParamInfo *q = model_find_param(&one, m.reg[i].name), *p = &m.reg[i];
            same &= q && q->numel == p->numel &&
                    memcmp(one.params + q->offset, m.params + p->offset, p->numel * 4) == 0;
        }
        CU_ASSERT(same);
        model_free(&one);
    }
    free(bufs);
    model_free(&m);
}

static void test_memory(void) {
    const MoeCfg cases[] = {{4, 0, 1, 1, 0, 1.25}, {4, 2, 2, 2, 2, 1.0}, {4, 1, 2, 3, 2, 1.0}};
    const int layers[] = {2, 4, 4};
    for (int i = 0; i < 3; i++)
        for (Recompute rc = RECOMPUTE_NONE; rc <= RECOMPUTE_BLOCK; rc++) {
            check_memory(&cases[i], layers[i], 1, 0, rc);
            for (int r = 0; r < 2; r++) check_memory(&cases[i], layers[i], 2, r, rc);
        }
}

/* ---------------------------------------------- one expert = the dense MLP */

/* E 1, top-1, the dense MLP's width and room for every row: the router's
 * softmax of one column is 1, so each MoE block is the dense block with the
 * expert's weights, bitwise in forward; the gradients agree too. */
static void test_one_expert_is_dense(void) {
    Model dense, moe;
    ModelDims d;
    model_dims(&d, V, T, L, NH, C, 1, 0);
    model_init(&dense, &d, B, NULL);
    model_init_weights(&dense, 5);
    for (size_t i = 0; i < dense.nparams; i++) dense.params[i] += 0.3f * (float)rng_normal(5, 6, i);
    model_dims_moe(&d, 1, 0, 1, 0, 1.0, 1);
    model_init(&moe, &d, B, NULL);
    moe.moe_aux_weight = 0.5f;
    const ParamInfo *pairs[64][2];
    int np = 0;
    for (int i = 0; i < moe.nreg; i++) {
        char name[64];
        const ParamInfo *p = &moe.reg[i];
        const char *ex = strstr(p->name, "experts.0.");
        if (ex) snprintf(name, sizeof name, "%.*s%s", (int)(ex - p->name), p->name, ex + 10);
        else snprintf(name, sizeof name, "%s", p->name);
        const ParamInfo *q = model_find_param(&dense, name);
        if (!q) { /* the router: any weights, its one column's probability is 1 */
            CU_ASSERT(strstr(p->name, "mlp.router.weight") != NULL);
            fill_normal(moe.params + p->offset, p->numel, 9, 1.f);
            continue;
        }
        CU_ASSERT_EQUAL_FATAL(q->numel, p->numel);
        memcpy(moe.params + p->offset, dense.params + q->offset, p->numel * 4);
        pairs[np][0] = p, pairs[np][1] = q, np++;
    }
    CU_ASSERT_EQUAL(np, dense.nreg);
    make_batch(35);
    model_zero_grad(&dense);
    model_zero_grad(&moe);
    float a = model_forward(&dense, inputs, targets, B, T);
    float b = model_forward(&moe, inputs, targets, B, T);
    CU_ASSERT_EQUAL(a, b);
    for (int l = 0; l < L; l++)
        CU_ASSERT(memcmp(dense.cur->acts[l].res3, moe.cur->acts[l].res3, (size_t)N * C * 4) == 0);
    CU_ASSERT(fabs(moe.cur->moe_aux - 1.f) < 1e-6); /* Et f P = 1 * 1 * 1 */
    model_backward(&dense, 1.f / N, 0.f);
    model_backward(&moe, 1.f / N, 0.f);
    double worst = 0;
    for (int i = 0; i < np; i++) {
        double *ref = xmalloc(pairs[i][1]->numel * sizeof(double));
        for (size_t j = 0; j < pairs[i][1]->numel; j++)
            ref[j] = dense.grads[pairs[i][1]->offset + j];
        worst = worse(worst, rel_err(moe.grads + pairs[i][0]->offset, ref, pairs[i][1]->numel));
        free(ref);
    }
    CU_ASSERT(worst < 1e-6);
    if (worst >= 1e-6) printf("\n  gradients differ by %g", worst);
    model_free(&dense);
    model_free(&moe);
}

int main(void) {
    test_threads_lock();
    kernels_init(2, "auto");
    CU_TestInfo tests[] = {
        {"gradient = finite differences (top-1; drops)", test_gradient_top1},
        {"gradient = finite differences (top-2; drops)", test_gradient_top2},
        {"gradient = finite differences (no-op experts)", test_gradient_noop},
        {"gradient = finite differences (staged MoDE)", test_gradient_staged_mode},
        {"MoE MLP = double reference (choices, ties, slots, output, aux)", test_reference},
        {"capacity = max(1, floor(cf N k / E))", test_capacity_formula},
        {"router forced to one expert: rows beyond cap dropped, in row order",
         test_capacity_forced_router},
        {"top-2 slots in priority order: first choices before second",
         test_capacity_priority_order},
        {"every row to a no-op: block output = res2 bitwise", test_noop_all_rows},
        {"rows sent to a no-op keep res2 bitwise", test_noop_some_rows},
        {"experts' GEMMs take the kept slots only; stats count them", test_sparse_compute},
        {"model_memory = what model_init lays out (ep 1 and 2)", test_memory},
        {"one expert of the dense MLP's shape = the dense model", test_one_expert_is_dense},
        CU_TEST_INFO_NULL};
    return run_suite("moe", tests);
}
