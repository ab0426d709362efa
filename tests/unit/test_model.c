/*
 * test_model: the whole model's gradient against finite differences of its
 * loss, the determinism of a step, and the shard-independence of the
 * counter-based initialisation.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "src/kernels/kernels.h"
#include "src/model/model.h"
#include "src/model/optim.h"
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

/* head_rows: the head's chunk (0: the default) */
static void tiny_model_rows(Model *m, int head_rows) {
    ModelDims d;
    model_dims(&d, V, T, L, NH, C, 1, 0);
    if (head_rows > 0) d.head_rows = head_rows;
    model_init(m, &d, B, NULL);
    model_init_weights(m, 1234);
    /* larger weights than GPT-2's 0.02 so that every path carries gradient */
    for (size_t i = 0; i < m->nparams; i++) m->params[i] += 0.3f * (float)rng_normal(5, 5, i);
}

static void tiny_model(Model *m) { tiny_model_rows(m, 0); }

static double model_loss(void *ctx) {
    Model *m = ctx;
    return model_forward(m, inputs, targets, B, T);
}

static void test_model_gradient(void) {
    /* training's head: chunks of 5 of the 12 rows (5, 5, 2), its backward
     * done in the forward */
    Model m;
    tiny_model_rows(&m, 5);
    make_batch();
    model_zero_grad(&m);
    model_expect_backward(&m, 1.f / (B * T));
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

/* AdamW is the textbook update (moments corrected by 1 - beta^t, decoupled
 * weight decay, decay on matrices only), followed in double over three
 * steps: every parameter within 1e-6 of the learning rate, plus the
 * float's rounding of the parameter itself. */
static void test_adamw_is_the_textbook_update(void) {
    ModelDims d;
    model_dims(&d, 61, 8, 1, 1, 16, 1, 0);
    Model a;
    model_init(&a, &d, 1, NULL);
    model_init_weights(&a, 3);
    AdamW o;
    adamw_init(&o, &a);
    const size_t n = a.nparams;
    double *w = xmalloc(n * sizeof(double)), *m = xcalloc(n, sizeof(double)),
           *v = xcalloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) w[i] = a.params[i];
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.7;
    for (int t = 1; t <= 3; t++) {
        for (size_t i = 0; i < n; i++) a.grads[i] = (float)rng_normal(5, (uint64_t)t, i) * 1e-2f;
        for (int r = 0; r < a.nreg; r++) {
            const ParamInfo *p = &a.reg[r];
            for (size_t j = p->offset; j < p->offset + p->numel; j++) {
                const double g = (double)a.grads[j] * (double)(float)gs;
                m[j] = b1 * m[j] + (1 - b1) * g;
                v[j] = b2 * v[j] + (1 - b2) * g * g;
                const double mh = m[j] / (1 - pow(b1, t)), vh = v[j] / (1 - pow(b2, t));
                w[j] -= lr * (mh / (sqrt(vh) + eps) + (p->decay ? wd : 0) * w[j]);
            }
        }
        adamw_step(&o, &a, lr, b1, b2, eps, wd, t, (float)gs);
    }
    double worst = 0;
    for (int r = 0; r < a.nreg; r++)
        for (size_t j = a.reg[r].offset; j < a.reg[r].offset + a.reg[r].numel; j++)
            /* 1e-6 of the step, and the float's own rounding of w */
            worst = worse(worst, fabs(a.params[j] - w[j]) / (1e-6 * lr + 4e-7 * fabs(w[j])));
    CU_ASSERT(worst < 1);
    if (worst >= 1) printf("\n  AdamW against the textbook: worst %g of the bound\n", worst);
    free(w), free(m), free(v);
    adamw_free(&o);
    model_free(&a);
}

/* The fused AdamW (one parallel region, tensors split in whole cache
 * lines) is the plain loops' update bit for bit, over three steps; the
 * gradient's sum of squares (blocks of 8192 on all threads) equals a long
 * double sum within 1e-12 and is the same bits on 1 and 2 threads. A model
 * of d_model 97 and a vocabulary of 501: tensors of many blocks and of odd
 * sizes (padded in the buffer, a short last chunk and block). */
