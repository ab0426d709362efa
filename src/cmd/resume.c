/*
 * resume: restoring a training run from its checkpoints, newest first,
 * with every rank agreeing on which one loaded.
 */
#include <string.h>

#include "checkpoint/ckpt.h"
#include "mpi/check.h"
#include "src/cmd/cmd.h"

/* Tries one checkpoint: its config must match the run's (a mismatch is the
 * user's error, not a damaged checkpoint: *fatal is set), then every rank
 * loads its slices. Returns 1 when all ranks loaded it. */
static int try_resume(const char *dir, const Config *cfg, Model *m, AdamW *opt, int *start,
                      MPI_Comm comm, int *fatal) {
    Config ck = *cfg;
    Err err = {""};
    int step = 0, had_m = 0;
    int ok = ckpt_read_config(dir, &ck, &step, &err) == 0;
    if (ok && ckpt_check_model_config(&ck, cfg, dir, &err) != 0) {
        err_print(&err);
        *fatal = 1;
        return 0;
    }
    if (ok) ok = ckpt_load(dir, m, opt, &had_m, &err) == 0;
    int all = 0;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm));
    if (!all) {
        if (!ok) errorf("resume: skipping %s: %s", dir, err.msg);
        return 0;
    }
    *start = step;
    log0("resume: loaded %s (step %d)%s\n", dir, step,
         had_m ? "" : "; it has no optimizer state, so AdamW starts from zero moments");
    return 1;
}

int resume_run(const Config *cfg, const char *ckpt_dir, Model *m, AdamW *opt, int *start,
               MPI_Comm comm) {
    if (strcmp(cfg->resume, "never") == 0) return 0;
    int fatal = 0;
    if (strcmp(cfg->resume, "auto") != 0) {
        char dir[1100];
        Err err;
        if (ckpt_resolve(cfg->resume, dir, sizeof dir, &err) != 0) {
            err_print(&err);
            return -1;
        }
        if (try_resume(dir, cfg, m, opt, start, comm, &fatal)) return 1;
        errorf("resume: cannot resume from '%s' (see above)", cfg->resume);
        return -1;
    }
    char **names;
    int n = ckpt_list_steps(ckpt_dir, &names), r = 0;
    for (int i = 0; i < n && r == 0 && !fatal; i++) {
        char dir[1100];
        snprintf(dir, sizeof dir, "%s/%s", ckpt_dir, names[i]);
        r = try_resume(dir, cfg, m, opt, start, comm, &fatal);
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
    return r;
}
