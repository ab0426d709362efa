/*
 * test_recompute: activation recomputation. Under recompute = attention and
 * block, training (two activation sets in flight, forwards then backwards
 * in reverse, AdamW) gives the losses, gradients, weights and routing
 * statistics of recompute = none bit for bit, for dense, MoD (the router's
 * BCE, the predictor), MoE (top-2, drops, no-op experts) and staged MoDE
 * models; forwards without a backward (evaluation, causal routing) too. The
 * sets keep less, mode by mode, and what they leave lies in one working
 * copy that every set shares.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/kernels/kernels.h"
#include "src/model/model.h"
#include "src/model/optim.h"
#include "src/base/util.h"
#include "testutil.h"

enum { V = 32, T = 8, L = 4, NH = 2, C = 16, B = 2, N = B * T, FE = 8, STEPS = 3, SETS = 2 };

typedef struct {
    const char *name;
    int route_every, predictor, E, Nn, k, moe_every;
    RouterGate gate;
    double cf;
} Kind;

static const Kind kinds[] = {
    {"dense", 0, 0, 0, 0, 1, 1, GATE_RAW, 1.0},
    {"MoD, router BCE", 2, 0, 0, 0, 1, 1, GATE_RAW, 1.0},
    {"MoD, predictor", 2, 1, 0, 0, 1, 1, GATE_SIGMOID, 1.0},
    {"MoE, top-2 with drops", 0, 0, 4, 0, 2, 1, GATE_RAW, 1.0},
    {"staged MoDE, no-op experts", 2, 0, 4, 1, 1, 1, GATE_RAW, 1.25},
    {"dense, routed, MoE blocks", 2, 1, 4, 0, 2, 3, GATE_RAW, 1.0},
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

static void kind_dims(ModelDims *d, const Kind *k, Recompute rc) {
    model_dims(d, V, T, L, NH, C, 1, 0);
    if (k->route_every) model_dims_mod(d, k->route_every, 0.5, k->gate, k->predictor, 4);
    if (k->E) model_dims_moe(d, k->E, k->Nn, k->k, FE, k->cf, k->moe_every);
    d->recompute = rc;
}

/* Everything a run shows: per step and set the losses, per step the
 * gradients; at the end the weights, the routing statistics, and the logits
 * of forwards without targets (top-k, then causal routing). */
typedef struct {
    float *loss;  /* (STEPS, SETS, 7): LM, aux, pred, moe_aux; the last three after backward */
    float *grads; /* (STEPS, nparams) */
    float *params, *logits;
    double *stats;
    long long *expert_rows;
    size_t nparams;
    int nstats, nexpert;
} Trace;

static void make_batch(int *in, int *tg, uint64_t seed) {
    for (int i = 0; i < N; i++) {
        in[i] = (int)(rng_u64(seed, 1, i) % V);
        tg[i] = (int)(rng_u64(seed, 2, i) % V);
    }
}

