/*
 * commit: the output folder: --out checked, the temporary folders of
 * preps that died cleaned up, and the finished set renamed (or exchanged)
 * into place.
 */
#include "src/prep/prep_impl.h"

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
#include "src/base/util.h"

/* Whether name is one a shard set holds: train*.bin or val*.bin. */
static int is_shard_name(const char *name) {
    return (strncmp(name, "train", 5) == 0 || strncmp(name, "val", 3) == 0) &&
           ends_with(name, ".bin");
}

/* Looks into dir: -1 with err when it is not a folder or holds anything but
 * shard files (regular train*.bin, val*.bin; named in err), else 0 (absent
 * or empty) or 1 (a shard set; one of its names in first). */
static int scan_set(const char *dir, const char *what, char *first, size_t nfirst, Err *err) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        if (errno == ENOTDIR)
            return err_set(
                err, "prep: %s '%s' exists and is not a folder (give a folder for the shards)",
                what, dir);
        return err_set(err, "prep: cannot read %s '%s': %s", what, dir, strerror(errno));
    }
    int found = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[PATH_CAP];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!is_shard_name(e->d_name) || lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
            rc = err_set(err,
                         "prep: %s '%s' holds '%s', which is not a token shard; prep replaces "
                         "only a folder of shards (train*.bin, val*.bin), even with --force: "
                         "give another --out or move it",
                         what, dir, e->d_name);
            break;
        }
        if (!found) snprintf(first, nfirst, "%s", e->d_name);
        found = 1;
    }
    closedir(d);
    return rc != 0 ? rc : found;
}

/* Removes a folder prep wrote: its shard files, then the folder. Something
 * else in it stays (and the folder with it). A folder that is a symbolic
 * link is never entered: the link itself goes. Returns 0 or -1 with errno. */
int remove_set(const char *dir) {
    DIR *d = opendir_nofollow(dir);
    if (!d && errno == ENOTDIR) return fp_unlink("prep.remove.unlink", dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_shard_name(e->d_name)) continue;
        char p[PATH_CAP];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        fp_unlink("prep.remove.unlink", p);
    }
    closedir(d);
    return fp_rmdir("prep.remove.rmdir", dir);
}

int paths_make(Paths *p, const char *out, Err *err) {
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--; /* data/x/ is data/x */
    if (n == 0 || n >= sizeof p->out)
        return err_set(err, "prep: --out '%s' is not a usable folder name", out);
    memcpy(p->out, out, n);
    p->out[n] = '\0';
    const char *slash = strrchr(p->out, '/');
    const char *base = slash ? slash + 1 : p->out;
    if (strcmp(base, ".") == 0 || strcmp(base, "..") == 0 || *base == '\0' ||
        strlen(base) >= sizeof p->base - 32)
        return err_set(err,
                       "prep: --out '%s' names no folder of its own (give a path such as "
                       "data/corpus: the set is renamed into place)",
                       out);
    snprintf(p->base, sizeof p->base, "%s", base);
    if (!slash) snprintf(p->parent, sizeof p->parent, ".");
    else if (slash == p->out) snprintf(p->parent, sizeof p->parent, "/");
    else snprintf(p->parent, sizeof p->parent, "%.*s", (int)(slash - p->out), p->out);
    /* the host: a folder shared between machines holds their preps' folders
     * apart, and only this machine's processes can be known to be gone */
    if (gethostname(p->host, sizeof p->host) != 0) snprintf(p->host, sizeof p->host, "host");
    p->host[sizeof p->host - 1] = '\0';
    for (char *c = p->host; *c; c++)
        if (!(*c == '-' || *c == '_' || (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') ||
              (*c >= 'A' && *c <= 'Z')))
            *c = '_';
    if (!p->host[0]) snprintf(p->host, sizeof p->host, "host");
    /* beside out: "x.prep-tmp.HOST.PID" for out "x", "data/x.prep-tmp.HOST.PID" for "data/x" */
    const int plen = (int)(base - p->out);
    snprintf(p->tmp, sizeof p->tmp, "%.*s%s.prep-tmp.%s.%ld", plen, p->out, p->base, p->host,
             (long)getpid());
    snprintf(p->old, sizeof p->old, "%.*s%s.prep-old.%s.%ld", plen, p->out, p->base, p->host,
             (long)getpid());
    return 0;
}

static void say(const PrepReport *rep, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const PrepReport *rep, const char *fmt, ...) {
    if (!rep || !rep->note) return;
    char line[2 * PATH_CAP + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    rep->note(rep->ctx, line);
}

/* Removes the temporary folders of earlier preps on this host into the same
 * out that did not finish (their process gone): OUT.prep-tmp.HOST.PID, and
 * OUT.prep-old.HOST.PID (the set an interrupted --force was replacing: put
 * back when OUT is missing, else removed). Another host's are left alone
 * (said). */
void clean_stale(const Paths *p, const PrepReport *rep) {
    DIR *d = opendir(p->parent);
    if (!d) return;
    const size_t bl = strlen(p->base);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, p->base, bl) != 0) continue;
        const int is_tmp = strncmp(n + bl, ".prep-tmp.", 10) == 0;
        const int is_old = strncmp(n + bl, ".prep-old.", 10) == 0;
        const char *host = n + bl + 10, *dot = strrchr(host, '.');
        long long pid;
        if ((!is_tmp && !is_old) || !dot || parse_i64(dot + 1, 1, INT_MAX, &pid) != 0) continue;
        char path[PATH_CAP + 300];
        struct stat st;
        snprintf(path, sizeof path, "%.*s%s", (int)(strlen(p->out) - bl), p->out, n);
        if ((size_t)(dot - host) != strlen(p->host) ||
            strncmp(host, p->host, (size_t)(dot - host)) != 0) {
            say(rep,
                "prep: left '%s' alone: another host's prep wrote it (remove it if none runs "
                "there)",
                path);
            continue;
        }
        if (kill((pid_t)pid, 0) == 0 || errno == EPERM)
            continue; /* at work (ours is not made yet) */
        if (is_old && stat(p->out, &st) != 0 && errno == ENOENT &&
            fp_rename("prep.stale.restore", path, p->out) == 0) {
            say(rep, "prep: put '%s' back as '%s' (a prep --force was killed between its renames)",
                path, p->out);
            continue;
        }
        if (remove_set(path) == 0)
            say(rep, "prep: removed '%s', left by a prep (process %lld) that did not finish", path,
                pid);
        else
            say(rep, "prep: could not remove '%s', left by an earlier prep: %s", path,
                strerror(errno));
    }
    closedir(d);
}

