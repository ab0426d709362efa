/*
 * eval: validation every eval_every steps and after the last (top-k, and
 * for a Mixture-of-Depths model causal routing too), and what one would
 * take, for time_limit's budget.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "src/base/fault.h"
#include "src/train/run.h"

/* The validation loss under `mode`: each dataset's share of the first
 * eval_seqs sequences (val_seqs: from its first, in order, whatever the
 * layout) into part[], and their blend by weight. Returns the blend, or
 * NAN when a read failed (err set: ranks_agree). */
static double run_val_loss(Run *r, RouteMode mode, double *part, Err *err) {
    double total = 0;
    for (int d = 0; d < r->val.n_parts; d++) {
        int failed = 0;
        const size_t n = (size_t)val_seqs(&r->val, d, (uint64_t)r->cfg.eval_seqs);
        part[d] = eval_loss(&r->m, &r->val, d, r->micro, n, mode, 0, 0.f, &failed, err);
        if (failed) return NAN;
        total += r->val.parts[d].weight * part[d];
    }
    return total;
}

/* Validation every eval_every steps and after the last. Returns 0, or -1
 * when a read failed (err set). */
int run_validate(Run *r, int done, Err *err) {
    const Config *c = &r->cfg;
    if (!r->have_val || !((c->eval_every && done % c->eval_every == 0) || done == c->steps))
        return 0;
    const double t0 = now_s();
    fault_phase("validation");
    run_params_settle(r);
    Model *m = &r->m;
    double parts[DS_MAX_PARTS], causal[DS_MAX_PARTS];
    const int np = r->val.n_parts;
    const double vl = run_val_loss(r, ROUTE_TOPK, parts, err);
    if (isnan(vl)) return -1;
    const double acc = r->n_routed ? (double)m->stats.agree / (double)m->stats.decisions : 0;
    Record *rec = &r->rec;
    record_begin(rec, REC_VAL, done);
    record_num(rec, MF_VAL_LOSS, vl);
    if (np > 1) record_list(rec, MF_VAL_LOSS_PARTS, parts, np);
    char each[DS_MAX_PARTS * 24] = "";
    for (int d = 0; np > 1 && d < np; d++)
        snprintf(each + strlen(each), sizeof each - strlen(each), "%s%.4f", d ? ", " : " (", parts[d]);
    if (np > 1) strcat(each, ")");
    if (r->n_routed) {
        const double vc = run_val_loss(r, ROUTE_CAUSAL, causal, err);
        if (isnan(vc)) return -1;
        record_num(rec, MF_VAL_LOSS_CAUSAL, vc);
        record_num(rec, MF_PREDICTOR_ACCURACY, acc);
        if (np > 1) record_list(rec, MF_VAL_LOSS_CAUSAL_PARTS, causal, np);
        say_log(r->say, "step %d | val_loss %.4f%s | val_loss_causal %.4f | predictor accuracy %.2f%%\n",
             done, vl, each, vc, 100 * acc);
    } else {
        say_log(r->say, "step %d | val_loss %.4f%s\n", done, vl, each);
    }
    run_emit(r);
    run_flush_tb(r);
    r->last_eval_s = now_s() - t0;
    phases_add(&r->ph, PH_EVAL, now_s() - t0);
    return 0;
}

/* What validating after step `done` would take: as timed last, or before
 * any, its forwards at a third of a training step's sequence each (two
 * passes for a MoD model: top-k and causal). */
double run_eval_estimate(const Run *r, int done, double per_step) {
    const Config *c = &r->cfg;
    if (!r->have_val || !((c->eval_every && done % c->eval_every == 0) || done == c->steps))
        return 0;
    if (r->last_eval_s > 0) return r->last_eval_s;
    return per_step / r->local_batch / 3 * c->eval_seqs * (r->n_routed ? 2 : 1);
}
