/*
 * test_mod: Mixture-of-Depths. Gradients through routed blocks (router and
 * predictor included) against finite differences; capacity 1 reproducing a
 * dense block; top-k selection; batch invariance; no leak under causal
 * routing; incremental decoding with the sparse KV cache against a full
 * forward (GPT-2's blocks and Llama's); the predictor leaving the LM
 * gradients alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/kernels/kernels.h"
#include "src/model/model.h"
#include "src/base/rng.h"
#include "src/base/util.h"
#include "testutil.h"

enum { V = 13, T = 16, L = 4, NH = 2, C = 8, B = 2, H = 6 };

static int inputs[4 * T], targets[4 * T];

static void make_batch(uint64_t seed) {
    for (int i = 0; i < 4 * T; i++) {
        inputs[i] = (int)(rng_u64(seed, 1, i) % V);
        targets[i] = (int)(rng_u64(seed, 2, i) % V);
    }
}

/* A MoD model (blocks 1 and 3 routed) with weights large enough that every
 * path carries gradient and router scores are well separated. */
static void mod_model_arch(Model *m, int maxB, double capacity, RouterGate gate, int predictor,
                           float scale, Arch arch) {
    ModelDims d;
    model_dims(&d, V, T, L, NH, C, 1, 0);
    /* llama: multi-query (one kv head), a small rotary base turning far */
    if (arch == ARCH_LLAMA) model_dims_arch(&d, ARCH_LLAMA, 1, 3 * C, 1e-5, 100.0, 0);
    model_dims_mod(&d, 2, capacity, gate, predictor, H);
    model_init(m, &d, maxB, NULL);
    model_init_weights(m, 99);
    for (size_t i = 0; i < m->nparams; i++) m->params[i] += scale * (float)rng_normal(6, 6, i);
}

static void mod_model(Model *m, int maxB, double capacity, RouterGate gate, int predictor,
                      float scale) {
    mod_model_arch(m, maxB, capacity, gate, predictor, scale, ARCH_GPT2);
}

typedef struct {
    Model *m;
    float aux_weight;
} LossCtx;

/* The loss whose gradient model_backward computes: LM + aux_weight * router
 * BCE (aux_loss) or LM + predictor BCE (predictor). */
static double total_loss(void *ctx) {
    LossCtx *c = ctx;
    float lm = model_forward(c->m, inputs, targets, B, T);
    return lm + (c->m->d.predictor ? 0.f : c->aux_weight * c->m->cur->aux_loss);
}

/* The predictor's own BCE: all that its weights see. */
static double predictor_loss(void *ctx) {
    LossCtx *c = ctx;
    model_forward(c->m, inputs, targets, B, T);
    return c->m->cur->pred_loss;
}

/* Derivative of f along the unit vector dir by central differences. */
static double directional(double (*f)(void *), void *ctx, float *w, const float *dir, size_t n,
                          float eps) {
    float *saved = xmalloc(n * 4);
    memcpy(saved, w, n * 4);
    for (size_t i = 0; i < n; i++) w[i] = saved[i] + eps * dir[i];
    double lp = f(ctx);
    for (size_t i = 0; i < n; i++) w[i] = saved[i] - eps * dir[i];
    double lm = f(ctx);
    memcpy(w, saved, n * 4);
    free(saved);
    return (lp - lm) / (2.0 * eps);
}

/* Each tensor's analytic gradient g against finite differences along g
 * itself (must give |g|) and along a random direction r (must give g.r).
 * Whole-tensor directions keep float32 round-off small against the signal;
 * a wrong gradient misses by O(|g|). Tolerance: 1% of |g| + 3e-5. */
