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

static struct {
    int armed;        /* an at: fault is set */
    char point[96];   /* its point */
    long step;        /* its step, -1: any */
    int err;          /* its errno, 0: kill */
    int rank;         /* its rank, -1: any */
    long nth;         /* it acts the nth time the point matches */
    char trace[1024]; /* the trace file, "": none */
} cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static atomic_int fired;   /* an errno fault fails one call only */
static atomic_long matched; /* the times the armed point matched */
static _Thread_local long cur_step = -1;

/* FIELD of at:POINT:STEP:ACTION:RANK into cfg; returns 0 or -1. */
static int parse_field(int k, const char *s) {
    long long v;
    switch (k) {
    case 0: return snprintf(cfg.point, sizeof cfg.point, "%s", s) < (int)sizeof cfg.point ? 0 : -1;
    case 1:
        if (strcmp(s, "*") == 0 || !*s) return 0;
        if (parse_i64(s, 0, 99999999, &v) != 0) return -1;
        cfg.step = (long)v;
        return 0;
    case 2:
        cfg.err = strcmp(s, "kill") == 0     ? 0
                  : strcmp(s, "EIO") == 0    ? EIO
                  : strcmp(s, "ENOSPC") == 0 ? ENOSPC
                  : strcmp(s, "EDQUOT") == 0 ? EDQUOT
                                             : -1;
        return cfg.err < 0 ? -1 : 0;
    case 3:
        if (strcmp(s, "*") == 0) return 0;
        if (parse_i64(s, 0, 1 << 30, &v) != 0) return -1;
        cfg.rank = (int)v;
        return 0;
    case 4:
        if (parse_i64(s, 1, 1 << 30, &v) != 0) return -1;
        cfg.nth = (long)v;
        return 0;
    }
    return -1;
}

static void cfg_read(void) {
    cfg.step = -1, cfg.rank = -1, cfg.nth = 1;
    const char *t = getenv("MODTRAIN_FAULT_TRACE");
    if (t) snprintf(cfg.trace, sizeof cfg.trace, "%s", t);
    const char *f = getenv("MODTRAIN_FAULT_AT");
    if (!f) f = getenv("MODTRAIN_FAULT");
    if (!f || strncmp(f, "at:", 3) != 0 || strlen(f) >= 256) return;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", f + 3);
    int k = 0, bad = 0;
    for (char *p = buf, *next; p && !bad; p = next, k++) {
        next = strchr(p, ':');
        if (next) *next++ = '\0';
        bad = k > 4 || parse_field(k, p) != 0;
    }
    if (bad || !cfg.point[0]) {
        fprintf(stderr,
                "modtrain: MODTRAIN_FAULT='%s' is not at:POINT[:STEP[:ACTION[:RANK[:NTH]]]] "
                "(ACTION kill, EIO, ENOSPC or EDQUOT); ignored\n",
                f);
        return;
    }
    cfg.armed = 1;
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
    if (!cfg.armed || strcmp(point, cfg.point) != 0 || (cfg.step >= 0 && cfg.step != cur_step) ||
        (cfg.rank >= 0 && cfg.rank != util_rank) || atomic_fetch_add(&matched, 1) + 1 != cfg.nth)
        return 0;
    if (cfg.err == 0) {
        fprintf(stderr, "modtrain: MODTRAIN_FAULT: killed at %s (step %ld, rank %d)\n", point,
                cur_step, util_rank);
        raise(SIGKILL);
    }
    if (atomic_exchange(&fired, 1)) return 0;
    fprintf(stderr, "modtrain: MODTRAIN_FAULT: %s fails with %s (step %ld, rank %d)\n", point,
            strerror(cfg.err), cur_step, util_rank);
    errno = cfg.err;
    return -1;
}

int fp_open(const char *point, const char *path, int flags, mode_t mode) {
    return fault_point(point) != 0 ? -1 : open(path, flags, mode);
}

int fp_write_all(const char *point, int fd, const void *buf, size_t n) {
    if (fault_point(point) != 0) return -1;
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (w == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
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
