/*
 * routing: Mixture-of-Depths, which tokens a routed block's work sees.
 *
 * A router (one logit per token, and optionally a small
 * predictor of it) chooses the top-k tokens of each sequence for a routed
 * block, or a causal decision does when sampling; the rest skip the block on
 * the residual path, and the block's output is scaled by the router's gate.
 * The experts' router is in experts.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/tp.h"
#include "src/base/util.h"
#include "src/kernels/kernels.h"
#include "src/model/model_impl.h"

/* ------------------------------------------------------- Mixture-of-Depths */

float mod_gate(RouterGate gate, float r) {
    return gate == GATE_SIGMOID ? 1.f / (1.f + expf(-r)) : r;
}
static float gate_grad(RouterGate gate, float r) {
    if (gate != GATE_SIGMOID) return 1.f;
    float s = 1.f / (1.f + expf(-r));
    return s * (1.f - s);
}

/* The causal decision of a token: the predictor's logit, or the router's
 * own, above zero. */
int mod_causal(const ModelDims *d, float r, float plogit) {
    return d->predictor ? plogit > 0.f : r > 0.f;
}

float model_gate(const ModelDims *d, float r) { return mod_gate(d->gate, r); }

int model_causal(const ModelDims *d, float r, float plogit) { return mod_causal(d, r, plogit); }

/* BCE of a logit z against a 0/1 target, in a form that never overflows. */
static double bce_logit(float z, int target) {
    return (z > 0 ? z : 0) - (double)z * target + log1p(exp(-fabs((double)z)));
}

typedef struct {
    float r;
    int t;
} Score;

/* Larger score first; ties to the lower position. */
static int score_cmp(const void *a, const void *b) {
    const Score *x = a, *y = b;
    if (x->r != y->r) return x->r > y->r ? -1 : 1;
    return x->t - y->t;
}

static void swap_scores(Score *a, Score *b) {
    Score t = *a;
    *a = *b;
    *b = t;
}

/* Marks the k best positions of r in score_cmp's order: a selection in
 * O(T) expected time (Hoare's, median-of-three pivots) rather than a sort.
 * score_cmp is a total order (positions differ), so the set is the one a
 * sort would give. */
static void topk_mark(unsigned char *member, const float *r, int T, int k, Score *buf) {
    if (T <= 0) return;
    for (int t = 0; t < T; t++) buf[t] = (Score){r[t], t};
    memset(member, k >= T, (size_t)T);
    if (k >= T) return;
    int lo = 0, hi = T - 1;
    while (lo < hi) { /* buf[0 .. k) holds the best k when done */
        const int mid = lo + (hi - lo) / 2;
        if (score_cmp(&buf[mid], &buf[lo]) < 0) swap_scores(&buf[mid], &buf[lo]);
        if (score_cmp(&buf[hi], &buf[lo]) < 0) swap_scores(&buf[hi], &buf[lo]);
        if (score_cmp(&buf[hi], &buf[mid]) < 0) swap_scores(&buf[hi], &buf[mid]);
        const Score pivot = buf[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (score_cmp(&buf[i], &pivot) < 0) i++;
            while (score_cmp(&pivot, &buf[j]) < 0) j--;
            if (i <= j) swap_scores(&buf[i++], &buf[j--]);
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
    for (int i = 0; i < k; i++) member[buf[i].t] = 1;
}

void model_topk(unsigned char *member, const float *r, int T, int k) {
    Score *buf = xmalloc((size_t)T * sizeof(Score));
    topk_mark(member, r, T, k, buf);
    free(buf);
}

/* Router logits r (and the predictor's) of block l for N rows of x, into
 * the block's activations. The predictor reads x but never sends gradient
 * into it. */
void mod_router_forward(Model *m, int l, const float *x, int N) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C;
    mv(0, N, C, 1.f, x, C, p->rw, 0.f, A->r);
    for (int i = 0; i < N; i++) A->r[i] += p->rb[0];
    if (!d->predictor) return;
    linear_forward(A->ph, x, p->pw1, p->pb1, N, C, d->H);
    gelu_forward(A->phg, A->ph, (size_t)N * d->H);
    mv(0, N, d->H, 1.f, A->phg, d->H, p->pw2, 0.f, A->plogit);
    for (int i = 0; i < N; i++) A->plogit[i] += p->pb2[0];
}

/* With debug checks: every tp rank routes from the same replicated stream,
 * so the chosen positions must agree bit for bit. Returns 0, or -1 with the
 * model faulted (on every rank of the tp group alike). */
static int routing_agrees(Model *m, int l, const BlockActs *a, int K) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < K; i++) h = (h ^ (uint64_t)a->sel[i]) * 1099511628211ULL;
    h = (h ^ (uint64_t)K) * 1099511628211ULL;
    if (tp_agree_u64(h, &m->tp)) return 0;
    m->faulted = 1;
    return err_set(&m->fault,
                   "routing: tensor-parallel ranks chose different tokens in block %d (rank %d of "
                   "its tp group)",
                   l, m->tp.rank);
}

