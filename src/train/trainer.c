/*
 * trainer: the API of trainer.h: a run set up once, its steps one call
 * each (with the checks before the first and the final save after the
 * last), and the teardown of whatever setup reached.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/check.h"
#include "src/base/fault.h"
#include "src/kernels/kernels.h"
#include "src/train/run.h"

/* Everything before the first step. Returns 0, or -1 with err set. */
static int run_setup(Run *r, int argc, char **argv, Err *err) {
    if (run_setup_layout(r, argc, argv, err) != 0 || run_setup_data(r, err) != 0 ||
        run_setup_model(r, err) != 0)
        return -1;
    const int rc = train_peak_gflops(&r->cfg, r->threads, &r->peak_gflops, r->peak_how,
                                     sizeof r->peak_how, err);
    if (ranks_agree(rc, err, r->grid.world) != 0) return -1;
    /* MFU is the job's model FLOPs over the job's peak: every rank's */
    MPI_CHECK(MPI_Allreduce(&r->peak_gflops, &r->job_peak_gflops, 1, MPI_DOUBLE, MPI_SUM,
                            r->grid.world));
    run_banner(r);
    if (run_open_metrics(r, err) != 0) return -1;
    if (run_saves_async(&r->cfg)) {
        Err why;
        r->async = ckpt_async_new(r->grid.world, r->m.nparams + 2 * r->opt.n, r->threads, &why);
        if (!r->async && r->grid.world_rank == 0) say_error(r->say, "%s", why.msg);
    }
    if (run_time_limit_auto(r, err) != 0) return -1;
    if (r->cfg.time_limit > 0 && run_probe_save(r, err) != 0) return -1;
    if (r->cfg.watchdog_s > 0) watchdog_start(r);
    const char *trace = getenv("MODTRAIN_DATA_TRACE");
    if (trace && *trace) { /* a test's view of the reads: FILE.DP_RANK */
        char p[4200];
        snprintf(p, sizeof p, "%.4096s.%d", trace, r->grid.dp_rank);
        r->data_trace = fopen(p, "a");
    }
    r->inputs = xmalloc((size_t)r->local_batch * r->T * sizeof(int));
    r->targets = xmalloc((size_t)r->local_batch * r->T * sizeof(int));
    r->frac = xcalloc((size_t)r->m.d.L, sizeof(double));
    r->t_start = r->opts.start_s; /* time_limit counts from the process's start */
    return 0;
}

TrainStatus trainer_open(Trainer **out, int argc, char **argv, const TrainerOpts *opts, Err *err) {
    Trainer *t = xcalloc(1, sizeof *t);
    Run *r = &t->r;
    r->opts = *opts;
    r->say = &r->opts.say;
    *out = t;
    err->msg[0] = '\0';
    return run_setup(r, argc, argv, err) == 0 ? TRAIN_STEPPED : TRAIN_BAD_INPUT;
}

/* The run ends with st. */
static TrainStatus run_end(Run *r, TrainStatus st) {
    r->ended = 1;
    r->end_status = st;
    return st;
}

/* After the last step: the final save (after the one in flight). */
static TrainStatus run_finish(Run *r, Err *err) {
    const Config *c = &r->cfg;
    const int final_step = c->steps > r->start ? c->steps : r->start;
    double stall = 0;
    run_finish_async(r, final_step, 1, &stall);
    if (stall > 0) run_log_stall(r, final_step, stall);
    if (run_save(r, final_step, err) != 0) return run_end(r, TRAIN_FAILED);
    phases_summary(&r->ph, r->grid.world, r->say);
    say_log(r->say, "done: step %d, %.1fs in all\n", final_step, now_s() - r->t_start);
    return run_end(r, TRAIN_DONE);
}

/* The step of index `step` (r->next) and what follows it. */
static TrainStatus run_one(Run *r, int step, Err *err) {
    const Config *c = &r->cfg;
    StepResult s = {0};
    fault_phase("step");
    atomic_store(&r->watch_step, step + 1);
    run_step(r, step, &s, err);
    if (s.data_error) return run_end(r, TRAIN_BAD_INPUT);
    r->rs.samples += c->batch_size; /* a skipped step's too: a rollback skips them */
    r->last = (TrainerStep){.step = step + 1, .samples = r->rs.samples, .loss = s.loss,
                            .grad_norm = s.grad_norm, .lr = s.lr, .step_s = s.dt,
                            .nonfinite = s.nonfinite};
    if (s.nonfinite) {
        const TrainStatus st = run_nonfinite(r, &step, &s, err);
        r->next = step + 1;
        return st == TRAIN_STEPPED ? st : run_end(r, st);
    }
    run_log(r, step, &s);
    if (run_validate(r, step + 1, err) != 0) return run_end(r, TRAIN_BAD_INPUT);
    run_flush_metrics(r);
    r->next = step + 1;
    if (step + 1 == c->steps) return run_finish(r, err);
    const TrainStatus st = run_maybe_save_or_stop(r, step + 1, s.dt, err);
    if (st == TRAIN_STOPPED) phases_summary(&r->ph, r->grid.world, r->say);
    return st == TRAIN_STEPPED ? st : run_end(r, st);
}

TrainStatus trainer_step(Trainer *t, Err *err) {
    Run *r = &t->r;
    err->msg[0] = '\0';
    if (r->ended) return r->end_status;
    if (!r->begun) {
        r->begun = 1;
        const TrainStatus st = run_before_steps(r);
        if (st != TRAIN_STEPPED) return run_end(r, st);
        phases_start(&r->ph);
        r->next = r->start;
    }
    if (r->next >= r->cfg.steps) return run_finish(r, err);
    return run_one(r, r->next, err);
}

TrainStatus trainer_run(Trainer *t, Err *err) {
    TrainStatus st;
    while ((st = trainer_step(t, err)) == TRAIN_STEPPED) {
    }
    return st;
}

const TrainerStep *trainer_last(const Trainer *t) { return &t->r.last; }

const Config *trainer_config(const Trainer *t) { return &t->r.cfg; }

void trainer_close(Trainer *t) {
    if (!t) return;
    Run *r = &t->r;
    watchdog_stop(r);
    ckpt_async_free(r->async);
    run_close_metrics(r);
    if (r->data_trace) fclose(r->data_trace);
    free(r->inputs);
    free(r->targets);
    free(r->frac);
    if (r->overlap) dp_overlap_free(&r->ov);
    free(r->seg_of);
    free(r->zero_need);
    if (r->emb_rows.slot) emb_rows_free(&r->emb_rows);
    if (r->use_zero) zero_free(&r->zero);
    free(r->trained.lo), free(r->trained.hi);
    if (r->model_ready) {
        adamw_free(&r->opt);
        model_free(&r->m);
    }
    ds_free(&r->train);
    ds_free(&r->val);
    free(r->data_id);
    if (r->grid_ready) grid_free(&r->grid);
    free(t);
}
