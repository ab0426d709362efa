/*
 * ckpt_commit: the commit protocol of a ckpt_dir. A save writes
 * step-N.tmp, fsyncs it, renames it into place (a re-save by way of
 * step-N.old), fsyncs ckpt_dir, replaces `latest` and prunes its line's
 * older checkpoints; what interrupted saves left is put right or removed;
 * the run line (state.run_id) says whose a checkpoint is, and the ones a
 * run abandons move to abandoned/. Also the listing of step directories.
 */
#include "checkpoint/ckpt_impl.h"

#include <dirent.h>
#include <errno.h>
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

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

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

/* Whether id is a run id as a fresh start draws it: 1 to 32 hex digits. */
int run_id_ok(const char *id) {
    const size_t n = strlen(id);
    return n >= 1 && n < CKPT_RUN_ID && strspn(id, "0123456789abcdef") == n;
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
int job_run(const SaveJob *j, MPI_Comm comm, CkStats *st, Err *err) {
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
