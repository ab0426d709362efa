/*
 * dp: bucketed all-reduces over the data-parallel group.
 */
#include "mpi/dp.h"

#include "mpi/check.h"

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
