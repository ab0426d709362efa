/*
 * stop: when a run stops before its last step: a stop signal (the ranks
 * act on it together at a step boundary), or time_limit, which budgets
 * the next step, its validation and the stop's save (auto: the SLURM
 * job's end); the periodic saves between; and the checks before the first
 * step (nothing left to train, a signal during setup).
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "mpi/check.h"
#include "src/train/run.h"

static const char *signal_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : sig == SIGINT ? "SIGINT" : "a signal";
}

/* The signal that asked this rank to stop (0: none). */
static int stop_asked(const Run *r) { return r->opts.stop ? atomic_load(r->opts.stop) : 0; }

/* A SLURM time ("2026-12-01T18:13:00", the controller's local time) as
 * seconds since the epoch; -1 when it is none ("Unknown", "N/A"). */
static time_t slurm_time(const char *s) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!end || (*end && *end != '\n' && *end != ' ')) return -1;
    tm.tm_isdst = -1;
    return mktime(&tm);
}

/* The first line a command prints, or "" when it fails. */
static void first_line(const char *cmd, char *buf, size_t n) {
    buf[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (!fgets(buf, (int)n, p)) buf[0] = '\0';
    while (fgetc(p) != EOF) { /* the rest, so the command ends */
    }
    if (pclose(p) != 0) buf[0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
}

/* The latest end time taken: 9999-12-31T23:59:59 UTC. Later ones (INT64_MAX,
 * 1e17) have no calendar date to print, and a job that long has no limit. */
#define SLURM_TIME_MAX 253402300799LL

/* The end of this SLURM job (time_limit = auto): SLURM_JOB_END_TIME, else
 * what squeue, else scontrol show job, says for SLURM_JOB_ID. Returns 1
 * with *end set and why naming the source, 0 with why saying what was
 * missing (not in a job, no end time), or -1 with why saying which of the
 * two variables is malformed or out of range. */
static int slurm_end_time(time_t *end, char *why, size_t n) {
    const char *job = getenv("SLURM_JOB_ID"), *env = getenv("SLURM_JOB_END_TIME");
    long long id, t;
    if (!job || !*job) {
        snprintf(why, n, "not inside a SLURM job (SLURM_JOB_ID is not set)");
        return 0;
    }
    if (parse_i64(job, 1, LLONG_MAX, &id) != 0) {
        snprintf(why, n, "SLURM_JOB_ID = '%.40s' is not a job number (an integer >= 1)", job);
        return -1;
    }
    if (env && *env) {
        if (parse_i64(env, 1, SLURM_TIME_MAX, &t) != 0) {
            snprintf(why, n,
                     "SLURM_JOB_END_TIME = '%.40s' is not seconds since 1970 (an integer in [1, "
                     "%lld], before the year 10000)",
                     env, SLURM_TIME_MAX);
            return -1;
        }
        *end = (time_t)t;
        snprintf(why, n, "SLURM_JOB_END_TIME");
        return 1;
    }
    char cmd[128], line[256];
    snprintf(cmd, sizeof cmd, "squeue -h -j %lld -o %%e 2> /dev/null", id);
    first_line(cmd, line, sizeof line);
    if ((*end = slurm_time(line)) != -1 && *end <= SLURM_TIME_MAX) {
        snprintf(why, n, "squeue");
        return 1;
    }
    snprintf(cmd, sizeof cmd, "scontrol show job %lld 2> /dev/null | grep -o 'EndTime=[^ ]*'", id);
    first_line(cmd, line, sizeof line);
    if (strncmp(line, "EndTime=", 8) == 0 && (*end = slurm_time(line + 8)) != -1 &&
        *end <= SLURM_TIME_MAX) {
        snprintf(why, n, "scontrol show job");
        return 1;
    }
    snprintf(why, n, "neither squeue nor scontrol gave job %lld an end time (no time limit, or "
             "not reachable)", id);
    return 0;
}
/* time_limit = auto: the seconds from the process's start to the SLURM
 * job's end, found by rank 0 and shared; outside a job, or when SLURM
 * gives no end, no limit (logged). The stop's save is budgeted before it
 * as for any time_limit. A malformed SLURM_JOB_ID or SLURM_JOB_END_TIME
 * is an error: returns -1 with err set (ranks_agree), else 0. */
int run_time_limit_auto(Run *r, Err *err) {
    Config *c = &r->cfg;
    if (c->time_limit != CONFIG_TIME_LIMIT_AUTO) return 0;
    double limit = 0;
    char why[256] = "", when[64] = "";
    time_t end = 0;
    int found = 0;
    if (r->grid.world_rank == 0) found = slurm_end_time(&end, why, sizeof why);
    if (found > 0) {
        const double left = difftime(end, time(NULL));
        limit = (now_s() - r->opts.start_s) + (left > 1 ? left : 1);
        struct tm tm;
        if (!localtime_r(&end, &tm) || !strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm))
            snprintf(when, sizeof when, "%lld s since 1970", (long long)end);
    }
    if (found < 0) err_set(err, "time_limit = auto: %s", why);
    if (ranks_agree(found < 0 ? -1 : 0, err, r->grid.world) != 0) return -1;
    MPI_CHECK(MPI_Bcast(&limit, 1, MPI_DOUBLE, 0, r->grid.world));
    c->time_limit = limit;
    char d[32];
    format_duration(d, sizeof d, limit);
    if (limit > 0)
        say_log(r->say, "train: time_limit = auto: job %s ends at %s (%s): %.0f s from the start, %s\n",
             getenv("SLURM_JOB_ID"), when, why, limit, d);
    else say_log(r->say, "train: time_limit = auto: %s: no time limit\n", why);
    return 0;
}

/* Whether the next step (and its validation), the save in flight and a
 * save at the stop would overrun time_limit, counted from the process's
 * start. Before any save has been timed, the stop's save is budgeted from
 * the probe write made at setup. */
static int run_out_of_time(const Run *r, int done, double per_step) {
    const Config *c = &r->cfg;
    if (c->time_limit <= 0) return 0;
    const double save = r->last_save_s > 0 ? r->last_save_s : r->save_estimate_s;
    double left = 0; /* what the save in flight may still take */
    if (ckpt_async_step(r->async) >= 0) {
        const double t = ckpt_async_elapsed(r->async);
        left = (save > t ? save : 2 * t) - t;
    }
    const double next = per_step + run_eval_estimate(r, done + 1, per_step);
    return now_s() - r->t_start + next + left + 2 * save + 1 > c->time_limit;
}

/* After step `done` (not the last): stop early, all ranks together, on a
 * signal or when the next step and a save would not fit in time_limit; or
 * save periodically. A save in flight that finished is reported. Returns
 * TRAIN_STEPPED to go on, or how the run ends (err set on rank 0). */
TrainStatus run_maybe_save_or_stop(Run *r, int done, double dt, Err *err) {
    const Config *c = &r->cfg;
    double stall = 0;
    run_finish_async(r, done, 0, &stall);
    double per_step = r->steps_timed ? r->time_timed / r->steps_timed : dt;
    int stop = stop_asked(r);
    if (run_out_of_time(r, done, per_step)) stop = -1;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, r->grid.world));
    if (stop) {
        /* the save in flight commits first: it is the older checkpoint */
        run_finish_async(r, done, 1, &stall);
        if (stall > 0) run_log_stall(r, done, stall);
        if (run_save(r, done, err) != 0) return TRAIN_FAILED;
        char why[80];
        if (stop > 0) snprintf(why, sizeof why, "%s", signal_name(stop));
        else /* the process's own clock, the stop's save included */
            snprintf(why, sizeof why, "time_limit (%.2f s of %g from the start)",
                     now_s() - r->t_start, c->time_limit);
        say_log(r->say, "stopping at step %d/%d on %s: checkpoint %s/step-%08d saved; exit %d (requeue "
             "to continue)\n",
             done, c->steps, why, r->ckpt_dir, done, r->opts.code_stopped);
        return TRAIN_STOPPED;
    }
    if (c->ckpt_every && done % c->ckpt_every == 0) run_periodic_save(r, done, &stall);
    if (stall > 0) run_log_stall(r, done, stall);
    return TRAIN_STEPPED;
}

