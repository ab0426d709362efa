/*
 * progress: the pump's thread (see progress.h).
 */
#include "mpi/progress.h"

#include <time.h>

#include "mpi/check.h"

static void *pump_main(void *p) {
    Pump *u = p;
    /* A millisecond: TCP's socket buffers hold more than a link moves
     * in one. The thread shares a rank's core where a node has one a
     * rank, and every 50 us it took a fifth of it (pp 2 across two
     * emulated hosts at 10 Gbit/s, d512: 1350 against 1050 ms a step,
     * the same without a pump as with one every 0.5 to 20 ms; ZeRO-1's
     * gather hid no more every 50 us than every millisecond). */
    const struct timespec nap = {0, 1000 * 1000};
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
