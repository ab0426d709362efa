/*
 * test_model: the whole model's gradient against finite differences of its
 * loss, the determinism of a step, and the shard-independence of the
 * counter-based initialisation.
 */
#include <stdio.h>
#include <string.h>

#include "src/kernels.h"
#include "src/model.h"
#include "src/optim.h"
#include "src/base/util.h"
#include "testutil.h"

enum { V = 11, T = 6, L = 2, NH = 2, C = 8, B = 2 };

static int inputs[B * T], targets[B * T];

static void make_batch(void) {
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int)(rng_u64(9, 1, i) % V);
        targets[i] = (int)(rng_u64(9, 2, i) % V);
    }
}

static void tiny_model(Model *m) {
    ModelDims d;
    model_dims(&d, V, T, L, NH, C, 1, 0);
    model_init(m, &d, B, NULL);
    model_init_weights(m, 1234);
    /* larger weights than GPT-2's 0.02 so that every path carries gradient */
    for (size_t i = 0; i < m->nparams; i++) m->params[i] += 0.3f * (float)rng_normal(5, 5, i);
}

static double model_loss(void *ctx) {
    Model *m = ctx;
    return model_forward(m, inputs, targets, B, T);
}

static void test_model_gradient(void) {
    Model m;
    tiny_model(&m);
    make_batch();
    model_zero_grad(&m);
    model_forward(&m, inputs, targets, B, T);
    model_backward(&m, 1.f / (B * T), 0.f);
    double worst = 0;
    for (int i = 0; i < m.nreg; i++) {
        const ParamInfo *p = &m.reg[i];
        size_t n = p->numel < 24 ? p->numel : 24; /* the first elements of each tensor */
        double *num = xmalloc(n * sizeof(double));
        finite_diff(model_loss, &m, m.params + p->offset, n, 5e-3f, num);
        double e = rel_err(m.grads + p->offset, num, n);
        if (e > worst) worst = e;
        if (e > 1e-2) printf("\n  %s: relative error %.3g\n", p->name, e);
        free(num);
    }
    CU_ASSERT(worst < 1e-2);
    model_free(&m);
}

static void test_loss_at_init_is_log_vocab(void) {
    /* GPT-2 init (std 0.02) gives near-uniform predictions: loss ~ ln V */
    Model m;
    ModelDims d;
    model_dims(&d, V, T, L, NH, C, 1, 0);
    model_init(&m, &d, B, NULL);
    model_init_weights(&m, 1);
    make_batch();
    float loss = model_forward(&m, inputs, targets, B, T);
    CU_ASSERT(fabs(loss - log((double)V)) < 0.05);
    model_free(&m);
}

static void test_step_is_deterministic(void) {
    Model a, b;
    tiny_model(&a);
    tiny_model(&b);
    make_batch();
    for (int rep = 0; rep < 2; rep++) {
        Model *m = rep ? &b : &a;
        AdamW o;
        adamw_init(&o, m);
        for (int s = 0; s < 3; s++) {
            model_zero_grad(m);
            model_forward(m, inputs, targets, B, T);
            model_backward(m, 1.f / (B * T), 0.f);
            adamw_step(&o, m, 1e-3, 0.9, 0.95, 1e-8, 0.1, s + 1, 1.f);
        }
        adamw_free(&o);
    }
    CU_ASSERT(memcmp(a.params, b.params, a.nparams * sizeof(float)) == 0);
    model_free(&a);
    model_free(&b);
}

