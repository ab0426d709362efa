/*
 * util: shared helpers: the error value, checked allocation, printing,
 * strict number parsing, the clock, memory figures. Nothing here knows
 * about the model or MPI beyond the rank number used to keep output to one
 * process; the files modtrain reads and writes are files.c's.
 */
#include "src/base/util.h"

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
