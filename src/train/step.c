/*
 * step: one optimizer step: this rank's sequences of the global batch,
 * the pipeline schedule of the micro-batches' forwards and backwards,
 * then sync (gradients, loss and routing counters), clip and AdamW, each
 * phase timed.
 */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/check.h"
#include "mpi/sync.h"
#include "src/base/fault.h"
#include "src/base/rng.h"
#include "src/train/run.h"

/* A step's micro-batches as pipeline callbacks. */
typedef struct {
    Run *r;
    int step;
    double loss_sum;
} StepCtx;

/* Test hook: MODTRAIN_FAULT=nan-batch:B makes the loss of the step that
 * trains on global batch B NaN (bad data); nan-from:B every batch from B. */
static int fault_nan_batch(long long batch) {
    const char *f = getenv("MODTRAIN_FAULT");
    long long b;
    if (f && strncmp(f, "nan-batch:", 10) == 0 && parse_i64(f + 10, 0, LLONG_MAX, &b) == 0)
        return batch == b;
    if (f && strncmp(f, "nan-from:", 9) == 0 && parse_i64(f + 9, 0, LLONG_MAX, &b) == 0)
        return batch >= b;
    return 0;
}

static void step_forward(void *p, int chunk, int mb, int slot) {
    StepCtx *c = p;
    Run *r = c->r;
    const int T = r->T;
    const double t0 = now_s(), tp0 = tp_time_s + ep_time_s, ag0 = dp_gather_wait_s;
    const size_t at = (size_t)mb * r->micro * T;
    model_use_chunk(&r->m, slot, chunk);
    fault_phase("forward");
    /* step_backward follows with this dloss: the head does its backward in
     * the forward, without the logits' product a second time */
    model_expect_backward(&r->m, (float)(1.0 / r->step_tokens));
    c->loss_sum +=
        model_forward(&r->m, r->inputs + at, r->targets + at, r->micro, T) * (double)r->micro * T;
    check_model_fault(&r->m);
    /* the wait for ZeRO-1's all-gather (what it did not hide) is dp's */
    const double ag = dp_gather_wait_s - ag0;
    phases_add(&r->ph, PH_FORWARD, now_s() - t0 - (tp_time_s + ep_time_s - tp0) - ag);
    phases_add(&r->ph, PH_DP, ag);
}

static void step_backward(void *p, int mb, int slot) {
    StepCtx *c = p;
    (void)mb;
    const double t0 = now_s(), tp0 = tp_time_s + ep_time_s;
    model_use_slot(&c->r->m, slot);
    fault_phase("backward");
    model_backward(&c->r->m, (float)(1.0 / c->r->step_tokens), (float)c->r->cfg.aux_weight);
    phases_add(&c->r->ph, PH_BACKWARD, now_s() - t0 - (tp_time_s + ep_time_s - tp0));
}

static float *step_input(void *p, int slot) { return ((StepCtx *)p)->r->m.slots[slot].enc; }

static float *step_output(void *p, int slot) {
    Model *m = &((StepCtx *)p)->r->m;
    model_use_slot(m, slot);
    return model_stage_output(m);
}

static float *step_grad(void *p) { return ((StepCtx *)p)->r->m.s.dres; }

/* This rank's sequences of the step that starts at sample r->rs.samples:
 * the fixed slice of the global batch its dp rank takes, the same on its
 * tp and pp peers. A failed read (a shard truncated or changed while in
 * use) on any rank ends the run on all of them. Returns 0 or -1 with err
 * set (ranks_agree). */
