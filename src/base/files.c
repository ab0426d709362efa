/*
 * files: every file modtrain reads or writes outside a checkpoint's data
 * goes through here: durable and atomic writes, opening only regular files
 * (never a FIFO, a device or a directory), reading a whole file under a
 * size cap, directories without following links. Each step that touches
 * the disk is a fault point (fault.h).
 */
#include "src/base/files.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/fault.h"

int fsync_dir(const char *path) { return fp_fsync_dir("dir.fsync", path); }

int write_file_durable(const char *what, const char *path, const void *data, size_t len,
                       Err *err) {
    char tmp[4096], point[80];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
#define POINT(name) (snprintf(point, sizeof point, "%s." name, what), point)
    int fd = fp_open(POINT("open"), tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return err_set(err, "cannot create %s: %s", tmp, strerror(errno));
    if (fp_write_all(POINT("write"), fd, data, len) != 0) {
        err_set(err, "cannot write %s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (fp_fsync(POINT("fsync"), fd) != 0) {
        err_set(err, "cannot fsync %s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        err_set(err, "cannot close %s: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (fp_rename(POINT("rename"), tmp, path) != 0) {
        err_set(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    /* renamed: the new content is what a reader sees; only its survival of
     * a power cut depends on the directory's fsync, which is reported */
    if (fp_fsync_dir(POINT("fsync_dir"), dirname(dir)) != 0) {
        err_set(err, "cannot fsync the directory of %s: %s", path, strerror(errno));
        return 1;
    }
    return 0;
fail:
    if (fd >= 0) close(fd);
    fp_unlink(POINT("unlink"), tmp);
    return -1;
#undef POINT
}

int write_file_atomic(const char *path, const void *data, size_t len, Err *err) {
    return write_file_durable("file", path, data, len, err) < 0 ? -1 : 0;
}

const char *file_kind(mode_t m) {
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "a special file";
}

/* open_regular, creating the file (mode 0666 less the umask) when flags
 * hold O_CREAT. */
static int open_checked(const char *path, int flags, struct stat *st, Err *err) {
    struct stat s; /* a device is refused before it is opened (opening may act) */
    if (stat(path, &s) == 0 && !S_ISREG(s.st_mode))
        return err_set(err, "'%s' is %s, not a file", path, file_kind(s.st_mode));
    /* O_NONBLOCK: a FIFO with no writer or reader (put there since) opens at once */
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd < 0) return err_set(err, "cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, &s) != 0) {
        err_set(err, "cannot open '%s': %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(s.st_mode)) {
        err_set(err, "'%s' is %s, not a file", path, file_kind(s.st_mode));
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        err_set(err, "cannot open '%s': %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (st) *st = s;
    return fd;
}

int open_regular(const char *path, int flags, struct stat *st, Err *err) {
    return open_checked(path, flags & ~O_CREAT, st, err);
}

FILE *open_output(const char *path, int append, Err *err) {
    const int fd =
        open_checked(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), NULL, err);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, append ? "a" : "w");
    if (!f) {
        err_set(err, "cannot open '%s': %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int close_output(FILE *f, const char *path, Err *err) {
    const int bad = ferror(f), e = errno;
    if (fclose(f) != 0 || bad)
        return err_set(err, "cannot write '%s': %s", path, strerror(bad ? e : errno));
    return 0;
}

/* Reads exactly n bytes from fd (at its current offset). 0, -1 with errno
 * set, or 1 when the file ends early. */
static int read_all(int fd, char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) return 1;
        got += (size_t)k;
    }
    return 0;
}

char *read_file(const char *path, size_t max, size_t *len, Err *err) {
    struct stat st;
    int fd = open_regular(path, O_RDONLY, &st, err);
    if (fd < 0) return NULL;
    const size_t n = (size_t)st.st_size;
    if (st.st_size < 0 || (uint64_t)st.st_size > max) {
        err_set(err, "'%s' is %lld bytes, more than the %zu it may have", path,
                (long long)st.st_size, max);
        close(fd);
        return NULL;
    }
    char *buf = malloc(n + 1);
    if (!buf) {
        err_set(err, "cannot read '%s': %zu bytes do not fit in memory", path, n);
        close(fd);
        return NULL;
    }
    const int rc = read_all(fd, buf, n);
    if (rc != 0) {
        err_set(err, "cannot read '%s': %s", path,
                rc > 0 ? "it ended early (changed while being read?)" : strerror(errno));
        free(buf);
        close(fd);
        return NULL;
    }
    close(fd);
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

DIR *opendir_nofollow(const char *path) {
    const int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP) errno = ENOTDIR; /* a symbolic link */
        return NULL;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        const int e = errno;
        close(fd);
        errno = e;
    }
    return d;
}

int is_real_dir(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int mkdirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (fp_mkdir("mkdirs", buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (fp_mkdir("mkdirs", buf, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}
