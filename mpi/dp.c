/*
 * dp: bucketed all-reduces over the data-parallel group.
 */
#include "mpi/dp.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "mpi/check.h"
#include "src/base/util.h"

unsigned long long dp_bytes = 0;

void zero_part(size_t lo, size_t hi, int p, int r, size_t *a, size_t *b) {
    const size_t len = hi - lo, q = ((len + (size_t)p - 1) / (size_t)p + 15) & ~(size_t)15;
    const size_t x = (size_t)r * q, y = (size_t)(r + 1) * q;
    *a = lo + (x < len ? x : len);
    *b = lo + (y < len ? y : len);
}

void dp_allreduce_sum(float *buf, size_t n, MPI_Comm comm) {
    int size = 1;
    if (comm == MPI_COMM_NULL) return;
    MPI_CHECK(MPI_Comm_size(comm, &size));
    if (size == 1) return;
    for (size_t off = 0; off < n; off += DP_BUCKET) {
        int cnt = (int)(n - off < DP_BUCKET ? n - off : DP_BUCKET);
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, comm));
        dp_bytes += (unsigned long long)cnt * sizeof(float);
    }
}

void dp_allreduce_sum_d(double *buf, int n, MPI_Comm comm) {
    int size = 1;
    if (comm == MPI_COMM_NULL) return;
    MPI_CHECK(MPI_Comm_size(comm, &size));
    if (size == 1) return;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_SUM, comm));
}

/* CPU seconds the calling thread has used. */
static double thread_cpu_s(void) {
    struct rusage u;
    if (getrusage(RUSAGE_THREAD, &u) != 0) return 0;
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double dp_allreduce_cpu_share(MPI_Comm comm, size_t n, int reps) {
    float *buf = xcalloc(n ? n : 1, sizeof(float));
    double wall = 0, cpu = 0;
    for (int r = 0; r < reps; r++) {
        MPI_CHECK(MPI_Barrier(comm));
        const double t = now_s(), c = thread_cpu_s();
        MPI_Request q;
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, comm, &q));
        for (int done = 0;;) {
            MPI_CHECK(MPI_Test(&q, &done, MPI_STATUS_IGNORE));
            if (done) break;
            const struct timespec nap = {0, 50 * 1000};
            nanosleep(&nap, NULL);
        }
        cpu += thread_cpu_s() - c, wall += now_s() - t;
    }
    double share = wall > 0 ? (cpu < wall ? cpu / wall : 1) : 0;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &share, 1, MPI_DOUBLE, MPI_MAX, comm));
    free(buf);
    return share;
}

void dp_allreduce_sum_outside(float *buf, size_t n, const size_t *lo, const size_t *hi, int k,
                              MPI_Comm comm) {
    size_t at = 0;
    for (;;) { /* the next excluded range at or above `at` */
        size_t next = n, skip = n;
        for (int i = 0; i < k; i++)
            if (lo[i] >= at && lo[i] < next) next = lo[i], skip = hi[i];
        dp_allreduce_sum(buf + at, next - at, comm);
        if (next >= n) return;
        at = skip;
    }
}

void dp_rows_reduce_add(float *table, int V, int C, const int *slot, const float *rows,
                        MPI_Comm comm) {
    const size_t nb = ((size_t)V + 7) / 8;
    unsigned char *map = xcalloc(nb, 1);
    for (int v = 0; v < V; v++)
        if (slot[v] >= 0) map[v >> 3] |= (unsigned char)(1u << (v & 7));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, map, (int)nb, MPI_UNSIGNED_CHAR, MPI_BOR, comm));
    size_t u = 0;
    for (int v = 0; v < V; v++) u += map[v >> 3] >> (v & 7) & 1;
    float *pack = xmalloc((u ? u : 1) * (size_t)C * sizeof(float));
    for (int v = 0, i = 0; v < V; v++) {
        if (!(map[v >> 3] >> (v & 7) & 1)) continue;
        float *dst = pack + (size_t)i++ * C;
        if (slot[v] >= 0) memcpy(dst, rows + (size_t)slot[v] * C, (size_t)C * sizeof(float));
        else memset(dst, 0, (size_t)C * sizeof(float));
    }
    dp_allreduce_sum(pack, u * (size_t)C, comm);
    for (int v = 0, i = 0; v < V; v++) {
        if (!(map[v >> 3] >> (v & 7) & 1)) continue;
        float *dst = table + (size_t)v * C;
        const float *src = pack + (size_t)i++ * C;
        for (int c = 0; c < C; c++) dst[c] += src[c];
    }
    free(pack);
    free(map);
}