static int run_read_batch(Run *r, uint64_t *hash, Err *err) {
    const double t0 = now_s();
    fault_phase("data");
    const uint64_t first = (uint64_t)r->rs.samples + (uint64_t)r->grid.dp_rank * r->local_batch;
    int rc = 0;
    uint64_t h = 0;
    for (int b = 0; b < r->local_batch && rc == 0; b++) {
        DsSample s;
        const uint64_t g = first + (uint64_t)b;
        ds_locate(&r->train, g, &s);
        const size_t at = (size_t)b * r->T;
        rc = ds_read(&r->train, &s, r->cfg.vocab_size, r->inputs + at, r->targets + at, err);
        h += rng_u64(g, (uint64_t)s.part << 32 ^ s.epoch, s.seq);
        if (rc == 0 && r->data_trace && r->grid.tp_rank == 0 && r->grid.pp_rank == 0) {
            fprintf(r->data_trace, "{\"sample\":%" PRIu64 ",\"dataset\":%d,\"shard\":%d,"
                    "\"offset\":%" PRIu64 ",\"epoch\":%" PRIu64 ",\"tokens\":[",
                    g, s.part, s.shard, s.offset, s.epoch);
            for (int t = 0; t < 8 && t < r->T; t++)
                fprintf(r->data_trace, "%s%d", t ? "," : "", r->inputs[at + (size_t)t]);
            fprintf(r->data_trace, "]}\n");
        }
    }
    if (r->data_trace) fflush(r->data_trace);
    for (int b = 0; b < r->local_batch && rc == 0; b++) { /* the next step's, in the background */
        DsSample s;
        ds_locate(&r->train, first + (uint64_t)r->cfg.batch_size + (uint64_t)b, &s);
        ds_prefetch(&r->train, &s);
    }
    phases_add(&r->ph, PH_DATA, now_s() - t0);
    if (ranks_agree(rc, err, r->grid.world) != 0) return -1;
    /* the step's samples over the dp ranks: which were read, not by whom */
    MPI_CHECK(MPI_Allreduce(&h, hash, 1, MPI_UINT64_T, MPI_SUM, r->grid.dp_comm));
    return 0;
}

/* The whole model's gradient norm: this rank's sums of squares (under
 * zero 1 of its parts, completed over their groups), then over tp, ep and
 * pp. */
static double run_grad_norm(Run *r) {
    double split[2], replicated[2];
    if (r->trained.n) { /* train_only = routers: theirs alone */
        model_grad_sumsq_ranges(&r->m, r->trained.lo, r->trained.hi, r->trained.n, split,
                                replicated);
    } else if (r->use_zero) {
        model_grad_sumsq_ranges(&r->m, r->zero.shard.lo, r->zero.shard.hi, r->zero.shard.n,
                                split, replicated);
        zero_sumsq_reduce(split, replicated, &r->zero);
    } else {
        model_grad_sumsq(&r->m, split, replicated);
    }
    return grads_norm(split, replicated, &r->grid);
}

/* The step's gradients over dp (and the tied embedding's copies over the
 * end stages): all of them, or under train_only = routers theirs alone. */
static void run_sync_grads(Run *r) {
    Model *m = &r->m;
    const Grid *g = &r->grid;
    if (r->trained.n) { /* only their gradients matter */
        for (int k = 0; k < r->trained.n; k++)
            dp_allreduce_sum(m->grads + r->trained.lo[k], r->trained.hi[k] - r->trained.lo[k],
                             g->dp_comm);
        return;
    }
    /* the embedding: tied, the end stages' copies; else the first stage's */
    const ParamInfo *tied = m->d.tied ? model_tied_param(m) : model_embed_param(m);
    const EmbRows *er = m->emb_rows;
    const TiedGrad tg = {.offset = tied ? tied->offset : 0,
                         .numel = tied ? tied->numel : 0,
                         .head = m->d.tied && model_last_stage(&m->d),
                         .shared = m->d.tied,
                         .slot = er ? er->slot : NULL,
                         .rows = er ? er->rows : NULL,
                         .Vl = m->d.Vl,
                         .C = m->d.C};
    grads_sync(m->grads, m->nparams, m->expert_floats, tied ? &tg : NULL, g,
               r->overlap ? &r->ov : NULL, r->use_zero ? &r->zero : NULL);
    if (m->emb_rows) emb_rows_clear(m->emb_rows);
}