static void check_gradient(RouterGate gate, int predictor) {
    Model m;
    mod_model(&m, B, 0.25, gate, predictor, 0.3f);
    make_batch(3);
    LossCtx ctx = {&m, 0.5f};
    model_zero_grad(&m);
    total_loss(&ctx);
    unsigned char sel0[2][B * T];
    memcpy(sel0[0], m.cur->acts[1].topk, sizeof sel0[0]);
    memcpy(sel0[1], m.cur->acts[3].topk, sizeof sel0[1]);
    model_backward(&m, 1.f / (B * T), ctx.aux_weight);
    double worst = 0;
    int router_nonzero = 0, moved = 0;
    for (int i = 0; i < m.nreg; i++) {
        const ParamInfo *p = &m.reg[i];
        const float *g = m.grads + p->offset;
        float *w = m.params + p->offset;
        double (*f)(void *) = strstr(p->name, "predictor") ? predictor_loss : total_loss;
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
        double along = directional(f, &ctx, w, dir, p->numel, 1e-2f);
        double across = directional(f, &ctx, w, rnd, p->numel, 1e-2f);
        moved |= memcmp(sel0[0], m.cur->acts[1].topk, sizeof sel0[0]) != 0 ||
                 memcmp(sel0[1], m.cur->acts[3].topk, sizeof sel0[1]) != 0;
        /* 3e-5: float32 round-off of a loss near 2.5 over a 2e-2 difference */
        double e = (worse(fabs(along - gn), fabs(across - gr)) - 3e-5) / fmax(gn, 1e-6);
        if (e > 1e-2)
            printf("\n  %s: |g| %.4g, along g %.4g, g.r %.4g, along r %.4g", p->name, gn, along,
                   gr, across);
        if (e > worst) worst = e;
        if (strstr(p->name, "router.weight")) router_nonzero += gn > 0;
        free(dir);
        free(rnd);
    }
    CU_ASSERT(!moved); /* no perturbation changed the top-k selection */
    CU_ASSERT(worst < 1e-2);
    CU_ASSERT(router_nonzero == 2); /* the gate puts both routers on the gradient path */
    model_free(&m);
}

static void test_gradient_raw_aux(void) { check_gradient(GATE_RAW, 0); }
static void test_gradient_sigmoid_predictor(void) { check_gradient(GATE_SIGMOID, 1); }

static void test_capacity_one_is_dense(void) {
    Model dense, mod;
    ModelDims d;
    model_dims(&d, V, T, L, NH, C, 1, 0);
    model_init(&dense, &d, B, NULL);
    model_init_weights(&dense, 5);
    mod_model(&mod, B, 1.0, GATE_RAW, 0, 0.f);
    model_init_weights(&mod, 5); /* same names, same seed: same weights */
    for (int l = 1; l < L; l += 2) {
        memset(mod.P.h[l].rw, 0, C * sizeof(float));
        mod.P.h[l].rb[0] = 1.f;
    }
    make_batch(4);
    float a = model_forward(&dense, inputs, targets, B, T);
    float b = model_forward(&mod, inputs, targets, B, T);
    CU_ASSERT_EQUAL(a, b);
    for (int l = 0; l < L; l++)
        CU_ASSERT(memcmp(dense.cur->acts[l].res3, mod.cur->acts[l].res3, (size_t)B * T * C * 4) ==
                  0);
    model_free(&dense);
    model_free(&mod);
}