/* Checks out before the work: 0 when the set may go there, -1 with err. */
int check_out(const Paths *p, int force, Err *err) {
    char first[256] = "";
    struct stat st;
    if (lstat(p->out, &st) == 0 && S_ISLNK(st.st_mode))
        return err_set(err,
                       "prep: --out '%s' is a symbolic link (the set is renamed into place; give "
                       "the folder it points to)",
                       p->out);
    const int r = scan_set(p->out, "--out", first, sizeof first, err);
    if (r < 0) return -1;
    if (r == 1 && !force)
        return err_set(err,
                       "prep: '%s' already holds a shard set ('%s'...); give --force to replace "
                       "it whole, or another --out",
                       p->out, first);
    return 0;
}

/* Moves the finished set in p->tmp to p->out: a plain rename when out is
 * absent or empty, else (force) an exchange of the two folders and the old
 * set removed, or where the file system cannot exchange, out renamed aside
 * first. fsyncs the parent. Returns 0 or -1 with err (p->tmp still there). */
int commit_set(const Paths *p, int force, const PrepReport *rep, Err *err) {
    if (fp_fsync_dir("prep.commit.fsync_tmp", p->tmp) != 0)
        return err_set(err, "prep: cannot fsync '%s': %s", p->tmp, strerror(errno));
    char first[256] = "";
    const int r = scan_set(p->out, "--out", first, sizeof first, err);
    if (r < 0) return -1;
    if (r == 1 && !force)
        return err_set(err,
                       "prep: '%s' now holds a shard set ('%s'...); give --force to replace it",
                       p->out, first);
    if (r == 0) {
        if (fp_rename("prep.commit.rename", p->tmp, p->out) != 0)
            return err_set(err, "prep: cannot rename '%s' to '%s': %s", p->tmp, p->out,
                           strerror(errno));
    } else if (fp_exchange("prep.commit.exchange", p->tmp, p->out) == 0) {
        /* the old set goes only once the exchange is on disk: before, a power
         * loss could bring back the old names over a half-removed set */
        if (fp_fsync_dir("prep.commit.fsync_exchanged", p->parent) != 0)
            say(rep,
                "prep: warning: the old set in '%s' is kept: the fsync of '%s' failed (%s); "
                "the next prep into '%s' removes it",
                p->tmp, p->parent, strerror(errno), p->out);
        else if (remove_set(p->tmp) != 0) /* committed: the next prep into out removes it */
            say(rep,
                "prep: warning: the old set in '%s' could not be removed (%s); the next prep "
                "into '%s' removes it",
                p->tmp, strerror(errno), p->out);
    } else {
        if (fp_rename("prep.commit.aside", p->out, p->old) != 0)
            return err_set(err, "prep: cannot move the old set '%s' aside: %s", p->out,
                           strerror(errno));
        if (fp_rename("prep.commit.rename_new", p->tmp, p->out) != 0) {
            const int e = errno;
            if (fp_rename("prep.commit.restore", p->old, p->out) != 0)
                return err_set(err,
                               "prep: cannot rename '%s' to '%s' (%s), nor put the old set back "
                               "from '%s' (%s): the next prep into '%s' puts it back",
                               p->tmp, p->out, strerror(e), p->old, strerror(errno), p->out);
            return err_set(err, "prep: cannot rename '%s' to '%s': %s", p->tmp, p->out,
                           strerror(e));
        }
        if (fp_fsync_dir("prep.commit.fsync_renamed", p->parent) != 0)
            say(rep,
                "prep: warning: the old set in '%s' is kept: the fsync of '%s' failed (%s); "
                "the next prep into '%s' removes it",
                p->old, p->parent, strerror(errno), p->out);
        else if (remove_set(p->old) != 0)
            say(rep,
                "prep: warning: the old set in '%s' could not be removed (%s); the next prep "
                "into '%s' removes it",
                p->old, strerror(errno), p->out);
    }
    if (fp_fsync_dir("prep.commit.fsync_dir", p->parent) != 0)
        return err_set(err, "prep: the set is at '%s', but its folder's fsync failed: %s", p->out,
                       strerror(errno));
    return 0;
}
