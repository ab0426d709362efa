/*
 * forward: a stage's forward and backward over a micro-batch: the
 * embeddings on the first stage, each block in turn (dense through
 * block.c, routed through routing.c, recomputed under recompute = block),
 * the head and the loss on the last, and the routing statistics they
 * count. The model's other rooms: its shape in dims.c, the parameters in
 * params.c, activations and memory in model_mem.c, the branches in
 * block.c, mlp.c and experts.c, Mixture-of-Depths in routing.c, the head
 * in head.c, decoding in decode.c.
 *
 * Routing reads only the replicated residual stream, so every tp rank
 * chooses the same tokens without talking to the others.
 */
#include "src/model/model_impl.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "src/kernels/kernels.h"

void model_stats_reset(Model *m) {
    const ModelDims *d = &m->d;
    RouteStats keep = m->stats;
    memset(keep.processed, 0, (size_t)d->L * sizeof(long long));
    memset(keep.moe, 0, (size_t)d->L * (d->E + d->Nn + 2) * sizeof(long long));
    memset(keep.expert_rows, 0, ((size_t)d->L * d->El + 1) * sizeof(long long));
    memset(&m->stats, 0, sizeof m->stats);
    m->stats.processed = keep.processed;
    m->stats.moe = keep.moe;
    m->stats.expert_rows = keep.expert_rows;
}

/* Block l, routed or dense, on x (B,T,C) into y. Returns 0, or -1 when
 * the debug routing check faulted. */
static int block_forward(Model *m, int l, const float *x, float *y, int B, int T) {
    const int N = B * T;
    if (model_is_routed(&m->d, l)) return routed_forward(m, l, x, y, B, T);
    block_branches_forward(m, l, x, N, B, m->s.off_dense, rows_pos(m, NULL, N, T), NULL,
                           m->s.scratch, m->s.scratch2);
    residual_forward(y, m->cur->acts[l].res2, m->s.scratch2, (size_t)N * m->d.C);
    m->stats.processed[l] += N;
    return 0;
}

/* recompute = block: block l's forward again, from its input x, into the
 * working copy, just before its backward reads it. The first forward
 * counted its routing and losses: this one's counts go to m->restats and
 * the set's losses are put back. The output, the same bits as res3, is
 * dropped into m->s.scratch. Under ep > 1 an MoE block repeats its
 * all-to-alls: every rank of the group runs the same blocks' backwards in
 * the same order, so they meet. */
static void block_recompute(Model *m, int l, const float *x, int B, int T) {
    ActSet *S = m->cur;
    const float aux = S->aux_loss, pred = S->pred_loss, moe = S->moe_aux;
    const RouteStats counted = m->stats;
    m->stats = m->restats;
    /* the forward's routing check passed on these very inputs */
    (void)block_forward(m, l, x, m->s.scratch, B, T);
    m->restats = m->stats;
    m->stats = counted;
    S->aux_loss = aux, S->pred_loss = pred, S->moe_aux = moe;
}

/* The first stage's input: token and (gpt2) position embeddings of the
 * set's inputs, into its enc. */
static void embed_stage_input(Model *m, int B, int T) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    const int N = B * T;
    embed_forward(S->enc, S->inputs, m->P.wte, d->v0, d->Vl, N, d->C);
    tp_allreduce_sum(S->enc, (size_t)N * d->C, &m->tp);
    if (m->P.wpe) pos_forward(S->enc, m->P.wpe, B, T, d->C); /* llama: rotary, in the blocks */
}

