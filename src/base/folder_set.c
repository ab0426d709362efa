/*
 * folder_set: a folder of files written whole (folder_set.h): --out
 * checked, the temporary folders of writers that died cleaned up, and the
 * finished set renamed (or exchanged) into place.
 */
#include "src/base/folder_set.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/fault.h"
#include "src/base/files.h"

/* Fault point TAG.step in buf. */
static const char *pt(const FolderSet *fs, char *buf, size_t n, const char *step) {
    snprintf(buf, n, "%s.%s", fs->tag, step);
    return buf;
}
#define PT(step) pt(fs, point, sizeof point, step)

static void say(const FolderSet *fs, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const FolderSet *fs, const char *fmt, ...) {
    if (!fs->note) return;
    char line[2 * FSET_PATH + 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fs->note(fs->ctx, line);
}

/* Looks into dir: -1 with err when it is not a folder or holds anything but
 * the set's files (regular files fs->member takes; named in err), else 0
 * (absent or empty) or 1 (a set; one of its names in first). */
static int scan_set(const FolderSet *fs, const char *dir, char *first, size_t nfirst, Err *err) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        if (errno == ENOTDIR)
            return err_set(err, "%s: --out '%s' exists and is not a folder (%s)", fs->who, dir,
                           fs->not_folder);
        return err_set(err, "%s: cannot read --out '%s': %s", fs->who, dir, strerror(errno));
    }
    int found = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[FSET_PATH + 256];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!fs->member(e->d_name) || lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
            rc = err_set(err, "%s: --out '%s' holds '%s', %s", fs->who, dir, e->d_name, fs->other);
            break;
        }
        if (!found) snprintf(first, nfirst, "%s", e->d_name);
        found = 1;
    }
    closedir(d);
    return rc != 0 ? rc : found;
}

int fset_remove(const FolderSet *fs, const char *dir) {
    char point[96];
    DIR *d = opendir_nofollow(dir);
    if (!d && errno == ENOTDIR) return fp_unlink(PT("remove.unlink"), dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!fs->member(e->d_name)) continue;
        char p[FSET_PATH + 600];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        fp_unlink(PT("remove.unlink"), p);
    }
    closedir(d);
    return fp_rmdir(PT("remove.rmdir"), dir);
}

int fset_paths(FolderSet *fs, const char *out, Err *err) {
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--; /* data/x/ is data/x */
    if (n == 0 || n >= sizeof fs->out)
        return err_set(err, "%s: --out '%s' is not a usable folder name", fs->who, out);
    memcpy(fs->out, out, n);
    fs->out[n] = '\0';
    const char *slash = strrchr(fs->out, '/');
    const char *base = slash ? slash + 1 : fs->out;
    if (strcmp(base, ".") == 0 || strcmp(base, "..") == 0 || *base == '\0' ||
        strlen(base) >= sizeof fs->base - 32)
        return err_set(err,
                       "%s: --out '%s' names no folder of its own (give a path such as "
                       "data/corpus: the set is renamed into place)",
                       fs->who, out);
    snprintf(fs->base, sizeof fs->base, "%s", base);
    if (!slash) snprintf(fs->parent, sizeof fs->parent, ".");
    else if (slash == fs->out) snprintf(fs->parent, sizeof fs->parent, "/");
    else snprintf(fs->parent, sizeof fs->parent, "%.*s", (int)(slash - fs->out), fs->out);
    /* the host: a folder shared between machines holds their writers'
     * folders apart, and only this machine's processes can be known gone */
    if (gethostname(fs->host, sizeof fs->host) != 0) snprintf(fs->host, sizeof fs->host, "host");
    fs->host[sizeof fs->host - 1] = '\0';
    for (char *c = fs->host; *c; c++)
        if (!(*c == '-' || *c == '_' || (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') ||
              (*c >= 'A' && *c <= 'Z')))
            *c = '_';
    if (!fs->host[0]) snprintf(fs->host, sizeof fs->host, "host");
    /* beside out: "x.TAG-tmp.HOST.PID" for out "x", "data/x.TAG-tmp.HOST.PID" for "data/x" */
    const int plen = (int)(base - fs->out);
    snprintf(fs->tmp, sizeof fs->tmp, "%.*s%s.%s-tmp.%s.%ld", plen, fs->out, fs->base, fs->tag,
             fs->host, (long)getpid());
    snprintf(fs->old, sizeof fs->old, "%.*s%s.%s-old.%s.%ld", plen, fs->out, fs->base, fs->tag,
             fs->host, (long)getpid());
    return 0;
}

void fset_clean_stale(const FolderSet *fs) {
    char point[96], tmp_mark[64], old_mark[64];
    DIR *d = opendir(fs->parent);
    if (!d) return;
    const size_t bl = strlen(fs->base);
    const size_t ml = (size_t)snprintf(tmp_mark, sizeof tmp_mark, ".%s-tmp.", fs->tag);
    snprintf(old_mark, sizeof old_mark, ".%s-old.", fs->tag);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, fs->base, bl) != 0) continue;
        const int is_tmp = strncmp(n + bl, tmp_mark, ml) == 0;
        const int is_old = strncmp(n + bl, old_mark, ml) == 0;
        const char *host = n + bl + ml, *dot = strrchr(host, '.');
        long long pid;
        if ((!is_tmp && !is_old) || !dot || parse_i64(dot + 1, 1, INT_MAX, &pid) != 0) continue;
        char path[FSET_PATH + 300];
        struct stat st;
        snprintf(path, sizeof path, "%.*s%s", (int)(strlen(fs->out) - bl), fs->out, n);
        if ((size_t)(dot - host) != strlen(fs->host) ||
            strncmp(host, fs->host, (size_t)(dot - host)) != 0) {
            say(fs, "%s: left '%s' alone: another host's %s wrote it (remove it if none runs there)",
                fs->who, path, fs->who);
            continue;
        }
        if (kill((pid_t)pid, 0) == 0 || errno == EPERM)
            continue; /* at work (ours is not made yet) */
        if (is_old && stat(fs->out, &st) != 0 && errno == ENOENT &&
            fp_rename(PT("stale.restore"), path, fs->out) == 0) {
            say(fs, "%s: put '%s' back as '%s' (a %s replacing it was killed between its renames)",
                fs->who, path, fs->out, fs->who);
            continue;
        }
        if (fset_remove(fs, path) == 0)
            say(fs, "%s: removed '%s', left by a %s (process %lld) that did not finish", fs->who,
                path, fs->who, pid);
        else
            say(fs, "%s: could not remove '%s', left by an earlier %s: %s", fs->who, path, fs->who,
                strerror(errno));
    }
    closedir(d);
}

