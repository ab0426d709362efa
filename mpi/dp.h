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

/* The share of a non-blocking in-place sum of n floats over comm's time
 * (reps of them) that the calling thread is busy driving it, tested every
 * 50 us and asleep between, on the busiest rank: what compute on its
 * core cannot hide. */
double dp_allreduce_cpu_share(MPI_Comm comm, size_t n, int reps);

/* Collectives an overlap keeps in flight at once: each holds a temporary
 * of its chunk in the non-blocking collectives (libnbc), so at most
 * DP_INFLIGHT x DP_BUCKET floats beside the gradients. */
#define DP_INFLIGHT 2

/* Overlapped reduction (dp_overlap): a gradient buffer's segments become
 * final one by one (the head's share of the tied embedding and ln_f, then a
 * stage's blocks as the backward finishes them, the last first), each
 * after `uses` marks (one per micro-batch's backward). Consecutive
 * segments that lie one below the other (each ends where the one before it
 * begins) form buckets of at least bucket_floats; one that does not starts
 * a bucket of its own. Once a bucket's last segment is final its chunks
 * (DP_BUCKET floats from its start) join a queue, and are summed over comm
 * in that order by non-blocking all-reduces (in place), at most
 * DP_INFLIGHT at once; every mark, and a thread of its own, test them and
 * start the next. Every rank of comm declares the same segments and marks
 * them in the same order, so the collectives start in one order and sum
 * in fixed chunks: runs repeat bit for bit. */
typedef struct {
    MPI_Comm comm;
    float *buf;
    int nseg, nbucket, uses;
    size_t *blo, *bhi;   /* (nbucket) each bucket's range */
    int *seg_bucket;     /* (nseg) */
    int *left;           /* (nbucket) marks still awaited this step */
    int *seg_left;       /* (nseg) */
    int next;            /* buckets queued this step, in order */
    int nchunk;          /* every bucket's chunks, in order: */
    size_t *clo, *chi;   /* (nchunk) */
    int *bucket_end;     /* (nbucket) the chunks of buckets 0..b end here */
    int queued, started; /* chunks queued and started this step */
    /* (DP_INFLIGHT x nreq) the requests of each chunk in flight: one
     * all-reduce, or under ZeRO-1 one reduce a part, to the part's owner */
    MPI_Request *req;
    int nreq;
    int req_chunk[DP_INFLIGHT]; /* the chunk of each slot, -1: free */
    /* a thread that tests the requests every 100 us while any chunk is
     * queued or in flight (the transport moves only inside MPI calls),
     * under mu with the thread that marks */
    pthread_t progress;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    int stop, threaded;
    int draining; /* dp_overlap_finish waits on the requests itself */
    /* ZeRO-1 (zero_p > 1): each chunk is reduce-scattered over the zero_p
     * ranks (this one zero_r) */
    int zero_p, zero_r;
} DpOverlap;

/* Sets o up over buf; seg_lo/seg_hi (nseg) the segments in the order they
 * become final, disjoint. Returns 0, or -1 when a segment is empty or two
 * overlap (o is then unusable; reduce after the backward instead). */
int dp_overlap_init(DpOverlap *o, MPI_Comm comm, float *buf, const size_t *seg_lo,
                    const size_t *seg_hi, int nseg, size_t bucket_floats, int uses);
/* ZeRO-1's partition, which the reduce-scatter here and mpi/zero.c share:
 * rank r of p's part of the piece [lo, hi): [*a, *b), perhaps empty. */
void zero_part(size_t lo, size_t hi, int p, int r, size_t *a, size_t *b);
/* Makes o reduce-scatter its chunks (ZeRO-1's pieces: zero.h) over its p
 * ranks, this one r, instead of all-reducing them: a non-blocking reduce
 * of each part to its owner, in place there (Open MPI's non-blocking
 * reduce-scatter reduces the whole chunk to one rank and scatters it: half
 * as many bytes again at dp 2). Before the first mark. */
void dp_overlap_set_zero(DpOverlap *o, int p, int r);
/* One use of segment seg is final: queues its bucket when that was the
 * last mark it awaited (and every bucket before it was), then progresses
 * what is in flight. */
void dp_overlap_mark(DpOverlap *o, int seg);
/* Queues every bucket, and waits until each is summed; then readies o for
 * the next step. Nothing else may use comm until it returns. */
void dp_overlap_finish(DpOverlap *o);
void dp_overlap_free(DpOverlap *o);

/* buf[0..n) summed over comm as dp_allreduce_sum does, except the
 * ranges [lo[i], hi[i]) (k of them, disjoint, in any order): the gaps
 * between them, in ascending order. */
void dp_allreduce_sum_outside(float *buf, size_t n, const size_t *lo, const size_t *hi, int k,
                              MPI_Comm comm);

/* Sparse rows of a V x C table, summed over comm and added into it: rows
 * holds this rank's row slot[v] for each v with slot[v] >= 0. The union of
 * the ranks' rows (an all-reduce of a V-bit map) is summed in one packed
 * all-reduce of |union| x C floats, in ascending row order, and added to
 * table; a rank without a row sends zeros for it. Collective over comm. */
void dp_rows_reduce_add(float *table, int V, int C, const int *slot, const float *rows,
                        MPI_Comm comm);

/* Bytes handed to data-parallel all-reduces since start (for benchmarks). */
extern unsigned long long dp_bytes;

#endif
