/*
 * dp: bucketed all-reduces over the data-parallel group.
 */
#include "mpi/dp.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi/check.h"
#include "src/base/util.h"

unsigned long long dp_bytes = 0;

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

static void *progress_main(void *arg) {
    DpOverlap *o = arg;
    pthread_mutex_lock(&o->mu);
    while (!o->stop) {
        if (!o->in_flight) {
            pthread_cond_wait(&o->wake, &o->mu);
            continue;
        }
        int flag = 0;
        MPI_CHECK(MPI_Testall(o->nreq, o->req, &flag, MPI_STATUSES_IGNORE));
        if (flag) o->in_flight = 0;
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
        if (i > 0 && seg_hi[i] != seg_lo[i - 1]) return -1;
    }
    o->comm = comm, o->buf = buf, o->nseg = nseg, o->uses = uses;
    o->lo = seg_lo[nseg - 1], o->hi = seg_hi[0];
    o->blo = xmalloc((size_t)nseg * sizeof(size_t));
    o->bhi = xmalloc((size_t)nseg * sizeof(size_t));
    o->seg_bucket = xmalloc((size_t)nseg * sizeof(int));
    o->left = xmalloc((size_t)nseg * sizeof(int));
    o->seg_left = xmalloc((size_t)nseg * sizeof(int));
    int b = -1;
    for (int i = 0; i < nseg; i++) { /* a new bucket once the last one holds enough */
        if (b < 0 || o->bhi[b] - o->blo[b] >= bucket_floats) {
            b++;
            o->bhi[b] = seg_hi[i];
        }
        o->blo[b] = seg_lo[i];
        o->seg_bucket[i] = b;
    }
    o->nbucket = b + 1;
    for (size_t k = 0; k < (size_t)o->nbucket; k++) /* its requests, DP_BUCKET floats each */
        o->capreq += (int)((o->bhi[k] - o->blo[k] + DP_BUCKET - 1) / DP_BUCKET);
    o->req = xmalloc((size_t)o->capreq * sizeof(MPI_Request));
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->wake, NULL);
    int level = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&level));
    o->threaded = level == MPI_THREAD_MULTIPLE &&
                  pthread_create(&o->progress, NULL, progress_main, o) == 0;
    dp_overlap_finish(o); /* nothing in flight: sets the counts */
    return 0;
}

/* Under o->mu. */
static void start_bucket(DpOverlap *o, int b) {
    for (size_t off = o->blo[b]; off < o->bhi[b]; off += DP_BUCKET) {
        const int cnt = (int)(o->bhi[b] - off < DP_BUCKET ? o->bhi[b] - off : DP_BUCKET);
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, o->buf + off, cnt, MPI_FLOAT, MPI_SUM, o->comm,
                                 &o->req[o->nreq++]));
        dp_bytes += (unsigned long long)cnt * sizeof(float);
    }
    o->in_flight = 1;
    pthread_cond_signal(&o->wake);
}

void dp_overlap_mark(DpOverlap *o, int seg) {
    if (seg < 0 || seg >= o->nseg || o->seg_left[seg] == 0) return;
    const int b = o->seg_bucket[seg];
    o->seg_left[seg]--;
    o->left[b]--;
    pthread_mutex_lock(&o->mu);
    /* buckets start in order: one is started only once those before it were */
    while (o->next < o->nbucket && o->left[o->next] == 0) start_bucket(o, o->next++);
    if (o->nreq > 0 && !o->threaded) {
        int flag;
        MPI_CHECK(MPI_Testall(o->nreq, o->req, &flag, MPI_STATUSES_IGNORE));
    }
    pthread_mutex_unlock(&o->mu);
}

void dp_overlap_start_rest(DpOverlap *o) {
    pthread_mutex_lock(&o->mu);
    while (o->next < o->nbucket) start_bucket(o, o->next++);
    pthread_mutex_unlock(&o->mu);
}

void dp_overlap_finish(DpOverlap *o) {
    dp_overlap_start_rest(o);
    pthread_mutex_lock(&o->mu);
    if (o->nreq > 0) MPI_CHECK(MPI_Waitall(o->nreq, o->req, MPI_STATUSES_IGNORE));
    o->nreq = 0, o->next = 0, o->in_flight = 0;
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
    if (o->req) {
        pthread_mutex_destroy(&o->mu);
        pthread_cond_destroy(&o->wake);
    }
    free(o->blo), free(o->bhi), free(o->seg_bucket), free(o->left), free(o->seg_left);
    free(o->req);
    memset(o, 0, sizeof *o);
}
