/*
 * rollback: a step whose loss or gradient was not finite (no update made):
 * stop, or return to the checkpoint this run loaded or committed last,
 * skip the batches since it and go on, until nonfinite_tries rollbacks
 * onto one checkpoint give up.
 */
#include <stdio.h>

#include "src/base/fault.h"
#include "src/train/run.h"

/* After step index *step found a non-finite loss or gradient (no update
 * made): stop (TRAIN_DIVERGED), or roll back: reload the checkpoint this
 * run loaded or committed last (the seed's init when there is none; never
 * another run's, nor one outside this launch's steps), skip the global batches
 * of the steps since it, record that in a re-save of its step (so a
 * requeued job skips them too) and go on from there; after nonfinite_tries
 * rollbacks onto one checkpoint, give up. Returns TRAIN_STEPPED to go on
 * (*step set so that the loop continues at the checkpoint's step), or how
 * the run ends, with err set. */
TrainStatus run_nonfinite(Run *r, int *step, const StepResult *s, Err *err) {
    const Config *c = &r->cfg;
    const int done = *step + 1;
    run_params_settle(r);
    record_begin(&r->rec, REC_NONFINITE, done);
    record_int(&r->rec, MF_NONFINITE, 1);
    record_int(&r->rec, MF_BATCH, (long long)*step + r->rs.batch_offset);
    run_emit(r);
    if (c->on_nonfinite == NONFINITE_STOP) {
        err_set(err, "train: loss %g, gradient norm %g at step %d: no update made; stopping with "
                "exit %d (lower lr, check the data, or set on_nonfinite = rollback)",
                s->loss, s->grad_norm, done, r->opts.code_diverged);
        run_err_rank0(r, err);
        return TRAIN_DIVERGED;
    }
    double stall = 0;
    int got_bad = 0;
    run_finish_async(r, done, 1, &stall); /* the save in flight commits first */
    fault_phase("rollback");
    CkptRunState had = {0};
    int to = 0;
    const int got = rollback_run(c, r->ckpt_dir, r->last_ckpt, sizeof r->last_ckpt, r->rs.run_id,
                                 r->start, *step, &r->m, &r->opt, &to, &had, r->grid.world, r->say, err);
    if (got > 0 && run_check_data(r, &had, "rollback", err) != 0) got_bad = 1;
    ckpt_run_state_free(&had); /* its samples are skipped: the cursor stays past this step */
    if (got < 0 || got_bad) return TRAIN_FAILED;
    if (got == 0) { /* nothing loaded or saved yet: back to the seed's init, or init_from's */
        if (!c->init_from[0]) model_init_weights(&r->m, (uint64_t)c->seed);
        else if (init_from_load(c, r->ckpt_dir, &r->m, -1, 0, r->grid.world, r->say, err) != 0)
            return TRAIN_FAILED;
        adamw_reset(&r->opt);
    }
    r->last_step = got ? had.parent_step : -1; /* the re-save below descends as it did */
    if (had.rollbacks >= c->nonfinite_tries) {
        err_set(err, "train: loss %g at step %d after %d rollbacks onto step %d: giving up with "
                "exit %d, which the job scripts do not requeue (lower lr, or check the data)",
                s->loss, done, had.rollbacks, to, r->opts.code_diverged);
        run_err_rank0(r, err);
        return TRAIN_DIVERGED;
    }
    r->rs.batch_offset = had.batch_offset + (done - to);
    r->rs.rollbacks = had.rollbacks + 1;
    say_log(r->say, "train: loss %g at step %d: rolled back to step %d, skipping the batches of steps %d-%d "
         "(rollback %d of %d onto it)\n",
         s->loss, done, to, to + 1, done, r->rs.rollbacks, c->nonfinite_tries);
    if (run_save(r, to, err) != 0) return TRAIN_FAILED;
    r->rs.rollbacks = 0; /* later checkpoints: none onto them yet */
    *step = to - 1;
    return TRAIN_STEPPED;
}