static void test_fused_optimizer_matches_reference(void) {
    ModelDims d;
    model_dims(&d, 501, 16, 2, 1, 97, 1, 0);
    Model a, b;
    model_init(&a, &d, 1, NULL);
    model_init(&b, &d, 1, NULL);
    model_init_weights(&a, 7);
    model_init_weights(&b, 7);
    AdamW oa, ob;
    adamw_init(&oa, &a);
    adamw_init(&ob, &b);
    for (int t = 1; t <= 3; t++) {
        for (size_t i = 0; i < a.nparams; i++)
            a.grads[i] = b.grads[i] = (float)rng_normal(9, (uint64_t)t, i) * 1e-2f;
        adamw_step(&oa, &a, 1e-3, 0.9, 0.95, 1e-8, 0.1, t, 0.7f);
        adamw_step_ref(&ob, &b, 1e-3, 0.9, 0.95, 1e-8, 0.1, t, 0.7f);
    }
    CU_ASSERT_EQUAL(memcmp(a.params, b.params, a.nparams * sizeof(float)), 0);
    CU_ASSERT_EQUAL(memcmp(oa.m, ob.m, a.nparams * sizeof(float)), 0);
    CU_ASSERT_EQUAL(memcmp(oa.v, ob.v, a.nparams * sizeof(float)), 0);
    /* the fused step leaves the gradients zero, and says so */
    int zero = a.grads_zeroed == 1;
    for (size_t i = 0; i < a.nparams; i++) zero &= a.grads[i] == 0.f;
    CU_ASSERT(zero);
    CU_ASSERT_EQUAL(b.grads_zeroed, 0);
    /* the sum of squares, on the reference's gradients (left as they were) */
    CU_ASSERT(model_find_param(&b, "wte.weight")->numel > 4 * 8192);
    long double ref = 0;
    for (int t = 0; t < b.nreg; t++) /* the tensors' elements, not their padding */
        for (size_t i = 0; i < b.reg[t].numel; i++) {
            const long double g = b.grads[b.reg[t].offset + i];
            ref += g * g;
        }
    CU_ASSERT(ref > 0);
    double split[2], rep[2], split1[2], rep1[2];
    model_grad_sumsq(&b, split, rep);
    const double got = split[0] + split[1] + rep[0] + rep[1];
    CU_ASSERT(fabs(got - (double)ref) <= 1e-12 * (double)ref);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    model_grad_sumsq(&b, split1, rep1);
    omp_set_num_threads(threads);
    CU_ASSERT(memcmp(split, split1, sizeof split) == 0 && memcmp(rep, rep1, sizeof rep) == 0);
    /* the AVX2 build's lanes in registers give the baseline's bits */
    const int level = kernels_vec_level();
    kernels_set_vec_level(0);
    model_grad_sumsq(&b, split1, rep1);
    kernels_set_vec_level(level);
    CU_ASSERT(memcmp(split, split1, sizeof split) == 0 && memcmp(rep, rep1, sizeof rep) == 0);
    adamw_free(&oa);
    adamw_free(&ob);
    model_free(&a);
    model_free(&b);
}

/* ------------------------------------------------------------------ head */

/* The chunked head against the reference (the whole micro-batch's logits,
 * as the head was before chunks): a vocabulary of 300 (the softmax's row
 * blocks of 256 and a partial one of 44, a multiple of no vector width),
 * micro-batches of 14 and 7 rows. */
enum { HV = 300, HT = 7, HB = 3 };

static int hin[HB * HT], htg[HB * HT];