float model_forward(Model *m, const int *inputs, const int *targets, int B, int T) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    /* the callers size micro-batches from maxB and maxT: a mismatch is a bug */
    assert(B >= 1 && B <= m->maxB && T >= 1 && T <= d->maxT);
    const int N = B * T;
    S->B = B;
    S->T = T;
    S->aux_loss = S->pred_loss = S->moe_aux = 0.f;
    /* model_expect_backward's promise holds for this forward alone */
    const int fused = m->expect && targets && !m->ref_logits;
    m->expect = 0;
    S->head_fused = 0;
    memcpy(S->inputs, inputs, (size_t)N * sizeof(int));
    if (targets) memcpy(S->targets, targets, (size_t)N * sizeof(int));
    for (int b = 0; b <= B; b++) m->s.off_dense[b] = b * T;
    /* later stages: the caller put the previous stage's output in S->enc */
    const int embeds = model_set_embeds(m), c0 = d->c0[S->chunk], c1 = d->c1[S->chunk];
    if (embeds) {
        if (m->block_needs) m->block_needs(m->block_done_ctx, -1);
        embed_stage_input(m, B, T);
    }

    const float *x = S->enc;
    int routed = 0, moe = 0;
    for (int l = c0; l < c1; l++) {
        if (m->block_needs) m->block_needs(m->block_done_ctx, l);
        if (block_forward(m, l, x, S->acts[l].res3, B, T) != 0) return NAN;
        routed += model_is_routed(d, l);
        moe += model_is_moe(d, l);
        x = S->acts[l].res3;
    }
    if (embeds) m->stats.tokens += N; /* counted once per pipeline */
    /* the load-balancing loss, as the objective weighs it: per micro-batch
     * by its tokens */
    m->stats.moe_aux_sum += (double)S->moe_aux * N;
    m->stats.moe_forwards += (long long)moe * N;
    if (routed) {
        S->aux_loss /= (float)N * routed;
        S->pred_loss /= (float)N * routed;
    }
    /* the mean over the model's MoE blocks (a chunk's share of it), as
     * model_backward weighs each block's load-balancing loss */
    if (model_moe_blocks(d) > 0) S->moe_aux /= (float)model_moe_blocks(d);
    if (!model_set_heads(m)) return 0.f; /* the output is model_stage_output() */
    if (m->block_needs) m->block_needs(m->block_done_ctx, d->L);
    head_forward(m, x, N);
    if (m->ref_logits) return head_reference_forward(m, N, targets != NULL);
    if (!targets) return 0.f; /* the logits are model_logits()'s to make */
    return head_loss_forward(m, N, fused, m->expect_dloss);
}

void model_backward(Model *m, float dloss, float aux_weight) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    const int B = S->B, T = S->T, N = B * T;
    int routed = 0; /* over the whole model: the BCEs are means over all routed blocks */
    for (int l = 0; l < d->L; l++) routed += model_is_routed(d, l);
    const float aux_scale = routed ? aux_weight * dloss / routed : 0.f;
    const float pred_scale = routed ? dloss / routed : 0.f;
    /* each MoE block's load-balancing loss, weighted by the micro-batch's
     * tokens (as the LM loss is) and averaged over the MoE blocks */
    const int moe = model_moe_blocks(d);
    m->moe_scale = moe ? m->moe_aux_weight * dloss * (float)N / moe : 0.f;

    /* earlier stages: the caller put the next stage's input gradient in dres */
    if (model_set_heads(m)) {
        head_backward(m, dloss, N);
        if (m->block_done) m->block_done(m->block_done_ctx, d->L);
    }
    /* m->s.dres holds dL/d(residual stream) and moves back block by block */
    const int c0 = d->c0[S->chunk], c1 = d->c1[S->chunk];
    for (int l = c1 - 1; l >= c0; l--) {
        const float *x = l == c0 ? S->enc : S->acts[l - 1].res3;
        if (d->recompute == RECOMPUTE_BLOCK) block_recompute(m, l, x, B, T);
        if (model_is_routed(d, l)) routed_backward(m, l, x, m->s.dres, B, T, aux_scale, pred_scale);
        else
            block_branches_backward(m, l, x, N, B, m->s.off_dense, rows_pos(m, NULL, N, T),
                                    m->s.dres);
        if (m->block_done) m->block_done(m->block_done_ctx, l);
    }
    if (model_set_embeds(m)) {
        if (m->emb_rows) emb_rows_add(m->emb_rows, m->s.dres, S->inputs, d->v0, N);
        else embed_backward(m->G.wte, m->s.dres, S->inputs, d->v0, d->Vl, N, d->C);
        if (m->G.wpe) pos_backward(m->G.wpe, m->s.dres, B, T, d->C);
    } /* later stages: m->s.dres is dL/d(stage input), for the previous stage */
}
