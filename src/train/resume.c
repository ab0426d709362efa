/*
 * resume: restoring a training run from its checkpoints, newest first,
 * with every rank agreeing on which one loaded; a rollback's reload; and
 * init_from, a new run from another run's weights (Megatron's --finetune).
 * What it has to say goes through a Say; a failure comes back in an Err.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/ckpt.h"
#include "src/base/files.h"
#include "mpi/check.h"
#include "src/base/fault.h"
#include "src/train/run.h"

/* Tries one checkpoint: its config must match the run's (a mismatch is the
 * user's error, not a damaged checkpoint: *fatal is set, and *fatal_err
 * says it), then every rank loads its slices. Returns 1 when all ranks
 * loaded it. */
static int try_resume(const char *dir, const Config *cfg, Model *m, AdamW *opt, int *start,
                      CkptRunState *rs, MPI_Comm comm, int *fatal, const Say *say,
                      Err *fatal_err) {
    Config ck = *cfg;
    Err err = {""};
    int step = 0, had_m = 0;
    int ok = ckpt_read_config(dir, &ck, &step, &err) == 0;
    if (ok && ckpt_check_model_config(&ck, cfg, dir, &err) != 0) {
        *fatal_err = err;
        *fatal = 1;
        return 0;
    }
    CkptRunState got = {0};
    if (ok) ok = ckpt_read_run_state(dir, &got, &err) == 0;
    fault_progress(); /* a load is progress for the watchdog, however long */
    if (ok) ok = ckpt_load(dir, m, opt, &had_m, &err) == 0;
    fault_progress();
    int all = 0;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm));
    if (!all) {
        if (!ok) say_error(say, "resume: skipping %s: %s", dir, err.msg);
        ckpt_run_state_free(&got);
        return 0;
    }
    *start = step;
    ckpt_run_state_free(rs);
    *rs = got;
    say_log(say, "resume: loaded %s (step %d)%s\n", dir, step,
         had_m ? "" : "; it has no optimizer state, so AdamW starts from zero moments");
    return 1;
}

/* Rank 0 puts right what interrupted saves left in ckpt_dir, and refuses
 * to start over where `latest` names a checkpoint that is gone and none
 * is left (they were moved or deleted: starting from scratch would
 * silently throw the run away). Collective; returns 0 or -1 with err set
 * (ranks_agree). */
static int resume_prepare(const char *ckpt_dir, MPI_Comm comm, Err *err) {
    int rank = 0, rc = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (rank == 0) {
        rc = ckpt_recover(ckpt_dir, NULL, err);
        char **names, p[1100];
        int n = ckpt_list_steps(ckpt_dir, &names);
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        snprintf(p, sizeof p, "%s/latest", ckpt_dir);
        Err rerr;
        char *latest = n == 0 && rc == 0 ? read_file(p, 4096, NULL, &rerr) : NULL;
        if (latest) {
            latest[strcspn(latest, "\r\n")] = '\0';
            rc = err_set(err,
                         "resume: '%s/latest' names '%.40s' but '%s' holds no checkpoint (moved "
                         "or deleted?); put them back, or set resume = never to start over",
                         ckpt_dir, latest, ckpt_dir);
            free(latest);
        }
    }
    return ranks_agree(rc, err, comm);
}

/* The run resumed from `step`: newer checkpoints of ckpt_dir belong to an
 * abandoned line (see ckpt_abandon_after). Collective; 0 or -1 with err
 * set (ranks_agree). */
static int resume_abandon(const char *ckpt_dir, int step, const char *run_id, MPI_Comm comm,
                          Err *err) {
    int rank = 0, rc = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (rank == 0) rc = ckpt_abandon_after(ckpt_dir, step, run_id, err);
    return ranks_agree(rc, err, comm);
}

/* resume = never: a new line starts in ckpt_dir, so the checkpoints already
 * there (another run's, or this one's before) move to abandoned/, out of
 * the sight of a later resume = auto and of pruning, nothing deleted.
 * Collective; 0 or -1 with err set (ranks_agree). */
