/*
 * resume: restoring a training run from its checkpoints, newest first,
 * with every rank agreeing on which one loaded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt.h"
#include "mpi/check.h"
#include "src/cmd/cmd.h"

/* Tries one checkpoint: its config must match the run's (a mismatch is the
 * user's error, not a damaged checkpoint: *fatal is set), then every rank
 * loads its slices. Returns 1 when all ranks loaded it. */
static int try_resume(const char *dir, const Config *cfg, Model *m, AdamW *opt, int *start,
                      CkptRunState *rs, MPI_Comm comm, int *fatal) {
    Config ck = *cfg;
    Err err = {""};
    int step = 0, had_m = 0;
    int ok = ckpt_read_config(dir, &ck, &step, &err) == 0;
    if (ok && ckpt_check_model_config(&ck, cfg, dir, &err) != 0) {
        err_print(&err);
        *fatal = 1;
        return 0;
    }
    CkptRunState got = {0};
    if (ok) ok = ckpt_read_run_state(dir, &got, &err) == 0;
    if (ok) ok = ckpt_load(dir, m, opt, &had_m, &err) == 0;
    int all = 0;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm));
    if (!all) {
        if (!ok) errorf("resume: skipping %s: %s", dir, err.msg);
        ckpt_run_state_free(&got);
        return 0;
    }
    *start = step;
    ckpt_run_state_free(rs);
    *rs = got;
    log0("resume: loaded %s (step %d)%s\n", dir, step,
         had_m ? "" : "; it has no optimizer state, so AdamW starts from zero moments");
    return 1;
}

/* Rank 0 puts right what interrupted saves left in ckpt_dir, and refuses
 * to start over where `latest` names a checkpoint that is gone and none
 * is left (they were moved or deleted: starting from scratch would
 * silently throw the run away). Collective; returns 0 or -1 (printed). */
static int resume_prepare(const char *ckpt_dir, MPI_Comm comm) {
    int rank = 0, rc = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    Err err;
    if (rank == 0) {
        rc = ckpt_recover(ckpt_dir, NULL, &err);
        char **names, p[1100];
        int n = ckpt_list_steps(ckpt_dir, &names);
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        snprintf(p, sizeof p, "%s/latest", ckpt_dir);
        Err rerr;
        char *latest = n == 0 && rc == 0 ? read_file(p, 4096, NULL, &rerr) : NULL;
        if (latest) {
            latest[strcspn(latest, "\r\n")] = '\0';
            rc = err_set(&err,
                         "resume: '%s/latest' names '%.40s' but '%s' holds no checkpoint (moved "
                         "or deleted?); put them back, or set resume = never to start over",
                         ckpt_dir, latest, ckpt_dir);
            free(latest);
        }
    }
    return cmd_agree(rc, &err, comm);
}

/* The run resumed from `step`: newer checkpoints of ckpt_dir belong to an
 * abandoned line (see ckpt_abandon_after). Collective; 0 or -1. */
static int resume_abandon(const char *ckpt_dir, int step, MPI_Comm comm) {
    int rank = 0, rc = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    Err err;
    if (rank == 0) rc = ckpt_abandon_after(ckpt_dir, step, &err);
    return cmd_agree(rc, &err, comm);
}

int resume_run(const Config *cfg, const char *ckpt_dir, Model *m, AdamW *opt, int *start,
               CkptRunState *rs, MPI_Comm comm) {
    if (strcmp(cfg->resume, "never") == 0) return 0;
    int fatal = 0;
    if (resume_prepare(ckpt_dir, comm) != 0) return -1;
    if (strcmp(cfg->resume, "auto") != 0) {
        char dir[1100];
        Err err;
        if (ckpt_resolve(cfg->resume, dir, sizeof dir, &err) != 0) {
            err_print(&err);
            return -1;
        }
        if (try_resume(dir, cfg, m, opt, start, rs, comm, &fatal))
            return resume_abandon(ckpt_dir, *start, comm) == 0 ? 1 : -1;
        errorf("resume: cannot resume from '%s' (see above)", cfg->resume);
        return -1;
    }
    char **names;
    int n = ckpt_list_steps(ckpt_dir, &names), r = 0;
    for (int i = 0; i < n && r == 0 && !fatal; i++) {
        char dir[1100];
        snprintf(dir, sizeof dir, "%s/%s", ckpt_dir, names[i]);
        r = try_resume(dir, cfg, m, opt, start, rs, comm, &fatal);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (fatal) return -1;
    if (n > 0 && r == 0) {
        errorf("resume: none of the %d checkpoints in '%s' loads (see above); move them away, "
               "or set resume = never or a ckpt_dir of its own",
               n, ckpt_dir);
        return -1;
    }
    if (r == 1 && resume_abandon(ckpt_dir, *start, comm) != 0) return -1;
    return r;
}
