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

void mpi_env_defaults(void) {
    /* zero 1's overlapped reduce-scatter is a non-blocking reduce a part
     * (mpi/dp.c): for large ones on few ranks Open MPI's libnbc picks a
     * chain of segments, each moved by a test of the request, and the
     * progress thread's tests then slowed GPT-2 small's backward by a fifth
     * on shared memory (3.75 against 3.0 s); binomial sends a part at once.
     * Open MPI reads it at MPI_Init; a user's own setting wins. */
    setenv("OMPI_MCA_coll_libnbc_ireduce_algorithm", "2", 0);
    /* dp_overlap's non-blocking all-reduce is in place, which libnbc
     * (like any reduction on fewer than 4 ranks) does by a binomial tree:
     * the whole buffer to one rank, then the whole result back, twice the
     * bytes a link carries each way and each way in turn. Across two
     * emulated hosts that doubled GPT-2-size reductions (3688 against 1834
     * ms a step at 1 Gbit/s). Reduce-scatter then all-gather (Rabenseifner;
     * libnbc's ring where the count is under the ranks) is what the
     * blocking all-reduce does for large messages. With two ranks the sums
     * are the same single additions, so the bits are too. */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
    /* Open MPI's TCP transport carries a link loaded both ways at once
     * (every all-reduce, the pipeline's two directions) at the link's rate
     * each way only where each direction has a connection of its own: on
     * one, ob1's "put" makes them take turns (a request queues behind its
     * own rank's slice), 60 against 120 MB/s each way at 1 Gbit/s. Two
     * connections open only where both ranks start one before either
     * takes the other's, and an incoming one then needs a closed endpoint
     * to land on: more than one link (pp_connect_peers). */
    setenv("OMPI_MCA_btl_tcp_links", "4", 0);
    /* Every MPI_File_open (a checkpoint's data.bin) also opens a shared
     * file pointer, which modtrain never uses. On one node Open MPI's
     * default for it (sharedfp sm) guards it with a POSIX semaphore named
     * after the file's base name alone, "OMPIO_data.bin", machine-wide: a
     * rank killed while holding it (a preemption during a save) left it
     * taken, and every later save on that node, of any job, waited at
     * MPI_File_open forever. lockedfile, what Open MPI takes when the ranks
     * span nodes, locks a file in the save's own .tmp folder instead, which
     * a killed process's lock does not outlive. */
    setenv("OMPI_MCA_sharedfp", "^sm", 0);
}