static int resume_never(const char *ckpt_dir, MPI_Comm comm, const Say *say, Err *err) {
    int rank = 0, rc = 0, moved = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (rank == 0) {
        rc = ckpt_recover(ckpt_dir, NULL, err);
        if (rc == 0) rc = ckpt_abandon_all(ckpt_dir, &moved, err);
        if (rc == 0 && moved)
            say_log(say, "resume: resume = never: the %d checkpoint%s already in '%s' moved to "
                 "'%s/abandoned/' (a new run starts there)\n",
                 moved, moved == 1 ? "" : "s", ckpt_dir, ckpt_dir);
    }
    return ranks_agree(rc, err, comm);
}

/* The checkpoints of one line in ckpt_dir, newest first (malloc'd names,
 * NULL when none): line `want`, or ("") the line of the checkpoint
 * `latest` names, else of the newest whose index reads. A line's are
 * those recording its run id or none (older than lines), and those whose
 * index does not read (resume passes over them, saying why). *others
 * counts the checkpoints of other lines, which are left alone. Returns the
 * count. */
static int line_checkpoints(const char *ckpt_dir, const char *want, char ***out, int *others) {
    char **names, p[1100], line[CKPT_RUN_ID] = "";
    int n = ckpt_list_steps(ckpt_dir, &names), k = 0;
    char(*ids)[CKPT_RUN_ID] = xcalloc((size_t)n + 1, sizeof *ids);
    int *readable = xcalloc((size_t)n + 1, sizeof(int));
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", ckpt_dir, names[i]);
        readable[i] = ckpt_read_run_id(p, ids[i]) == 0;
    }
    if (want[0]) snprintf(line, sizeof line, "%s", want);
    else {
        snprintf(p, sizeof p, "%s/latest", ckpt_dir);
        Err e;
        char *head = read_file(p, 4096, NULL, &e);
        int found = -1;
        if (head) head[strcspn(head, "\r\n")] = '\0';
        for (int i = 0; head && i < n; i++)
            if (strcmp(names[i], head) == 0 && readable[i]) found = i;
        for (int i = 0; found < 0 && i < n; i++)
            if (readable[i]) found = i;
        if (found >= 0) snprintf(line, sizeof line, "%s", ids[found]);
        free(head);
    }
    *out = NULL;
    *others = 0;
    for (int i = 0; i < n; i++) {
        if (!readable[i] || ckpt_same_line(ids[i], line)) {
            *out = xrealloc(*out, (size_t)(k + 1) * sizeof(char *));
            (*out)[k++] = names[i];
        } else {
            ++*others;
            free(names[i]);
        }
    }
    free(names);
    free(ids);
    free(readable);
    return k;
}

/* Tries the checkpoints of a line of ckpt_dir newest first, those with a
 * step outside [lo, hi] left out; fills loaded. Returns try_resume's
 * result for the one that loads (0: none, or *fatal with err set). */
static int try_line(const char *ckpt_dir, const char *want, int lo, int hi, const Config *cfg,
                    Model *m, AdamW *opt, int *start, CkptRunState *rs, char *loaded, size_t ln,
                    MPI_Comm comm, int *fatal, int *tried, const Say *say, Err *err) {
    char **names;
    int others = 0, r = 0;
    const int n = line_checkpoints(ckpt_dir, want, &names, &others);
    if (others > 0)
        say_log(say, "resume: left alone %d checkpoint%s of another run in '%s'\n", others,
             others == 1 ? "" : "s", ckpt_dir);
    *tried = 0;
    for (int i = 0; i < n && r == 0 && !*fatal; i++) {
        long long step = -1; /* step-NNNNNNNN, as listed: 8 digits */
        if (parse_i64(names[i] + 5, 0, CONFIG_MAX_STEP, &step) != 0 || step < lo || step > hi)
            continue;
        snprintf(loaded, ln, "%s/%s", ckpt_dir, names[i]);
        ++*tried;
        r = try_resume(loaded, cfg, m, opt, start, rs, comm, fatal, say, err);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!r) loaded[0] = '\0';
    return r;
}

/* Restores a run from a checkpoint as cfg->resume says:
 * - auto: the newest checkpoint of ckpt_dir's line that loads (the line of
 *   the one `latest` names: it, or a newer one of the same run id that a
 *   save killed before `latest` left; then older ones of the line);
 *   another run's checkpoints are never loaded;
 * - never: a fresh start, the checkpoints already in ckpt_dir moved to
 *   ckpt_dir/abandoned/;
 * - a path: that checkpoint.
 * Collective over comm. Returns 1 loaded (*start = its step, *rs its run
 * state, loaded[ln] its directory), 0 start fresh, -1 an error (err set). */
