/*
 * progress: the pump's thread (see progress.h).
 */
#include "mpi/progress.h"

#include <time.h>

#include "mpi/check.h"

static void *pump_main(void *p) {
    Pump *u = p;
    const struct timespec nap = {0, 50000};
    for (;;) {
        pthread_mutex_lock(&u->mu);
        if (u->stop) break;
        u->tick(u->ctx);
        pthread_mutex_unlock(&u->mu);
        nanosleep(&nap, NULL);
    }
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

void pump_start(Pump *u, PumpTick tick, void *ctx) {
    int level = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&level));
    *u = (Pump){.tick = tick, .ctx = ctx};
    if (level != MPI_THREAD_MULTIPLE) return;
    pthread_mutex_init(&u->mu, NULL);
    u->running = pthread_create(&u->thread, NULL, pump_main, u) == 0;
    if (!u->running) pthread_mutex_destroy(&u->mu);
}

void pump_stop(Pump *u) {
    if (!u->running) return;
    pthread_mutex_lock(&u->mu);
    u->stop = 1;
    pthread_mutex_unlock(&u->mu);
    pthread_join(u->thread, NULL);
    pthread_mutex_destroy(&u->mu);
    u->running = 0;
}

void pump_lock(Pump *u) {
    if (u->running) pthread_mutex_lock(&u->mu);
}

void pump_unlock(Pump *u) {
    if (u->running) pthread_mutex_unlock(&u->mu);
}

void pump_probe(void *ctx) {
    int flag = 0;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, *(MPI_Comm *)ctx, &flag, MPI_STATUS_IGNORE));
}