static float *dup_floats(const float *x, size_t n) {
    float *y = xmalloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* head_rows: the chunk; 0: the reference head, its logits in *ref. */
static void head_model(Model *m, int head_rows, float **ref) {
    ModelDims d;
    model_dims(&d, HV, HT, L, NH, C, 1, 0);
    if (head_rows > 0) d.head_rows = head_rows;
    model_init(m, &d, HB, NULL);
    model_init_weights(m, 99);
    for (size_t i = 0; i < m->nparams; i++) m->params[i] += 0.3f * (float)rng_normal(6, 6, i);
    /* the (tied) embeddings of tokens 256 on three times larger, so that
     * many rows' largest logits lie in the softmax's second block of 256 */
    const ParamInfo *wte = model_find_param(m, "wte.weight");
    for (size_t i = (size_t)256 * C; i < (size_t)HV * C; i++) m->params[wte->offset + i] *= 3.f;
    for (int i = 0; i < HB * HT; i++) {
        hin[i] = (int)(rng_u64(10, 1, i) % HV);
        htg[i] = (int)(rng_u64(10, 2, i) % HV);
    }
    if (head_rows > 0) return;
    *ref = xmalloc((size_t)HB * HT * HV * sizeof(float));
    m->ref_logits = *ref;
}

/* A step's gradient over micro-batches of 2 and 1 sequences for dloss
 * (fused: each forward under model_expect_backward); their losses into
 * loss. */
static void head_step(Model *m, int fused, float dloss, float loss[2]) {
    model_zero_grad(m);
    for (int k = 0, b0 = 0; k < 2; b0 += 2 - k, k++) {
        if (fused) model_expect_backward(m, dloss);
        loss[k] = model_forward(m, hin + b0 * HT, htg + b0 * HT, 2 - k, HT);
        model_backward(m, dloss, 0.f);
    }
}

/* The worst relative error of a's tensors' gradients against r's. */
static double worst_grad_err(const Model *a, const Model *r, int rows, int fused) {
    double worst = 0;
    for (int i = 0; i < a->nreg; i++) {
        const ParamInfo *p = &a->reg[i], *q = model_find_param(r, p->name);
        double *ref = xmalloc(q->numel * sizeof(double));
        for (size_t j = 0; j < q->numel; j++) ref[j] = r->grads[q->offset + j];
        const double e = rel_err(a->grads + p->offset, ref, p->numel);
        if (e > 1e-6) printf("\n  head_rows %d fused %d: %s off by %.3g", rows, fused, p->name, e);
        worst = worse(worst, e);
        free(ref);
    }
    return worst;
}

static void test_head_chunks_match_reference(void) {
    /* chunks of 1, 4 and 8 (14 = 8 + 6, 7 < 8), 7 (14 = 2 x 7), 64 (more
     * than a micro-batch); 300 columns is a multiple of no vector width; a step's dloss
     * of 1 / tokens, and of exactly 1 (a one-token step's) */
    const int rows[] = {1, 4, 7, 8, 64};
    const float dlosses[] = {1.f / (HB * HT), 1.f};
    for (int dl = 0; dl < 2; dl++) {
        Model r;
        float *ref_logits, ref_loss[2];
        head_model(&r, 0, &ref_logits);
        head_step(&r, 0, dlosses[dl], ref_loss);
        for (size_t c = 0; c < sizeof rows / sizeof rows[0]; c++) {
            float *plain = NULL;
            for (int fused = 0; fused < 2; fused++) {
                Model m;
                float loss[2];
                head_model(&m, rows[c], NULL);
                head_step(&m, fused, dlosses[dl], loss);
                for (int k = 0; k < 2; k++)
                    CU_ASSERT(fabs(loss[k] - ref_loss[k]) <= 1e-6 * ref_loss[k]);
                /* the last micro-batch's per-token losses */
                for (int i = 0; i < HT; i++)
                    CU_ASSERT(fabs(m.cur->losses[i] - r.cur->losses[i]) <=
                              1e-6 * r.cur->losses[i]);
                CU_ASSERT(worst_grad_err(&m, &r, rows[c], fused) < 1e-6);
                /* the same probabilities either way: the same gradients, bit for bit */
                if (fused) {
                    CU_ASSERT(memcmp(plain, m.grads, m.nparams * sizeof(float)) == 0);
                } else {
                    plain = dup_floats(m.grads, m.nparams);
                }
                model_free(&m);
            }
            free(plain);
        }
        free(ref_logits);
        model_free(&r);
    }
}

static void test_head_forward_leaves_grads(void) {
    /* evaluation's forwards (no promise) touch no gradient, and a promise
     * is the next forward's alone */
    Model m;
    head_model(&m, 4, NULL);
    fill_normal(m.grads, m.nparams, 3, 1.f);
    float *before = dup_floats(m.grads, m.nparams);
    model_forward(&m, hin, htg, HB, HT);
    CU_ASSERT(memcmp(before, m.grads, m.nparams * sizeof(float)) == 0);
    model_expect_backward(&m, 0.5f);
    model_forward(&m, hin, NULL, HB, HT);
    model_forward(&m, hin, htg, HB, HT);
    CU_ASSERT(memcmp(before, m.grads, m.nparams * sizeof(float)) == 0);
    free(before);
    model_free(&m);
}

static void test_head_logits_match_reference(void) {
    /* a forward without targets: model_logits' rows, a chunk at a time,
     * are the reference's whole-batch logits */
    Model r, m;
    float *ref_logits;
    head_model(&r, 0, &ref_logits);
    head_model(&m, 4, NULL);
    model_forward(&r, hin, NULL, HB, HT);
    model_forward(&m, hin, NULL, HB, HT);
    double num = 0, den = 0;
    for (int r0 = 0; r0 < HB * HT; r0 += 4) {
        const int n = HB * HT - r0 < 4 ? HB * HT - r0 : 4;
        const float *lg = model_logits(&m, r0, n);
        for (int j = 0; j < n * HV; j++) {
            const double want = ref_logits[(size_t)r0 * HV + j];
            num += (lg[j] - want) * (lg[j] - want), den += want * want;
        }
    }
    CU_ASSERT(sqrt(num) <= 1e-6 * sqrt(den));
    /* some rows have their largest logit past the first 256: the softmax's
     * second block raises their maximum and rescales the sums (these are
     * the inputs of the chunked head's test above too) */
    int raised = 0;
    for (int i = 0; i < HB * HT; i++) {
        const float *row = ref_logits + (size_t)i * HV;
        int arg = 0;
        for (int j = 1; j < HV; j++) arg = row[j] > row[arg] ? j : arg;
        raised += arg >= 256;
    }
    CU_ASSERT(raised > 0);
    free(ref_logits);
    model_free(&r);
    model_free(&m);
}

static void test_head_memory(void) {
    /* GPT-2's vocabulary at T 1024, B 4: the head's logits are one chunk's,
     * in the last stage's scratch; nothing of them is per token */
    ModelDims big, small, first, short_seq;
    model_dims(&big, 50257, 1024, 2, 12, 768, 1, 0);
    model_dims(&small, 1024, 1024, 2, 12, 768, 1, 0);
    first = big;
    CU_ASSERT_EQUAL(model_dims_stage(&first, 2, 1, 0, NULL), 0);
    ModelMemory mb, ms, mf, mt;
    model_memory(&big, 4, 1, 1, &mb);
    model_memory(&small, 4, 1, 1, &ms);
    model_memory(&first, 4, 1, 1, &mf);
    CU_ASSERT_EQUAL(mb.acts, ms.acts);
    CU_ASSERT_EQUAL(mb.scratch - ms.scratch, (size_t)HEAD_ROWS * (50257 - 1024) * sizeof(float));
    CU_ASSERT_EQUAL(mb.scratch - mf.scratch, (size_t)HEAD_ROWS * 50257 * sizeof(float));
    /* a micro-batch of fewer rows than a chunk: a chunk of its rows */
    model_dims(&short_seq, 50257, 100, 2, 12, 768, 1, 0);
    model_memory(&short_seq, 2, 1, 1, &mt);
    short_seq.V = short_seq.Vp = short_seq.Vl = 1024;
    model_memory(&short_seq, 2, 1, 1, &ms);
    const size_t chunk = (size_t)200 * 50257 * sizeof(float); /* laid out on 64 bytes */
    CU_ASSERT_EQUAL(mt.scratch - ms.scratch, (chunk + 63) / 64 * 64 - (size_t)200 * 1024 * 4);
}

int main(void) {
    test_threads_lock();
    kernels_init(2, "auto");
    CU_TestInfo tests[] = {{"whole-model gradient = finite differences", test_model_gradient},
                           {"loss at init is ln V", test_loss_at_init_is_log_vocab},
                           {"three steps twice are bitwise identical", test_step_is_deterministic},
                           {"init is the same under any tp split", test_init_is_layout_independent},
                           {"accumulated micro-batches = one batch", test_accumulation_equals_full_batch},
                           {"warmup then cosine to min_lr", test_lr_schedule},
                           {"weight decay on matrices only", test_weight_decay_on_matrices_only},
                           {"fused AdamW and the blocked sum of squares = plain loops",
                            test_fused_optimizer_matches_reference},
        {"AdamW is the textbook update, in double", test_adamw_is_the_textbook_update},
                           {"chunked head = reference head (loss, every gradient)",
                            test_head_chunks_match_reference},
                           {"forwards without the promise leave gradients alone",
                            test_head_forward_leaves_grads},
                           {"model_logits = the reference's logits", test_head_logits_match_reference},
                           {"the head's memory is one chunk's logits", test_head_memory},
                           CU_TEST_INFO_NULL};
    return run_suite_each_vec("model", tests, kernels_vec_level(), kernels_set_vec_level,
                              kernels_threads(), kernels_set_threads);
}
