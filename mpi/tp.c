/*
 * tp: in-place all-reduces, chunked so counts stay within int.
 */
#include "tp.h"

#include "grid.h"

static void allreduce(float *buf, size_t n, MPI_Op op, const TpGroup *g) {
    if (!g || g->size <= 1) return;
    const size_t chunk = (size_t)1 << 30;
    for (size_t off = 0; off < n; off += chunk) {
        int cnt = (int)(n - off < chunk ? n - off : chunk);
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, op, g->comm));
    }
}

void tp_allreduce_sum(float *buf, size_t n, const TpGroup *g) { allreduce(buf, n, MPI_SUM, g); }
void tp_allreduce_max(float *buf, size_t n, const TpGroup *g) { allreduce(buf, n, MPI_MAX, g); }
