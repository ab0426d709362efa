/*
 * optim: AdamW over the registry, elementwise and so trivially deterministic.
 */
#include "src/model/optim.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/util.h"
#include "src/kernels/kernels_impl.h"

void adamw_init(AdamW *o, const Model *model) { adamw_init_shard(o, model, NULL); }

void adamw_init_shard(AdamW *o, const Model *model, const ZeroShard *shard) {
    o->shard = shard;
    o->n = shard ? shard->floats : model->nparams;
    o->m = xcalloc(o->n ? o->n : 1, sizeof(float));
    o->v = xcalloc(o->n ? o->n : 1, sizeof(float));
}

void adamw_free(AdamW *o) {
    free(o->m);
    free(o->v);
    o->m = o->v = NULL;
}

double lr_at(const Config *c, int s) {
    if (c->warmup_steps > 0 && s < c->warmup_steps)
        return c->lr * (double)(s + 1) / (double)c->warmup_steps;
    int decay_steps = c->steps - c->warmup_steps;
    if (decay_steps <= 1) return c->lr;
    double progress = (double)(s - c->warmup_steps) / (double)(decay_steps - 1);
    if (progress > 1) progress = 1;
    return c->min_lr + 0.5 * (1.0 + cos(M_PI * progress)) * (c->lr - c->min_lr);
}

/* AdamW on [lo, hi) of one tensor, zeroing the gradient as it reads it.
 * Three divisions and a square root an element make it compute-bound on
 * SSE2's four lanes, so it is compiled for AVX2's eight too, without FMA:
 * IEEE division and square root round exactly and nothing can be fused,
 * so both builds give adamw_step_ref's bits. */
VEC_IMPL adamw_range_impl(float *w, float *g, float *m, float *v, size_t lo, size_t hi, float b1,
                          float b2, float c1, float c2, float lr, float eps, float wd,
                          float grad_scale) {
#pragma omp simd
    for (size_t j = lo; j < hi; j++) {
        float gj = g[j] * grad_scale;
        m[j] = b1 * m[j] + (1.f - b1) * gj;
        v[j] = b2 * v[j] + (1.f - b2) * gj * gj;
        float mhat = m[j] / c1, vhat = v[j] / c2;
        w[j] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * w[j]);
        g[j] = 0.f; /* consumed: the next step's zeroing pass is saved */
    }
}
VEC_DISPATCH_EXACT(adamw_range,
                   (float *w, float *g, float *m, float *v, size_t lo, size_t hi, float b1,
                    float b2, float c1, float c2, float lr, float eps, float wd, float grad_scale),
                   (w, g, m, v, lo, hi, b1, b2, c1, c2, lr, eps, wd, grad_scale))

/* The update on a shard's ranges: each range's pieces in each tensor (for
 * its weight decay), the pieces split over the threads. */
static void adamw_step_shard(AdamW *o, Model *model, float lr, float b1, float b2, float c1,
                             float c2, float eps, float wd, float grad_scale) {
    const ZeroShard *sh = o->shard;
    size_t at = 0;
    for (int k = 0; k < sh->n; k++) {
        const size_t lo = sh->lo[k], hi = sh->hi[k];
        for (int i = 0; i < model->nreg; i++) {
            const ParamInfo *p = &model->reg[i];
            const size_t a = p->offset > lo ? p->offset : lo;
            const size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
            if (a >= b) continue;
            float *m = o->m + at + (a - lo), *v = o->v + at + (a - lo);
#pragma omp parallel
            {
                const size_t nt = (size_t)omp_get_num_threads(), th = (size_t)omp_get_thread_num();
                const size_t chunks = (b - a + 15) / 16;
                const size_t x = chunks * th / nt * 16, y0 = chunks * (th + 1) / nt * 16;
                const size_t y = y0 < b - a ? y0 : b - a;
                if (x < y)
                    adamw_range(model->params + a, model->grads + a, m, v, x, y, b1, b2, c1, c2,
                                lr, eps, p->decay ? wd : 0.f, grad_scale);
            }
        }
        at += hi - lo;
        if (o->range_done) o->range_done(o->range_ctx, hi);
    }
    model->grads_zeroed = 0; /* the other ranks' ranges were not consumed */
}

void adamw_step(AdamW *o, Model *model, double lr, double beta1, double beta2, double eps,
                double weight_decay, int t, float grad_scale) {
    const float b1 = (float)beta1, b2 = (float)beta2;
    const float c1 = (float)(1.0 - pow(beta1, t)), c2 = (float)(1.0 - pow(beta2, t));
    if (o->shard) {
        adamw_step_shard(o, model, (float)lr, b1, b2, c1, c2, (float)eps, (float)weight_decay,
                         grad_scale);
        return;
    }
    /* one parallel region for every tensor (no fork and join a tensor), each
     * tensor split over the threads in chunks of 16 elements (whole cache
     * lines); elementwise, so any split gives the same bits */
#pragma omp parallel
    {
        const size_t nt = (size_t)omp_get_num_threads(), th = (size_t)omp_get_thread_num();
        for (int i = 0; i < model->nreg; i++) {
            const ParamInfo *p = &model->reg[i];
            const size_t chunks = (p->numel + 15) / 16;
            const size_t lo = chunks * th / nt * 16, hi0 = chunks * (th + 1) / nt * 16;
            const size_t hi = hi0 < p->numel ? hi0 : p->numel;
            if (lo >= hi) continue;
            const size_t off = p->offset;
            adamw_range(model->params + off, model->grads + off, o->m + off, o->v + off, lo, hi, b1,
                        b2, c1, c2, (float)lr, (float)eps, p->decay ? (float)weight_decay : 0.f,
                        grad_scale);
        }
    }
    /* each tensor's padding to 16 floats (never written, zeroed all the
     * same), and whether the tensors so padded tile the whole buffer */
    size_t next = 0;
    int tiled = 1;
    for (int i = 0; i < model->nreg; i++) {
        const ParamInfo *p = &model->reg[i];
        const size_t end = p->offset + ((p->numel + 15) & ~(size_t)15);
        tiled &= p->offset == next && end <= model->nparams;
        if (tiled) memset(model->grads + p->offset + p->numel, 0, (end - p->offset - p->numel) * 4);
        next = end;
    }
    model->grads_zeroed = tiled && next == model->nparams;
}

void adamw_step_ref(AdamW *o, Model *model, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int t, float grad_scale) {
    const float b1 = (float)beta1, b2 = (float)beta2;
    const float c1 = (float)(1.0 - pow(beta1, t)), c2 = (float)(1.0 - pow(beta2, t));
    for (int i = 0; i < model->nreg; i++) {
        const ParamInfo *p = &model->reg[i];
        float *w = model->params + p->offset, *g = model->grads + p->offset;
        float *m = o->m + p->offset, *v = o->v + p->offset;
        const float wd = p->decay ? (float)weight_decay : 0.f, flr = (float)lr, feps = (float)eps;
        for (size_t j = 0; j < p->numel; j++) {
            float gj = g[j] * grad_scale;
            m[j] = b1 * m[j] + (1.f - b1) * gj;
            v[j] = b2 * v[j] + (1.f - b2) * gj * gj;
            float mhat = m[j] / c1, vhat = v[j] / c2;
            w[j] -= flr * (mhat / (sqrtf(vhat) + feps) + wd * w[j]);
        }
    }
}

void adamw_reset(AdamW *o) {
    memset(o->m, 0, o->n * sizeof(float));
    memset(o->v, 0, o->n * sizeof(float));
}
