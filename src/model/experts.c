/*
 * experts: a Mixture-of-Experts MLP branch. The experts' router (E + Nn
 * logits, Nn of them no-op experts) sends each of a block's rows to its
 * top-k experts, as many as each expert's capacity takes; the rest are
 * dropped and keep their residual stream. The rows sent travel to the
 * ranks holding their experts (mpi/ep.c; at ep 1 they stay), each expert's
 * GEMMs run on exactly the rows it took, and the outputs come back to be
 * combined, each scaled by its router probability. A dropped slot or a
 * no-op costs nothing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/ep.h"
#include "mpi/tp.h"
#include "src/base/util.h"
#include "src/kernels/kernels.h"
#include "src/model/model_impl.h"

/* ------------------------------------------------------ the experts' router */

int model_expert_capacity(const ModelDims *d, int N) {
    const double c = floor(d->cf * (double)N * d->ek / d->E);
    return c < 1 ? 1 : c > N ? N : (int)c;
}

/* Softmax of each of the N rows of z (n columns), in place. */
static void softmax_rows(float *z, int N, int n) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = z + (size_t)i * n, mx = row[0], sum = 0.f;
        for (int e = 1; e < n; e++) mx = row[e] > mx ? row[e] : mx;
        for (int e = 0; e < n; e++) sum += row[e] = expf(row[e] - mx);
        for (int e = 0; e < n; e++) row[e] /= sum;
    }
}

/* The k best columns of each row of p (largest first, ties to the lower
 * column). */
static void choose(int *ch, const float *p, int N, int n, int k) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *row = p + (size_t)i * n;
        int first = 0, second = -1;
        for (int e = 1; e < n; e++)
            if (row[e] > row[first]) first = e;
        for (int e = 0; e < n && k > 1; e++)
            if (e != first && (second < 0 || row[e] > row[second])) second = e;
        ch[(size_t)i * k] = first;
        if (k > 1) ch[(size_t)i * k + 1] = second;
    }
}

/* Slots in priority order (every row's first choice, then every row's
 * second): each kept while its expert has room, counted into cnt[0 .. E);
 * slot[] first holds the place within the expert, then the row among all
 * the rows sent. Counts what happened to the slots in st (E + Nn + 2). */
static void assign_slots(const ModelDims *d, const int *ch, int *slot, int *cnt, int N, int cap,
                         long long *st) {
    const int E = d->E, k = d->ek;
    memset(cnt, 0, (size_t)E * sizeof(int));
    for (int j = 0; j < k; j++)
        for (int i = 0; i < N; i++) {
            const size_t s = (size_t)i * k + j;
            const int e = ch[s];
            if (e >= E) slot[s] = MOE_NOOP, st[e]++;
            else if (cnt[e] < cap) slot[s] = cnt[e]++, st[e]++;
            else slot[s] = MOE_DROPPED, st[d->E + d->Nn]++;
        }
    st[d->E + d->Nn + 1] += (long long)N * k;
    int base[4096 + 1];
    base[0] = 0;
    for (int e = 0; e < E; e++) base[e + 1] = base[e] + cnt[e];
    for (size_t s = 0; s < (size_t)N * k; s++)
        if (slot[s] >= 0) slot[s] += base[ch[s]];
}

/* Switch's load-balancing loss Et * sum_e f_e * P_e over all Et = E + Nn
 * columns: f_e the share of the N*k choices that picked e (before
 * capacity), P_e the mean probability of e. f into f[0 .. Et). */
static double balance_loss(const ModelDims *d, const float *p, const int *ch, int N, double *f) {
    const int Et = d->E + d->Nn, k = d->ek;
    memset(f, 0, (size_t)Et * sizeof(double));
    if (N == 0) return 0;
    for (size_t s = 0; s < (size_t)N * k; s++) f[ch[s]] += 1;
    double loss = 0;
    for (int e = 0; e < Et; e++) {
        double P = 0;
        for (int i = 0; i < N; i++) P += p[(size_t)i * Et + e];
        f[e] /= (double)N * k;
        loss += f[e] * P / N;
    }
    return Et * loss;
}

