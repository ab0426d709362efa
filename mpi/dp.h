/*
 * dp: data-parallel gradient averaging. Gradients are summed over the
 * data-parallel group in buckets (one all-reduce per bucket of floats rather
 * than one per tensor), in place.
 */
#ifndef MODTRAIN_DP_H
#define MODTRAIN_DP_H

#include <mpi.h>
#include <pthread.h>
#include <stddef.h>

/* Floats per all-reduce call: 4 Mi (16 MiB). */
#define DP_BUCKET ((size_t)1 << 22)

/* buf[0..n) summed over comm in buckets; a no-op for a group of one. */
void dp_allreduce_sum(float *buf, size_t n, MPI_Comm comm);
/* The same for doubles (loss sums, routing counters), unbucketed. */
void dp_allreduce_sum_d(double *buf, int n, MPI_Comm comm);

/* Overlapped reduction (dp_overlap): a gradient buffer's segments become
 * final one by one (a stage's blocks as the backward finishes them, the
 * last first), each after `uses` marks (one per micro-batch's backward).
 * Consecutive segments form buckets of at least bucket_floats; a bucket is
 * summed over comm by non-blocking all-reduces (in place, DP_BUCKET floats
 * each) as soon as its last segment is final, and every later mark tests
 * the requests so the transport makes progress. Segments must be given in
 * the order they become final and lie one below the other in the buffer
 * (each ends where the one before it begins), so the buckets' union is one
 * range, [lo, hi). Every rank of comm declares the same segments and marks
 * them in the same order, so the collectives start in one order and sum in
 * fixed buckets: runs repeat bit for bit. */
typedef struct {
    MPI_Comm comm;
    float *buf;
    int nseg, nbucket, uses;
    size_t lo, hi;       /* the union of the segments */
    size_t *blo, *bhi;   /* (nbucket) each bucket's range */
    int *seg_bucket;     /* (nseg) */
    int *left;           /* (nbucket) marks still awaited this step */
    int *seg_left;       /* (nseg) */
    int next;            /* buckets started this step, in order */
    MPI_Request *req;    /* the started buckets' requests */
    int nreq, capreq;
    /* a thread that tests the requests every 100 us while any is in
     * flight (the transport moves only inside MPI calls), under mu with
     * the thread that starts them */
    pthread_t progress;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    int in_flight, stop, threaded;
} DpOverlap;

/* Sets o up over buf; seg_lo/seg_hi (nseg) the segments in the order they
 * become final. Returns 0, or -1 when the segments are not contiguous as
 * described (o is then unusable; reduce after the backward instead). */
int dp_overlap_init(DpOverlap *o, MPI_Comm comm, float *buf, const size_t *seg_lo,
                    const size_t *seg_hi, int nseg, size_t bucket_floats, int uses);
/* One use of segment seg is final: starts its bucket when that was the last
 * mark it awaited, then progresses what is in flight. */
void dp_overlap_mark(DpOverlap *o, int seg);
/* Starts any bucket not yet started, in order. */
void dp_overlap_start_rest(DpOverlap *o);
/* Starts any bucket not yet started (in order) and waits for every one;
 * then readies o for the next step. */
void dp_overlap_finish(DpOverlap *o);
void dp_overlap_free(DpOverlap *o);

/* Bytes handed to data-parallel all-reduces since start (for benchmarks). */
extern unsigned long long dp_bytes;

#endif