static void test_topk_selection(void) {
    ModelDims d;
    model_dims(&d, V, T, L, NH, C, 1, 0);
    model_dims_mod(&d, 2, 0.125, GATE_RAW, 0, H);
    CU_ASSERT_EQUAL(model_capacity_k(&d, 256), 32);
    CU_ASSERT_EQUAL(model_capacity_k(&d, 7), 1);  /* round(0.875) */
    CU_ASSERT_EQUAL(model_capacity_k(&d, 12), 2); /* round(1.5), half away from zero */
    CU_ASSERT_EQUAL(model_capacity_k(&d, 1), 1);
    d.capacity = 0.001;
    CU_ASSERT_EQUAL(model_capacity_k(&d, 100), 1); /* never zero */
    d.capacity = 0.5;
    CU_ASSERT_EQUAL(model_capacity_k(&d, 13), 7); /* round(6.5) */
    unsigned char mem[8];
    float tied[8] = {1, 3, 3, 0, 3, 3, 2, 3};
    model_topk(mem, tied, 8, 3);
    const unsigned char want[8] = {0, 1, 1, 0, 1, 0, 0, 0}; /* ties to the lower position */
    CU_ASSERT(memcmp(mem, want, 8) == 0);
    float flat[5] = {0, 0, 0, 0, 0};
    model_topk(mem, flat, 5, 2);
    CU_ASSERT(mem[0] && mem[1] && !mem[2] && !mem[3] && !mem[4]);
    float neg[4] = {-5, -1, -3, -2};
    model_topk(mem, neg, 4, 1);
    CU_ASSERT(!mem[0] && mem[1] && !mem[2] && !mem[3]);
    /* the selection against the obvious rule (a position is chosen when
     * fewer than k positions beat it: larger, or equal and earlier), on
     * random scores with many ties, every k from 1 to T */
    {
        enum { TT = 97 };
        float rr[TT];
        unsigned char got[TT];
        const uint64_t st = 12345;
        int bad = 0;
        for (int round = 0; round < 20; round++) {
            for (int t = 0; t < TT; t++) rr[t] = (float)(rng_u64(st, (uint64_t)round, (uint64_t)t) % (round % 2 ? 7 : 1000)) - 3.f;
            for (int kk = 1; kk <= TT; kk++) {
                model_topk(got, rr, TT, kk);
                for (int t = 0; t < TT; t++) {
                    int beats = 0;
                    for (int u = 0; u < TT; u++) beats += rr[u] > rr[t] || (rr[u] == rr[t] && u < t);
                    bad += got[t] != (beats < kk);
                }
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
    }

    /* in the model: k per sequence, positions ascending, offsets per sequence */
    Model m;
    mod_model(&m, B, 0.3, GATE_RAW, 0, 0.3f);
    make_batch(8);
    model_forward(&m, inputs, targets, B, T);
    const BlockActs *a = &m.cur->acts[1];
    int k = model_capacity_k(&m.d, T);
    for (int b = 0; b < B; b++) {
        CU_ASSERT_EQUAL(a->off[b + 1] - a->off[b], k);
        for (int i = a->off[b]; i < a->off[b + 1]; i++) {
            CU_ASSERT(a->sel[i] / T == b); /* batch offsets in place */
            if (i > a->off[b]) CU_ASSERT(a->sel[i] > a->sel[i - 1]);
            CU_ASSERT(a->topk[a->sel[i]]);
        }
    }
    model_free(&m);
}

static double max_diff(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) w = worse(w, fabs((double)a[i] - b[i]));
    return w;
}

/* The logits of the current set's first n rows (malloc'd), made a chunk
 * of rows at a time as the head makes them. */
static float *logits_of(Model *m, int n) {
    float *out = xmalloc((size_t)n * m->d.Vl * 4);
    for (int r = 0; r < n; r += m->d.head_rows) {
        const int k = n - r < m->d.head_rows ? n - r : m->d.head_rows;
        memcpy(out + (size_t)r * m->d.Vl, model_logits(m, r, k), (size_t)k * m->d.Vl * 4);
    }
    return out;
}

static void test_batch_invariance(void) {
    /* sequence 0's logits alone and among three others */
    for (int mode = 0; mode < 2; mode++) {
        Model m;
        mod_model(&m, 4, 0.25, GATE_RAW, 0, 0.3f);
        m.route = mode;
        make_batch(11);
        model_forward(&m, inputs, NULL, 1, T);
        float *alone = logits_of(&m, T);
        model_forward(&m, inputs, NULL, 4, T);
        float *among = logits_of(&m, T);
        double w = max_diff(alone, among, (size_t)T * V);
        CU_ASSERT(w < 1e-5);
        if (w >= 1e-5) printf("\n  batch invariance (mode %d): %g", mode, w);
        free(alone);
        free(among);
        model_free(&m);
    }
}

/* Shifts each routed block's decision logit (router or predictor) so that
 * about half of the tokens of the current batch go through it under causal
 * routing: a test of causal routing needs both kinds of token. */
static void center_routers(Model *m) {
    for (int l = 1; l < L; l += 2) {
        model_forward(m, inputs, NULL, 1, T);
        const float *z = m->d.predictor ? m->cur->acts[l].plogit : m->cur->acts[l].r;
        float *bias = m->d.predictor ? m->P.h[l].pb2 : m->P.h[l].rb;
        float sorted[T];
        memcpy(sorted, z, sizeof sorted);
        for (int i = 1; i < T; i++) /* insertion sort for the median */
            for (int j = i; j > 0 && sorted[j] < sorted[j - 1]; j--) {
                float t = sorted[j];
                sorted[j] = sorted[j - 1];
                sorted[j - 1] = t;
            }
        bias[0] -= 0.5f * (sorted[T / 2 - 1] + sorted[T / 2]);
    }
    model_stats_reset(m);
}

static void test_no_leak_under_causal_routing(void) {
    for (int pred = 0; pred < 2; pred++) {
        Model m;
        mod_model(&m, 1, 0.25, GATE_RAW, pred, 0.3f);
        m.route = ROUTE_CAUSAL;
        make_batch(12);
        center_routers(&m);
        const int t = 9;
        model_forward(&m, inputs, NULL, 1, T);
        float *before = logits_of(&m, T);
        long long processed = m.stats.processed[1];
        for (int i = t + 1; i < T; i++) inputs[i] = (inputs[i] + 5) % V;
        model_forward(&m, inputs, NULL, 1, T);
        float *after = logits_of(&m, T);
        double w = max_diff(before, after, (size_t)(t + 1) * V);
        CU_ASSERT(w < 1e-5);
        /* the future did change */
        CU_ASSERT(max_diff(before, after, (size_t)T * V) > 1e-3);
        CU_ASSERT(processed > 0 && processed < T); /* routing chose some tokens, not all */
        if (w >= 1e-5 || processed <= 0 || processed >= T)
            printf("\n  predictor %d: past changed by %g, block 1 processed %lld of %d", pred, w,
                   processed, T);
        free(before);
        free(after);
        model_free(&m);
    }
}

/* Llama's too: the cache holds the kv heads' keys turned to each token's
 * own position, which a routed token keeps. */
static void test_decode_matches_full_forward(void) {
    for (int k = 0; k < 4; k++) {
        const int pred = k % 2;
        Model m;
        mod_model_arch(&m, 1, 0.25, GATE_SIGMOID, pred, 0.3f, k < 2 ? ARCH_GPT2 : ARCH_LLAMA);
        m.route = ROUTE_CAUSAL;
        make_batch(13);
        center_routers(&m);
        model_stats_reset(&m);
        model_forward(&m, inputs, NULL, 1, T);
        float *full = logits_of(&m, T);
        long long full_processed = m.stats.processed[1] + m.stats.processed[3];
        DecodeState s;
        decode_init(&s, &m);
        double w = 0;
        for (int t = 0; t < T; t++) {
            const float *lg = decode_step(&m, &s, inputs[t], t);
            w = worse(w, max_diff(lg, full + (size_t)t * V, V));
        }
        CU_ASSERT(w < 1e-4);
        if (w >= 1e-4) printf("\n  decode vs full (predictor %d, arch %d): %g", pred, k / 2, w);
        /* the caches hold exactly the tokens that went through each block */
        CU_ASSERT_EQUAL(s.len[0], T);
        CU_ASSERT_EQUAL((long long)s.len[1] + s.len[3], full_processed);
        CU_ASSERT_EQUAL(s.len[1], s.processed[1]);
        CU_ASSERT(s.len[1] > 0 && s.len[1] < T); /* some tokens skipped block 1, some not */
        decode_free(&s, &m);
        free(full);
        model_free(&m);
    }
}

static void test_predictor_leaves_lm_gradients(void) {
    Model m;
    mod_model(&m, B, 0.25, GATE_RAW, 1, 0.3f);
    make_batch(14);
    float *g[2];
    for (int on = 0; on < 2; on++) {
        m.predictor_on = on;
        model_zero_grad(&m);
        model_forward(&m, inputs, targets, B, T);
        model_backward(&m, 1.f / (B * T), 0.5f);
        g[on] = xmalloc(m.nparams * 4);
        memcpy(g[on], m.grads, m.nparams * 4);
    }
    int lm_same = 1, pred_moved = 0;
    for (int i = 0; i < m.nreg; i++) {
        const ParamInfo *p = &m.reg[i];
        int is_pred = strstr(p->name, "predictor") != NULL;
        for (size_t j = 0; j < p->numel; j++) {
            size_t k = p->offset + j;
            if (is_pred) pred_moved += g[1][k] != 0.f;
            else lm_same &= memcmp(&g[0][k], &g[1][k], 4) == 0;
        }
    }
    CU_ASSERT(lm_same);
    CU_ASSERT(pred_moved > 0);
    free(g[0]);
    free(g[1]);
    model_free(&m);
}

int main(void) {
    test_threads_lock();
    kernels_init(2, "auto");
    CU_TestInfo tests[] = {
        {"gradient = finite differences (raw gate, router BCE)", test_gradient_raw_aux},
        {"gradient = finite differences (sigmoid gate, predictor)", test_gradient_sigmoid_predictor},
        {"capacity 1, router 0 and bias 1 = the dense block, bitwise", test_capacity_one_is_dense},
        {"top-k: ties, order, k for odd T and tiny capacities", test_topk_selection},
        {"a sequence's logits do not depend on its batch", test_batch_invariance},
        {"causal routing does not leak the future", test_no_leak_under_causal_routing},
        {"sparse-KV decoding = full causal-routing forward", test_decode_matches_full_forward},
        {"the predictor leaves the LM gradients unchanged", test_predictor_leaves_lm_gradients},
        CU_TEST_INFO_NULL};
    return run_suite("mod", tests);
}
