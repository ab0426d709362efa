/*
 * plan: what a run would cost on a cluster, before it is submitted. For a
 * config (model, batch, sequence) and a cluster description, each candidate
 * layout (tp, pp, dp, ranks per node, threads) gets its memory per rank
 * (the allocation train makes, plus the process baseline), its FLOPs and
 * the bytes each rank hands to the tp, dp and pp groups per step (counted
 * as train counts them), an estimated step time, tokens/s, and the
 * checkpoint's size and save time.
 *
 * The time model: compute is FLOPs over the sgemm rate times the measured
 * efficiency; a ring all-reduce of n bytes over p ranks costs
 * 2(p-1) alpha + 2 (p-1)/p n / beta (alpha, beta those of shared memory when
 * the group is on one node, of the network otherwise); a pipeline of m
 * micro-batches takes m of its slowest stage's micro-batch plus one of
 * every other stage's (the fill and drain: the bubble, (pp - 1) / (m + pp
 * - 1) of the step when the stages are balanced); under interleaved 1F1B
 * (virtual_stages v, its chunks each 1/v of a stage's work) the fill and
 * drain shrink to 1/v of that ((pp - 1) / (v m + pp - 1)) and each
 * micro-batch crosses v times as many stage boundaries; AdamW streams 28
 * bytes per parameter through memory.
 *
 * Mixture-of-Experts: an MoE block costs one expert per slot (expert_top_k
 * a token, none dropped) and its router C (E + Nn) a token; under ep each
 * rank holds E / ep experts of each MoE block, and each MoE block's
 * micro-batch makes 4 all-to-alls of its n x k rows of C floats ((ep - 1)
 * / ep of them to other ranks: n the rows the block sees, k expert_top_k)
 * and one of the counts; an all-to-all over ep ranks costs (ep - 1) alpha +
 * (bytes sent) / beta, on one node's shared memory when tp x ep ranks fit
 * on one. The experts' gradients are all-reduced over their dp / ep
 * replicas, the rest over dp.
 *
 * Recompute (the config's): the sets keep what the mode keeps and the
 * model one working copy of the rest (model_memory's); block runs each
 * block's forward again in its backward (a third more of the blocks'
 * FLOPs, their forward's tp all-reduces, an MoE block's 2 all-to-alls of
 * rows and 1 of the counts), attention ln1, the qkv product and the heads
 * (FLOPs only). flops_step stays the model's.
 */
#ifndef MODTRAIN_PLAN_H
#define MODTRAIN_PLAN_H

#include <stddef.h>

#include "src/plan/cluster.h"
#include "src/config/config.h"
#include "src/model/model.h"

typedef struct {
    int tp, pp, dp, ranks_per_node, threads;
    int vs;                              /* virtual stages: the config's at pp > 1, else 1 */
    int ep;                              /* expert-parallel ranks (1 without experts) */
    int micro, n_micro;                  /* per dp rank and step */
    ModelMemory mem;                     /* the largest stage's model (staging included) */
    size_t comm_bytes;                   /* pipeline receive buffers */
    size_t rank_bytes;                   /* mem.total + comm_bytes + the baseline */
    int fits;                            /* rank_bytes x ranks_per_node within the node */
    double flops_step;                   /* the job's model FLOPs per step */
    double tp_bytes, dp_bytes, pp_bytes; /* per step, by the busiest rank of each */
    double ep_bytes;        /* the experts' all-to-alls' rows a rank sends to others per step */
    double dp_expert_bytes; /* the part of dp_bytes reduced over the experts' dp / ep replicas */
    double dp_rows_bytes;   /* the part of dp_bytes for the embedding's rows: at most this */
    double t_compute, t_tp, t_pp, t_bubble, t_dp, t_optimizer, t_step; /* seconds */
    double t_ep; /* the all-to-alls (in t_step after the optimizer) */
    /* the dp reduction's own time; t_dp is what of it the step waits for
     * (all of it with dp_overlap 0) */
    double t_dp_all;
    double tokens_per_s;
    double ckpt_bytes, ckpt_s; /* stored size (at the measured ratio 1.2) and save time */
    RankOrder order;           /* the grid's (cfg's, or what auto picks) */
    int crossing[3];           /* per axis (AXIS_TP, ...): its groups that span nodes */
} PlanRow;

/* Model FLOPs per token of a training step (forward and backward), as train
 * counts them: routed blocks at their realised capacity k / seq_len. */
double plan_flops_per_token(const Config *cfg);
/* Parameters of the model (the tied embedding once, V rows). */
size_t plan_num_params(const Config *cfg);
/* Of them, the experts' (every MoE block's n_expert experts, 2 C Fe + Fe +
 * C each). */
size_t plan_expert_params(const Config *cfg);

/* The plan of one layout: tp x pp x dp ranks, ranks_per_node of them on a
 * node, and cfg's ep (an MoE config's; ep must divide dp). cfg's
 * vocab_size must be set. With stage_bytes (pp entries), each
 * stage's rank_bytes too. Returns 0, or -1 with err saying why the layout
 * cannot run (n_head % tp, the batch split, ...). */
int plan_layout(const Config *cfg, const Cluster *cl, int tp, int pp, int ranks_per_node,
                PlanRow *row, size_t *stage_bytes, Err *err);
/* "TP,PP,RANKS_PER_NODE" (plan --layout): exactly three comma-separated
 * fields, each a whole number in [1, 2^20] parsed strictly (an empty field
 * is refused, not skipped). Returns 0, or -1 with the outputs unspecified. */
int plan_parse_layout(const char *v, int *tp, int *pp, int *rpn);
/* Every layout that can run on the cluster's nodes (tp within a node or
 * across whole nodes, under cfg's rank_order; an
 * MoE config's ep each divisor of dp that divides n_expert, or only cfg's
 * ep when it is above 1), fitting ones first, each group by tokens/s, best first. Returns the count
 * (*rows malloc'd) or -1 with err set. */
int plan_candidates(const Config *cfg, const Cluster *cl, PlanRow **rows, Err *err);

#endif
