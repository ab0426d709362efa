/*
 * optim: AdamW with decoupled weight decay on matrices only, the learning-
 * rate schedule (linear warmup, then cosine to min_lr), and gradient-norm
 * clipping. Moments are laid out like the parameters (one registry).
 */
#ifndef MODTRAIN_OPTIM_H
#define MODTRAIN_OPTIM_H

#include <stddef.h>

#include "config.h"
#include "model.h"

typedef struct {
    float *m, *v; /* (nparams) each, same layout as Model.params */
    size_t n;
} AdamW;

void adamw_init(AdamW *o, const Model *model);
void adamw_free(AdamW *o);

/* Learning rate for 0-based step s of cfg->steps. */
double lr_at(const Config *cfg, int s);

/* L2 norm of all gradients of the whole model (double accumulation, fixed
 * order; a collective over the tp group). */
double grad_norm(const Model *model);

/* One update at 1-based step t; gradients are multiplied by grad_scale
 * first (clipping). */
void adamw_step(AdamW *o, Model *model, double lr, double beta1, double beta2, double eps,
                double weight_decay, int t, float grad_scale);

#endif
