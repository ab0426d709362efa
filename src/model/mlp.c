/*
 * mlp: a block's MLP branch, dense or a Mixture-of-Experts.
 *
 * The dense MLP is GPT-2's: c_fc (column-parallel over tp), GELU, c_proj
 * (row-parallel), then the all-reduce. An MoE MLP is E such MLPs of width
 * Fe: the experts' router (routing.c) chooses each row's experts and
 * gathers the rows sent; the rows travel to the ranks holding their experts
 * (mpi/ep.c; at ep 1 they stay), each expert's GEMMs run on exactly the
 * rows it took, and the outputs come back to be combined, each scaled by
 * its router probability. A dropped slot or a no-op costs nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "mpi/ep.h"
#include "mpi/tp.h"
#include "src/kernels/kernels.h"
#include "src/model/model_impl.h"

/* ------------------------------------------------------------------ dense */

/* The GELU output out of the kept pre-activation pre (n floats) again, for
 * the backward: the sets never keep it (its buffer is the working copy's,
 * which later blocks' forwards overwrite). With it, grad = gelu'(pre) on
 * the same tanh, which the GELU's backward then multiplies by its output's
 * gradient: the same floats as gelu_forward and gelu_backward_set. Returns
 * 0 under recompute = block, where the block's forward has just made out
 * and grad is left for gelu_backward_set. */
static int gelu_again(const Model *m, const float *pre, float *out, float *grad, size_t n) {
    if (m->d.recompute == RECOMPUTE_BLOCK) return 0;
    if (n) gelu_with_grad(out, grad, pre, n);
    return 1;
}

/* The GELU's backward: dpre = gelu'(pre) * dout, dpre holding gelu'(pre)
 * already when gelu_again made it. */
static void gelu_back(int have_grad, float *dpre, const float *pre, const float *dout, size_t n) {
    if (have_grad) mul_inplace(dpre, dout, n);
    else gelu_backward_set(dpre, pre, dout, n);
}

static void dense_forward(Model *m, int l, const float *u, int N, float *out) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C;
    linear_forward(A->fch, u, p->fcw, NULL, N, C, d->Fl);
    bias_gelu_forward(A->fch, A->fch_gelu, p->fcb, N, d->Fl);
    linear_forward(out, A->fch_gelu, p->fcprojw, NULL, N, d->Fl, C);
    tp_allreduce_sum(out, (size_t)N * C, &m->tp);
    bias_add(out, p->fcprojb, N, C);
}

static void dense_backward(Model *m, int l, const float *u, int N, const float *dout, float *du) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockParams *g = &m->G.h[l];
    BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int C = d->C;
    const size_t NF = (size_t)N * d->Fl;
    if (d->recompute == RECOMPUTE_BLOCK) { /* the block's forward has just made fch_gelu */
        linear_backward_set(S->dfchg, g->fcprojw, g->fcprojb, dout, A->fch_gelu, p->fcprojw, N,
                            d->Fl, C);
        gelu_backward_set(S->dfch, A->fch, S->dfchg, NF);
    } else { /* c_proj's input gradient, then the GELU's output again and its
              * backward in one pass, then c_proj's weights' gradient */
        linear_backward_set(S->dfchg, NULL, NULL, dout, NULL, p->fcprojw, N, d->Fl, C);
        gelu_with_backward(A->fch_gelu, S->dfch, A->fch, S->dfchg, NF);
        linear_backward(NULL, g->fcprojw, g->fcprojb, dout, A->fch_gelu, NULL, N, d->Fl, C);
    }
    linear_backward_set(du, g->fcw, g->fcb, S->dfch, u, p->fcw, N, C, d->Fl);
    tp_allreduce_sum(du, (size_t)N * C, &m->tp);
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
 * + b2. */
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
        linear_forward(A->mh + o * F, x + o * C, p->fcw, NULL, n, C, F);
        bias_gelu_forward(A->mh + o * F, A->mhg + o * F, p->fcb, n, F);
        linear_forward(y + o * C, A->mhg + o * F, p->projw, NULL, n, F, C);
    }
    tp_allreduce_sum(y, (size_t)eoff[d->El] * C, &m->tp);
    for (int e = 0; e < d->El; e++)
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
        float *dhg = S->mdhg + o * F, *dh = S->mdh + o * F;
        const size_t nF = (size_t)n * F;
        const int have_grad = gelu_again(m, A->mh + o * F, A->mhg + o * F, dh, nF);
        linear_backward_set(dhg, g->projw, g->projb, dy + o * C, A->mhg + o * F, p->projw, n, F, C);
        gelu_back(have_grad, dh, A->mh + o * F, dhg, nF);
        linear_backward_set(dx + o * C, g->fcw, g->fcb, dh, x + o * C, p->fcw, n, C, F);
    }
}

static void moe_forward(Model *m, int l, const float *u, int N, float *out, int capped) {
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

static void moe_backward(Model *m, int l, const float *u, int N, const float *dout, float *du,
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

/* ------------------------------------------------------------------ entry */

void mlp_forward(Model *m, int l, const float *u, int N, float *out, int capped) {
    if (model_is_moe(&m->d, l)) moe_forward(m, l, u, N, out, capped);
    else dense_forward(m, l, u, N, out);
}

void mlp_backward(Model *m, int l, const float *u, int N, const float *dout, float *du,
                  float aux_scale) {
    if (model_is_moe(&m->d, l)) moe_backward(m, l, u, N, dout, du, aux_scale);
    else dense_backward(m, l, u, N, dout, du);
}