static void trace(const Kind *k, Recompute rc, Trace *t) {
    ModelDims d;
    kind_dims(&d, k, rc);
    Model m;
    model_init(&m, &d, B, NULL);
    model_set_slots(&m, SETS);
    model_init_weights(&m, 21);
    /* larger than GPT-2's weights: every path carries gradient, routing spreads */
    for (size_t i = 0; i < m.nparams; i++) m.params[i] += 0.3f * (float)rng_normal(21, 6, i);
    m.moe_aux_weight = 0.5f;
    AdamW opt;
    adamw_init(&opt, &m);
    memset(t, 0, sizeof *t);
    t->nparams = m.nparams;
    t->loss = xcalloc(STEPS * SETS * 7, sizeof(float));
    t->grads = xmalloc(STEPS * m.nparams * sizeof(float));
    int in[SETS][N], tg[SETS][N];
    for (int s = 0; s < STEPS; s++) {
        model_zero_grad(&m);
        for (int j = 0; j < SETS; j++) { /* the pipeline's way: every forward first */
            make_batch(in[j], tg[j], 100 + 10 * s + j);
            model_use_slot(&m, j);
            float *o = t->loss + (s * SETS + j) * 7;
            o[0] = model_forward(&m, in[j], tg[j], B, T);
            o[1] = m.cur->aux_loss, o[2] = m.cur->pred_loss, o[3] = m.cur->moe_aux;
        }
        for (int j = SETS - 1; j >= 0; j--) {
            model_use_slot(&m, j);
            model_backward(&m, 1.f / (SETS * N), 0.5f);
            float *o = t->loss + (s * SETS + j) * 7 + 4; /* what train reports */
            o[0] = m.cur->aux_loss, o[1] = m.cur->pred_loss, o[2] = m.cur->moe_aux;
        }
        memcpy(t->grads + s * m.nparams, m.grads, m.nparams * sizeof(float));
        adamw_step(&opt, &m, 1e-2, 0.9, 0.95, 1e-8, 0.1, s + 1, 1.f);
    }
    t->params = xmalloc(m.nparams * sizeof(float));
    memcpy(t->params, m.params, m.nparams * sizeof(float));
    t->nstats = route_stats_len(&d);
    t->stats = xmalloc((size_t)t->nstats * sizeof(double));
    route_stats_to_vec(&m.stats, &d, t->stats);
    t->nexpert = L * d.El + 1;
    t->expert_rows = xmalloc((size_t)t->nexpert * sizeof(long long));
    memcpy(t->expert_rows, m.stats.expert_rows, (size_t)t->nexpert * sizeof(long long));
    /* evaluation and sampling never backward: their forwards alone */
    t->logits = xmalloc(2 * (size_t)N * d.Vl * sizeof(float));
    model_use_slot(&m, 0);
    for (int r = 0; r < 2; r++) {
        m.route = r ? ROUTE_CAUSAL : ROUTE_TOPK;
        model_forward(&m, in[0], NULL, B, T);
        for (int r0 = 0; r0 < N; r0 += m.d.head_rows) { /* the head makes them a chunk at a time */
            const int n = N - r0 < m.d.head_rows ? N - r0 : m.d.head_rows;
            memcpy(t->logits + ((size_t)r * N + r0) * d.Vl, model_logits(&m, r0, n),
                   (size_t)n * d.Vl * sizeof(float));
        }
    }
    adamw_free(&opt);
    model_free(&m);
}

