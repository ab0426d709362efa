/*
 * tp: in-place all-reduces, chunked so counts stay within int.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "mpi/tp.h"

#include "mpi/check.h"
#include "src/base/util.h"

unsigned long long tp_bytes = 0;
double tp_time_s = 0;

static void allreduce(float *buf, size_t n, MPI_Op op, const TpGroup *g) {
    if (!g || g->size <= 1) return;
    tp_bytes += (unsigned long long)n * sizeof(float);
    const double t0 = now_s();
    const size_t chunk = (size_t)1 << 30;
    for (size_t off = 0; off < n; off += chunk) {
        int cnt = (int)(n - off < chunk ? n - off : chunk);
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, op, g->comm));
    }
    tp_time_s += now_s() - t0;
}

void tp_allreduce_sum(float *buf, size_t n, const TpGroup *g) { allreduce(buf, n, MPI_SUM, g); }
void tp_allreduce_max(float *buf, size_t n, const TpGroup *g) { allreduce(buf, n, MPI_MAX, g); }

void tp_allgather(float *out, const float *in, size_t n, const TpGroup *g) {
    if (!g || g->size <= 1) {
        for (size_t i = 0; i < n; i++) out[i] = in[i];
        return;
    }
    tp_bytes += (unsigned long long)n * sizeof(float) * (unsigned long long)g->size;
    const double t0 = now_s();
    if (n <= INT_MAX) {
        MPI_CHECK(MPI_Allgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, g->comm));
    } else { /* MPI counts are int: in pieces, each gathered and put in place */
        const size_t chunk = (size_t)1 << 28;
        float *tmp = xmalloc(chunk * (size_t)g->size * sizeof(float));
        for (size_t off = 0; off < n; off += chunk) {
            const int cnt = (int)(n - off < chunk ? n - off : chunk);
            MPI_CHECK(MPI_Allgather(in + off, cnt, MPI_FLOAT, tmp, cnt, MPI_FLOAT, g->comm));
            for (int r = 0; r < g->size; r++)
                memcpy(out + (size_t)r * n + off, tmp + (size_t)r * cnt, (size_t)cnt * sizeof(float));
        }
        free(tmp);
    }
    tp_time_s += now_s() - t0;
}

int tp_agree_u64(unsigned long long v, const TpGroup *g) {
    if (!g || g->size <= 1) return 1;
    unsigned long long lo = v, hi = v;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, g->comm));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, g->comm));
    return lo == hi;
}
