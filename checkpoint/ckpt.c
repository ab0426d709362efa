/*
 * ckpt: the model's view of checkpoints: registry rows become ckio slices,
 * training state becomes key/value lines, and the commit protocol (tmp
 * directory, fsync, rename, `latest`, pruning) lives here.
 */
#include "checkpoint/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "mpi/check.h"
#include "src/base/fault.h"
#include "src/base/files.h"
#include "src/base/util.h"
#include "src/kernels/kernels.h"
#include "checkpoint/ckio.h"
#include "checkpoint/safetensors.h"

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---------------------------------------------------------------- slices */

/* Who else holds the same data as this rank, for sharing the writing. */
typedef struct {
    int dp, dp_rank;
} Replicas;

/* The holders of registry row p's data on this rank (see CkSlice): the dp
 * replicas of its slice (group 0); for a tensor replicated across tp, also
 * every tp rank (group 1); for the tied embedding, also the other stage's
 * copy (group 2). An expert's replicas are the dp / ep ranks holding it
 * (groups 4 and 5, so that their tallies stay apart from the tensors every
 * dp rank holds). */
static void share_of(const Model *m, const ParamInfo *p, const Replicas *r, CkSlice *s) {
    const ModelDims *d = &m->d;
    if (p->expert >= 0) {
        const int dp = r->dp / d->ep, dp_rank = r->dp_rank / d->ep;
        const int tp = p->split_dim < 0 ? d->tp : 1;
        s->group = p->split_dim < 0 ? 5 : 4;
        s->holders = dp * tp;
        s->holder = dp_rank * tp + (tp > 1 ? d->tp_rank : 0);
    } else if (p->tied) {
        const int copies = d->pp > 1 ? 2 : 1;
        s->group = 2;
        s->holders = r->dp * copies;
        s->holder = r->dp_rank * copies + (copies == 2 && !model_first_stage(d));
    } else if (p->split_dim < 0) {
        s->group = 1;
        s->holders = r->dp * d->tp;
        s->holder = r->dp_rank * d->tp + d->tp_rank;
    } else {
        s->group = 0;
        s->holders = r->dp;
        s->holder = r->dp_rank;
    }
}

/* This rank's pieces of every registry row in buffer `base` (laid out like
 * m->params), named prefix/name, with the real rows only (padded
 * vocabulary rows are not saved); with r, each says who shares its
 * writing. Returns the count; out holds at most 3 * nreg. */
static int model_slices(const Model *m, float *base, const char *prefix, const Replicas *r,
                        CkSlice *out) {
    int n = 0;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        int blocks = p->split_dim < 0 ? 1 : p->split_blocks;
        for (int b = 0; b < blocks; b++) {
            CkSlice *s = &out[n];
            memset(s, 0, sizeof *s);
            snprintf(s->name, sizeof s->name, "%s/%s", prefix, p->name);
            s->ndim = p->ndim;
            s->rows = p->vocab_rows;
            s->cols = p->shape[1];
            s->ld = p->lshape[1];
            s->r0 = 0, s->nr = p->shape[0], s->c0 = 0, s->nc = p->shape[1];
            s->data = base + p->offset;
            if (p->split_dim == 0) {
                int64_t g = p->shape[0] / blocks, l = g / m->d.tp;
                s->r0 = b * g + (int64_t)m->d.tp_rank * l;
                s->nr = l;
                s->data = base + p->offset + (size_t)(b * l) * p->lshape[1];
            } else if (p->split_dim == 1) {
                int64_t g = p->shape[1] / blocks, l = g / m->d.tp;
                s->c0 = b * g + (int64_t)m->d.tp_rank * l;
                s->nc = l;
                s->data = base + p->offset + b * l;
            }
            /* padded vocabulary rows are not saved */
            if (s->r0 >= s->rows) continue;
            if (s->r0 + s->nr > s->rows) s->nr = s->rows - s->r0;
            if (r) share_of(m, p, r, s);
            n++;
        }
    }
    return n;
}

/* A rectangle of registry row p's local rows [i0, i0 + nr) and columns
 * [j0, j1), its first element at `data` (row stride p's local width), as
 * global slices: one per tp block it touches, padded vocabulary rows left
 * out. Returns the count added to out. */
static int rect_slices(const Model *m, const ParamInfo *p, float *data, const char *prefix,
                       int64_t i0, int64_t nr, int64_t j0, int64_t j1, CkSlice *out) {
    const int blocks = p->split_dim < 0 ? 1 : p->split_blocks;
    const int64_t ld = p->lshape[1];
    int n = 0;
    for (int b = 0; b < blocks; b++) {
        int64_t r0 = i0, rn = nr, c0 = j0, cn = j1 - j0;
        float *at = data;
        if (p->split_dim == 0) { /* block b's local rows [b l, (b + 1) l) */
            const int64_t l = p->lshape[0] / blocks, g = p->shape[0] / blocks;
            const int64_t a = i0 > b * l ? i0 : b * l, e = i0 + nr < (b + 1) * l ? i0 + nr : (b + 1) * l;
            if (a >= e) continue;
            r0 = b * g + (int64_t)m->d.tp_rank * l + (a - b * l), rn = e - a;
            at = data + (a - i0) * ld;
        } else if (p->split_dim == 1) { /* block b's local columns */
            const int64_t l = ld / blocks, g = p->shape[1] / blocks;
            const int64_t a = j0 > b * l ? j0 : b * l, e = j1 < (b + 1) * l ? j1 : (b + 1) * l;
            if (a >= e) continue;
            c0 = b * g + (int64_t)m->d.tp_rank * l + (a - b * l), cn = e - a;
            at = data + (a - j0);
        }
        if (r0 >= p->vocab_rows) continue; /* padded vocabulary rows are not saved */
        if (r0 + rn > p->vocab_rows) rn = p->vocab_rows - r0;
        CkSlice *s = &out[n++];
        memset(s, 0, sizeof *s);
        snprintf(s->name, sizeof s->name, "%s/%s", prefix, p->name);
        s->ndim = p->ndim;
        s->rows = p->vocab_rows;
        s->cols = p->shape[1];
        s->ld = ld;
        s->r0 = r0, s->nr = rn, s->c0 = c0, s->nc = cn;
        s->data = at;
    }
    return n;
}

/* This rank's pieces of a buffer sharded as sh (ZeRO-1's moments: sh's
 * ranges of the flat buffer back to back in `base`), named prefix/name:
 * each range's part of each tensor as rectangles (a partial first row,
 * whole rows, a partial last row), with w, each says who shares its
 * writing: nobody over dp (the shards are disjoint), the tp ranks of a
 * replicated tensor and the tied embedding's two copies as usual. Returns
 * the count; out holds at most shard_slices_cap. */
static int shard_slices(const Model *m, float *base, const char *prefix, const ZeroShard *sh,
                        int with_share, CkSlice *out) {
    int n = 0;
    size_t at = 0;
    for (int k = 0; k < sh->n; k++) {
        for (int i = 0; i < m->nreg; i++) {
            const ParamInfo *p = &m->reg[i];
            const size_t a = p->offset > sh->lo[k] ? p->offset : sh->lo[k];
            const size_t e = p->offset + p->numel < sh->hi[k] ? p->offset + p->numel : sh->hi[k];
            if (a >= e) continue;
            const int64_t ld = p->lshape[1], x0 = (int64_t)(a - p->offset), x1 = (int64_t)(e - p->offset);
            float *d = base + at + (a - sh->lo[k]);
            const int first = n;
            int64_t x = x0;
            if (x % ld) { /* the partial first row */
                const int64_t j1 = x1 - x / ld * ld < ld ? x1 - x / ld * ld : ld;
                n += rect_slices(m, p, d, prefix, x / ld, 1, x % ld, j1, out + n);
                d += j1 - x % ld, x += j1 - x % ld;
            }
            if (x1 / ld > x / ld) { /* whole rows */
                const int64_t rows = x1 / ld - x / ld;
                n += rect_slices(m, p, d, prefix, x / ld, rows, 0, ld, out + n);
                d += rows * ld, x += rows * ld;
            }
            if (x < x1) n += rect_slices(m, p, d, prefix, x / ld, 1, 0, x1 - x, out + n);
            const Replicas solo = {p->expert >= 0 ? m->d.ep : 1, 0};
            for (int q = first; q < n && with_share; q++) share_of(m, p, &solo, &out[q]);
        }
        at += sh->hi[k] - sh->lo[k];
    }
    return n;
}