/* Chooses the tokens routed block l processes, fills sel/off/gate, and
 * accumulates the BCE losses and the agreement of the causal decision with
 * top-k membership. Returns 0, or -1 when the debug check faulted. */
static int route_select(Model *m, int l, int B, int T) {
    const ModelDims *d = &m->d;
    BlockActs *a = &m->cur->acts[l];
    const int k = model_capacity_k(d, T);
    Score *buf = xmalloc((size_t)T * sizeof(Score));
    double aux = 0, pred = 0;
    long long agree = 0;
    int K = 0;
    a->off[0] = 0;
    for (int b = 0; b < B; b++) {
        const float *r = a->r + (size_t)b * T;
        const float *z = d->predictor ? a->plogit + (size_t)b * T : NULL;
        unsigned char *tk = a->topk + (size_t)b * T;
        topk_mark(tk, r, T, k, buf);
        for (int t = 0; t < T; t++) {
            int causal = mod_causal(d, r[t], z ? z[t] : 0.f);
            agree += causal == tk[t];
            aux += bce_logit(r[t], tk[t]);
            if (z) pred += bce_logit(z[t], tk[t]);
            if (m->route == ROUTE_TOPK ? tk[t] : causal) {
                a->sel[K] = b * T + t;
                a->gate[K] = mod_gate(d->gate, r[t]);
                K++;
            }
        }
        a->off[b + 1] = K;
    }
    free(buf);
    if (m->check_routing && routing_agrees(m, l, a, K) != 0) return -1;
    m->stats.aux_sum += aux;
    m->stats.pred_sum += pred;
    m->stats.agree += agree;
    m->stats.decisions += (long long)B * T;
    m->cur->aux_loss += (float)aux;
    m->cur->pred_loss += (float)pred;
    return 0;
}

/* Routed block l on x(B,T,C): router (and predictor) on every token, the
 * branches on the chosen K tokens only, y = x + g(r) * (a + mo) on those and
 * y = x elsewhere. Returns 0, or -1 when the debug routing check faulted. */
int routed_forward(Model *m, int l, const float *x, float *y, int B, int T) {
    BlockActs *A = &m->cur->acts[l];
    const int N = B * T, C = m->d.C;
    mod_router_forward(m, l, x, N);
    if (route_select(m, l, B, T) != 0) return -1;
    const int K = A->off[B];
    m->stats.processed[l] += K;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < K; i++)
        memcpy(A->xs + (size_t)i * C, x + (size_t)A->sel[i] * C, (size_t)C * sizeof(float));
    /* a routed token keeps its own position for the rotary embedding */
    if (K > 0)
        block_branches_forward(m, l, A->xs, K, B, A->off, rows_pos(m, A->sel, K, T), NULL, A->a,
                               A->mo);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) /* y = x a row at a time on every thread (one memcpy
                                   of GPT-2 small's took 0.24 ms of a routed block's 8) */
        memcpy(y + (size_t)t * C, x + (size_t)t * C, (size_t)C * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int i = 0; i < K; i++)
        gated_add(y + (size_t)A->sel[i] * C, A->a + (size_t)i * C, A->mo + (size_t)i * C,
                  A->gate[i], C);
    return 0;
}

