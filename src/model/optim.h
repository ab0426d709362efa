/*
 * optim: AdamW with decoupled weight decay on matrices only, and the
 * learning-rate schedule (linear warmup, then cosine to min_lr). Moments are
 * laid out like the parameters (one registry). Clipping scales the
 * gradients inside the update; their norm comes from mpi/sync.h.
 */
#ifndef MODTRAIN_OPTIM_H
#define MODTRAIN_OPTIM_H

#include <stddef.h>

#include "mpi/zero.h"
#include "src/config/config.h"
#include "src/model/model.h"

typedef struct {
    /* (n) each: laid out like Model.params, or, with a shard, its ranges
     * back to back */
    float *m, *v;
    size_t n;
    const ZeroShard *shard; /* NULL: the whole buffer */
    /* with a shard, when set: called after each of its ranges is updated,
     * with the range's end (ZeRO-1 gathers a piece once its part is) */
    void (*range_done)(void *ctx, size_t hi);
    void *range_ctx;
} AdamW;

void adamw_init(AdamW *o, const Model *model);
/* The moments of shard's ranges only (shard outlives o); NULL: adamw_init. */
void adamw_init_shard(AdamW *o, const Model *model, const ZeroShard *shard);
void adamw_free(AdamW *o);
/* Zeroes the moments, as adamw_init leaves them. */
void adamw_reset(AdamW *o);

/* Learning rate for 0-based step s of cfg->steps. */
double lr_at(const Config *cfg, int s);

/* One update at 1-based step t; gradients are multiplied by grad_scale
 * first (clipping), and left zero (model->grads_zeroed: the next
 * model_zero_grad skips its pass). With a shard, only its ranges are
 * read and updated (the caller gathers the parameters after). */
void adamw_step(AdamW *o, Model *model, double lr, double beta1, double beta2, double eps,
                double weight_decay, int t, float grad_scale);
/* The same update as plain loops, one tensor after another on one thread,
 * leaving the gradients as they were: the reference adamw_step is tested
 * against (the same bits). */
void adamw_step_ref(AdamW *o, Model *model, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int t, float grad_scale);

#endif