static void trace_free(Trace *t) {
    void *p[] = {t->loss, t->grads, t->params, t->logits, t->stats, t->expert_rows};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

static const char *const mode[] = {"none", "attention", "block"};

static void test_bitwise(void) {
    for (size_t i = 0; i < NKINDS; i++) {
        Trace none;
        trace(&kinds[i], RECOMPUTE_NONE, &none);
        for (Recompute rc = RECOMPUTE_ATTENTION; rc <= RECOMPUTE_BLOCK; rc++) {
            Trace t;
            trace(&kinds[i], rc, &t);
            const int same[] = {
                memcmp(t.loss, none.loss, STEPS * SETS * 7 * sizeof(float)) == 0,
                memcmp(t.grads, none.grads, STEPS * none.nparams * sizeof(float)) == 0,
                memcmp(t.params, none.params, none.nparams * sizeof(float)) == 0,
                /* counted once: the recomputed forwards count nothing */
                memcmp(t.stats, none.stats, (size_t)none.nstats * sizeof(double)) == 0 &&
                    memcmp(t.expert_rows, none.expert_rows,
                           (size_t)none.nexpert * sizeof(long long)) == 0,
                memcmp(t.logits, none.logits, 2 * (size_t)N * V * sizeof(float)) == 0};
            const char *what[] = {"losses", "gradients", "weights", "statistics", "logits"};
            for (int w = 0; w < 5; w++) {
                CU_ASSERT(same[w]);
                if (!same[w])
                    printf("\n  %s, recompute = %s: the %s differ from none's", kinds[i].name,
                           mode[rc], what[w]);
            }
            trace_free(&t);
        }
        /* the statistics are real: routing and experts counted something */
        CU_ASSERT(none.stats[4] == STEPS * SETS * N); /* tokens */
        trace_free(&none);
    }
}

/* Whether [p, p + n) lies inside [base, base + size). */
static int inside(const void *p, size_t n, const void *base, size_t size) {
    const char *c = p, *b = base;
    return c >= b && c + n <= b + size;
}

/* The activations model_memory counts, none > attention > block for each
 * kind, and where they are: a set keeps res3 (block) or all but ln1 ..
 * atty (attention), in its own allocation; the rest of every set's blocks
 * is one working copy, the same for each set, within model_memory's; the
 * MLP's GELU output is the working copy's in every mode. */
static void test_memory(void) {
    for (size_t i = 0; i < NKINDS; i++) {
        size_t acts[3];
        for (Recompute rc = RECOMPUTE_NONE; rc <= RECOMPUTE_BLOCK; rc++) {
            ModelDims d;
            kind_dims(&d, &kinds[i], rc);
            ModelMemory one, two;
            model_memory(&d, B, 1, 1, &one);
            model_memory(&d, B, 2, 1, &two);
            acts[rc] = one.acts;
            const size_t set = two.acts - one.acts, work = one.acts - set;
            CU_ASSERT(work > 0); /* the GELU outputs, in every mode */
            Model m;
            model_init(&m, &d, B, NULL);
            model_set_slots(&m, 2);
            CU_ASSERT_PTR_NOT_NULL(m.work);
            int ok = 1;
            for (int l = 0; l < L; l++) {
                const BlockActs *a = &m.slots[0].acts[l], *b = &m.slots[1].acts[l];
                const float *att[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->lse, a->atty};
                const float *rest[] = {a->res2, a->ln2, a->ln2_mean, a->ln2_rstd};
                for (int j = 0; j < 6; j++)
                    ok &= inside(att[j], 4, rc ? m.work : m.slots[0].mem, rc ? work : set);
                for (int j = 0; j < 4; j++)
                    ok &= inside(rest[j], 4, rc == RECOMPUTE_BLOCK ? m.work : m.slots[0].mem,
                                 rc == RECOMPUTE_BLOCK ? work : set);
                ok &= inside(a->res3, (size_t)N * C * 4, m.slots[0].mem, set);
                ok &= inside(b->res3, (size_t)N * C * 4, m.slots[1].mem, set);
                /* the working copy is shared, each set's output its own */
                ok &= (a->qkv == b->qkv) == (rc != RECOMPUTE_NONE) && a->res3 != b->res3;
                ok &= (a->res2 == b->res2) == (rc == RECOMPUTE_BLOCK);
                /* the MLP's GELU output: the working copy's in every mode */
                if (a->fch_gelu)
                    ok &= a->fch_gelu == b->fch_gelu && inside(a->fch_gelu, 4, m.work, work);
            }
            CU_ASSERT(ok);
            if (!ok)
                printf("\n  %s, recompute = %s: a buffer lies elsewhere", kinds[i].name, mode[rc]);
            model_free(&m);
        }
        CU_ASSERT(acts[0] > acts[1] && acts[1] > acts[2]);
        if (!(acts[0] > acts[1] && acts[1] > acts[2]))
            printf("\n  %s: activations %zu, %zu, %zu", kinds[i].name, acts[0], acts[1], acts[2]);
    }
}

int main(void) {
    test_threads_lock();
    kernels_init(2, "auto");
    CU_TestInfo tests[] = {
        {"attention, block = none bit for bit (dense, MoD, MoE, MoDE)", test_bitwise},
        {"memory: none > attention > block, one working copy", test_memory},
        CU_TEST_INFO_NULL,
    };
    /* each build of the elementwise loops: the recomputed GELU and its
     * derivative must equal the forward's floats on every one */
    return run_suite_each_vec("recompute", tests, kernels_vec_level(), kernels_set_vec_level,
                              kernels_threads(), kernels_set_threads);
}
