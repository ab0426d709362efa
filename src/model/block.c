/*
 * block: the one implementation of a block's two branches, attention and
 * the MLP, forward and backward, over whole sequences or (decoding) one
 * token against its KV cache. Training, evaluation and decoding all run
 * it; routing.c runs it on the tokens a router chose.
 *
 * The tensor-parallel collectives sit exactly where Megatron puts them: an
 * all-reduce after each row-parallel product and one on the input gradient
 * of each column-parallel product.
 */
#include "src/model/model_impl.h"

#include <string.h>

#include "src/kernels/kernels.h"

/* The attention branch of block l up to its projection: ln1, qkv, and the
 * heads' output atty (with each row's lse). Under recompute = attention the
 * backward runs it again, the same code on the same x: the same bits. */
static void attention_heads_forward(Model *m, int l, const float *x, int N, int B, const int *off,
                                    const KvCache *kv) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C, Cl = d->Cl;
    layernorm_forward(A->ln1, A->ln1_mean, A->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
    linear_forward(A->qkv, A->ln1, p->qkvw, p->qkvb, N, C, 3 * Cl);
    if (kv) {
        int n = (*kv->len)++;
        memcpy(kv->k + (size_t)n * Cl, A->qkv + Cl, (size_t)Cl * sizeof(float));
        memcpy(kv->v + (size_t)n * Cl, A->qkv + 2 * Cl, (size_t)Cl * sizeof(float));
        attention_decode(A->atty, kv->p, A->qkv, kv->k, kv->v, n + 1, d->NHl, d->hs, Cl);
    } else {
        attention_forward(A->atty, A->lse, A->qkv, B, off, d->NHl, d->hs);
    }
}

/* Block l's two branches on N rows x (B sequences, rows off[b]..off[b+1];
 * or, with kv, one token attending to its cache): a = attention branch
 * (projected, all-reduced, biased), mo = MLP branch, with res2 = x + a
 * inside. Internals stay in the current set's acts[l] for backward. The one
 * block implementation: training, evaluation and decoding all run it. */
void block_branches_forward(Model *m, int l, const float *x, int N, int B, const int *off,
                            const KvCache *kv, float *a, float *mo) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C, Cl = d->Cl;
    attention_heads_forward(m, l, x, N, B, off, kv);
    linear_forward(a, A->atty, p->attprojw, NULL, N, Cl, C);
    tp_allreduce_sum(a, (size_t)N * C, &m->tp);
    bias_residual_layernorm_forward(a, A->res2, A->ln2, A->ln2_mean, A->ln2_rstd, x, p->attprojb,
                                    p->ln2w, p->ln2b, N, C);
    mlp_forward(m, l, A->ln2, N, mo, kv == NULL);
}

/* Backward of the branches: dres holds dL/d(res2 + mo) on entry (the
 * gradient reaching the MLP branch and the residual) and dL/dx on exit. */
void block_branches_backward(Model *m, int l, const float *x, int N, int B, const int *off,
                             float *dres) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockParams *g = &m->G.h[l];
    BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int C = d->C;
    const size_t NC = (size_t)N * C;
    mlp_backward(m, l, A->ln2, N, dres, S->dln, m->moe_scale);
    layernorm_backward(dres, g->ln2w, g->ln2b, S->dln, A->res2, p->ln2w, A->ln2_mean, A->ln2_rstd,
                       N, C);
    /* (no communication: the qkv product is column-parallel) */
    if (d->recompute == RECOMPUTE_ATTENTION) attention_heads_forward(m, l, x, N, B, off, NULL);
    linear_backward_set(S->datty, g->attprojw, g->attprojb, dres, A->atty, p->attprojw, N, d->Cl,
                        C);
    attention_backward(S->dqkv, S->datty, A->qkv, A->atty, A->lse, B, off, d->NHl, d->hs);
    linear_backward_set(S->dln, g->qkvw, g->qkvb, S->dqkv, A->ln1, p->qkvw, N, C, 3 * d->Cl);
    tp_allreduce_sum(S->dln, NC, &m->tp);
    layernorm_backward(dres, g->ln1w, g->ln1b, S->dln, x, p->ln1w, A->ln1_mean, A->ln1_rstd, N, C);
}
