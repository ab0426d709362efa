/*
 * pipeline: schedules. Sends are non-blocking from buffers that stay
 * untouched until they complete (a slot's output until the slot is reused,
 * gradients in a buffer per slot); each direction's next receive is posted
 * as soon as the one before it is taken, into a buffer of its own (as
 * Megatron-LM posts a step's receives with its sends), so the message lands
 * while the rank computes. Matching is by tag, one per message, so no order
 * of stages deadlocks. Where the stages' links are slow (pump), a thread
 * drives MPI's progress while the rank computes: Open MPI's TCP transport
 * moves bytes only inside MPI calls.
 */
#include "mpi/pipeline.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/base/util.h"
#include "mpi/check.h"
#include "mpi/progress.h"

double pp_wait_s = 0;
unsigned long long pp_bytes = 0;

/* The stage `step` after this one, round the ring (interleaved chunks
 * hand on from the last stage to the first). */
static int stage_after(MPI_Comm comm, int step) {
    int r = 0, n = 1;
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    MPI_CHECK(MPI_Comm_size(comm, &n));
    return (r + step + n) % n;
}

void pp_recv_prev(float *buf, size_t n, int tag, MPI_Comm comm) {
    MPI_CHECK(MPI_Recv(buf, (int)n, MPI_FLOAT, stage_after(comm, -1), tag, comm, MPI_STATUS_IGNORE));
}

void pp_send_next(const float *buf, size_t n, int tag, MPI_Comm comm) {
    MPI_CHECK(MPI_Send(buf, (int)n, MPI_FLOAT, stage_after(comm, 1), tag, comm));
}

/* 1F1B's warm-up: the forwards before the first backward (Megatron's
 * count under interleaving), at most all of them. */
static long long warmup(int m, int v, int stage, int stages) {
    const long long total = (long long)m * v;
    const long long warm = v == 1 ? stages - stage - 1
                                  : (stages - stage - 1) * 2LL + (v - 1LL) * stages;
    return warm < total ? warm : total;
}

int pp_order(PpSchedule s, int m, int v, int stage, int stages, PpOp *ops) {
    int n = 0;
    if (v < 1) v = 1;
    const int total = m * v, group = stages * v;
    /* the k-th forward (backward) of the rank: Megatron's order, groups of
     * `stages` micro-batches through each chunk in turn (backwards through
     * the chunks from the last); plain 1F1B and GPipe at v = 1 */
#define OP(f, k)                                                                            \
    ops[n++] = (PpOp){(f), (f) ? (k) % group / stages : v - 1 - (k) % group / stages,      \
                      v == 1 ? (k) : (k) / group * stages + (k) % stages}
    if (s == PP_GPIPE) {
        for (int k = 0; k < total; k++) OP(1, k);
        for (int k = 0; k < total; k++) OP(0, k);
        return n;
    }
    /* warm up with the forwards that reach the last stage's first backward,
     * then one forward and one backward in turn, then drain */
    const int warm = (int)warmup(m, v, stage, stages);
    for (int k = 0; k < warm; k++) OP(1, k);
    for (int i = 0; i < total - warm; i++) {
        OP(1, warm + i);
        OP(0, i);
    }
    for (int k = total - warm; k < total; k++) OP(0, k);
#undef OP
    return n;
}

int pp_sets(PpSchedule s, int m, int v, int stage, int stages) {
    /* GPipe: every forward before any backward; 1F1B: the warm-up, then
     * one more before each backward (test_plan checks it on pp_order) */
    if (v < 1) v = 1;
    const long long total = (long long)m * v, warm = warmup(m, v, stage, stages);
    return (int)(s == PP_GPIPE || warm + 1 > total ? total : warm + 1);
}

int pp_slots(PpSchedule s, int n_micro, int stage, int stages) {
    return pp_sets(s, n_micro, 1, stage, stages);
}

long long pp_tags(int n_micro, int v) { return 2LL * (v < 1 ? 1 : v) * n_micro; }

typedef struct {
    const PpStage *st;
    MPI_Comm comm;
    const PpOp *ops;
    int nops;
    /* each direction's next receive: its op (nops: none left), request and
     * buffer (0: activations into a forward, 1: gradients into a backward) */
    int next[2];
    MPI_Request rreq[2];
    float *rbuf[2];
    int stage, stages, v, m, live, max_live, sets;
    int *set_of;           /* (v * m) the set of chunk c's micro-batch mb in flight */
    char *busy;            /* (sets) */
    MPI_Request *fwd_req;  /* (sets) the send of each set's output */
    MPI_Request *bwd_req;  /* (sets) the send of each gradient buffer */
    float **bwd_buf;       /* (sets) */
} PpRun;

