/*
 * check: MPI failures end the job with one line naming where.
 */
#include "mpi/check.h"

#include <stdio.h>
#include <stdlib.h>

void mpi_check_fail(int rc, const char *call, const char *file, int line) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0, rank = -1;
    MPI_Error_string(rc, msg, &len);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "modtrain: rank %d: %s failed at %s:%d: %s\n", rank, call, file, line, msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(EXIT_FAILURE); /* MPI_Abort does not return; this keeps noreturn honest */
}

void mpi_abort_job(const char *msg) {
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "modtrain: rank %d: %s\n", rank, msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(EXIT_FAILURE);
}