/* Before the first step: a run already at `steps` whose ckpt_dir holds
 * that step (a chain job or a requeue after the end, under any layout)
 * ends without training or writing (one that loaded a checkpoint from
 * elsewhere saves it into its ckpt_dir: a copy, or a new layout's); a stop signal
 * that came during setup stops it with nothing lost (the state is the
 * checkpoint just loaded, or the seed's). Returns TRAIN_STEPPED to train,
 * or how the run ends. */
TrainStatus run_before_steps(Run *r) {
    const Config *c = &r->cfg;
    char have[CONFIG_STR + 32];
    struct stat st;
    snprintf(have, sizeof have, "%s/step-%08d/index", r->ckpt_dir, r->start);
    if (r->resumed && r->start >= c->steps && stat(have, &st) == 0) {
        say_log(r->say, "resume: steps = %d is at or below the checkpoint's step %d: nothing to train or "
             "save, exiting 0\n",
             c->steps, r->start);
        return TRAIN_DONE;
    }
    if (r->resumed && r->start >= c->steps)
        say_log(r->say, "resume: steps = %d is at or below the checkpoint's step %d: nothing to train; "
             "saving it into %s\n",
             c->steps, r->start, r->ckpt_dir);
    int stop = stop_asked(r);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, r->grid.world));
    if (!stop) return TRAIN_STEPPED;
    say_log(r->say, "stopping before step %d/%d on %s: nothing to save (%s); exit %d (requeue to "
         "continue)\n",
         r->start + 1, c->steps, signal_name(stop),
         r->resumed ? "the state is the checkpoint loaded" : "no step trained yet",
         r->opts.code_stopped);
    return TRAIN_STOPPED;
}