int resume_run(const Config *cfg, const char *ckpt_dir, Model *m, AdamW *opt, int *start,
               CkptRunState *rs, char *loaded, size_t ln, MPI_Comm comm, const Say *say,
               Err *err) {
    loaded[0] = '\0';
    if (strcmp(cfg->resume, "never") == 0) return resume_never(ckpt_dir, comm, say, err);
    int fatal = 0;
    if (resume_prepare(ckpt_dir, comm, err) != 0) return -1;
    if (strcmp(cfg->resume, "auto") != 0) {
        char dir[1100];
        if (ckpt_resolve(cfg->resume, dir, sizeof dir, err) != 0) return -1;
        if (try_resume(dir, cfg, m, opt, start, rs, comm, &fatal, say, err)) {
            snprintf(loaded, ln, "%s", dir);
            return resume_abandon(ckpt_dir, *start, rs->run_id, comm, err) == 0 ? 1 : -1;
        }
        if (fatal) say_error(say, "%s", err->msg);
        return err_set(err, "resume: cannot resume from '%s' (see above)", cfg->resume);
    }
    int tried = 0;
    const int r = try_line(ckpt_dir, "", 0, CONFIG_MAX_STEP, cfg, m, opt, start, rs, loaded, ln,
                           comm, &fatal, &tried, say, err);
    if (fatal) return -1;
    if (tried > 0 && r == 0)
        return err_set(err,
                       "resume: none of the %d checkpoints in '%s' loads (see above); move them "
                       "away, or set resume = never or a ckpt_dir of its own",
                       tried, ckpt_dir);
    if (r == 1 && resume_abandon(ckpt_dir, *start, rs->run_id, comm, err) != 0) return -1;
    return r;
}

/* A rollback's reload: `last` (the checkpoint this run loaded or committed
 * last), or when it no longer loads the newest of line run_id in ckpt_dir;
 * only a step in [lo, hi] (the run's start, the current step) is taken.
 * Collective. Returns 1 (*step, *rs, last[ln] the one loaded), 0 when last
 * is "" (nothing loaded or saved yet: the caller re-initialises), or -1
 * with err set. */
int rollback_run(const Config *cfg, const char *ckpt_dir, char *last, size_t ln,
                 const char *run_id, int lo, int hi, Model *m, AdamW *opt, int *step,
                 CkptRunState *rs, MPI_Comm comm, const Say *say, Err *err) {
    if (!last[0]) return 0;
    int fatal = 0, at = -1, tried = 0;
    Config ck = *cfg;
    Err why;
    /* the checkpoint's own record of its step, not its name, is checked */
    if (ckpt_read_config(last, &ck, &at, &why) == 0 && (at < lo || at > hi))
        return err_set(err,
                       "rollback: '%s' holds step %d, outside this run's steps %d-%d that a "
                       "rollback may return to; stopping rather than train from another state",
                       last, at, lo, hi);
    if (try_resume(last, cfg, m, opt, step, rs, comm, &fatal, say, err)) return 1;
    if (fatal) return -1;
    if (try_line(ckpt_dir, run_id, lo, hi, cfg, m, opt, step, rs, last, ln, comm, &fatal, &tried,
                 say, err))
        return 1;
    if (!fatal)
        err_set(err,
                "rollback: neither '%s' nor any checkpoint of this run in '%s' between steps %d "
                "and %d loads (see above)",
                last, ckpt_dir, lo, hi);
    return -1;
}

/* ------------------------------------------------------------- init_from */

enum { SRC_CKPT, SRC_ST, SRC_HF };

/* What init_from names: a safetensors file (SRC_ST, dir = the path), a
 * Hugging Face folder (SRC_HF: a config.json in it) or a checkpoint's step
 * directory (SRC_CKPT: a ckpt_dir's newest). Returns 0, or -1 with err
 * set. */