void moe_route(Model *m, int l, const float *u, int N, int capped) {
    const ModelDims *d = &m->d;
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C, Et = d->E + d->Nn, k = d->ek;
    if (N > 0) mm(0, 0, N, Et, C, 1.f, u, C, m->P.h[l].mrw, Et, 0.f, A->mp, Et);
    softmax_rows(A->mp, N, Et);
    choose(A->mch, A->mp, N, Et, k);
    const int cap = capped ? model_expert_capacity(d, N) : N;
    assign_slots(d, A->mch, A->mslot, A->mcnt, N, cap, m->stats.moe + (size_t)l * (Et + 2));
#pragma omp parallel for schedule(static)
    for (size_t s = 0; s < (size_t)N * k; s++)
        if (A->mslot[s] >= 0)
            memcpy(A->mxs + (size_t)A->mslot[s] * C, u + s / k * C, (size_t)C * sizeof(float));
    double f[4096 * 2 + 1];
    const double aux = balance_loss(d, A->mp, A->mch, N, f);
    m->cur->moe_aux += (float)aux; /* model_forward counts it into the stats */
}

void moe_route_backward(Model *m, int l, const float *u, int N, float *du, float aux_scale) {
    const ModelDims *d = &m->d;
    const BlockActs *A = &m->cur->acts[l];
    const int C = d->C, Et = d->E + d->Nn;
    float *dp = m->s.mdp;
    if (N == 0) return;
    double f[4096 * 2 + 1];
    balance_loss(d, A->mp, A->mch, N, f);
    /* d(aux)/dp[i][e] = Et * f_e / N; then the softmax's backward */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *p = A->mp + (size_t)i * Et;
        float *g = dp + (size_t)i * Et, dot = 0.f;
        for (int e = 0; e < Et; e++) {
            g[e] += aux_scale * (float)(Et * f[e] / N);
            dot += p[e] * g[e];
        }
        for (int e = 0; e < Et; e++) g[e] = p[e] * (g[e] - dot);
    }
    mm(1, 0, C, Et, N, 1.f, u, C, dp, Et, 1.f, m->G.h[l].mrw, Et);
    mm(0, 1, N, C, Et, 1.f, dp, Et, m->P.h[l].mrw, Et, 1.f, du, C);
}

/* ---------------------------------------------------------------- experts */

/* The count tables of acts[l].mcnt: rows sent to each expert (E), rows
 * received per rank and local expert (ep x El), the local experts' offsets
 * among the rows received (El + 1). */
static int *sent_counts(const BlockActs *A) { return A->mcnt; }
static int *recv_counts(const ModelDims *d, const BlockActs *A) { return A->mcnt + d->E; }
static int *expert_offsets(const ModelDims *d, const BlockActs *A) { return A->mcnt + 2 * d->E; }

/* This rank's experts on the rows x they took (expert el's are rows
 * [eoff[el], eoff[el+1])): y = gelu(x W1 + b1) W2, all-reduced over tp,
 * + b2; llama's SwiGLU experts without biases. */
static void experts_forward(Model *m, int l, const float *x, const int *eoff, float *y) {
    const ModelDims *d = &m->d;
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C, F = d->Fel;
    for (int e = 0; e < d->El; e++) {
        const ExpertParams *p = &m->P.h[l].ex[e];
        const size_t o = (size_t)eoff[e];
        const int n = eoff[e + 1] - eoff[e];
        m->stats.expert_rows[(size_t)l * d->El + e] += n;
        if (n == 0) continue;
        if (d->arch == ARCH_LLAMA) { /* SwiGLU experts: mh holds gate|up rows */
            swiglu_mlp_forward(x + o * C, n, C, F, p->fcw, p->projw, A->mh + 2 * o * F,
                               A->mhg + o * F, y + o * C);
            continue;
        }
        linear_forward(A->mh + o * F, x + o * C, p->fcw, NULL, n, C, F);
        bias_gelu_forward(A->mh + o * F, A->mhg + o * F, p->fcb, n, F);
        linear_forward(y + o * C, A->mhg + o * F, p->projw, NULL, n, F, C);
    }
    tp_allreduce_sum(y, (size_t)eoff[d->El] * C, &m->tp);
    for (int e = 0; e < d->El && d->arch == ARCH_GPT2; e++)
        bias_add(y + (size_t)eoff[e] * C, m->P.h[l].ex[e].projb, eoff[e + 1] - eoff[e], C);
}

/* Backward of experts_forward: dy in, dx (the rows' input gradients, this
 * rank's tp share) out, the experts' weight gradients added. */
