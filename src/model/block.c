/*
 * block: the one implementation of a block's two branches, attention and
 * the MLP, forward and backward, over whole sequences or (decoding) one
 * token against its KV cache. Training, evaluation and decoding all run
 * it; routing.c runs it on the tokens a router chose.
 *
 * GPT-2's block and llama's differ in their norms (norm_forward), llama's
 * rotary positions on q and k, and its grouped-query attention: KV key and
 * value heads, spread to the query heads before the attention kernels
 * (gqa_expand) and their gradients gathered back after (gqa_reduce).
 *
 * The tensor-parallel collectives sit exactly where Megatron puts them: an
 * all-reduce after each row-parallel product and one on the input gradient
 * of each column-parallel product.
 */
#include "src/model/model_impl.h"

#include <string.h>

#include "src/kernels/kernels.h"

/* The attention branch of block l up to its projection: ln1, qkv (q and k
 * rotated, llama), and the heads' output atty (with each row's lse). Under
 * recompute = attention the backward runs it again, the same code on the
 * same x: the same bits. */
static void attention_heads_forward(Model *m, int l, const float *x, int N, int B, const int *off,
                                    const int *pos, const KvCache *kv) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C, ldkv = d->KVl * d->hs;
    norm_forward(m, A->ln1, A->ln1_mean, A->ln1_rstd, x, p->ln1w, p->ln1b, N);
    linear_forward(A->qkv, A->ln1, p->qkvw, p->qkvb, N, C, d->qkvl);
    if (pos) /* q's heads and k's, one after the other in a row */
        rope_apply(A->qkv, pos, N, d->NHl + d->KVl, d->hs, d->qkvl, m->s.rope_cos, m->s.rope_sin,
                   1);
    if (kv) {
        int n = (*kv->len)++;
        memcpy(kv->k + (size_t)n * ldkv, A->qkv + d->Cl, (size_t)ldkv * sizeof(float));
        memcpy(kv->v + (size_t)n * ldkv, A->qkv + d->Cl + ldkv, (size_t)ldkv * sizeof(float));
        attention_decode(A->atty, kv->p, A->qkv, kv->k, kv->v, n + 1, d->NHl, d->KVl, d->hs, ldkv);
    } else if (d->KV != d->NH) {
        gqa_expand(m->s.qkvg, A->qkv, N, d->NHl, d->KVl, d->hs);
        attention_forward(A->atty, A->lse, m->s.qkvg, B, off, d->NHl, d->hs);
    } else {
        attention_forward(A->atty, A->lse, A->qkv, B, off, d->NHl, d->hs);
    }
}

void block_branches_forward(Model *m, int l, const float *x, int N, int B, const int *off,
                            const int *pos, const KvCache *kv, float *a, float *mo) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockActs *A = &m->cur->acts[l];
    const int C = d->C, Cl = d->Cl;
    attention_heads_forward(m, l, x, N, B, off, pos, kv);
    linear_forward(a, A->atty, p->attprojw, NULL, N, Cl, C);
    tp_allreduce_sum(a, (size_t)N * C, &m->tp);
    if (d->arch == ARCH_LLAMA) {
        residual_forward(A->res2, x, a, (size_t)N * C);
        rmsnorm_forward(A->ln2, A->ln2_rstd, A->res2, p->ln2w, N, C, d->eps);
    } else {
        bias_residual_layernorm_forward(a, A->res2, A->ln2, A->ln2_mean, A->ln2_rstd, x,
                                        p->attprojb, p->ln2w, p->ln2b, N, C);
    }
    mlp_forward(m, l, A->ln2, N, mo, kv == NULL);
}

/* The attention kernels' backward into dL/d(qkv) (N, qkvl): each query
 * head's k and v gradients gathered onto their kv head, then llama's
 * rotations undone. Returns where it is. */
static float *attention_heads_backward(Model *m, int l, int N, int B, const int *off,
                                       const int *pos) {
    const ModelDims *d = &m->d;
    BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    float *dqkv = S->dqkv;
    if (d->KV != d->NH) { /* qkvg: the expanded q|k|v, then their gathered gradients */
        gqa_expand(S->qkvg, A->qkv, N, d->NHl, d->KVl, d->hs);
        attention_backward(S->dqkv, S->datty, S->qkvg, A->atty, A->lse, B, off, d->NHl, d->hs);
        gqa_reduce(S->qkvg, S->dqkv, N, d->NHl, d->KVl, d->hs);
        dqkv = S->qkvg;
    } else {
        attention_backward(S->dqkv, S->datty, A->qkv, A->atty, A->lse, B, off, d->NHl, d->hs);
    }
    if (pos)
        rope_apply(dqkv, pos, N, d->NHl + d->KVl, d->hs, d->qkvl, S->rope_cos, S->rope_sin, -1);
    return dqkv;
}

void block_branches_backward(Model *m, int l, const float *x, int N, int B, const int *off,
                             const int *pos, float *dres) {
    const ModelDims *d = &m->d;
    const BlockParams *p = &m->P.h[l];
    BlockParams *g = &m->G.h[l];
    BlockActs *A = &m->cur->acts[l];
    Scratch *S = &m->s;
    const int C = d->C;
    mlp_backward(m, l, A->ln2, N, dres, S->dln, m->moe_scale);
    norm_backward(m, dres, g->ln2w, g->ln2b, S->dln, A->res2, p->ln2w, A->ln2_mean, A->ln2_rstd, N);
    /* (no communication: the qkv product is column-parallel) */
    if (d->recompute == RECOMPUTE_ATTENTION) attention_heads_forward(m, l, x, N, B, off, pos, NULL);
    linear_backward_set(S->datty, g->attprojw, g->attprojb, dres, A->atty, p->attprojw, N, d->Cl,
                        C);
    const float *dqkv = attention_heads_backward(m, l, N, B, off, pos);
    linear_backward_set(S->dln, g->qkvw, g->qkvb, dqkv, A->ln1, p->qkvw, N, C, d->qkvl);
    tp_allreduce_sum(S->dln, (size_t)N * C, &m->tp);
    norm_backward(m, dres, g->ln1w, g->ln1b, S->dln, x, p->ln1w, A->ln1_mean, A->ln1_rstd, N);
}
