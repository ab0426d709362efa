/*
 * model_impl: what the model's own files share and nothing else includes.
 *
 * The room from the top down; a file calls only the files below it:
 *   forward.c    a stage's forward and backward over a micro-batch
 *   decode.c     incremental decoding with a KV cache
 *   routing.c    Mixture-of-Depths: router, top-k, causal decision, routed
 *                blocks
 *   block.c      a block's two branches, attention and MLP
 *   mlp.c        the MLP branch: dense, or the experts
 *   experts.c    the experts' router (choices, capacity, the
 *                load-balancing loss) and the experts with their dispatch
 *   head.c       ln_f, the tied head and the loss, in chunks of rows
 *   model_mem.c  activations and memory: the size tables, allocation,
 *                model_init and model_memory
 *   params.c     the parameter registry, initial weights, gradient norms
 *   dims.c       the model's shape, stages and routed blocks, FLOPs
 *   optim.c      AdamW over the registry (beside the rest)
 */
#ifndef MODTRAIN_MODEL_IMPL_H
#define MODTRAIN_MODEL_IMPL_H

#include "src/kernels/kernels.h"
#include "src/model/model.h"

/* Decoding's view of a block's attention: one new token against the
 * block's KV cache instead of whole sequences. */
typedef struct {
    float *k, *v; /* (maxT, KVl hs) keys (llama's rotated) and values of the tokens cached */
    int *len;     /* tokens cached; the new one is appended */
    float *p;     /* (maxT) scratch */
} KvCache;

/* A routed block's output row: y += g*a + g*mo, computed as (y + g*a) + g*mo
 * so that capacity 1 with g = 1 reproduces a dense block bit for bit. */
static inline void gated_add(float *y, const float *a, const float *mo, float g, int C) {
    for (int c = 0; c < C; c++) {
        float h = y[c] + g * a[c];
        y[c] = h + g * mo[c];
    }
}

/* The block's norms: GPT-2's LayerNorm (weight, bias; the mean kept) or
 * llama's RMSNorm (weight). The backward adds into dx. */
static inline void norm_forward(const Model *m, float *out, float *mean, float *rstd,
                                const float *x, const float *w, const float *b, int N) {
    if (m->d.arch == ARCH_LLAMA) rmsnorm_forward(out, rstd, x, w, N, m->d.C, m->d.eps);
    else layernorm_forward(out, mean, rstd, x, w, b, N, m->d.C);
}
static inline void norm_backward(const Model *m, float *dx, float *dw, float *db, const float *dout,
                                 const float *x, const float *w, const float *mean,
                                 const float *rstd, int N) {
    if (m->d.arch == ARCH_LLAMA) rmsnorm_backward(dx, dw, dout, x, w, rstd, N, m->d.C);
    else layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, m->d.C);
}

/* The positions in their sequences of T of N rows (llama's rotary
 * positions): rows sel[i] of the micro-batch (NULL: rows 0 .. N-1) sit at
 * sel[i] mod T. Into the scratch's pos; NULL for gpt2, which has none. */
static inline const int *rows_pos(Model *m, const int *sel, int N, int T) {
    if (m->d.arch != ARCH_LLAMA) return NULL;
    for (int i = 0; i < N; i++) m->s.pos[i] = (sel ? sel[i] : i) % T;
    return m->s.pos;
}

/* The MLP's GELU in the backward, for the dense MLP (mlp.c) and the
 * experts (experts.c) alike. */
/* The GELU output out of the kept pre-activation pre (n floats) again, for
 * the backward: the sets never keep it (its buffer is the working copy's,
 * which later blocks' forwards overwrite). With it, grad = gelu'(pre) on
 * the same tanh, which the GELU's backward then multiplies by its output's
 * gradient: the same floats as gelu_forward and gelu_backward_set. Returns
 * 0 under recompute = block, where the block's forward has just made out
 * and grad is left for gelu_backward_set. */
static inline int gelu_again(const Model *m, const float *pre, float *out, float *grad, size_t n) {
    if (m->d.recompute == RECOMPUTE_BLOCK) return 0;
    if (n) gelu_with_grad(out, grad, pre, n);
    return 1;
}

/* The GELU's backward: dpre = gelu'(pre) * dout, dpre holding gelu'(pre)
 * already when gelu_again made it. */
static inline void gelu_back(int have_grad, float *dpre, const float *pre, const float *dout, size_t n) {
    if (have_grad) mul_inplace(dpre, dout, n);
    else gelu_backward_set(dpre, pre, dout, n);
}

/* dims.c: the first block at or after l this rank holds, or L: a loop over
 * the held blocks costs their count, not L (the planner measures stages
 * of models of thousands of blocks). */
int model_next_held(const ModelDims *d, int l);

