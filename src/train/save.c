/*
 * save: checkpoints during a run: a save made now, or started in the
 * background and reported when it commits; what each did (time, rate,
 * ratio, peak RSS) on the log and in the metrics; and the probe write that
 * budgets time_limit's last save before any was timed.
 */
#include <stdio.h>

#include "mpi/check.h"
#include "src/base/fault.h"
#include "src/train/run.h"

/* Logs a committed save of `step` (seen at step `done`) and gives the
 * metrics its figures: its time (for an asynchronous one, from the copy to
 * the commit, of which `stall` held training up; stall < 0: synchronous),
 * rate, ratio, shares and the peak RSS before it and now. */
static void run_report_save(Run *r, int done, int step, double dt, double stall, const CkStats *st,
                            size_t rss0) {
    const double ratio = st->stored > 0 ? st->raw / st->stored : 0;
    const double mb_s = st->raw / 1e6 / (dt > 0 ? dt : 1e-9);
    const int async = stall >= 0;
    r->last_save_s = dt;
    const size_t rss1 = peak_rss();
    char raw[32], lo[32], hi[32], p0[32], p1[32], how[64] = "";
    format_bytes(raw, sizeof raw, (size_t)st->raw);
    format_bytes(lo, sizeof lo, (size_t)st->share_min);
    format_bytes(hi, sizeof hi, (size_t)st->share_max);
    format_bytes(p0, sizeof p0, rss0);
    format_bytes(p1, sizeof p1, rss1);
    if (async) snprintf(how, sizeof how, " in the background, stall %.2fs", stall);
    say_log(r->say, "checkpoint: %s/step-%08d | %.2fs%s | %s of state at %.1f MB/s, ratio %.3f (%lld of "
         "%lld byte planes deflated) | written by %d rank%s, %s to %s each | peak RSS %s, %s "
         "after\n",
         r->ckpt_dir, step, dt, how, raw, mb_s, ratio, st->planes_deflated, st->planes,
         r->grid.world_size, r->grid.world_size == 1 ? "" : "s", lo, hi, p0, p1);
    Record *rec = &r->rec;
    record_begin(rec, REC_CKPT, done);
    record_int(rec, MF_CKPT_STEP, step);
    record_int(rec, MF_CKPT_ASYNC, async);
    record_num(rec, MF_CKPT_S, dt);
    record_num(rec, MF_CKPT_MB_S, mb_s);
    record_num(rec, MF_CKPT_RATIO, ratio);
    record_num(rec, MF_CKPT_SHARE_MIN_MB, st->share_min / 1e6);
    record_num(rec, MF_CKPT_SHARE_MAX_MB, st->share_max / 1e6);
    record_num(rec, MF_CKPT_RSS_BEFORE_MB, rss0 / 1e6);
    record_num(rec, MF_CKPT_RSS_AFTER_MB, rss1 / 1e6);
    run_emit(r);
    run_flush_tb(r);
}

/* The metrics record of a step boundary that waited for checkpoint work,
 * which the next step's phases count. */
void run_log_stall(Run *r, int done, double stall) {
    record_begin(&r->rec, REC_STALL, done);
    record_num(&r->rec, MF_CKPT_STALL_MS, stall * 1e3);
    run_emit(r);
    phases_add(&r->ph, PH_CKPT, stall);
}

/* A save of `step` committed: what a rollback returns to from now on. */
static void run_committed(Run *r, int step) {
    snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s/step-%08d", r->ckpt_dir, step);
    r->last_step = step;
}

/* Saves the state after `step` now and logs what the save did. Returns 0
 * or -1 with err set (on rank 0). */
int run_save(Run *r, int step, Err *err) {
    const double t0 = now_s();
    const size_t rss0 = peak_rss();
    CkStats st;
    fault_phase("checkpoint");
    run_params_settle(r);
    r->rs.parent_step = r->last_step;
    const int rc = ckpt_save(r->ckpt_dir, &r->m, &r->opt, &r->cfg, step, &r->rs, r->grid.world,
                             r->grid.dp, r->grid.dp_rank, &st, err);
    if (rc < 0) return run_err_rank0(r, err);
    if (rc > 0 && r->grid.world_rank == 0) say_error(r->say, "%s", err->msg); /* committed, with a warning */
    run_committed(r, step);
    const double dt = now_s() - t0;
    run_log_stall(r, step, dt);
    run_report_save(r, step, step, dt, -1, &st, rss0);
    return 0;
}

/* At step `done`: when an asynchronous save is in flight and `block` or it
 * has finished, waits for it (adding the wait to *stall) and reports it.
 * A failed save is said; training goes on (the state is in memory).
 * Returns 0, or -1 when it failed. */
int run_finish_async(Run *r, int done, int block, double *stall) {
    const int step = ckpt_async_step(r->async);
    if (step < 0 || (!block && !ckpt_async_ready(r->async))) return 0;
    const double t0 = now_s();
    CkStats st;
    double dt;
    Err err;
    fault_phase("checkpoint wait");
    const int rc = ckpt_async_wait(r->async, &st, &dt, &err);
    if (block) *stall += now_s() - t0; /* joining a finished thread is no wait */
    if (rc != 0 && r->grid.world_rank == 0) say_error(r->say, "%s", err.msg); /* > 0: committed, a warning */
    if (rc < 0) return -1;
    run_committed(r, step);
    run_report_save(r, done, step, dt, r->async_stall, &st, r->async_rss0);
    return 0;
}

/* A periodic save at step `done`: started in the background (after the one
 * still in flight, if any, finishes), or made now. */
void run_periodic_save(Run *r, int done, double *stall) {
    Err err;
    run_params_settle(r);
    if (!r->async) {
        if (run_save(r, done, &err) != 0 && err.msg[0]) say_error(r->say, "%s", err.msg);
        return;
    }
    run_finish_async(r, done, 1, stall);
    const double t0 = now_s();
    r->async_rss0 = peak_rss();
    r->rs.parent_step = r->last_step;
    ckpt_async_start(r->async, r->ckpt_dir, &r->m, &r->opt, &r->cfg, done, &r->rs, r->grid.dp,
                     r->grid.dp_rank, r->threads);
    r->async_stall = now_s() - t0;
    *stall += r->async_stall;
}

/* time_limit's budget for the stop's save before any save was timed: a
 * probe write into ckpt_dir (see ckpt_probe_save) scaled to the state of
 * every rank. Returns 0 or -1 with err set (on rank 0). */
int run_probe_save(Run *r, Err *err) {
    double mine = 12.0 * (double)r->m.nparams / r->grid.dp, all = 0; /* weights, 2 moments */
    MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, r->grid.world));
    const int rc = ckpt_probe_save(r->ckpt_dir, all, r->grid.world, &r->save_estimate_s, err);
    return rc != 0 ? run_err_rank0(r, err) : 0;
}