static int init_locate(const char *arg, char *dir, size_t n, int *kind, Err *err) {
    struct stat st;
    char cj[4200];
    snprintf(cj, sizeof cj, "%s/config.json", arg);
    *kind = stat(arg, &st) == 0 && S_ISREG(st.st_mode) ? SRC_ST
            : stat(cj, &st) == 0                       ? SRC_HF
                                                       : SRC_CKPT;
    if (*kind != SRC_CKPT) {
        snprintf(dir, n, "%s", arg);
        return 0;
    }
    if (ckpt_resolve(arg, dir, n, err) == 0) return 0;
    Err why = *err;
    return err_set(err,
                   "init_from: %s (name a checkpoint, a ckpt_dir, a safetensors file or a "
                   "Hugging Face folder)",
                   why.msg);
}

/* Whether step directory stepdir lies in ckpt_dir: the same folder by
 * device and inode, once every link and "." or ".." of the path is
 * resolved (ck/step-N/. and a link to ck/step-N are ck's too). */
static int in_ckpt_dir(const char *stepdir, const char *ckpt_dir) {
    char *real = realpath(stepdir, NULL);
    if (!real) return 0;
    char *slash = strrchr(real, '/');
    if (slash == real) slash[1] = '\0';
    else if (slash) *slash = '\0';
    struct stat a, b;
    const int same = stat(real, &a) == 0 && stat(ckpt_dir, &b) == 0 && a.st_dev == b.st_dev &&
                     a.st_ino == b.st_ino;
    free(real);
    return same;
}

/* init_from, before resume_run: refuses a checkpoint of the run's own
 * ckpt_dir, whose step names a new run would collide with. Collective; 0,
 * or -1 with err set (ranks_agree). */
int init_from_check(const Config *cfg, const char *ckpt_dir, MPI_Comm comm, Err *err) {
    if (!cfg->init_from[0]) return 0;
    char dir[1100];
    int kind = 0, rc = 0;
    Err why;
    /* one that does not resolve may be gone from a requeued job: resume decides */
    if (init_locate(cfg->init_from, dir, sizeof dir, &kind, &why) == 0 && kind == SRC_CKPT &&
        in_ckpt_dir(dir, ckpt_dir))
        rc = err_set(err,
                     "init_from: '%s' is a checkpoint of this run's own ckpt_dir '%s'; a new run "
                     "from it needs a ckpt_dir of its own (set ckpt_dir or run_dir), so that step "
                     "names never collide, or leave init_from out to resume it",
                     cfg->init_from, ckpt_dir);
    return ranks_agree(rc, err, comm);
}

/* Whether model key `key` may differ between init_from's model src and the
 * run's: what trains (train_only); a dense source's routing (a
 * Mixture-of-Depths run from a dense model: its routers and predictors
 * start fresh); a Hugging Face folder's
 * tokenizer, which its config.json does not say, and a llama's seq_len up
 * to the source's (no tensor depends on it). */
static int may_differ(const char *key, const Config *src, const Config *run, int hf) {
    static const char *const routing[] = {"route_every", "capacity", "router_gate", "causal_router",
                                          "predictor_hidden"};
    for (size_t i = 0; src->route_every == 0 && i < sizeof routing / sizeof routing[0]; i++)
        if (strcmp(key, routing[i]) == 0) return 1;
    if (hf && (strcmp(key, "tokenizer") == 0 || strcmp(key, "tokenizer_hash") == 0)) return 1;
    if (strcmp(key, "train_only") == 0) return 1; /* what trains next is the run's to say */
    return strcmp(key, "seq_len") == 0 && src->arch == ARCH_LLAMA && run->seq_len <= src->seq_len;
}

/* Every model key of `src` (a config read from init_from) equals the run's,
 * but those that may differ. Returns 0, or -1 with err naming the first
 * that differs. */
static int init_same_model(const Config *src, const Config *run, const char *path, int hf,
                           Err *err) {
    const char *key;
    for (int i = 0; (key = config_model_key(i)); i++) {
        char a[128], b[128];
        config_model_value(src, key, a, sizeof a);
        config_model_value(run, key, b, sizeof b);
        if (strcmp(a, b) != 0 && !may_differ(key, src, run, hf))
            return err_set(err,
                           "init_from: '%s' has %s = %s but this run has %s = %s (the model must "
                           "be the source's: set %s = %s)",
                           path, key, a, key, b, key, a);
    }
    return 0;
}