static void wait_req(MPI_Request *r) {
    if (*r != MPI_REQUEST_NULL) MPI_CHECK(MPI_Wait(r, MPI_STATUS_IGNORE));
}

/* A message into virtual stage t's chunk for micro-batch mb: forward
 * activations (bwd 0) or a gradient (1). Virtual stage t is chunk
 * t / stages of rank t % stages. */
static int tag_of(const PpRun *r, int t, int mb, int bwd) {
    return mb + r->m * (2 * (t / r->stages) + bwd);
}

/* The virtual stage of op i, and whether it receives: a forward from the
 * stage before (all but the first), a backward from the one after (all
 * but the last). */
static int op_stage(const PpRun *r, int i) { return r->ops[i].chunk * r->stages + r->stage; }
static int op_receives(const PpRun *r, int i, int bwd) {
    const int t = op_stage(r, i);
    return r->ops[i].fwd != bwd && (bwd ? t < r->stages * r->v - 1 : t > 0);
}

/* Posts direction bwd's receive for the first op from `from` that takes
 * one. */
static void post_next(PpRun *r, int bwd, int from) {
    int i = from;
    while (i < r->nops && !op_receives(r, i, bwd)) i++;
    r->next[bwd] = i;
    if (i == r->nops) return;
    const int peer = (r->stage + (bwd ? 1 : r->stages - 1)) % r->stages;
    MPI_CHECK(MPI_Irecv(r->rbuf[bwd], (int)r->st->count, MPI_FLOAT, peer,
                        tag_of(r, op_stage(r, i), r->ops[i].mb, bwd), r->comm, &r->rreq[bwd]));
}

/* Op i's message (posted ahead) into dst, and the next one posted. */
static void take(PpRun *r, int i, int bwd, float *dst) {
    assert(r->next[bwd] == i);
    const double t0 = now_s();
    MPI_CHECK(MPI_Wait(&r->rreq[bwd], MPI_STATUS_IGNORE));
    pp_wait_s += now_s() - t0;
    memcpy(dst, r->rbuf[bwd], r->st->count * sizeof(float));
    post_next(r, bwd, i + 1);
}

static void do_forward(PpRun *r, int i, int c, int mb) {
    const PpStage *st = r->st;
    const int t = c * r->stages + r->stage;
    int slot = 0;
    while (r->busy[slot]) slot++;
    assert(slot < r->sets); /* pp_sets counted the most in flight */
    r->busy[slot] = 1;
    r->set_of[c * r->m + mb] = slot;
    wait_req(&r->fwd_req[slot]); /* its previous output has left */
    if (t > 0) take(r, i, 0, st->input(st->ctx, slot));
    st->forward(st->ctx, c, mb, slot);
    if (++r->live > r->max_live) r->max_live = r->live;
    if (t < r->stages * r->v - 1) {
        MPI_CHECK(MPI_Isend(st->output(st->ctx, slot), (int)st->count, MPI_FLOAT,
                            (r->stage + 1) % r->stages, tag_of(r, t + 1, mb, 0), r->comm,
                            &r->fwd_req[slot]));
        pp_bytes += st->count * sizeof(float);
    }
}

static void do_backward(PpRun *r, int i, int c, int mb) {
    const PpStage *st = r->st;
    const int slot = r->set_of[c * r->m + mb], t = c * r->stages + r->stage;
    if (t < r->stages * r->v - 1) take(r, i, 1, st->grad_out(st->ctx));
    st->backward(st->ctx, mb, slot);
    r->busy[slot] = 0;
    r->live--;
    if (t > 0) {
        wait_req(&r->bwd_req[slot]);
        memcpy(r->bwd_buf[slot], st->grad_in(st->ctx), st->count * sizeof(float));
        MPI_CHECK(MPI_Isend(r->bwd_buf[slot], (int)st->count, MPI_FLOAT,
                            (r->stage + r->stages - 1) % r->stages, tag_of(r, t - 1, mb, 1),
                            r->comm, &r->bwd_req[slot]));
        pp_bytes += st->count * sizeof(float);
    }
}