static void test_init_is_layout_independent(void) {
    /* each tp rank's slice of every tensor equals the same slice of the
     * single-rank model: init depends on (seed, name, global index) alone */
    Model full;
    ModelDims d;
    model_dims(&d, V, T, L, NH, C, 1, 0);
    model_init(&full, &d, 1, NULL);
    model_init_weights(&full, 77);
    for (int r = 0; r < 2; r++) {
        Model part;
        ModelDims dp;
        model_dims(&dp, V, T, L, NH, C, 2, r);
        model_init(&part, &dp, 1, NULL);
        model_init_weights(&part, 77);
        int mismatches = 0;
        for (int i = 0; i < part.nreg; i++) {
            const ParamInfo *p = &part.reg[i];
            const ParamInfo *q = model_find_param(&full, p->name);
            for (size_t j = 0; j < p->numel; j++) {
                size_t g = param_global_index(p, 2, r, j);
                float want = g / (size_t)p->shape[1] >= (size_t)full.reg[0].shape[0] &&
                                     strcmp(p->name, "wte.weight") == 0
                                 ? 0.f
                                 : full.params[q->offset + g];
                if (part.params[p->offset + j] != want) mismatches++;
            }
        }
        CU_ASSERT_EQUAL(mismatches, 0);
        /* q, k and v are split separately: rank r holds heads r*NH/2.. of each */
        const ParamInfo *qkv = model_find_param(&part, "h.0.attn.c_attn.weight");
        CU_ASSERT_EQUAL(qkv->lshape[1], 3 * C / 2);
        CU_ASSERT_EQUAL(param_global_index(qkv, 2, r, (size_t)C / 2), (size_t)C + (size_t)r * C / 2);
        model_free(&part);
    }
    model_free(&full);
}

static void test_accumulation_equals_full_batch(void) {
    /* two micro-batches of one sequence accumulate the gradient of the batch */
    Model m;
    tiny_model(&m);
    make_batch();
    model_zero_grad(&m);
    model_forward(&m, inputs, targets, B, T);
    model_backward(&m, 1.f / (B * T), 0.f);
    float *full = xmalloc(m.nparams * 4);
    memcpy(full, m.grads, m.nparams * 4);
    model_zero_grad(&m);
    for (int b = 0; b < B; b++) {
        model_forward(&m, inputs + b * T, targets + b * T, 1, T);
        model_backward(&m, 1.f / (B * T), 0.f);
    }
    double *ref = xmalloc(m.nparams * sizeof(double));
    for (size_t i = 0; i < m.nparams; i++) ref[i] = full[i];
    CU_ASSERT(rel_err(m.grads, ref, m.nparams) < 1e-5);
    free(full);
    free(ref);
    model_free(&m);
}

static void test_lr_schedule(void) {
    Config c;
    memset(&c, 0, sizeof c);
    c.lr = 1.0, c.min_lr = 0.1, c.warmup_steps = 4, c.steps = 14;
    CU_ASSERT_DOUBLE_EQUAL(lr_at(&c, 0), 0.25, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(lr_at(&c, 3), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(lr_at(&c, 4), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(lr_at(&c, 13), 0.1, 1e-12);
    CU_ASSERT(lr_at(&c, 8) < 1.0 && lr_at(&c, 8) > 0.1);
}

static void test_weight_decay_on_matrices_only(void) {
    Model m;
    tiny_model(&m);
    AdamW o;
    adamw_init(&o, &m);
    model_zero_grad(&m);
    float *before = xmalloc(m.nparams * 4);
    memcpy(before, m.params, m.nparams * 4);
    adamw_step(&o, &m, 0.1, 0.9, 0.95, 1e-8, 0.5, 1, 1.f); /* zero gradient: decay only */
    const ParamInfo *w = model_find_param(&m, "h.0.mlp.c_fc.weight");
    const ParamInfo *b = model_find_param(&m, "h.0.mlp.c_fc.bias");
    const ParamInfo *g = model_find_param(&m, "ln_f.weight");
    CU_ASSERT_DOUBLE_EQUAL(m.params[w->offset], before[w->offset] * (1 - 0.1 * 0.5), 1e-6);
    CU_ASSERT_EQUAL(m.params[b->offset], before[b->offset]);
    CU_ASSERT_EQUAL(m.params[g->offset], before[g->offset]);
    free(before);
    adamw_free(&o);
    model_free(&m);
}

int main(void) {
    kernels_init(2, "auto");
    CU_TestInfo tests[] = {{"whole-model gradient = finite differences", test_model_gradient},
                           {"loss at init is ln V", test_loss_at_init_is_log_vocab},
                           {"three steps twice are bitwise identical", test_step_is_deterministic},
                           {"init is the same under any tp split", test_init_is_layout_independent},
                           {"accumulated micro-batches = one batch", test_accumulation_equals_full_batch},
                           {"warmup then cosine to min_lr", test_lr_schedule},
                           {"weight decay on matrices only", test_weight_decay_on_matrices_only},
                           CU_TEST_INFO_NULL};
    return run_suite("model", tests);
}
