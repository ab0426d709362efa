/*
 * zero: ZeRO-1's pieces, parts and collectives.
 */
#include "mpi/zero.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/check.h"
#include "mpi/dp.h"
#include "src/base/util.h"

unsigned long long dp_gather_bytes = 0;
double dp_gather_wait_s = 0;

/* The counts of a reduce-scatter of piece [lo, hi) over p ranks. */
static void zero_counts(size_t lo, size_t hi, int p, int *counts) {
    for (int r = 0; r < p; r++) {
        size_t a, b;
        zero_part(lo, hi, p, r, &a, &b);
        counts[r] = (int)(b - a);
    }
}

/* After a reduce-scatter of piece [lo, hi) over p ranks in place (rank
 * r's sums land at lo): moves them to its part. */
static void zero_place(float *buf, size_t lo, size_t hi, int p, int r) {
    size_t a, b;
    zero_part(lo, hi, p, r, &a, &b);
    if (a != lo && b > a) memmove(buf + a, buf + lo, (b - a) * sizeof(float));
}

static int cmp_size(const void *x, const void *y) {
    const size_t a = *(const size_t *)x, b = *(const size_t *)y;
    return a < b ? -1 : a > b;
}

void zero_init(Zero *z, size_t n, size_t shared, const size_t *cut, int ncut, MPI_Comm dp,
               MPI_Comm edp) {
    memset(z, 0, sizeof *z);
    z->comm[0] = dp, z->comm[1] = edp != MPI_COMM_NULL ? edp : dp;
    for (int g = 0; g < 2; g++) {
        MPI_CHECK(MPI_Comm_size(z->comm[g], &z->size[g]));
        MPI_CHECK(MPI_Comm_rank(z->comm[g], &z->rank[g]));
    }
    /* the cuts, sorted, with 0, shared and n */
    size_t *c = xmalloc(((size_t)ncut + 3) * sizeof(size_t));
    int nc = 0;
    c[nc++] = 0, c[nc++] = shared, c[nc++] = n;
    for (int i = 0; i < ncut; i++)
        if (cut[i] < n) c[nc++] = cut[i];
    qsort(c, (size_t)nc, sizeof(size_t), cmp_size);
    size_t cap = 0;
    for (int i = 0; i + 1 < nc; i++) cap += (c[i + 1] - c[i] + DP_BUCKET - 1) / DP_BUCKET;
    z->lo = xmalloc((cap + 1) * sizeof(size_t));
    z->hi = xmalloc((cap + 1) * sizeof(size_t));
    z->grp = xmalloc((cap + 1) * sizeof(int));
    z->shard.lo = xmalloc((cap + 1) * sizeof(size_t));
    z->shard.hi = xmalloc((cap + 1) * sizeof(size_t));
    for (int i = 0; i + 1 < nc; i++)
        for (size_t a = c[i]; a < c[i + 1]; a += DP_BUCKET) {
            const int k = z->npiece++, g = a >= shared && edp != MPI_COMM_NULL;
            z->lo[k] = a;
            z->hi[k] = c[i + 1] - a < DP_BUCKET ? c[i + 1] : a + DP_BUCKET;
            z->grp[k] = g;
            size_t x, y;
            zero_part(z->lo[k], z->hi[k], z->size[g], z->rank[g], &x, &y);
            if (x < y) {
                z->shard.lo[z->shard.n] = x, z->shard.hi[z->shard.n++] = y;
                z->shard.floats += y - x;
            }
        }
    free(c);
}

void zero_free(Zero *z) {
    zero_gather_wait(z, SIZE_MAX);
    free(z->greq), free(z->gcounts), free(z->gdispls);
    free(z->lo), free(z->hi), free(z->grp);
    free(z->shard.lo), free(z->shard.hi);
    memset(z, 0, sizeof *z);
}

/* Whether [lo, hi) lies inside one of the ranges. */
static int inside(size_t lo, size_t hi, const size_t *slo, const size_t *shi, int n) {
    for (int i = 0; i < n; i++)
        if (lo >= slo[i] && hi <= shi[i]) return 1;
    return 0;
}

void zero_reduce_scatter(const Zero *z, float *buf, const size_t *skip_lo,
                         const size_t *skip_hi, int nskip) {
    int *counts = xmalloc((size_t)(z->size[0] > z->size[1] ? z->size[0] : z->size[1]) *
                          sizeof(int));
    for (int k = 0; k < z->npiece; k++) {
        if (inside(z->lo[k], z->hi[k], skip_lo, skip_hi, nskip)) continue;
        const int g = z->grp[k];
        if (z->size[g] == 1) continue;
        zero_counts(z->lo[k], z->hi[k], z->size[g], counts);
        MPI_CHECK(MPI_Reduce_scatter(MPI_IN_PLACE, buf + z->lo[k], counts, MPI_FLOAT, MPI_SUM,
                                     z->comm[g]));
        zero_place(buf, z->lo[k], z->hi[k], z->size[g], z->rank[g]);
        dp_bytes += (unsigned long long)(z->hi[k] - z->lo[k]) * sizeof(float);
    }
    free(counts);
}

