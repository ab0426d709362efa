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
        const int stop = u->stop;
        pthread_mutex_unlock(&u->mu);
        if (stop) return NULL;
        int flag = 0;
        MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, u->comm, &flag, MPI_STATUS_IGNORE));
        nanosleep(&nap, NULL);
    }
}

void pump_start(Pump *u, MPI_Comm comm) {
    int level = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&level));
    *u = (Pump){.comm = comm};
    pthread_mutex_init(&u->mu, NULL);
    u->running = level == MPI_THREAD_MULTIPLE && pthread_create(&u->thread, NULL, pump_main, u) == 0;
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