/* Room for shard_slices of sh: 3 rectangles of 3 blocks a range's part of a tensor. */
static size_t shard_slices_cap(const Model *m, const ZeroShard *sh) {
    return 9 * ((size_t)m->nreg + (size_t)sh->n);
}

/* ------------------------------------------------------------------ save */

/* The names in a ckpt_dir that are not checkpoints but what a save, a
 * prune or a replacement left when interrupted: step-NNNNNNNN.tmp (a save
 * not committed), .old (the checkpoint a re-save of its step replaces),
 * .del (one being pruned), each perhaps with a suffix, and latest.tmp.PID.
 * Returns the kind's letter ('t', 'o', 'd', 'l') or 0. */
static int leftover_kind(const char *name) {
    if (strncmp(name, "latest.tmp.", 11) == 0 || strncmp(name, "probe.tmp.", 10) == 0) return 'l';
    if (strncmp(name, "step-", 5) != 0 || strspn(name + 5, "0123456789") != 8) return 0;
    const char *k = name + 13;
    if (strncmp(k, ".tmp", 4) == 0 && (!k[4] || k[4] == '.')) return 't';
    if (strncmp(k, ".old", 4) == 0 && (!k[4] || k[4] == '.')) return 'o';
    if (strncmp(k, ".del", 4) == 0 && (!k[4] || k[4] == '.')) return 'd';
    return 0;
}

/* Removes directory dir and every file in it: a checkpoint's two, and
 * whatever an interrupted write left (index.tmp.PID, NFS's .nfsXXXX).
 * Nothing is entered through a symbolic link: a dir that is one is
 * unlinked itself, and so is a link inside it (what it names stays).
 * Each unlink and the rmdir are fault points WHAT.unlink, WHAT.rmdir.
 * Returns 0 (dir gone, or never there) or -1 with errno. */
static int rm_dir_tree(const char *what, const char *dir) {
    char point[64], p[1400];
    snprintf(point, sizeof point, "%s.unlink", what);
    DIR *d = opendir_nofollow(dir);
    if (!d && errno == ENOTDIR) return fp_unlink(point, dir) == 0 || errno == ENOENT ? 0 : -1;
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (fp_unlink(point, p) == 0 || errno == ENOENT) continue;
            if ((errno != EISDIR && errno != EPERM) || rm_dir_tree(what, p) != 0) rc = -1;
        }
    const int e0 = errno;
    closedir(d);
    snprintf(point, sizeof point, "%s.rmdir", what);
    if (rc == 0 && fp_rmdir(point, dir) != 0 && errno != ENOENT) return -1;
    if (rc != 0) errno = e0;
    return rc;
}

static int cmp_desc(const void *a, const void *b) {
    return strcmp(*(char *const *)b, *(char *const *)a);
}

int ckpt_list_steps(const char *ckpt_dir, char ***names) {
    *names = NULL;
    DIR *d = opendir(ckpt_dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        /* step-NNNNNNNN exactly: .tmp and .old directories are not checkpoints */
        if (strncmp(e->d_name, "step-", 5) != 0 || strlen(e->d_name) != 13 ||
            strspn(e->d_name + 5, "0123456789") != 8)
            continue;
        /* a symbolic link (to share another run's checkpoint, say) is not
         * this directory's: never loaded, counted or pruned */
        char p[1100];
        snprintf(p, sizeof p, "%s/%s", ckpt_dir, e->d_name);
        if (!is_real_dir(p)) continue;
        *names = xrealloc(*names, (size_t)(n + 1) * sizeof(char *));
        (*names)[n++] = xstrdup(e->d_name);
    }
    closedir(d);
    if (n > 1) qsort(*names, (size_t)n, sizeof(char *), cmp_desc); /* NULL when none */
    return n;
}

int ckpt_recover(const char *ckpt_dir, const char *keep_tmp, Err *err) {
    DIR *d = opendir(ckpt_dir);
    if (!d) return 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        const int kind = leftover_kind(e->d_name);
        if (!kind || (keep_tmp && strcmp(e->d_name, keep_tmp) == 0)) continue;
        char p[1100], fin[1100];
        snprintf(p, sizeof p, "%s/%s", ckpt_dir, e->d_name);
        snprintf(fin, sizeof fin, "%s/%.13s", ckpt_dir, e->d_name);
        if (kind == 'o' && !is_real_dir(fin) && is_real_dir(p)) {
            /* a re-save of this step stopped between its two renames: the
             * checkpoint it was replacing is the step's only copy */
            if (fp_rename("recover.rename", p, fin) == 0) continue;
        }
        const int r = kind == 'l' ? fp_unlink("recover.unlink", p) : rm_dir_tree("recover", p);
        if (r != 0 && errno != ENOENT && rc == 0)
            rc = err_set(err, "ckpt: cannot remove '%s' (left by an interrupted save): %s", p,
                         strerror(errno));
    }
    closedir(d);
    return rc;
}

int ckpt_same_line(const char *have, const char *want) {
    return !have[0] || !want[0] || strcmp(have, want) == 0;
}

/* Whether checkpoint dir (readable) belongs to a line other than run_id. */
static int other_line(const char *dir, const char *run_id) {
    char id[CKPT_RUN_ID];
    return ckpt_read_run_id(dir, id) == 0 && !ckpt_same_line(id, run_id);
}

/* Removes all but the newest `keep` checkpoints of line run_id; never the
 * one named keep_name, nor one of another line or one whose index does not
 * read (it may be anyone's: kept, not counted). A checkpoint is first
 * renamed out of the step-NNNNNNNN namespace, then emptied, so a process
 * killed while pruning leaves no half-deleted checkpoint behind, only a
 * .del directory the next save clears. Returns 0 or -1 with err set (the
 * first failure). */