/* params.c: the registry of m->d's stage into m->reg (measure: only
 * m->nparams, with one expert's rows standing for a block's El). */
void model_build_registry(Model *m, int measure);

/* block.c */
/* Block l's two branches on N rows x (B sequences, rows off[b]..off[b+1];
 * or, with kv, one token attending to its cache), at positions pos (N,
 * llama's rotary positions; NULL for gpt2): a = attention branch
 * (projected, all-reduced, biased), mo = MLP branch, with res2 = x + a
 * inside. Internals stay in the current set's acts[l] for backward. The one
 * block implementation: training, evaluation and decoding all run it. */
void block_branches_forward(Model *m, int l, const float *x, int N, int B, const int *off,
                            const int *pos, const KvCache *kv, float *a, float *mo);
/* Backward of the branches: dres holds dL/d(res2 + mo) on entry (the
 * gradient reaching the MLP branch and the residual) and dL/dx on exit. */
void block_branches_backward(Model *m, int l, const float *x, int N, int B, const int *off,
                             const int *pos, float *dres);

/* head.c: the last stage's ln_f, tied head and loss, in chunks of rows */
/* ln_f of the residual stream x (N rows) into the set's lnf. */
void head_forward(Model *m, const float *x, int N);
/* This rank's logits of the set's lnf rows [r0, r0 + n) (n <= head_rows):
 * (n,Vl) = lnf @ wte(Vl,C)^T, into m->s.logits, which it returns. */
float *head_logits(Model *m, int r0, int n);
/* The vocab-parallel loss of the set's N rows, chunk by chunk; the mean.
 * fused: also the head's backward for dloss (model_expect_backward). */
float head_loss_forward(Model *m, int N, int fused, float dloss);
/* The reference head (m->ref_logits): the whole micro-batch's logits, and
 * with loss the mean loss, turning them into probabilities. */
float head_reference_forward(Model *m, int N, int loss);
/* Backward of the head and the loss into m->s.dres (dL/d(stage output)). */
void head_backward(Model *m, float dloss, int N);

/* model_mem.c: the scratch buffers backward and decoding share, laid out
 * by the size table (model_init calls it). */
void model_alloc_scratch(Model *m);
/* The working copy of the buffers m->d.recompute leaves out of the sets
 * (none under recompute = none): before the first set is laid out. */
void model_alloc_work(Model *m);

/* routing.c: Mixture-of-Depths */
float mod_gate(RouterGate gate, float r);
int mod_causal(const ModelDims *d, float r, float plogit);
/* Router logits r (and the predictor's) of block l for N rows of x, into
 * the block's activations. */
void mod_router_forward(Model *m, int l, const float *x, int N);
/* Routed block l on x(B,T,C) into y. Returns 0, or -1 when the debug
 * routing check faulted. */
int routed_forward(Model *m, int l, const float *x, float *y, int B, int T);
/* Its backward: dres holds dL/dy on entry, dL/dx on exit. */
void routed_backward(Model *m, int l, const float *x, float *dres, int B, int T, float aux_scale,
                     float pred_scale);

/* experts.c: the experts' router */
/* Routes block l's N rows u (the MLP's input) to experts: probabilities,
 * choices, and (capped: by capacity; else every choice of a real expert is
 * kept) each slot's row among the rows sent, grouped by expert; the rows
 * sent are gathered into acts[l].mxs and their counts into mcnt[0 .. E).
 * Adds the block's load-balancing loss to the set's moe_aux and counts the
 * slots. */
void moe_route(Model *m, int l, const float *u, int N, int capped);
/* Backward of the router: m->s.mdp holds dL/d(probabilities) from the
 * combine on entry; adds the load-balancing loss's gradient (scaled by
 * m's moe_aux scale), then dL/du into du and dL/dW into the router. */
void moe_route_backward(Model *m, int l, const float *u, int N, float *du, float aux_scale);

/* experts.c: block l's Mixture-of-Experts MLP branch, forward and
 * backward, as mlp_forward and mlp_backward below (which call them). */
void moe_forward(Model *m, int l, const float *u, int N, float *out, int capped);
void moe_backward(Model *m, int l, const float *u, int N, const float *dout, float *du,
                  float aux_scale);

/* mlp.c */
/* The MLP branch of block l on its N rows u = ln_2(res2): out(N,C),
 * all-reduced over tp and biased. capped: apply the experts' capacity
 * (training and evaluation; decoding does not). */
void mlp_forward(Model *m, int l, const float *u, int N, float *out, int capped);
/* Its backward: dout (N,C) in, du (N,C) = dL/du out (overwritten, complete
 * over tp). aux_scale weighs the experts' load-balancing loss. */
void mlp_backward(Model *m, int l, const float *u, int N, const float *dout, float *du,
                  float aux_scale);

#endif
