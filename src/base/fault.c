/*
 * fault: the fault points of fault.h. The environment is read once; a
 * point then compares its name with the one armed and, when tracing,
 * appends a line to the trace file (O_APPEND: the ranks' lines never
 * interleave within a line).
 */
#include "src/base/fault.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/util.h"

/* One armed fault: at:POINT:STEP:ACTION:RANK:NTH. */
typedef struct {
    char point[96];      /* its point */
    long step;           /* its step, -1: any */
    int err;             /* its errno, 0: kill, FAULT_STALL: a slow call */
    int rank;            /* its rank, -1: any */
    long nth;            /* it acts the nth time the point matches */
    atomic_long matched; /* the times the point matched */
    atomic_int fired;    /* an errno fault fails one call only */
} Fault;

#define MAX_FAULTS 4
/* The action stall: the call takes STALL_S longer each time, from the nth
 * on (a slow file system: the watchdog's tests). */
#define FAULT_STALL (-2)
#define STALL_S 0.15
static struct {
    int nfaults; /* armed faults */
    Fault fault[MAX_FAULTS];
    char trace[1024]; /* the trace file, "": none */
} cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static _Thread_local long cur_step = -1;

/* FIELD k of at:POINT:STEP:ACTION:RANK:NTH into f; returns 0 or -1. */
static int parse_field(Fault *f, int k, const char *s) {
    long long v;
    switch (k) {
    case 0: return snprintf(f->point, sizeof f->point, "%s", s) < (int)sizeof f->point ? 0 : -1;
    case 1:
        if (strcmp(s, "*") == 0 || !*s) return 0;
        if (parse_i64(s, 0, 99999999, &v) != 0) return -1;
        f->step = (long)v;
        return 0;
    case 2:
        f->err = strcmp(s, "kill") == 0     ? 0
                 : strcmp(s, "EIO") == 0    ? EIO
                 : strcmp(s, "ENOSPC") == 0 ? ENOSPC
                 : strcmp(s, "EDQUOT") == 0 ? EDQUOT
                 : strcmp(s, "EINVAL") == 0 ? EINVAL
                 : strcmp(s, "stall") == 0  ? FAULT_STALL
                                            : -1;
        return f->err == -1 ? -1 : 0;
    case 3:
        if (strcmp(s, "*") == 0) return 0;
        if (parse_i64(s, 0, 1 << 30, &v) != 0) return -1;
        f->rank = (int)v;
        return 0;
    case 4:
        if (parse_i64(s, 1, 1 << 30, &v) != 0) return -1;
        f->nth = (long)v;
        return 0;
    }
    return -1;
}

/* One "at:..." item (NUL-ended, without "at:") into f; returns 0 or -1. */
static int parse_fault(Fault *f, char *item) {
    f->step = -1, f->rank = -1, f->nth = 1;
    int k = 0;
    for (char *p = item, *next; p; p = next, k++) {
        next = strchr(p, ':');
        if (next) *next++ = '\0';
        if (k > 4 || parse_field(f, k, p) != 0) return -1;
    }
    return f->point[0] ? 0 : -1;
}

static void cfg_read(void) {
    const char *t = getenv("MODTRAIN_FAULT_TRACE");
    if (t) snprintf(cfg.trace, sizeof cfg.trace, "%s", t);
    const char *f = getenv("MODTRAIN_FAULT_AT");
    if (!f) f = getenv("MODTRAIN_FAULT");
    if (!f || strncmp(f, "at:", 3) != 0 || strlen(f) >= 1024) return;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", f);
    int n = 0, bad = 0;
    for (char *p = buf, *next; p && !bad; p = next, n++) {
        next = strchr(p, ',');
        if (next) *next++ = '\0';
        bad =
            n >= MAX_FAULTS || strncmp(p, "at:", 3) != 0 || parse_fault(&cfg.fault[n], p + 3) != 0;
    }
    if (bad) {
        fprintf(stderr,
                "modtrain: MODTRAIN_FAULT='%s' is not at:POINT[:STEP[:ACTION[:RANK[:NTH]]]], or up "
                "to %d such joined by commas (ACTION kill, EIO, ENOSPC, EDQUOT, EINVAL or stall); "
                "ignored\n",
                f, MAX_FAULTS);
        return;
    }
    cfg.nfaults = n;
}