int fset_check_out(const FolderSet *fs, int replace, Err *err) {
    char first[256] = "";
    struct stat st;
    if (lstat(fs->out, &st) == 0 && S_ISLNK(st.st_mode))
        return err_set(err,
                       "%s: --out '%s' is a symbolic link (the set is renamed into place; give "
                       "the folder it points to)",
                       fs->who, fs->out);
    const int r = scan_set(fs, fs->out, first, sizeof first, err);
    if (r < 0) return -1;
    if (r == 1 && !replace)
        return err_set(err,
                       "%s: '%s' already holds %s ('%s'...); give --force to replace it whole, or "
                       "another --out",
                       fs->who, fs->out, fs->what, first);
    return 0;
}

/* The old set at dir goes once the exchange or rename is on disk (before,
 * a power loss could bring back the old names over a half-removed set). */
static void drop_old(const FolderSet *fs, const char *dir, const char *fsync_point) {
    char point[96];
    if (fp_fsync_dir(PT(fsync_point), fs->parent) != 0)
        say(fs,
            "%s: warning: the old set in '%s' is kept: the fsync of '%s' failed (%s); the next "
            "%s into '%s' removes it",
            fs->who, dir, fs->parent, strerror(errno), fs->who, fs->out);
    else if (fset_remove(fs, dir) != 0) /* committed: the next writer into out removes it */
        say(fs,
            "%s: warning: the old set in '%s' could not be removed (%s); the next %s into '%s' "
            "removes it",
            fs->who, dir, strerror(errno), fs->who, fs->out);
}

int fset_commit(const FolderSet *fs, int replace, Err *err) {
    char point[96];
    if (fp_fsync_dir(PT("commit.fsync_tmp"), fs->tmp) != 0)
        return err_set(err, "%s: cannot fsync '%s': %s", fs->who, fs->tmp, strerror(errno));
    char first[256] = "";
    const int r = scan_set(fs, fs->out, first, sizeof first, err);
    if (r < 0) return -1;
    if (r == 1 && !replace)
        return err_set(err, "%s: '%s' now holds %s ('%s'...); give --force to replace it", fs->who,
                       fs->out, fs->what, first);
    if (r == 0) {
        /* (a folder there is empty, and the rename replaces it) */
        if (fp_rename(PT("commit.rename"), fs->tmp, fs->out) != 0)
            return err_set(err, "%s: cannot rename '%s' to '%s': %s", fs->who, fs->tmp, fs->out,
                           strerror(errno));
    } else if (fp_exchange(PT("commit.exchange"), fs->tmp, fs->out) == 0) {
        drop_old(fs, fs->tmp, "commit.fsync_exchanged");
    } else {
        if (fp_rename(PT("commit.aside"), fs->out, fs->old) != 0)
            return err_set(err, "%s: cannot move the old set '%s' aside: %s", fs->who, fs->out,
                           strerror(errno));
        if (fp_rename(PT("commit.rename_new"), fs->tmp, fs->out) != 0) {
            const int e = errno;
            if (fp_rename(PT("commit.restore"), fs->old, fs->out) != 0)
                return err_set(err,
                               "%s: cannot rename '%s' to '%s' (%s), nor put the old set back "
                               "from '%s' (%s): the next %s into '%s' puts it back",
                               fs->who, fs->tmp, fs->out, strerror(e), fs->old, strerror(errno),
                               fs->who, fs->out);
            return err_set(err, "%s: cannot rename '%s' to '%s': %s", fs->who, fs->tmp, fs->out,
                           strerror(e));
        }
        drop_old(fs, fs->old, "commit.fsync_renamed");
    }
    if (fp_fsync_dir(PT("commit.fsync_dir"), fs->parent) != 0)
        return err_set(err, "%s: the set is at '%s', but its folder's fsync failed: %s", fs->who,
                       fs->out, strerror(errno));
    return 0;
}