/* Under o->mu: tests the requests in flight, finishes those done, and
 * starts queued chunks, in order, into the free ones. Returns whether any
 * chunk is queued or in flight. */
static int pump(DpOverlap *o) {
    for (int k = 0; k < DP_INFLIGHT; k++) {
        if (o->req_chunk[k] < 0) continue;
        int done = 0;
        MPI_CHECK(MPI_Testall(o->nreq, o->req + (size_t)k * o->nreq, &done, MPI_STATUSES_IGNORE));
        if (done) o->req_chunk[k] = -1;
    }
    /* in order: a chunk starts only after every chunk before it */
    for (int k = 0; k < DP_INFLIGHT && o->started < o->queued; k++) {
        if (o->req_chunk[k] >= 0) continue;
        const int c = o->started++;
        const size_t off = o->clo[c];
        MPI_Request *rq = o->req + (size_t)k * o->nreq;
        if (o->zero_p > 1) { /* each part reduced to its owner, in place there */
            for (int r = 0; r < o->zero_p; r++) {
                size_t a, b;
                zero_part(off, o->chi[c], o->zero_p, r, &a, &b);
                MPI_CHECK(MPI_Ireduce(r == o->zero_r ? MPI_IN_PLACE : o->buf + a,
                                      r == o->zero_r ? o->buf + a : NULL, (int)(b - a), MPI_FLOAT,
                                      MPI_SUM, r, o->comm, &rq[r]));
            }
        } else {
            MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, o->buf + off, (int)(o->chi[c] - off), MPI_FLOAT,
                                     MPI_SUM, o->comm, &rq[0]));
        }
        o->req_chunk[k] = c;
        dp_bytes += (unsigned long long)(o->chi[c] - off) * sizeof(float);
    }
    int busy = o->started < o->queued;
    for (int k = 0; k < DP_INFLIGHT; k++) busy |= o->req_chunk[k] >= 0;
    return busy;
}

static void *progress_main(void *arg) {
    DpOverlap *o = arg;
    pthread_mutex_lock(&o->mu);
    while (!o->stop) {
        if (o->draining || !pump(o)) {
            pthread_cond_wait(&o->wake, &o->mu);
            continue;
        }
        pthread_mutex_unlock(&o->mu);
        const struct timespec nap = {0, 100 * 1000};
        nanosleep(&nap, NULL);
        pthread_mutex_lock(&o->mu);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

int dp_overlap_init(DpOverlap *o, MPI_Comm comm, float *buf, const size_t *seg_lo,
                    const size_t *seg_hi, int nseg, size_t bucket_floats, int uses) {
    memset(o, 0, sizeof *o);
    if (nseg < 1 || uses < 1) return -1;
    for (int i = 0; i < nseg; i++) {
        if (seg_lo[i] >= seg_hi[i]) return -1;
        for (int j = 0; j < i; j++)
            if (seg_lo[i] < seg_hi[j] && seg_lo[j] < seg_hi[i]) return -1;
    }
    o->comm = comm, o->buf = buf, o->nseg = nseg, o->uses = uses;
    o->blo = xmalloc((size_t)nseg * sizeof(size_t));
    o->bhi = xmalloc((size_t)nseg * sizeof(size_t));
    o->seg_bucket = xmalloc((size_t)nseg * sizeof(int));
    o->left = xmalloc((size_t)nseg * sizeof(int));
    o->seg_left = xmalloc((size_t)nseg * sizeof(int));
    o->bucket_end = xmalloc((size_t)nseg * sizeof(int));
    int b = -1;
    for (int i = 0; i < nseg; i++) { /* a new bucket once the last one holds enough */
        if (b < 0 || o->bhi[b] - o->blo[b] >= bucket_floats || seg_hi[i] != seg_lo[i - 1]) {
            b++;
            o->bhi[b] = seg_hi[i];
        }
        o->blo[b] = seg_lo[i];
        o->seg_bucket[i] = b;
    }
    o->nbucket = b + 1;
    size_t chunks = 0;
    for (int k = 0; k < o->nbucket; k++) chunks += (o->bhi[k] - o->blo[k] + DP_BUCKET - 1) / DP_BUCKET;
    o->clo = xmalloc(chunks * sizeof(size_t));
    o->chi = xmalloc(chunks * sizeof(size_t));
    for (int k = 0; k < o->nbucket; k++) {
        for (size_t off = o->blo[k]; off < o->bhi[k]; off += DP_BUCKET) {
            o->clo[o->nchunk] = off;
            o->chi[o->nchunk++] = o->bhi[k] - off < DP_BUCKET ? o->bhi[k] : off + DP_BUCKET;
        }
        o->bucket_end[k] = o->nchunk;
    }
    o->nreq = 1;
    o->req = xmalloc(DP_INFLIGHT * sizeof(MPI_Request));
    for (int k = 0; k < DP_INFLIGHT; k++) o->req_chunk[k] = -1, o->req[k] = MPI_REQUEST_NULL;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->wake, NULL);
    int level = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&level));
    o->threaded = level == MPI_THREAD_MULTIPLE &&
                  pthread_create(&o->progress, NULL, progress_main, o) == 0;
    dp_overlap_finish(o); /* nothing in flight: sets the counts */
    return 0;
}

