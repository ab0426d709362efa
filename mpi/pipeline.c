/*
 * pipeline: schedules. Receives block; sends are non-blocking from buffers
 * that stay untouched until they complete (a slot's output until the slot is
 * reused, gradients in a buffer per slot), so no order of stages deadlocks.
 */
#include "mpi/pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "src/base/util.h"
#include "mpi/check.h"

double pp_wait_s = 0;
unsigned long long pp_bytes = 0;

static int stage_of(MPI_Comm comm) {
    int r = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    return r;
}

void pp_recv_prev(float *buf, size_t n, int tag, MPI_Comm comm) {
    MPI_CHECK(MPI_Recv(buf, (int)n, MPI_FLOAT, stage_of(comm) - 1, tag, comm, MPI_STATUS_IGNORE));
}

void pp_send_next(const float *buf, size_t n, int tag, MPI_Comm comm) {
    MPI_CHECK(MPI_Send(buf, (int)n, MPI_FLOAT, stage_of(comm) + 1, tag, comm));
}

int pp_slots(PpSchedule s, int n_micro, int stage, int stages) {
    if (s == PP_GPIPE) return n_micro;
    int k = stages - stage;
    return k < n_micro ? k : n_micro;
}

typedef struct {
    const PpStage *st;
    MPI_Comm comm;
    int stage, stages, slots, live, max_live;
    MPI_Request *fwd_req;  /* (slots) the send of each slot's output */
    MPI_Request *bwd_req;  /* (slots) the send of each gradient buffer */
    float **bwd_buf;       /* (slots) */
} PpRun;

static void wait_req(MPI_Request *r) {
    if (*r != MPI_REQUEST_NULL) MPI_CHECK(MPI_Wait(r, MPI_STATUS_IGNORE));
}

static void do_forward(PpRun *r, int mb) {
    const PpStage *st = r->st;
    int slot = mb % r->slots;
    wait_req(&r->fwd_req[slot]); /* its previous output has left */
    if (r->stage > 0) {
        double t0 = now_s();
        MPI_CHECK(MPI_Recv(st->input(st->ctx, slot), (int)st->count, MPI_FLOAT, r->stage - 1, mb,
                           r->comm, MPI_STATUS_IGNORE));
        pp_wait_s += now_s() - t0;
    }
    st->forward(st->ctx, mb, slot);
    if (++r->live > r->max_live) r->max_live = r->live;
    if (r->stage < r->stages - 1) {
        MPI_CHECK(MPI_Isend(st->output(st->ctx, slot), (int)st->count, MPI_FLOAT, r->stage + 1, mb,
                            r->comm, &r->fwd_req[slot]));
        pp_bytes += st->count * sizeof(float);
    }
}

static void do_backward(PpRun *r, int mb) {
    const PpStage *st = r->st;
    int slot = mb % r->slots;
    if (r->stage < r->stages - 1) {
        double t0 = now_s();
        MPI_CHECK(MPI_Recv(st->grad_out(st->ctx), (int)st->count, MPI_FLOAT, r->stage + 1, mb,
                           r->comm, MPI_STATUS_IGNORE));
        pp_wait_s += now_s() - t0;
    }
    st->backward(st->ctx, mb, slot);
    r->live--;
    if (r->stage > 0) {
        wait_req(&r->bwd_req[slot]);
        memcpy(r->bwd_buf[slot], st->grad_in(st->ctx), st->count * sizeof(float));
        MPI_CHECK(MPI_Isend(r->bwd_buf[slot], (int)st->count, MPI_FLOAT, r->stage - 1, mb,
                            r->comm, &r->bwd_req[slot]));
        pp_bytes += st->count * sizeof(float);
    }
}

void pp_run(PpSchedule s, int m, MPI_Comm comm, const PpStage *st, int *max_live) {
    PpRun r = {st, comm, 0, 1, 0, 0, 0, NULL, NULL, NULL};
    if (comm != MPI_COMM_NULL) {
        MPI_CHECK(MPI_Comm_rank(comm, &r.stage));
        MPI_CHECK(MPI_Comm_size(comm, &r.stages));
    }
    r.slots = pp_slots(s, m, r.stage, r.stages);
    r.fwd_req = xmalloc((size_t)r.slots * sizeof(MPI_Request));
    r.bwd_req = xmalloc((size_t)r.slots * sizeof(MPI_Request));
    r.bwd_buf = xcalloc((size_t)r.slots, sizeof(float *));
    for (int k = 0; k < r.slots; k++) {
        r.fwd_req[k] = r.bwd_req[k] = MPI_REQUEST_NULL;
        if (r.stage > 0) r.bwd_buf[k] = xmalloc(st->count * sizeof(float));
    }
    if (s == PP_GPIPE) {
        for (int mb = 0; mb < m; mb++) do_forward(&r, mb);
        for (int mb = 0; mb < m; mb++) do_backward(&r, mb);
    } else {
        /* 1F1B: warm up with as many forwards as stages after this one,
         * then one forward and one backward in turn, then drain */
        int warm = r.stages - r.stage - 1;
        if (warm > m) warm = m;
        for (int mb = 0; mb < warm; mb++) do_forward(&r, mb);
        for (int i = 0; i < m - warm; i++) {
            do_forward(&r, warm + i);
            do_backward(&r, i);
        }
        for (int mb = m - warm; mb < m; mb++) do_backward(&r, mb);
    }
    for (int k = 0; k < r.slots; k++) {
        wait_req(&r.fwd_req[k]);
        wait_req(&r.bwd_req[k]);
        free(r.bwd_buf[k]);
    }
    free(r.fwd_req);
    free(r.bwd_req);
    free(r.bwd_buf);
    if (max_live) *max_live = r.max_live;
}

double pp_pingpong(MPI_Comm comm, int bytes, int reps) {
    int rank, size;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    if (size < 2 || rank > 1) return 0;
    char *buf = xcalloc((size_t)bytes + 1, 1);
    const int peer = 1 - rank;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s();
        if (rank == 0) MPI_CHECK(MPI_Send(buf, bytes, MPI_BYTE, peer, 0, comm));
        MPI_CHECK(MPI_Recv(buf, bytes, MPI_BYTE, peer, 0, comm, MPI_STATUS_IGNORE));
        if (rank == 1) MPI_CHECK(MPI_Send(buf, bytes, MPI_BYTE, peer, 0, comm));
        const double half = (now_s() - t0) / 2;
        if (half < best) best = half;
    }
    free(buf);
    return best;
}