void fault_set_step(long step) { cur_step = step; }

long fault_get_step(void) { return cur_step; }

static void trace(const char *point) {
    int fd = open(cfg.trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char line[160];
    int n = snprintf(line, sizeof line, "%s %ld %d\n", point, cur_step, util_rank);
    if (n > 0 && write(fd, line, (size_t)n) < 0) { /* a trace is best effort */
    }
    close(fd);
}

int fault_point(const char *point) {
    pthread_once(&cfg_once, cfg_read);
    if (cfg.trace[0]) trace(point);
    for (int i = 0; i < cfg.nfaults; i++) {
        Fault *f = &cfg.fault[i];
        if (strcmp(point, f->point) != 0 || (f->step >= 0 && f->step != cur_step) ||
            (f->rank >= 0 && f->rank != util_rank))
            continue;
        const long m = atomic_fetch_add(&f->matched, 1) + 1;
        if (f->err == FAULT_STALL && m >= f->nth) {
            if (m == f->nth)
                fprintf(stderr, "modtrain: MODTRAIN_FAULT: %s stalls %.2f s a call from here on "
                        "(step %ld, rank %d)\n", point, STALL_S, cur_step, util_rank);
            struct timespec nap = {0, (long)(STALL_S * 1e9)};
            nanosleep(&nap, NULL);
        }
        if (f->err == FAULT_STALL || m != f->nth) continue;
        if (f->err == 0) {
            fprintf(stderr, "modtrain: MODTRAIN_FAULT: killed at %s (step %ld, rank %d)\n", point,
                    cur_step, util_rank);
            raise(SIGKILL);
        }
        if (atomic_exchange(&f->fired, 1)) continue;
        fprintf(stderr, "modtrain: MODTRAIN_FAULT: %s fails with %s (step %ld, rank %d)\n", point,
                strerror(f->err), cur_step, util_rank);
        errno = f->err;
        return -1;
    }
    return 0;
}

int fp_open(const char *point, const char *path, int flags, mode_t mode) {
    return fault_point(point) != 0 ? -1 : open(path, flags, mode);
}

/* write(2), or pwrite(2) at off when off >= 0, of all n bytes. */
static int write_all(int fd, const void *buf, size_t n, off_t off) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = off < 0 ? write(fd, p, n) : pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (w == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += w;
        n -= (size_t)w;
        if (off >= 0) off += w;
    }
    return 0;
}

int fp_write_all(const char *point, int fd, const void *buf, size_t n) {
    return fault_point(point) != 0 ? -1 : write_all(fd, buf, n, -1);
}

int fp_pwrite_all(const char *point, int fd, const void *buf, size_t n, off_t off) {
    return fault_point(point) != 0 ? -1 : write_all(fd, buf, n, off < 0 ? 0 : off);
}

int fp_fsync(const char *point, int fd) { return fault_point(point) != 0 ? -1 : fsync(fd); }

int fp_fsync_dir(const char *point, const char *path) {
    if (fault_point(point) != 0) return -1;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    /* a directory's fsync that the file system does not support loses
     * nothing it could have kept */
    if (rc != 0 && (errno == EINVAL || errno == ENOTSUP)) rc = 0;
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

int fp_rename(const char *point, const char *from, const char *to) {
    return fault_point(point) != 0 ? -1 : rename(from, to);
}

int fp_exchange(const char *point, const char *a, const char *b) {
    return fault_point(point) != 0 ? -1 : renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
}

int fp_unlink(const char *point, const char *path) {
    return fault_point(point) != 0 ? -1 : unlink(path);
}

int fp_rmdir(const char *point, const char *path) {
    return fault_point(point) != 0 ? -1 : rmdir(path);
}

int fp_mkdir(const char *point, const char *path, mode_t mode) {
    return fault_point(point) != 0 ? -1 : mkdir(path, mode);
}

static _Atomic double last_progress;
static _Atomic(const char *) cur_phase = "setup";

void fault_progress(void) { atomic_store(&last_progress, now_s()); }

void fault_phase(const char *phase) {
    atomic_store(&cur_phase, phase);
    fault_progress();
}

double fault_last_progress(const char **phase) {
    if (phase) *phase = atomic_load(&cur_phase);
    return atomic_load(&last_progress);
}