/* The gradients of the router's BCE (aux_loss) and the predictor's own BCE
 * for routed block l; m->s.dr holds the gate's gradient on entry and is
 * spent on exit. dres gets the router's share of dL/dx. */
static void router_backward(Model *m, int l, const float *x, float *dres, int N, float aux_scale,
                            float pred_scale) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockParams *g = &m->G.h[l];
    const BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int C = d->C;
    /* the router's BCE toward top-k membership (causal_router = aux_loss) */
    if (!d->predictor && aux_scale != 0.f)
        for (int t = 0; t < N; t++)
            S->dr[t] += aux_scale * (1.f / (1.f + expf(-A->r[t])) - (float)A->topk[t]);
    /* router: r = x . w + b */
    mv(1, N, C, 1.f, x, C, S->dr, 1.f, g->rw);
    double db = 0;
    for (int t = 0; t < N; t++) db += S->dr[t];
    g->rb[0] += (float)db;
    rank1(N, C, 1.f, S->dr, p->rw, dres, C);
    if (!d->predictor || !m->predictor_on) return;
    /* predictor: its own BCE, into its own weights only */
    float *dl = S->dr; /* reused: the router's gradient is spent */
    for (int t = 0; t < N; t++)
        dl[t] = pred_scale * (1.f / (1.f + expf(-A->plogit[t])) - (float)A->topk[t]);
    mv(1, N, d->H, 1.f, A->phg, d->H, dl, 1.f, g->pw2);
    double db2 = 0;
    for (int t = 0; t < N; t++) db2 += dl[t];
    g->pb2[0] += (float)db2;
    float *dphg = S->dph + (size_t)N * d->H;
    memset(dphg, 0, (size_t)N * d->H * sizeof(float));
    rank1(N, d->H, 1.f, dl, p->pw2, dphg, d->H);
    gelu_backward_set(S->dph, A->ph, dphg, (size_t)N * d->H);
    linear_backward(NULL, g->pw1, g->pb1, S->dph, x, p->pw1, N, C, d->H);
}

/* Backward of routed_forward: dres holds dL/dy on entry, dL/dx on exit. */
void routed_backward(Model *m, int l, const float *x, float *dres, int B, int T, float aux_scale,
                     float pred_scale) {
    const ModelDims *d = &m->d;
    const BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int N = B * T, C = d->C, K = A->off[B];
    float *ds = S->scratch; /* (K,C) gradient of the gathered rows */
    /* gate: dL/dr = g'(r) * <dy, a + mo>; the branches see g * dy */
    memset(S->dr, 0, (size_t)N * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int i = 0; i < K; i++) {
        int t = A->sel[i];
        const float *dy = dres + (size_t)t * C;
        const float *ar = A->a + (size_t)i * C, *mr = A->mo + (size_t)i * C;
        float *dsr = ds + (size_t)i * C, dot = 0.f, gi = A->gate[i];
        for (int c = 0; c < C; c++) {
            dot += dy[c] * (ar[c] + mr[c]);
            dsr[c] = gi * dy[c];
        }
        S->dr[t] = dot * gate_grad(d->gate, A->r[t]);
    }
    if (K > 0) {
        block_branches_backward(m, l, A->xs, K, B, A->off, rows_pos(m, A->sel, K, T), ds);
        /* ds now includes the residual's g * dy; the gathered rows' own
         * gradient is the rest */
#pragma omp parallel for schedule(static)
        for (int i = 0; i < K; i++) {
            float *dy = dres + (size_t)A->sel[i] * C;
            const float *dsr = ds + (size_t)i * C, gi = A->gate[i];
            for (int c = 0; c < C; c++) dy[c] += dsr[c] - gi * dy[c];
        }
    }
    router_backward(m, l, x, dres, N, aux_scale, pred_scale);
}
