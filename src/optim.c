/*
 * optim: AdamW over the registry, elementwise and so trivially deterministic.
 */
#include "src/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/util.h"

void adamw_init(AdamW *o, const Model *model) {
    o->n = model->nparams;
    o->m = xcalloc(o->n, sizeof(float));
    o->v = xcalloc(o->n, sizeof(float));
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

void adamw_step(AdamW *o, Model *model, double lr, double beta1, double beta2, double eps,
                double weight_decay, int t, float grad_scale) {
    const float b1 = (float)beta1, b2 = (float)beta2;
    const float c1 = (float)(1.0 - pow(beta1, t)), c2 = (float)(1.0 - pow(beta2, t));
    for (int i = 0; i < model->nreg; i++) {
        const ParamInfo *p = &model->reg[i];
        float *w = model->params + p->offset, *g = model->grads + p->offset;
        float *m = o->m + p->offset, *v = o->v + p->offset;
        const float wd = p->decay ? (float)weight_decay : 0.f, flr = (float)lr, feps = (float)eps;
#pragma omp parallel for simd schedule(static)
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
