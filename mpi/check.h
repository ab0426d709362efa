/*
 * check: the one fatal path for MPI. Every MPI call goes through MPI_CHECK;
 * communicators use MPI_ERRORS_RETURN so that a failure reaches it, and it
 * prints rank, call, file and line and aborts the whole job, because the
 * other ranks cannot go on without this one. Includes nothing but MPI, so
 * any layer can use it.
 */
#ifndef MODTRAIN_MPI_CHECK_H
#define MODTRAIN_MPI_CHECK_H

#include <mpi.h>

#define MPI_CHECK(call)                                               \
    do {                                                              \
        int mpi_check_rc_ = (call);                                   \
        if (mpi_check_rc_ != MPI_SUCCESS)                             \
            mpi_check_fail(mpi_check_rc_, #call, __FILE__, __LINE__); \
    } while (0)

/* Prints "rank R: CALL failed at FILE:LINE: MPI's message" and aborts. */
void mpi_check_fail(int rc, const char *call, const char *file, int line) __attribute__((noreturn));

/* Ends the job from the command layer after a failure other ranks cannot
 * see (they would wait forever): prints msg from this rank and aborts. */
void mpi_abort_job(const char *msg) __attribute__((noreturn));

/* Open MPI's settings modtrain's processes need, each unless the user set
 * it: called before MPI_Init, which reads them. */
void mpi_env_defaults(void);

#endif
