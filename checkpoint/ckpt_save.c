/*
 * ckpt_save: saving a model. ckpt_save; the asynchronous saves (the state
 * copied into a staging buffer, then saved by a thread of its own beside
 * training); and the probe write that measures what a save would take.
 */
#include "checkpoint/ckpt_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi/check.h"
#include "src/base/fault.h"
#include "src/base/files.h"
#include "src/base/util.h"

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