static void experts_backward(Model *m, int l, const float *x, const int *eoff, const float *dy,
                             float *dx) {
    const ModelDims *d = &m->d;
    const BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int C = d->C, F = d->Fel;
    for (int e = 0; e < d->El; e++) {
        const ExpertParams *p = &m->P.h[l].ex[e];
        ExpertParams *g = &m->G.h[l].ex[e];
        const size_t o = (size_t)eoff[e];
        const int n = eoff[e + 1] - eoff[e];
        if (n == 0) continue;
        if (d->arch == ARCH_LLAMA) {
            swiglu_mlp_backward(x + o * C, n, C, F, p->fcw, p->projw, g->fcw, g->projw,
                                A->mh + 2 * o * F, A->mhg + o * F, d->recompute != RECOMPUTE_BLOCK,
                                dy + o * C, S->mdhg + o * F, S->mdh + 2 * o * F, dx + o * C);
            continue;
        }
        float *dhg = S->mdhg + o * F, *dh = S->mdh + o * F;
        const size_t nF = (size_t)n * F;
        const int have_grad = gelu_again(m, A->mh + o * F, A->mhg + o * F, dh, nF);
        linear_backward_set(dhg, g->projw, g->projb, dy + o * C, A->mhg + o * F, p->projw, n, F, C);
        gelu_back(have_grad, dh, A->mh + o * F, dhg, nF);
        linear_backward_set(dx + o * C, g->fcw, g->fcb, dh, x + o * C, p->fcw, n, C, F);
    }
}

void moe_forward(Model *m, int l, const float *u, int N, float *out, int capped) {
    const ModelDims *d = &m->d;
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C, Et = d->E + d->Nn, k = d->ek;
    moe_route(m, l, u, N, capped);
    int *eoff = expert_offsets(d, A);
    if (m->ep.size > 1) {
        A->nrecv = ep_dispatch(&m->ep, A->mxs, sent_counts(A), d->El, C, 0, recv_counts(d, A), eoff,
                               A->mxr);
        experts_forward(m, l, A->mxr, eoff, A->myr);
        ep_return(&m->ep, A->myr, sent_counts(A), recv_counts(d, A), eoff, d->El, C, A->mys);
    } else {
        eoff[0] = 0;
        for (int e = 0; e < d->E; e++) eoff[e + 1] = eoff[e] + sent_counts(A)[e];
        A->nrecv = eoff[d->E];
        experts_forward(m, l, A->mxs, eoff, A->mys);
    }
    /* out = sum over the row's kept slots of p * expert output; 0 for none */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *o = out + (size_t)i * C;
        memset(o, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < k; j++) {
            const int s = A->mslot[(size_t)i * k + j];
            if (s < 0) continue;
            const float pe = A->mp[(size_t)i * Et + A->mch[(size_t)i * k + j]];
            const float *y = A->mys + (size_t)s * C;
            for (int c = 0; c < C; c++) o[c] += pe * y[c];
        }
    }
}

void moe_backward(Model *m, int l, const float *u, int N, const float *dout, float *du,
                         float aux_scale) {
    const ModelDims *d = &m->d;
    const BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int C = d->C, Et = d->E + d->Nn, k = d->ek;
    /* each kept slot: d(output) = p * dout, d(p) = <dout, output> */
    memset(S->mdp, 0, (size_t)N * Et * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *g = dout + (size_t)i * C;
        for (int j = 0; j < k; j++) {
            const int s = A->mslot[(size_t)i * k + j], e = A->mch[(size_t)i * k + j];
            if (s < 0) continue;
            const float pe = A->mp[(size_t)i * Et + e], *y = A->mys + (size_t)s * C;
            float *dy = S->mdys + (size_t)s * C, dot = 0.f;
            for (int c = 0; c < C; c++) {
                dot += g[c] * y[c];
                dy[c] = pe * g[c];
            }
            S->mdp[(size_t)i * Et + e] = dot;
        }
    }
    const int *eoff = expert_offsets(d, A);
    float *dx; /* the sent rows' input gradients, laid out as mxs */
    if (m->ep.size > 1) {
        ep_dispatch(&m->ep, S->mdys, sent_counts(A), d->El, C, 1, recv_counts(d, A), (int *)eoff,
                    S->mdyr);
        experts_backward(m, l, A->mxr, eoff, S->mdyr, S->mdxr);
        ep_return(&m->ep, S->mdxr, sent_counts(A), recv_counts(d, A), eoff, d->El, C, S->mdys);
        dx = S->mdys;
    } else {
        experts_backward(m, l, A->mxs, eoff, S->mdys, S->mdxr);
        dx = S->mdxr;
    }
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *g = du + (size_t)i * C;
        memset(g, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < k; j++) {
            const int s = A->mslot[(size_t)i * k + j];
            if (s < 0) continue;
            const float *x = dx + (size_t)s * C;
            for (int c = 0; c < C; c++) g[c] += x[c];
        }
    }
    tp_allreduce_sum(du, (size_t)N * C, &m->tp);
    /* the router reads the replicated u: its share comes after the reduce */
    moe_route_backward(m, l, u, N, du, aux_scale);
}