/* The model keys a safetensors file's metadata records must be the run's
 * (those it lacks, as GPT-2's own files lack n_head, are the run's), and
 * its tensors the whole model's. Returns 0, or -1 with err set. */
static int init_check_st(const StFile *f, const Config *run, const ModelDims *d, int *fresh,
                         Err *err) {
    Config src = *run;
    const char *key;
    for (int i = 0; (key = config_model_key(i)); i++) {
        const char *v = st_meta(f, key);
        if (v && config_set(&src, key, v, f->path, err) != 0) return -1;
    }
    if (init_same_model(&src, run, f->path, 0, err) != 0) return -1;
    *fresh = src.route_every == 0 && run->route_every > 0;
    ModelDims whole = *d;
    model_dims_whole(&whole);
    Err why;
    if (ckpt_check_safetensors(f, &whole, *fresh, &why) == 0) return 0;
    return err_set(err, "init_from: %s", why.msg);
}

/* Loads init_from's weights into m (this rank's slices, from any layout):
 * 0, or -1 with err set; *step is the source's step. A dense source of a
 * Mixture-of-Depths run leaves the routers and predictors as initialised. */
static int init_load(const Config *cfg, Model *m, char *dir, size_t n, int *step, Err *err) {
    int kind = 0;
    *step = 0;
    if (init_locate(cfg->init_from, dir, n, &kind, err) != 0) return -1;
    if (kind == SRC_CKPT) {
        Config src = *cfg;
        if (ckpt_read_config(dir, &src, step, err) != 0) return -1;
        if (init_same_model(&src, cfg, dir, 0, err) != 0) return -1;
        return ckpt_load_weights(dir, m, src.route_every == 0 && cfg->route_every > 0, err);
    }
    if (kind == SRC_HF) {
        HfFolder h;
        if (hf_open(&h, dir, err) != 0) return -1;
        int rc = init_same_model(&h.cfg, cfg, dir, 1, err);
        const char *s = st_meta(&h.f[0], "step"); /* modtrain's own export says it */
        long long v = 0;
        if (s && parse_i64(s, 0, CONFIG_MAX_STEP, &v) == 0) *step = (int)v;
        if (rc == 0) rc = hf_load(&h, m, err);
        hf_close(&h);
        if (rc != 0 && strncmp(err->msg, "init_from", 9) != 0) {
            Err why = *err;
            err_set(err, "init_from: %s", why.msg);
        }
        return rc;
    }
    StFile f;
    if (st_read(&f, dir, err) != 0) return -1;
    int fresh = 0, rc = init_check_st(&f, cfg, &m->d, &fresh, err);
    const char *s = st_meta(&f, "step");
    long long v = 0;
    if (s && parse_i64(s, 0, CONFIG_MAX_STEP, &v) == 0) *step = (int)v;
    if (rc == 0) rc = ckpt_load_safetensors(&f, m, fresh, err);
    st_free(&f);
    return rc;
}

/* init_from, after resume_run (resumed: its result, start: the step it
 * loaded; -1: a rollback before the first save, which loads the weights
 * again): a resumed run says that init_from is ignored; a new one loads
 * only the weights of init_from (a checkpoint or ckpt_dir under any
 * layout, or a GPT-2 safetensors file), whose model must be cfg's, and
 * leaves the moments as they are. Collective; 0, or -1 with err set
 * (ranks_agree). */
int init_from_load(const Config *cfg, const char *ckpt_dir, Model *m, int resumed, int start,
                   MPI_Comm comm, const Say *say, Err *err) {
    if (!cfg->init_from[0]) return 0;
    if (resumed > 0) {
        say_log(say, "init_from: ckpt_dir '%s' holds this run's own checkpoints: resumed at step %d; "
             "init_from '%s' is ignored\n",
             ckpt_dir, start, cfg->init_from);
        return 0;
    }
    char dir[1100];
    int step = 0;
    int rc = init_load(cfg, m, dir, sizeof dir, &step, err);
    if (ranks_agree(rc, err, comm) != 0) return -1;
    if (resumed < 0) say_log(say, "init_from: rolled back to the weights of %s\n", dir);
    else
        say_log(say, "init_from: the weights of %s (step %d of its run) start a new run at step 0: "
             "fresh AdamW moments, the lr schedule from its start, train_data from sample 0\n",
             dir, step);
    return 0;
}