/* Posts piece k's all-gather (a group of one has none). */
static void gather_post(Zero *z, int k) {
    const int g = z->grp[k], p = z->size[g];
    const int most = z->size[0] > z->size[1] ? z->size[0] : z->size[1];
    int *counts = z->gcounts + (size_t)k * most, *displs = z->gdispls + (size_t)k * most;
    z->greq[k] = MPI_REQUEST_NULL;
    if (p == 1) return;
    for (int r = 0; r < p; r++) {
        size_t a, b;
        zero_part(z->lo[k], z->hi[k], p, r, &a, &b);
        counts[r] = (int)(b - a), displs[r] = (int)(a - z->lo[k]);
    }
    MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, z->gbuf + z->lo[k], counts,
                              displs, MPI_FLOAT, z->comm[g], &z->greq[k]));
    dp_gather_bytes += (unsigned long long)(z->hi[k] - z->lo[k]) * sizeof(float);
}

/* Keeps ZERO_INFLIGHT pieces in flight: posts the next while fewer of
 * those posted are unfinished. */
static void gather_top_up(Zero *z) {
    int open = 0;
    for (int k = z->gnext; k < z->gposted; k++) open += z->greq[k] != MPI_REQUEST_NULL;
    for (; z->gposted < z->gready && open < ZERO_INFLIGHT; z->gposted++, open++)
        gather_post(z, z->gposted);
}

/* The pump's turn: tests the pieces in flight (a finished one's request
 * becomes MPI_REQUEST_NULL) and posts the next. */
static void gather_tick(void *ctx) {
    Zero *z = ctx;
    for (int k = z->gnext; k < z->gposted; k++) {
        int done = 0;
        if (z->greq[k] != MPI_REQUEST_NULL)
            MPI_CHECK(MPI_Test(&z->greq[k], &done, MPI_STATUS_IGNORE));
    }
    gather_top_up(z);
}

void zero_gather_begin(Zero *z, float *buf) {
    zero_gather_wait(z, SIZE_MAX); /* one gather in flight at a time */
    const int most = z->size[0] > z->size[1] ? z->size[0] : z->size[1];
    if (!z->greq) {
        z->greq = xmalloc(((size_t)z->npiece + 1) * sizeof(MPI_Request));
        z->gcounts = xmalloc(((size_t)z->npiece * most + 1) * sizeof(int));
        z->gdispls = xmalloc(((size_t)z->npiece * most + 1) * sizeof(int));
    }
    z->gbuf = buf;
    z->gnext = z->gposted = z->gready = 0;
    for (int k = 0; k < z->npiece; k++) z->greq[k] = MPI_REQUEST_NULL;
    if (z->pump && z->npiece > 0) pump_start(&z->pumping, gather_tick, z);
}

void zero_gather_ready(Zero *z, size_t hi) {
    if (!z->greq) return;
    pump_lock(&z->pumping);
    while (z->gready < z->npiece && z->lo[z->gready] < hi) z->gready++;
    gather_top_up(z);
    pump_unlock(&z->pumping);
}

void zero_gather_start(Zero *z, float *buf) {
    zero_gather_begin(z, buf);
    zero_gather_ready(z, SIZE_MAX);
}

void zero_gather_wait(Zero *z, size_t upto) {
    if (!z->greq || z->gnext >= z->npiece) return;
    const double t0 = now_s();
    pump_lock(&z->pumping);
    for (; z->gnext < z->npiece && z->lo[z->gnext] < upto; z->gnext++) {
        gather_top_up(z);
        assert(z->gnext < z->gposted); /* waited for only once ready (the update done) */
        MPI_CHECK(MPI_Wait(&z->greq[z->gnext], MPI_STATUS_IGNORE));
    }
    gather_top_up(z); /* the next ones move while the rank computes */
    pump_unlock(&z->pumping);
    dp_gather_wait_s += now_s() - t0;
    if (z->gnext == z->npiece) pump_stop(&z->pumping);
}

void zero_gather(Zero *z, float *buf) {
    zero_gather_start(z, buf);
    zero_gather_wait(z, SIZE_MAX);
}
