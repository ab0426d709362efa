/*
 * watchdog: a thread that gives up on the job when neither training nor a
 * save has made progress (fault_progress) for watchdog_s seconds, naming
 * the rank and the phase: a peer stuck in a collective, a file system that
 * stopped answering. It hands its line to the options' hang, which ends
 * the process (MPI itself may be what hangs, so not through MPI).
 */
#include <signal.h>
#include <stdio.h>
#include <time.h>

#include "src/base/fault.h"
#include "src/train/run.h"

static void *watchdog_main(void *arg) {
    Run *r = arg;
    const double limit = r->cfg.watchdog_s;
    pthread_mutex_lock(&r->watch_lock);
    while (!r->watch_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r->watch_wake, &r->watch_lock, &until);
        if (r->watch_stop) break;
        const char *phase;
        const double idle = now_s() - fault_last_progress(&phase);
        if (idle <= limit) continue;
        char line[512];
        snprintf(line, sizeof line,
                 "watchdog: rank %d made no progress for %.0f s in %s (step %d, watchdog_s = %g); "
                 "ending the job (exit %d)",
                 r->grid.world_rank, idle, phase, atomic_load(&r->watch_step), limit,
                 r->opts.code_watchdog);
        if (r->opts.hang) r->opts.hang(r->opts.ctx, line);
        break; /* a hang that returned: nothing more to watch for */
    }
    pthread_mutex_unlock(&r->watch_lock);
    return NULL;
}

void watchdog_start(Run *r) {
    pthread_mutex_init(&r->watch_lock, NULL);
    pthread_cond_init(&r->watch_wake, NULL);
    r->watch_stop = 0;
    atomic_store(&r->watch_step, 0);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* signals go to the training thread */
    fault_phase("setup");
    r->watchdog_ready = pthread_create(&r->watchdog, NULL, watchdog_main, r) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!r->watchdog_ready) {
        pthread_cond_destroy(&r->watch_wake);
        pthread_mutex_destroy(&r->watch_lock);
    }
}

/* Ends the thread cleanly: watch_stop set under the lock, the thread woken,
 * then joined (a cancelled thread is what sanitizers misread). */
void watchdog_stop(Run *r) {
    if (!r->watchdog_ready) return;
    pthread_mutex_lock(&r->watch_lock);
    r->watch_stop = 1;
    pthread_cond_signal(&r->watch_wake);
    pthread_mutex_unlock(&r->watch_lock);
    pthread_join(r->watchdog, NULL);
    pthread_cond_destroy(&r->watch_wake);
    pthread_mutex_destroy(&r->watch_lock);
    r->watchdog_ready = 0;
}
