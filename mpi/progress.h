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

/* One turn of the pump: whatever MPI calls move the owner's transfers on
 * (testing its requests, posting the next), under the pump's lock. */
typedef void (*PumpTick)(void *ctx);

typedef struct {
    pthread_t thread;
    pthread_mutex_t mu;
    PumpTick tick;
    void *ctx;
    int stop, running;
} Pump;

/* Starts a thread that runs tick(ctx) every millisecond under the pump's lock,
 * where MPI gives MPI_THREAD_MULTIPLE; else none runs. */
void pump_start(Pump *u, PumpTick tick, void *ctx);
/* Stops and joins it (a pump not running: nothing). */
void pump_stop(Pump *u);
/* The owner's thread holds the lock while it touches what tick does (a
 * request tick tests); no-ops where no pump runs. */
void pump_lock(Pump *u);
void pump_unlock(Pump *u);
/* A tick that probes a communicator (ctx: an MPI_Comm *): an MPI_Iprobe
 * that takes no message, which moves its point-to-point transfers on. */
void pump_probe(void *ctx);

#endif
