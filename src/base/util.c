/*
 * util: shared helpers. Nothing here knows about the model or MPI beyond the
 * rank number used to keep output to one process.
 */
#include "src/base/util.h"

#include "src/base/fault.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int util_rank = 0;
int util_quiet = 0;

int err_set(Err *e, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* The one fatal path for memory: there is nothing sensible left to do. */
static void out_of_memory(size_t bytes) {
    errorf("out of memory allocating %zu bytes", bytes);
    exit(EXIT_FAILURE);
}

void *xmalloc(size_t size) {
    void *p = NULL;
    if (size == 0) size = 64;
    if (size > SIZE_MAX - 63) out_of_memory(size);
    size = (size + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, size) != 0) out_of_memory(size);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) out_of_memory(SIZE_MAX);
    size_t total = count * size;
    void *p = xmalloc(total);
    memset(p, 0, total ? total : 64);
    return p;
}

void *xrealloc(void *p, size_t size) {
    void *q = realloc(p, size ? size : 1);
    if (!q) out_of_memory(size);
    return q;
}

char *xstrdup(const char *s) {
    char *d = strdup(s);
    if (!d) out_of_memory(strlen(s) + 1);
    return d;
}

void log0(const char *fmt, ...) {
    if (util_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* One write for the whole line: stderr is unbuffered, and ranks that print
 * at once would otherwise interleave their prefixes and messages. */
void errorf(const char *fmt, ...) {
    if (util_quiet) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(line, sizeof line, "modtrain: ");
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    line[n] = '\0';
    fputs(line, stderr);
    fflush(stderr);
}

void err_print(const Err *e) { errorf("%s", e->msg); }

int parse_i64(const char *s, long long min, long long max, long long *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || v < min || v > max) return -1;
    *out = v;
    return 0;
}

int parse_f64(const char *s, double *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

void format_duration(char *buf, size_t n, double s) {
    if (s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

/* A control group's memory limit in bytes from one of its files ("max" or
 * a missing file: none, SIZE_MAX). */
static size_t cgroup_limit(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return SIZE_MAX;
    char line[64] = "";
    long long v = 0;
    if (fgets(line, sizeof line, f)) line[strcspn(line, "\n")] = '\0';
    fclose(f);
    if (parse_i64(line, 1, LLONG_MAX, &v) != 0) return SIZE_MAX;
    return (size_t)v;
}

size_t machine_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    size_t mem = pages > 0 && page > 0 ? sat_mul((size_t)pages, (size_t)page) : SIZE_MAX;
    size_t v2 = cgroup_limit("/sys/fs/cgroup/memory.max");
    size_t v1 = cgroup_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (v2 < mem) mem = v2;
    if (v1 < mem) mem = v1;
    return mem;
}

void format_bytes(char *buf, size_t n, size_t bytes) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes == SIZE_MAX) {
        snprintf(buf, n, "more than 16 EiB");
        return;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 6) v /= 1024, u++;
    if (u == 0) snprintf(buf, n, "%zu B", bytes);
    else snprintf(buf, n, "%.*f %s", v < 10 ? 2 : 1, v, unit[u]);
}

size_t peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) {
            char *p = line + 6, *end;
            while (*p == ' ' || *p == '\t') p++;
            end = p + strspn(p, "0123456789");
            *end = '\0';
            if (parse_i64(p, 0, LLONG_MAX / 1024, &kb) != 0) kb = 0;
            break;
        }
    fclose(f);
    return (size_t)kb * 1024;
}