void pp_run(PpSchedule s, int m, MPI_Comm comm, const PpStage *st, int *max_live) {
    PpRun r = {.st = st, .comm = comm, .stages = 1, .v = st->chunks > 1 ? st->chunks : 1, .m = m};
    if (comm != MPI_COMM_NULL) {
        MPI_CHECK(MPI_Comm_rank(comm, &r.stage));
        MPI_CHECK(MPI_Comm_size(comm, &r.stages));
    }
    const int sets = r.sets = pp_sets(s, m, r.v, r.stage, r.stages);
    r.set_of = xmalloc((size_t)r.v * m * sizeof(int));
    r.busy = xcalloc((size_t)sets, 1);
    r.fwd_req = xmalloc((size_t)sets * sizeof(MPI_Request));
    r.bwd_req = xmalloc((size_t)sets * sizeof(MPI_Request));
    r.bwd_buf = xcalloc((size_t)sets, sizeof(float *));
    for (int k = 0; k < sets; k++) {
        r.fwd_req[k] = r.bwd_req[k] = MPI_REQUEST_NULL;
        if (r.stage > 0 || r.v > 1) r.bwd_buf[k] = xmalloc(st->count * sizeof(float));
    }
    PpOp *ops = xmalloc(2 * (size_t)m * r.v * sizeof(PpOp));
    const int n = pp_order(s, m, r.v, r.stage, r.stages, ops);
    r.ops = ops, r.nops = n;
    Pump pump = {.running = 0};
    if (st->pump && r.stages > 1) pump_start(&pump, pump_probe, &comm);
    for (int d = 0; d < 2; d++) {
        r.rreq[d] = MPI_REQUEST_NULL;
        r.rbuf[d] = r.stages > 1 ? xmalloc(st->count * sizeof(float)) : NULL;
        if (r.stages > 1) post_next(&r, d, 0);
        else r.next[d] = n;
    }
    for (int i = 0; i < n; i++) {
        if (ops[i].fwd) do_forward(&r, i, ops[i].chunk, ops[i].mb);
        else do_backward(&r, i, ops[i].chunk, ops[i].mb);
    }
    pump_stop(&pump);
    free(r.rbuf[0]), free(r.rbuf[1]);
    for (int k = 0; k < sets; k++) {
        wait_req(&r.fwd_req[k]);
        wait_req(&r.bwd_req[k]);
        free(r.bwd_buf[k]);
    }
    free(ops);
    free(r.fwd_req);
    free(r.bwd_req);
    free(r.bwd_buf);
    free(r.set_of);
    free(r.busy);
    if (max_live) *max_live = r.max_live;
}

double pp_exchange(MPI_Comm comm, int bytes, int reps) {
    int rank, size;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    if (size < 2 || rank > 1) return 0;
    char *out = xcalloc((size_t)bytes + 1, 1), *in = xcalloc((size_t)bytes + 1, 1);
    const int peer = 1 - rank;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s();
        MPI_CHECK(MPI_Sendrecv(out, bytes, MPI_BYTE, peer, 1, in, bytes, MPI_BYTE, peer, 1, comm,
                               MPI_STATUS_IGNORE));
        const double t = now_s() - t0;
        if (t < best) best = t;
    }
    free(out), free(in);
    return best;
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

void pp_connect_peers(void) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2 || size > PP_CONNECT_MAX_RANKS) return;
    /* all on one node (as Open MPI's mpirun says): shared memory only */
    long long local = 0;
    const char *env = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (env && parse_i64(env, 1, PP_CONNECT_MAX_RANKS, &local) == 0 && local == size) return;
    /* Every send is posted before anything progresses: a rank's own
     * connection to each peer is then opening (Open MPI connects inside
     * the send) before it takes in the peer's, which lands on another
     * endpoint (btl_tcp_links > 1) instead of being shared both ways.
     * MPI_Init's last wait progresses too, and its ranks leave it up to
     * milliseconds apart (the node of mpirun first): 50 ms first, so that
     * every peer has left it before a connection reaches it (without:
     * 3 launches of 5 over two hosts of two ranks gave every pair a
     * connection from each end; with: 11 of 11). */
    const struct timespec settle = {0, 50 * 1000 * 1000};
    nanosleep(&settle, NULL);
    char one = 1, got[PP_CONNECT_MAX_RANKS] = {0};
    MPI_Request req[2 * PP_CONNECT_MAX_RANKS];
    int n = 0;
    for (int p = 0; p < size; p++)
        if (p != rank) MPI_CHECK(MPI_Isend(&one, 1, MPI_CHAR, p, 0, MPI_COMM_WORLD, &req[n++]));
    for (int p = 0; p < size; p++)
        if (p != rank) MPI_CHECK(MPI_Irecv(&got[p], 1, MPI_CHAR, p, 0, MPI_COMM_WORLD, &req[n++]));
    MPI_CHECK(MPI_Waitall(n, req, MPI_STATUSES_IGNORE));
}