void dp_overlap_set_zero(DpOverlap *o, int p, int r) {
    o->zero_p = p, o->zero_r = r;
    o->nreq = p > 1 ? p : 1;
    free(o->req);
    o->req = xmalloc((size_t)DP_INFLIGHT * (size_t)o->nreq * sizeof(MPI_Request));
    for (int k = 0; k < DP_INFLIGHT * o->nreq; k++) o->req[k] = MPI_REQUEST_NULL;
}

void dp_overlap_mark(DpOverlap *o, int seg) {
    if (seg < 0 || seg >= o->nseg || o->seg_left[seg] == 0) return;
    const int b = o->seg_bucket[seg];
    o->seg_left[seg]--;
    o->left[b]--;
    pthread_mutex_lock(&o->mu);
    /* buckets are queued in order: one only once those before it were */
    while (o->next < o->nbucket && o->left[o->next] == 0) o->queued = o->bucket_end[o->next++];
    pump(o);
    pthread_cond_signal(&o->wake);
    pthread_mutex_unlock(&o->mu);
}

void dp_overlap_finish(DpOverlap *o) {
    pthread_mutex_lock(&o->mu);
    o->next = o->nbucket, o->queued = o->nchunk;
    /* the requests are this thread's now: a blocking wait progresses them
     * at once, where tests 100 us apart move a segmented collective (a
     * non-blocking reduce on shared memory) one segment a test */
    o->draining = 1;
    while (pump(o)) {
        int k = -1; /* the chunk in flight longest */
        for (int q = 0; q < DP_INFLIGHT; q++)
            if (o->req_chunk[q] >= 0 && (k < 0 || o->req_chunk[q] < o->req_chunk[k])) k = q;
        pthread_mutex_unlock(&o->mu);
        MPI_CHECK(MPI_Waitall(o->nreq, o->req + (size_t)k * o->nreq, MPI_STATUSES_IGNORE));
        pthread_mutex_lock(&o->mu);
        o->req_chunk[k] = -1;
    }
    o->draining = 0;
    o->queued = o->started = o->next = 0;
    pthread_mutex_unlock(&o->mu);
    for (int b = 0; b < o->nbucket; b++) o->left[b] = 0;
    for (int i = 0; i < o->nseg; i++) {
        o->seg_left[i] = o->uses;
        o->left[o->seg_bucket[i]] += o->uses;
    }
}

void dp_overlap_free(DpOverlap *o) {
    if (o->threaded) {
        pthread_mutex_lock(&o->mu);
        o->stop = 1;
        pthread_cond_signal(&o->wake);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->progress, NULL);
    }
    if (o->blo) {
        pthread_mutex_destroy(&o->mu);
        pthread_cond_destroy(&o->wake);
    }
    free(o->blo), free(o->bhi), free(o->seg_bucket), free(o->left), free(o->seg_left);
    free(o->bucket_end), free(o->clo), free(o->chi), free(o->req);
    memset(o, 0, sizeof *o);
}
