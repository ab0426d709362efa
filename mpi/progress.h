/*
 * progress: a pump that drives MPI's progress from a thread of its own
 * while a rank computes. Open MPI's TCP transport, and its non-blocking
 * collectives, move data only inside MPI calls; across a slow link a
 * transfer posted ahead otherwise waits for the rank's next call.
 */
#ifndef MODTRAIN_PROGRESS_H
#define MODTRAIN_PROGRESS_H

#include <mpi.h>
#include <pthread.h>

typedef struct {
    MPI_Comm comm;
    pthread_t thread;
    pthread_mutex_t mu;
    int stop, running;
} Pump;

/* Starts a thread that probes comm every 50 us (an MPI_Iprobe that takes
 * no message), where MPI gives MPI_THREAD_MULTIPLE; else none runs. */
void pump_start(Pump *u, MPI_Comm comm);
/* Stops and joins it (a pump never started: nothing). */
void pump_stop(Pump *u);

#endif