/* One optimizer step: schedule -> sync -> clip -> optimizer. */
void run_step(Run *r, int step, StepResult *out, Err *err) {
    Model *m = &r->m;
    const Grid *g = &r->grid;
    const double t0 = now_s(), wait0 = pp_wait_s, tp_s0 = tp_time_s, ep_s0 = ep_time_s,
                 gw0 = dp_gather_wait_s;
    const unsigned long long tp0 = tp_bytes, dp0 = dp_bytes, pp0 = pp_bytes, ep0 = ep_bytes,
                             ag0 = dp_gather_bytes;
    if (run_read_batch(r, &out->data_hash, err) != 0) {
        out->data_error = 1;
        return;
    }
    model_zero_grad(m);
    model_stats_reset(m);
    /* schedule: the micro-batches' forwards and backwards */
    StepCtx sc = {r, step, 0};
    PpStage st = {.ctx = &sc,
                  .forward = step_forward,
                  .backward = step_backward,
                  .input = step_input,
                  .output = step_output,
                  .grad_out = step_grad,
                  .grad_in = step_grad,
                  .count = (size_t)r->micro * r->T * m->d.C,
                  .chunks = m->d.nchunk,
                  .pump = g->crossing[AXIS_PP] > 0};
    pp_run(r->sched, r->n_micro, g->pp > 1 ? g->pp_comm : MPI_COMM_NULL, &st, &out->live);
    run_params_settle(r); /* what the forwards did not read is whole too */
    out->gather_wait_s = dp_gather_wait_s - gw0;
    if (r->opts.after_backward) r->opts.after_backward(r->opts.ctx, g->world_rank, step + 1);
    /* sync: gradients, then the loss and routing counters */
    fault_phase("gradient all-reduce");
    double t1 = now_s(), tp1 = tp_time_s;
    run_sync_grads(r);
    double loss = reduce_step_stats(m, sc.loss_sum, g->dp_comm);
    if (g->pp > 1) {
        loss = reduce_step_stats(m, loss, g->pp_comm);
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &out->live, 1, MPI_INT, MPI_MAX, g->pp_comm));
    }
    out->loss = loss / r->step_tokens;
    if (fault_nan_batch(step + r->rs.batch_offset)) out->loss = NAN;
    phases_add(&r->ph, PH_DP, now_s() - t1 - (tp_time_s - tp1));
    t1 = now_s(), tp1 = tp_time_s;
    /* clip */
    out->grad_norm = run_grad_norm(r);
    const Config *c = &r->cfg;
    /* a non-finite loss or gradient: no update, so the weights stay those
     * of the last good step (every rank sees the same reduced values) */
    out->nonfinite = !isfinite(out->loss) || !isfinite(out->grad_norm);
    if (out->nonfinite) return;
    fault_phase("optimizer");
    float scale = c->grad_clip > 0 && out->grad_norm > c->grad_clip
                      ? (float)(c->grad_clip / out->grad_norm)
                      : 1.f;
    /* optimizer */
    out->lr = lr_at(c, step);
    if (r->use_zero) zero_gather_begin(&r->zero, m->params); /* each piece as it is updated */
    adamw_step(&r->opt, m, out->lr, c->beta1, c->beta2, c->adam_eps, c->weight_decay, step + 1,
               scale);
    phases_add(&r->ph, PH_OPTIMIZER, now_s() - t1 - (tp_time_s - tp1));
    if (r->use_zero) { /* every rank's updated parts, to every rank: in flight
                        * until the next forward needs them (zero_needs) */
        t1 = now_s();
        zero_gather_ready(&r->zero, SIZE_MAX);
        phases_add(&r->ph, PH_DP, now_s() - t1);
    }
    phases_add(&r->ph, PH_TP, tp_time_s - tp_s0);
    phases_add(&r->ph, PH_EP, ep_time_s - ep_s0);
    phases_add(&r->ph, PH_PP_WAIT, pp_wait_s - wait0);
    out->dt = now_s() - t0;
    out->tp_bytes = tp_bytes - tp0;
    out->dp_bytes = dp_bytes - dp0;
    out->dp_gather_bytes = dp_gather_bytes - ag0;
    out->pp_bytes = pp_bytes - pp0;
    out->ep_bytes = ep_bytes - ep0;
    /* the pipeline bubble: the share of the step each stage spent waiting on
     * its neighbours, averaged over the stages */
    out->bubble = (pp_wait_s - wait0) / out->dt;
    if (g->pp > 1) {
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &out->bubble, 1, MPI_DOUBLE, MPI_SUM, g->pp_comm));
        out->bubble /= g->pp;
    }
    for (int l = 0; l < m->d.L; l++) r->frac[l] = (double)m->stats.processed[l] / m->stats.tokens;
    out->fpt = run_step_flops(r);
    if (step > r->start) {
        r->steps_timed++;
        r->time_timed += out->dt;
    }
    phases_end_step(&r->ph);
}
