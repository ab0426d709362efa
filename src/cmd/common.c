/*
 * common: what several commands share over the trainer's shared helpers
 * (src/train/shared.h): each prints the error those return, once.
 */
#include <stdio.h>

#include "src/cmd/cmd.h"

double cmd_start_s;

void warn_oversubscribed(int threads, MPI_Comm comm) {
    char msg[1024];
    if (oversubscribed(threads, comm, msg, sizeof msg)) errorf("%s", msg);
}

int cmd_agree(int rc, const Err *err, MPI_Comm comm) {
    Err e = {""};
    if (rc != 0 && err) e = *err;
    if (ranks_agree(rc, &e, comm) == 0) return 0;
    if (e.msg[0]) err_print(&e);
    return -1;
}

double evaluate(Model *m, Dataset *ds, int part, int micro, size_t n_seqs, RouteMode mode,
                int backward, float aux_weight, int *failed) {
    Err err = {""};
    const double loss =
        eval_loss(m, ds, part, micro, n_seqs, mode, backward, aux_weight, failed, &err);
    if (*failed && err.msg[0]) err_print(&err);
    return loss;
}

int ds_open_shared(Dataset *ds, const char *spec, int T, uint64_t seed, MPI_Comm comm) {
    Err err = {""};
    if (ds_open_agreed(ds, spec, T, seed, comm, &err) == 0) return 0;
    if (err.msg[0]) err_print(&err);
    return -1;
}
