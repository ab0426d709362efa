/*
 * mlp: a block's MLP branch, dense here or a Mixture-of-Experts (E such
 * MLPs of width Fe, in experts.c).
 *
 * GPT-2's dense MLP: c_fc (column-parallel over tp), GELU, c_proj
 * (row-parallel), then the all-reduce. Llama's: gate and up in one
 * column-parallel product (each rank its Fl columns of each), SwiGLU, the
 * row-parallel down projection, the all-reduce; no biases.
 */
#include <stdlib.h>
#include <string.h>

#include "mpi/ep.h"
#include "mpi/tp.h"
#include "src/kernels/kernels.h"
#include "src/model/model_impl.h"

/* ------------------------------------------------------------------ dense */

static void dense_forward(Model *m, int l, const float *u, int N, float *out) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C;
    if (d->arch == ARCH_LLAMA) {
        swiglu_mlp_forward(u, N, C, d->Fl, p->fcw, p->fcprojw, A->fch, A->fch_gelu, out);
        tp_allreduce_sum(out, (size_t)N * C, &m->tp);
        return;
    }
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
    if (d->arch == ARCH_LLAMA) {
        swiglu_mlp_backward(u, N, C, d->Fl, p->fcw, p->fcprojw, g->fcw, g->fcprojw, A->fch,
                            A->fch_gelu, d->recompute != RECOMPUTE_BLOCK, dout, S->dfchg, S->dfch,
                            du);
        tp_allreduce_sum(du, (size_t)N * C, &m->tp);
        return;
    }
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