static int prune(const char *dir, int keep, const char *keep_name, const char *run_id, Err *err) {
    char **names;
    int n = ckpt_list_steps(dir, &names), rc = 0, mine = 0;
    for (int i = 0; i < n; i++) {
        char p[1100], q[1200], id[CKPT_RUN_ID];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        const int ours = strcmp(names[i], keep_name) == 0 ||
                         (ckpt_read_run_id(p, id) == 0 && ckpt_same_line(id, run_id));
        if (ours && mine++ >= keep && strcmp(names[i], keep_name) != 0) {
            snprintf(q, sizeof q, "%s.del", p);
            if ((rm_dir_tree("prune.stale", q) != 0 || fp_rename("prune.rename", p, q) != 0 ||
                 rm_dir_tree("prune", q) != 0) &&
                rc == 0)
                rc = err_set(err, "ckpt: cannot prune '%s': %s", p, strerror(errno));
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

/* Moves ckpt_dir/name to ckpt_dir/abandoned/ (as name.1, name.2, ... when
 * that is taken). An `abandoned` that is not a directory of its own (a
 * link) is never moved into. Returns 0 or -1 with errno. */
static int abandon_one(const char *ckpt_dir, const char *name) {
    char from[1100], to[1200], parent[1100];
    snprintf(parent, sizeof parent, "%s/abandoned", ckpt_dir);
    snprintf(from, sizeof from, "%s/%s", ckpt_dir, name);
    snprintf(to, sizeof to, "%s/%s", parent, name);
    struct stat st;
    for (int k = 1; lstat(to, &st) == 0 && k < 1000; k++)
        snprintf(to, sizeof to, "%s/%s.%d", parent, name, k);
    if (fp_mkdir("abandon.mkdir", parent, 0755) != 0 && errno != EEXIST) return -1;
    if (!is_real_dir(parent)) {
        errno = ENOTDIR;
        return -1;
    }
    return fp_rename("abandon.rename", from, to);
}

/* Moves the checkpoints of line run_id ("": of any) in ckpt_dir newer than
 * step (all: step < 0) aside; *moved counts them. Returns 0 or -1 with err
 * set. */
static int abandon_newer(const char *ckpt_dir, int step, const char *run_id, int *moved,
                         Err *err) {
    char **names, mine[32] = "";
    int n = ckpt_list_steps(ckpt_dir, &names), rc = 0;
    if (step >= 0) snprintf(mine, sizeof mine, "step-%08d", step);
    *moved = 0;
    for (int i = 0; i < n; i++) {
        char p[1100];
        snprintf(p, sizeof p, "%s/%s", ckpt_dir, names[i]);
        if (strcmp(names[i], mine) > 0 && rc == 0 && !other_line(p, run_id)) {
            if (abandon_one(ckpt_dir, names[i]) == 0) ++*moved;
            else
                rc = err_set(err, "ckpt: cannot move '%s/%s' aside to '%s/abandoned/': %s",
                             ckpt_dir, names[i], ckpt_dir, strerror(errno));
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int ckpt_abandon_all(const char *ckpt_dir, int *moved, Err *err) {
    char latest[1100];
    if (abandon_newer(ckpt_dir, -1, "", moved, err) != 0) return -1;
    snprintf(latest, sizeof latest, "%s/latest", ckpt_dir);
    if (fp_unlink("latest.unlink", latest) != 0 && errno != ENOENT)
        return err_set(err, "ckpt: cannot remove '%s': %s", latest, strerror(errno));
    return 0;
}

int ckpt_abandon_after(const char *ckpt_dir, int step, const char *run_id, Err *err) {
    char latest[1100], line[40], mine[32];
    int moved = 0, rc = abandon_newer(ckpt_dir, step, run_id, &moved, err);
    if (rc != 0 || !moved) return rc;
    /* `latest` names this line's head again (or, when it lies elsewhere,
     * nothing: the directory's newest checkpoint is then the one named) */
    snprintf(mine, sizeof mine, "step-%08d", step);
    snprintf(latest, sizeof latest, "%s/latest", ckpt_dir);
    snprintf(line, sizeof line, "%s\n", mine);
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", ckpt_dir, mine);
    if (is_real_dir(p))
        rc = write_file_durable("latest", latest, line, strlen(line), err) < 0 ? -1 : 0;
    else if (fp_unlink("latest.unlink", latest) != 0 && errno != ENOENT)
        rc = err_set(err, "ckpt: cannot remove '%s': %s", latest, strerror(errno));
    return rc;
}

static int add_kv(CkKV *kv, int n, const char *key, const char *value) {
    snprintf(kv[n].key, sizeof kv[n].key, "%.63s", key);
    snprintf(kv[n].value, sizeof kv[n].value, "%s", value);
    return n + 1;
}

/* The value a checkpoint records for model key `key`: the config's, but the
 * vocabulary the model was built with (the config may say 0 = the data's). */
static void model_key_value(const Config *cfg, const Model *m, const char *key, char *v, size_t n) {
    if (strcmp(key, "vocab_size") == 0) snprintf(v, n, "%d", m->d.V);
    else config_get(cfg, key, v, n);
}

static int state_kv(const Config *cfg, const Model *m, int step, const CkptRunState *rs, int world,
                    CkKV *kv) {
    const CkptRunState none = {0};
    if (!rs) rs = &none;
    int n = 0;
    char v[256], k[80];
    const char *key;
    for (int i = 0; (key = config_model_key(i)); i++) {
        snprintf(k, sizeof k, "config.%s", key);
        model_key_value(cfg, m, key, v, sizeof v);
        n = add_kv(kv, n, k, v);
    }
    snprintf(v, sizeof v, "%d", step);
    n = add_kv(kv, n, "state.step", v);
    const long long samples =
        rs->samples ? rs->samples : ((long long)step + rs->batch_offset) * cfg->batch_size;
    snprintf(v, sizeof v, "%lld", samples);
    n = add_kv(kv, n, "state.data_cursor", v);
    n = add_kv(kv, n, "state.samples", v);
    snprintf(v, sizeof v, "%lld", rs->batch_offset);
    n = add_kv(kv, n, "state.batch_offset", v);
    snprintf(v, sizeof v, "%d", rs->rollbacks);
    n = add_kv(kv, n, "state.rollbacks", v);
    snprintf(v, sizeof v, "%lld", cfg->seed);
    n = add_kv(kv, n, "state.seed", v);
    if (rs->run_id[0]) n = add_kv(kv, n, "state.run_id", rs->run_id);
    snprintf(v, sizeof v, "%d", rs->parent_step);
    n = add_kv(kv, n, "state.parent_step", v);
    snprintf(v, sizeof v, "%d", cfg->batch_size);
    n = add_kv(kv, n, "state.batch_size", v);
    /* the schedule the run trained under, which a resume compares with its own */
    snprintf(v, sizeof v, "%.17g", cfg->lr);
    n = add_kv(kv, n, "state.lr", v);
    snprintf(v, sizeof v, "%.17g", cfg->min_lr);
    n = add_kv(kv, n, "state.min_lr", v);
    snprintf(v, sizeof v, "%d", cfg->warmup_steps);
    n = add_kv(kv, n, "state.warmup_steps", v);
    snprintf(v, sizeof v, "%d", cfg->steps);
    n = add_kv(kv, n, "state.steps", v);
    snprintf(v, sizeof v, "%d", world);
    n = add_kv(kv, n, "layout.world", v);
    snprintf(v, sizeof v, "%d", m->d.tp);
    n = add_kv(kv, n, "layout.tp", v);
    snprintf(v, sizeof v, "%d", m->d.pp);
    n = add_kv(kv, n, "layout.pp", v);
    snprintf(v, sizeof v, "%d", m->d.ep);
    n = add_kv(kv, n, "layout.ep", v);
    for (int i = 0; i < rs->n_data; i++) n = add_kv(kv, n, rs->data[i].key, rs->data[i].value);
    return n;
}

/* Rank 0's part of make_tmp_dir. Returns 0 or -1 with err set. */
static int tmp_dir_make(const char *ckpt_dir, const char *tmp, int step, uint64_t bytes,
                        Err *err) {
    struct statvfs fs;
    if (mkdirs(ckpt_dir) != 0)
        return err_set(err, "ckpt: cannot create '%s': %s (checkpoint of step %d not saved)",
                       ckpt_dir, strerror(errno), step);
    /* what cannot be removed is only untidy, unless it is this save's own
     * .tmp: that moves aside under a name of its own, out of the way */
    Err rerr;
    if (ckpt_recover(ckpt_dir, NULL, &rerr) != 0 && is_dir(tmp)) {
        char aside[1200];
        snprintf(aside, sizeof aside, "%.*s.del.%ld", (int)(strlen(tmp) - 4), tmp, (long)getpid());
        if (fp_rename("save.aside", tmp, aside) != 0)
            return err_set(err, "%s (checkpoint of step %d not saved)", rerr.msg, step);
    }
    if (statvfs(ckpt_dir, &fs) == 0 && (uint64_t)fs.f_bavail * fs.f_frsize < bytes + (1u << 20)) {
        char have[32], need[32];
        format_bytes(have, sizeof have, (size_t)fs.f_bavail * fs.f_frsize);
        format_bytes(need, sizeof need, (size_t)bytes + (1u << 20));
        return err_set(err,
                       "ckpt: '%s' has %s free (or left in its quota) and a checkpoint needs up "
                       "to %s (checkpoint of step %d not saved; older ones untouched; free "
                       "space, or lower ckpt_keep)",
                       ckpt_dir, have, need, step);
    }
    if (fp_mkdir("save.mkdir", tmp, 0755) != 0)
        return err_set(err, "ckpt: cannot create '%s': %s (checkpoint of step %d not saved)", tmp,
                       strerror(errno), step);
    return 0;
}

/* Rank 0 makes ckpt_dir/step-N.tmp, after clearing what interrupted saves
 * left (a stale step-N.tmp whole, whatever files it holds) and checking
 * that the file system has room for `bytes` more. Collective; returns 0
 * or -1 on every rank. */
static int make_tmp_dir(const char *ckpt_dir, const char *tmp, int step, uint64_t bytes,
                        MPI_Comm comm, Err *err) {
    int rank = 0, ok = 1;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (rank == 0) ok = tmp_dir_make(ckpt_dir, tmp, step, bytes, err) == 0;
    MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, comm));
    if (!ok && rank != 0)
        err_set(err, "ckpt: checkpoint of step %d not saved (rank 0 says why)", step);
    return ok ? 0 : -1;
}

/* Moves the complete step-N.tmp into place as step-N (rank 0). A re-save
 * of a step moves the checkpoint it replaces to step-N.old first, and a
 * process stopped between the two renames leaves that one for
 * ckpt_recover to put back. Returns 0, or -1 with err set and nothing
 * committed (step-N as it was). */
static int commit_rename(const char *ckpt_dir, const char *name, const char *run_id,
                         const char *tmp, const char *fin, Err *err) {
    char old[1200];
    snprintf(old, sizeof old, "%s.old", fin);
    if (fp_fsync_dir("commit.fsync_tmp", tmp) != 0)
        return err_set(err, "ckpt: cannot fsync '%s': %s", tmp, strerror(errno));
    ck_fault("rename", fault_get_step());
    /* a step-N of another line (or a link) is never replaced: it moves aside */
    struct stat st;
    if (lstat(fin, &st) == 0 && (!S_ISDIR(st.st_mode) || other_line(fin, run_id)) &&
        abandon_one(ckpt_dir, name) != 0)
        return err_set(err, "ckpt: cannot move '%s' (not this run's) aside to '%s/abandoned/': %s",
                       fin, ckpt_dir, strerror(errno));
    const int resave = is_real_dir(fin);
    if (resave && (rm_dir_tree("commit.stale_old", old) != 0 ||
                   fp_rename("commit.rename_old", fin, old) != 0))
        return err_set(err, "ckpt: cannot move '%s' aside to replace it: %s", fin,
                       strerror(errno));
    if (fp_rename("commit.rename", tmp, fin) != 0) {
        const int e = errno;
        if (resave) fp_rename("commit.restore", old, fin); /* else ckpt_recover puts it back */
        return err_set(err, "ckpt: cannot rename '%s' to '%s': %s", tmp, fin, strerror(e));
    }
    if (resave) rm_dir_tree("commit.old", old); /* a leftover: the next save clears it */
    return 0;
}

/* Rank 0 commits step-N.tmp: renames it into place, makes the rename
 * durable, points `latest` at it and prunes. Returns 0; -1 with err set
 * when nothing was committed; or 1 with err holding a warning when the
 * checkpoint is committed but a later part (the directory's fsync,
 * `latest`, pruning) failed. */
static int commit(const char *ckpt_dir, const char *name, const char *run_id, int keep,
                  const char *tmp, const char *fin, Err *err) {
    if (commit_rename(ckpt_dir, name, run_id, tmp, fin, err) != 0) return -1;
    Err w = {""};
    char latest[1100], line[40];
    snprintf(latest, sizeof latest, "%s/latest", ckpt_dir);
    const int len = snprintf(line, sizeof line, "%s\n", name);
    if (fp_fsync_dir("commit.fsync_dir", ckpt_dir) != 0)
        err_set(&w, "cannot fsync '%s': %s (a power cut could undo it)", ckpt_dir,
                strerror(errno));
    else if (write_file_durable("latest", latest, line, (size_t)len, &w) == 0)
        prune(ckpt_dir, keep, name, run_id, &w);
    if (!w.msg[0]) return 0;
    Err why = w;
    err_set(err, "ckpt: %s saved, but %s", fin, why.msg);
    return 1;
}

/* One save: this rank's slices of the state in buffers laid out like
 * m->params, the key/value lines, and where it goes. */
typedef struct {
    char ckpt_dir[1024], run_id[CKPT_RUN_ID];
    int step, keep;
    CkSlice *slices;
    int n;
    CkKV *kv; /* (64 + the dataset's pairs) */
    int nkv;
    CkWriteOpts wo;
} SaveJob;

/* The save of weights `params` and moments `mom_m`, `mom_v` (NULL: none;
 * laid out as sh shards them, or like the weights when sh is NULL) of
 * model m after `step`. */
static void job_init(SaveJob *j, const char *ckpt_dir, const Model *m, float *params, float *mom_m,
                     float *mom_v, const ZeroShard *sh, const Config *cfg, int step,
                     const CkptRunState *rs, MPI_Comm comm, const Replicas *r) {
    int world = 1;
    MPI_CHECK(MPI_Comm_size(comm, &world));
    memset(j, 0, sizeof *j);
    snprintf(j->ckpt_dir, sizeof j->ckpt_dir, "%s", ckpt_dir);
    j->step = step;
    j->keep = cfg->ckpt_keep;
    if (rs) snprintf(j->run_id, sizeof j->run_id, "%s", rs->run_id);
    j->slices = xcalloc((size_t)(3 * 3 * m->nreg) + (sh ? 2 * shard_slices_cap(m, sh) : 0),
                        sizeof(CkSlice));
    j->n += model_slices(m, params, "param", r, j->slices + j->n);
    if (mom_m && sh) {
        j->n += shard_slices(m, mom_m, "adam_m", sh, 1, j->slices + j->n);
        j->n += shard_slices(m, mom_v, "adam_v", sh, 1, j->slices + j->n);
    } else if (mom_m) {
        j->n += model_slices(m, mom_m, "adam_m", r, j->slices + j->n);
        j->n += model_slices(m, mom_v, "adam_v", r, j->slices + j->n);
    }
    j->kv = xcalloc(64 + (size_t)(rs ? rs->n_data : 0), sizeof(CkKV));
    j->nkv = state_kv(cfg, m, step, rs, world, j->kv);
    j->wo = (CkWriteOpts){cfg->ckpt_level, cfg->ckpt_chunk, 0, 0};
}

/* The bytes this save adds to the file system at most, over all ranks:
 * the raw state (a plane is stored raw when coding does not gain) and the
 * index. Collective. */
static uint64_t job_bytes(const SaveJob *j, MPI_Comm comm) {
    double mine = 0, all = 0;
    for (int i = 0; i < j->n; i++) {
        const CkSlice *s = &j->slices[i];
        mine += (double)s->nr * (double)s->nc * 4 / (s->holders > 1 ? s->holders : 1);
    }
    MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, comm));
    return (uint64_t)(all * 1.01) + 4096 * (uint64_t)j->n;
}

/* Writes step-N.tmp, then commits it. Collective over comm; returns 0 on
 * every rank, -1 on every rank with err set (nothing committed), or 1 on
 * every rank with err holding a warning (committed; see commit). */
static int job_run(const SaveJob *j, MPI_Comm comm, CkStats *st, Err *err) {
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    fault_set_step(j->step);
    char name[32], tmp[1100], fin[1100];
    snprintf(name, sizeof name, "step-%08d", j->step);
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", j->ckpt_dir, name);
    snprintf(fin, sizeof fin, "%s/%s", j->ckpt_dir, name);
    int rc = make_tmp_dir(j->ckpt_dir, tmp, j->step, job_bytes(j, comm), comm, err);
    Err werr;
    if (rc == 0 && ck_write(comm, tmp, j->slices, j->n, j->kv, j->nkv, &j->wo, st, &werr) != 0) {
        err_set(err, "%s (checkpoint of step %d not saved; older ones untouched)", werr.msg,
                j->step);
        if (rank == 0) rm_dir_tree("save.cleanup", tmp); /* else the next save clears it */
        rc = -1;
    }
    if (rc == 0) {
        if (rank == 0) rc = commit(j->ckpt_dir, name, j->run_id, j->keep, tmp, fin, err);
        MPI_CHECK(MPI_Bcast(&rc, 1, MPI_INT, 0, comm));
        if (rc < 0 && rank != 0)
            err_set(err, "ckpt: checkpoint of step %d not saved (rank 0 says why)", j->step);
        if (rc > 0 && rank != 0)
            err_set(err, "ckpt: checkpoint of step %d saved (rank 0 warns why)", j->step);
    }
    fault_set_step(-1);
    return rc;
}

int ckpt_save(const char *ckpt_dir, const Model *m, const AdamW *opt, const Config *cfg, int step,
              const CkptRunState *rs, MPI_Comm comm, int dp, int dp_rank, CkStats *st, Err *err) {
    SaveJob j;
    const Replicas r = {dp, dp_rank};
    job_init(&j, ckpt_dir, m, m->params, opt ? opt->m : NULL, opt ? opt->v : NULL,
             opt ? opt->shard : NULL, cfg, step, rs, comm, &r);
    int rc = job_run(&j, comm, st, err);
    free(j.slices);
    free(j.kv);
    return rc;
}

/* Rank 0's probe write of `bytes`; its time in *seconds. Returns 0 or -1
 * with err set. */
static int probe_write(const char *ckpt_dir, size_t bytes, double *seconds, Err *err) {
    char path[1100];
    snprintf(path, sizeof path, "%s/probe.tmp.%ld", ckpt_dir, (long)getpid());
    uint8_t *buf = xmalloc(bytes);
    for (size_t i = 0; i < bytes; i++) buf[i] = (uint8_t)(i * 2654435761u >> 13);
    const double t0 = now_s();
    int rc = 0, fd = -1;
    if (mkdirs(ckpt_dir) != 0 ||
        (fd = fp_open("probe.open", path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
        rc = -1;
    ck_fault("slow", -1); /* a slow disk is slow for the probe too */
    if (rc == 0 && (fp_write_all("probe.write", fd, buf, bytes) != 0 || fp_fsync("probe.fsync", fd) != 0))
        rc = -1;
    const int e = errno;
    if (fd >= 0) close(fd);
    if (fd >= 0 && fp_unlink("probe.unlink", path) != 0 && rc == 0) rc = -1;
    *seconds = now_s() - t0;
    free(buf);
    if (rc != 0)
        err_set(err, "ckpt: cannot write into ckpt_dir '%s' (a probe write, for time_limit): %s",
                ckpt_dir, strerror(rc == -1 && e ? e : errno));
    return rc;
}

int ckpt_probe_save(const char *ckpt_dir, double state_bytes, MPI_Comm comm, double *seconds,
                    Err *err) {
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    const size_t bytes = state_bytes < (16 << 20) ? (state_bytes > 65536 ? (size_t)state_bytes : 65536)
                                                  : 16 << 20;
    double v[2] = {0, 0}; /* seconds, failed */
    if (rank == 0) v[1] = probe_write(ckpt_dir, bytes, &v[0], err) != 0;
    MPI_CHECK(MPI_Bcast(v, 2, MPI_DOUBLE, 0, comm));
    if (v[1] && rank != 0) err_set(err, "ckpt: rank 0 cannot write into ckpt_dir '%s'", ckpt_dir);
    *seconds = v[0] * (state_bytes > (double)bytes ? state_bytes / (double)bytes : 1.0);
    return v[1] ? -1 : 0;
}

/* ----------------------------------------------------------------- async */

struct CkptAsync {
    MPI_Comm comm; /* the saves' own: their collectives never meet training's */
    float *stage;  /* the state copied: weights, then both moments */
    size_t cap;    /* its floats */
    pthread_t thread;
    int busy; /* a save started and not yet waited for */
    atomic_int finished;
    SaveJob job;
    double t0, seconds; /* its start, and its time to the commit */
    int rc;
    CkStats st;
    Err err;
};

CkptAsync *ckpt_async_new(MPI_Comm comm, size_t floats, int threads, Err *err) {
    int level = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&level));
    if (level < MPI_THREAD_MULTIPLE) {
        err_set(err,
                "ckpt_async: MPI gives thread level %d, not MPI_THREAD_MULTIPLE (%d), which a "
                "save in the background needs; saving synchronously (set ckpt_async 0 to say so)",
                level, MPI_THREAD_MULTIPLE);
        return NULL;
    }
    CkptAsync *a = xcalloc(1, sizeof *a);
    MPI_CHECK(MPI_Comm_dup(comm, &a->comm));
    /* the staging buffer, its pages touched now rather than in the first
     * save's stall */
    a->stage = xmalloc(floats * sizeof(float));
    a->cap = floats;
    const long blocks = (long)((floats + (1 << 20) - 1) >> 20);
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1)
    for (long b = 0; b < blocks; b++) {
        const size_t lo = (size_t)b << 20, n = floats - lo < (1u << 20) ? floats - lo : 1u << 20;
        memset(a->stage + lo, 0, n * sizeof(float));
    }
    return a;
}

static void *async_main(void *p) {
    CkptAsync *a = p;
    a->rc = job_run(&a->job, a->comm, &a->st, &a->err);
    a->seconds = now_s() - a->t0;
    atomic_store(&a->finished, 1);
    return NULL;
}

/* dst = src, n floats, on `threads` threads. */
static void copy_floats(float *dst, const float *src, size_t n, int threads) {
    const size_t block = (size_t)1 << 20;
    const long blocks = (long)((n + block - 1) / block);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long b = 0; b < blocks; b++) {
        const size_t lo = (size_t)b * block, len = n - lo < block ? n - lo : block;
        memcpy(dst + lo, src + lo, len * sizeof(float));
    }
}

void ckpt_async_start(CkptAsync *a, const char *ckpt_dir, const Model *m, const AdamW *opt,
                      const Config *cfg, int step, const CkptRunState *rs, int dp, int dp_rank,
                      int threads) {
    if (a->busy) abort(); /* the caller waits first: at most one save in flight */
    const size_t n = m->nparams, mn = opt ? opt->n : 0, need = n + 2 * mn;
    a->t0 = now_s();
    if (threads < 1) threads = 1;
    if (a->cap < need) {
        free(a->stage);
        a->stage = xmalloc(need * sizeof(float));
        a->cap = need;
    }
    copy_floats(a->stage, m->params, n, threads);
    if (opt) {
        copy_floats(a->stage + n, opt->m, mn, threads);
        copy_floats(a->stage + n + mn, opt->v, mn, threads);
    }
    const Replicas r = {dp, dp_rank};
    job_init(&a->job, ckpt_dir, m, a->stage, opt ? a->stage + n : NULL,
             opt ? a->stage + n + mn : NULL, opt ? opt->shard : NULL, cfg, step, rs, a->comm, &r);
    a->job.wo.threads = threads;
    a->job.wo.background = 1;
    fault_set_step(step);
    ck_fault("staged", step);
    fault_set_step(-1);
    atomic_store(&a->finished, 0);
    a->err.msg[0] = '\0';
    /* signals (a scheduler's SIGTERM, SIGUSR1) go to the training thread */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_create(&a->thread, NULL, async_main, a) != 0) {
        /* no thread: the save runs here, as a synchronous one would */
        async_main(a);
        a->thread = pthread_self();
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    a->busy = 1;
}

int ckpt_async_step(const CkptAsync *a) { return a && a->busy ? a->job.step : -1; }

int ckpt_async_ready(CkptAsync *a) { return a && a->busy && atomic_load(&a->finished); }

double ckpt_async_elapsed(const CkptAsync *a) { return a && a->busy ? now_s() - a->t0 : 0; }

int ckpt_async_wait(CkptAsync *a, CkStats *st, double *seconds, Err *err) {
    if (!a->busy) return 0;
    if (!pthread_equal(a->thread, pthread_self())) pthread_join(a->thread, NULL);
    a->busy = 0;
    free(a->job.slices);
    a->job.slices = NULL;
    free(a->job.kv);
    a->job.kv = NULL;
    if (st) *st = a->st;
    if (seconds) *seconds = a->seconds;
    if (a->rc != 0) *err = a->err;
    return a->rc;
}

void ckpt_async_free(CkptAsync *a) {
    if (!a) return;
    Err err;
    ckpt_async_wait(a, NULL, NULL, &err);
    MPI_Comm_free(&a->comm);
    free(a->stage);
    free(a);
}

/* ------------------------------------------------------------------ load */

int ckpt_resolve(const char *path, char *out, size_t n, Err *err) {
    char p[1200], q[1200];
    snprintf(p, sizeof p, "%s/index", path);
    snprintf(q, sizeof q, "%s/data.bin", path);
    if (is_file(p) || is_file(q)) { /* a step directory, perhaps a broken one */
        snprintf(out, n, "%s", path);
        return 0;
    }
    snprintf(p, sizeof p, "%s/latest", path);
    Err e;
    char *latest = read_file(p, 4096, NULL, &e);
    if (!latest && access(p, F_OK) == 0) return err_set(err, "ckpt: %s", e.msg);
    if (latest) {
        latest[strcspn(latest, "\r\n")] = '\0';
        snprintf(out, n, "%s/%s", path, latest);
        snprintf(p, sizeof p, "%s/index", out);
        int rc = is_file(p) ? 0
                            : err_set(err,
                                      "ckpt: '%s/latest' names '%s', which is not a checkpoint "
                                      "(see 'modtrain ckpt list --ckpt %s'; pass a step "
                                      "directory instead)",
                                      path, latest, path);
        free(latest);
        return rc;
    }
    char **names;
    int k = ckpt_list_steps(path, &names);
    if (k > 0) snprintf(out, n, "%s/%s", path, names[0]);
    for (int i = 0; i < k; i++) free(names[i]);
    free(names);
    if (k > 0) return 0;
    return err_set(err,
                   "ckpt: '%s' is neither a checkpoint directory (with an index) nor a ckpt_dir "
                   "holding checkpoints",
                   path);
}

int ckpt_read_config(const char *stepdir, Config *cfg, int *step, Err *err) {
    CkIndex ix;
    if (ck_index_read(stepdir, &ix, err) != 0) return -1;
    int rc = 0;
    const char *key;
    for (int i = 0; (key = config_model_key(i)) && rc == 0; i++) {
        char k[80];
        snprintf(k, sizeof k, "config.%s", key);
        const char *v = ck_kv(&ix, k);
        if (!v && config_model_key_optional(key)) continue; /* older: see below */
        if (!v) rc = err_set(err, "ckpt: '%s/index' lacks '%s'", stepdir, k);
        else if (config_set(cfg, key, v, stepdir, NULL) != 0)
            rc = err_set(err, "ckpt: '%s/index' has a bad value for '%s'", stepdir, k);
    }
    /* A checkpoint from before the tokenizer was recorded: its vocabulary
     * says which (the byte tokenizer's 256 tokens, as they all were). */
    if (rc == 0 && !ck_kv(&ix, "config.tokenizer")) {
        cfg->tokenizer = config_tokenizer_for_vocab(cfg->vocab_size);
        cfg->tokenizer_hash[0] = '\0';
    }
    if (rc == 0 && cfg->tokenizer == TOK_AUTO)
        rc =
            err_set(err, "ckpt: '%s/index' has config.tokenizer = auto (expected the one resolved)",
                    stepdir);
    const char *s = ck_kv(&ix, "state.step");
    long long v = 0;
    if (rc == 0 && (!s || parse_i64(s, 0, CONFIG_MAX_STEP, &v) != 0))
        rc = err_set(err,
                     "ckpt: '%s/index' has state.step = '%.32s' (expected an integer in [0, %d])",
                     stepdir, s ? s : "", CONFIG_MAX_STEP);
    if (rc == 0 && step) *step = (int)v;
    ck_index_free(&ix);
    return rc;
}

/* The schedule keys of a checkpoint's index into rs (-1 where one is
 * absent or malformed: a checkpoint from before they were recorded). */
static void read_schedule(const CkIndex *ix, CkptRunState *rs) {
    const char *lr = ck_kv(ix, "state.lr"), *min_lr = ck_kv(ix, "state.min_lr");
    const char *ints[3] = {ck_kv(ix, "state.warmup_steps"), ck_kv(ix, "state.steps"),
                           ck_kv(ix, "state.batch_size")};
    int *to[3] = {&rs->warmup_steps, &rs->steps, &rs->batch_size};
    rs->lr = rs->min_lr = -1;
    if (lr && parse_f64(lr, &rs->lr) != 0) rs->lr = -1;
    if (min_lr && parse_f64(min_lr, &rs->min_lr) != 0) rs->min_lr = -1;
    for (int i = 0; i < 3; i++) {
        long long v = -1;
        if (!ints[i] || parse_i64(ints[i], 0, INT32_MAX, &v) != 0) v = -1;
        *to[i] = (int)v;
    }
}

/* Whether id is a run id as a fresh start draws it: 1 to 32 hex digits. */
static int run_id_ok(const char *id) {
    const size_t n = strlen(id);
    return n >= 1 && n < CKPT_RUN_ID && strspn(id, "0123456789abcdef") == n;
}

int ckpt_read_run_state(const char *stepdir, CkptRunState *rs, Err *err) {
    CkIndex ix;
    memset(rs, 0, sizeof *rs);
    rs->seed = -1;
    if (ck_index_read(stepdir, &ix, err) != 0) return -1;
    const char *o = ck_kv(&ix, "state.batch_offset"), *b = ck_kv(&ix, "state.rollbacks");
    const char *s = ck_kv(&ix, "state.samples"), *dc = ck_kv(&ix, "state.data_cursor");
    const char *sd = ck_kv(&ix, "state.seed");
    long long ov = 0, bv = 0, sv = 0, seed = -1;
    int rc = 0;
    if (!s) s = dc;
    if ((o && parse_i64(o, 0, 1LL << 50, &ov) != 0) || (b && parse_i64(b, 0, 1 << 20, &bv) != 0) ||
        (s && parse_i64(s, 0, 1LL << 62, &sv) != 0) || (sd && parse_i64(sd, 0, INT64_MAX, &seed) != 0))
        rc = err_set(err,
                     "ckpt: '%s/index' has state.batch_offset = '%.32s', state.rollbacks = "
                     "'%.32s', state.samples = '%.32s', state.seed = '%.32s' (expected integers "
                     ">= 0)",
                     stepdir, o ? o : "", b ? b : "", s ? s : "", sd ? sd : "");
    const char *id = ck_kv(&ix, "state.run_id"), *ps = ck_kv(&ix, "state.parent_step");
    long long pv = -1;
    if (rc == 0 && id && !run_id_ok(id))
        rc = err_set(err, "ckpt: '%s/index' has state.run_id = '%.40s' (expected 1 to %d hex digits)",
                     stepdir, id, CKPT_RUN_ID - 1);
    if (rc == 0 && ps && parse_i64(ps, -1, CONFIG_MAX_STEP, &pv) != 0)
        rc = err_set(err,
                     "ckpt: '%s/index' has state.parent_step = '%.32s' (expected an integer in "
                     "[-1, %d])",
                     stepdir, ps, CONFIG_MAX_STEP);
    if (rc == 0 && id) snprintf(rs->run_id, sizeof rs->run_id, "%s", id);
    rs->parent_step = (int)pv;
    rs->batch_offset = ov;
    rs->rollbacks = (int)bv;
    rs->samples = sv;
    rs->seed = seed;
    read_schedule(&ix, rs);
    for (int i = 0; i < ix.nkv; i++)
        if (strncmp(ix.kv[i].key, "data.", 5) == 0) {
            if (rs->n_data % 64 == 0)
                rs->data = xrealloc(rs->data, ((size_t)rs->n_data + 64) * sizeof(CkKV));
            rs->data[rs->n_data++] = ix.kv[i];
        }
    ck_index_free(&ix);
    return rc;
}

int ckpt_read_run_id(const char *stepdir, char *id) {
    CkIndex ix;
    Err err;
    id[0] = '\0';
    if (ck_index_read(stepdir, &ix, &err) != 0) return -1;
    const char *v = ck_kv(&ix, "state.run_id");
    int rc = 0;
    if (v && run_id_ok(v)) snprintf(id, CKPT_RUN_ID, "%s", v);
    else if (v) rc = -1;
    ck_index_free(&ix);
    return rc;
}

void ckpt_run_state_free(CkptRunState *rs) {
    free(rs->data);
    rs->data = NULL;
    rs->n_data = 0;
}

int ckpt_load(const char *stepdir, Model *m, AdamW *opt, int *had_moments, Err *err) {
    CkIndex ix;
    if (ck_index_read(stepdir, &ix, err) != 0) return -1;
    int have_m = 0;
    for (int i = 0; i < ix.nchunks && !have_m; i++)
        have_m = strncmp(ix.chunks[i].name, "adam_m/", 7) == 0;
    const size_t cap = (size_t)(3 * 3 * m->nreg) + (opt && opt->shard ? 2 * shard_slices_cap(m, opt->shard) : 0);
    int n = 0;
    CkSlice *slices = xcalloc(cap, sizeof(CkSlice));
    /* padded vocabulary rows are in no chunk: they start at zero */
    memset(m->params, 0, m->nparams * sizeof(float));
    n += model_slices(m, m->params, "param", NULL, slices + n);
    if (opt) {
        memset(opt->m, 0, opt->n * sizeof(float));
        memset(opt->v, 0, opt->n * sizeof(float));
        if (have_m && opt->shard) {
            n += shard_slices(m, opt->m, "adam_m", opt->shard, 0, slices + n);
            n += shard_slices(m, opt->v, "adam_v", opt->shard, 0, slices + n);
        } else if (have_m) {
            n += model_slices(m, opt->m, "adam_m", NULL, slices + n);
            n += model_slices(m, opt->v, "adam_v", NULL, slices + n);
        }
    }
    int rc = ck_read_slices(&ix, slices, n, err);
    if (had_moments) *had_moments = have_m;
    free(slices);
    ck_index_free(&ix);
    return rc;
}

int ckpt_check_model_config(const Config *ck, const Config *run, const char *stepdir, Err *err) {
    const char *key;
    for (int i = 0; (key = config_model_key(i)); i++) {
        char a[128], b[128];
        config_get(ck, key, a, sizeof a);
        config_get(run, key, b, sizeof b);
        if (strcmp(a, b) != 0)
            return err_set(err,
                           "resume: checkpoint '%s' has %s = %s but this run has %s = %s (use the "
                           "checkpoint's value, or resume = never with a new ckpt_dir)",
                           stepdir, key, a, key, b);
    }
    return 0;
}

int ckpt_open_model(const char *ckpt_arg, Model *m, Config *cfg, int maxB, int *step,
                    const TpGroup *tp, int pp, int pp_rank, int local_ranks, Err *err) {
    char dir[1024];
    if (ckpt_resolve(ckpt_arg, dir, sizeof dir, err) != 0) return -1;
    if (ckpt_read_config(dir, cfg, step, err) != 0 || config_validate(cfg, err) != 0) return -1;
    if (tp && cfg->n_head % tp->size != 0) {
        char alts[256] = "";
        for (int k = 1; k <= cfg->n_head; k++)
            if (cfg->n_head % k == 0)
                snprintf(alts + strlen(alts), sizeof alts - strlen(alts), "%s%d",
                         alts[0] ? ", " : "", k * pp);
        return err_set(err,
                       "ckpt: the model has n_head = %d, not divisible by tp = %d (the ranks "
                       "over pp = %d stages; run %s ranks with pp = %d)",
                       cfg->n_head, tp->size, pp, alts, pp);
    }
    ModelDims d;
    model_dims_config(&d, cfg, tp ? tp->size : 1, tp ? tp->rank : 0);
    if (pp > d.L || model_dims_stage(&d, pp, 1, pp_rank, NULL) != 0)
        return err_set(err,
                       "ckpt: the model's n_layer = %d blocks cannot be split over pp = %d "
                       "stages (choose pp <= %d)",
                       d.L, pp, d.L);
    ModelMemory mm;
    model_memory(&d, maxB, 1, 0, &mm);
    model_memory_threads(&mm, &d, kernels_threads());
    if (model_memory_check(&mm, machine_memory() / (size_t)local_ranks, local_ranks, err) != 0) {
        Err why = *err;
        return err_set(err, "ckpt: '%s': %s", dir, why.msg);
    }
    model_init(m, &d, maxB, tp);
    if (ckpt_load(dir, m, NULL, NULL, err) != 0) {
        model_free(m);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ safetensors */

static void export_shape(const ParamInfo *p, StOut *o) {
    o->ndim = p->ndim;
    o->shape[0] = p->vocab_rows;
    o->shape[1] = p->shape[1];
}

/* A router's or a predictor's tensor: Mixture-of-Depths only, nothing a
 * dense GPT-2 has. */
static int is_mod_tensor(const ParamInfo *p) {
    return strstr(p->name, ".router.") || strstr(p->name, ".predictor.");
}

/* The safetensors file of base (weights or gradients); dense: the dense part
 * alone (no router or predictor tensors, route_every = 0 in the metadata),
 * the model Hugging Face's GPT-2 runs. */
static int write_safetensors(const char *path, const Model *m, const float *base, const Config *cfg,
                             int step, int dense, Err *err) {
    if (m->d.tp != 1)
        return err_set(err, "ckpt: writing safetensors under tp = %d is not built yet", m->d.tp);
    StMeta meta[32];
    int nmeta = 0;
    const char *key;
    for (int i = 0; (key = config_model_key(i)); i++, nmeta++) {
        snprintf(meta[nmeta].key, sizeof meta[nmeta].key, "%s", key);
        model_key_value(cfg, m, key, meta[nmeta].value, sizeof meta[nmeta].value);
        if (dense && strcmp(key, "route_every") == 0)
            snprintf(meta[nmeta].value, sizeof meta[nmeta].value, "0");
    }
    snprintf(meta[nmeta].key, sizeof meta[nmeta].key, "step");
    snprintf(meta[nmeta].value, sizeof meta[nmeta].value, "%d", step);
    nmeta++;
    snprintf(meta[nmeta].key, sizeof meta[nmeta].key, "format");
    snprintf(meta[nmeta].value, sizeof meta[nmeta].value, "pt");
    nmeta++;
    StOut *outs = xcalloc((size_t)m->nreg, sizeof(StOut));
    int n = 0;
    for (int i = 0; i < m->nreg; i++) {
        if (dense && is_mod_tensor(&m->reg[i])) continue;
        outs[n].name = m->reg[i].name;
        export_shape(&m->reg[i], &outs[n]);
        outs[n++].data = base + m->reg[i].offset;
    }
    int rc = st_write(path, outs, n, meta, nmeta, err);
    free(outs);
    return rc;
}

int ckpt_export_safetensors(const char *path, const Model *m, const Config *cfg, int step,
                            Err *err) {
    return write_safetensors(path, m, m->params, cfg, step, 0, err);
}

int ckpt_export_hf(const char *dir, const Model *m, const Config *cfg, int step, int *left_out,
                   Err *err) {
    struct stat st;
    if (fp_mkdir("hf.mkdir", dir, 0755) != 0 && errno != EEXIST)
        return err_set(err, "ckpt export: cannot create the folder '%s': %s", dir, strerror(errno));
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return err_set(err, "ckpt export: '%s' exists and is not a folder (--format hf writes a folder)",
                       dir);
    *left_out = 0;
    for (int i = 0; i < m->nreg; i++) *left_out += is_mod_tensor(&m->reg[i]);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (write_safetensors(path, m, m->params, cfg, step, 1, err) != 0) return -1;
    /* GPT-2's config (transformers' GPT2Config): modtrain's block is GPT-2's,
     * with tanh-GELU (gelu_new), LayerNorm eps 1e-5, no dropout and the head
     * tied to wte; V is the real vocabulary, never the padded one */
    const int gpt2 = cfg->tokenizer == TOK_GPT2;
    char json[2048];
    const int n = snprintf(
        json, sizeof json,
        "{\n"
        "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
        "  \"model_type\": \"gpt2\",\n"
        "  \"vocab_size\": %d,\n"
        "  \"n_positions\": %d,\n"
        "  \"n_ctx\": %d,\n"
        "  \"n_embd\": %d,\n"
        "  \"n_layer\": %d,\n"
        "  \"n_head\": %d,\n"
        "  \"n_inner\": %d,\n"
        "  \"activation_function\": \"gelu_new\",\n"
        "  \"layer_norm_epsilon\": 1e-05,\n"
        "  \"initializer_range\": 0.02,\n"
        "  \"resid_pdrop\": 0.0,\n"
        "  \"embd_pdrop\": 0.0,\n"
        "  \"attn_pdrop\": 0.0,\n"
        "  \"scale_attn_weights\": true,\n"
        "  \"tie_word_embeddings\": true,\n"
        "  \"use_cache\": true,\n"
        "%s"
        "  \"torch_dtype\": \"float32\"\n"
        "}\n",
        m->d.V, cfg->seq_len, cfg->seq_len, cfg->d_model, cfg->n_layer, cfg->n_head,
        4 * cfg->d_model, gpt2 ? "  \"bos_token_id\": 50256,\n  \"eos_token_id\": 50256,\n" : "");
    snprintf(path, sizeof path, "%s/config.json", dir);
    return write_file_durable("hf.config", path, json, (size_t)n, err) < 0 ? -1 : 0;
}

int ckpt_export_grads(const char *path, const Model *m, const Config *cfg, Err *err) {
    return write_safetensors(path, m, m->grads, cfg, 0, 0, err);
}

/* Whether tensor t of the file has the shape registry row p exports. */
static int same_shape(const StTensor *t, const ParamInfo *p) {
    StOut want;
    export_shape(p, &want);
    return t->ndim == want.ndim && t->shape[0] == want.shape[0] &&
           (want.ndim == 1 || t->shape[1] == want.shape[1]);
}

static void shape_text(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Hugging Face's GPT-2 files carry each block's causal mask as a buffer
 * (h.N.attn.bias, h.N.attn.masked_bias): not a parameter, nothing to load.
 * Whether name is one of those, for a block the model has. */
static int is_mask_buffer(const char *name, int L) {
    if (strncmp(name, "h.", 2) != 0) return 0;
    const char *p = name + 2, *dot = strchr(p, '.');
    char num[12];
    long long l;
    if (!dot || dot - p >= (ptrdiff_t)sizeof num) return 0;
    memcpy(num, p, (size_t)(dot - p));
    num[dot - p] = '\0';
    if (parse_i64(num, 0, L - 1, &l) != 0) return 0;
    return strcmp(dot, ".attn.bias") == 0 || strcmp(dot, ".attn.masked_bias") == 0;
}

int ckpt_check_safetensors(const StFile *f, const ModelDims *d, Err *err) {
    ParamInfo *reg;
    int n = model_registry(d, &reg), rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const StTensor *t = st_find(f, reg[i].name);
        StOut want;
        export_shape(&reg[i], &want);
        char got[96], exp[96];
        if (!t) {
            rc = err_set(err, "ckpt: '%s' lacks tensor '%s'", f->path, reg[i].name);
        } else if (!same_shape(t, &reg[i])) {
            shape_text(got, sizeof got, t->ndim, t->shape);
            shape_text(exp, sizeof exp, want.ndim, want.shape);
            rc = err_set(err, "ckpt: '%s': tensor '%s' has shape %s, the model needs %s", f->path,
                         reg[i].name, got, exp);
        }
    }
    for (int i = 0; i < f->nt && rc == 0; i++) {
        int found = is_mask_buffer(f->t[i].name, d->L);
        for (int k = 0; k < n && !found; k++) found = strcmp(reg[k].name, f->t[i].name) == 0;
        if (!found)
            rc = err_set(err,
                         "ckpt: '%s': tensor '%s' is not part of the model its metadata describes "
                         "(n_layer = %d, route_every = %d)",
                         f->path, f->t[i].name, d->L, d->route_every);
    }
    free(reg);
    return rc;
}

int ckpt_load_safetensors(const StFile *f, Model *m, Err *err) {
    ModelDims whole = m->d; /* the file holds every stage: check the whole model */
    model_dims_whole(&whole);
    if (ckpt_check_safetensors(f, &whole, err) != 0) return -1;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        const StTensor *t = st_find(f, p->name);
        size_t limit = st_numel(t);
        float *dst = m->params + p->offset;
        for (size_t j = 0; j < p->numel; j++) {
            size_t g = param_global_index(p, m->d.tp, m->d.tp_rank, j);
            dst[j] = g < limit ? st_float(t, f, g) : 0.f; /* padded vocabulary rows are zero */
            if (!isfinite(dst[j]))
                return err_set(err, "ckpt: '%s': tensor '%s' holds %f at element %zu", f->path,
                               p->name, (double)dst[j], g);
        }
    }
    return 0;
}
