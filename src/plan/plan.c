/*
 * plan: memory, bytes and an estimated step time per layout (see plan.h).
 */
#include "src/plan/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/dp.h"
#include "mpi/grid.h"
#include "mpi/pipeline.h"
#include "src/data/dataset.h"

/* ------------------------------------------------------------- the model */

/* Ring all-reduce of n bytes over p ranks. */
static double allreduce_s(double n, int p, double alpha, double beta) {
    return p <= 1 ? 0 : 2.0 * (p - 1) * alpha + 2.0 * (p - 1) / p * n / beta;
}

/* Matrix weights a token meets in a block (whole, before tp): attention's
 * q and o (C x C each) and k and v (C x KV hs each, grouped-query
 * attention's smaller ones); the MLP's two matrices (GPT-2) or three
 * (llama's gate, up and down); an expert's alike. */
static double attn_weights(const ModelDims *d) {
    return 2.0 * d->C * d->C + 2.0 * d->C * d->KV * d->hs;
}
static double mlp_weights(const ModelDims *d, int width) {
    return (d->arch == ARCH_LLAMA ? 3.0 : 2.0) * d->C * width;
}
/* The qkv product's weights: what recompute = attention runs again. */
static double qkv_weights(const ModelDims *d) {
    return (double)d->C * d->C + 2.0 * d->C * d->KV * d->hs;
}

/* One stage's figures per micro-batch of B sequences on one rank. */
typedef struct {
    double flops, tp_bytes;
    double tp_calls; /* a count, in double: B T / rows of a big plan overflows an int */
    double ep_rows; /* expert slots (rows of C floats) the MoE blocks send out */
    int moe;        /* the stage's MoE blocks */
} StageCost;

/* The stage's MoE blocks (d->E > 0): each on its rows n (N, or B K when
 * routed), the attention and one expert a slot on them, split over tp, the
 * router on them on every tp rank; tp all-reduces of the attention forward
 * and backward (n C each), of the experts' outputs (n k C, every slot kept)
 * and of the rows' input gradient (n C). Returns the dense and routed
 * blocks among them. */
static void moe_cost(const ModelDims *d, int B, int T, StageCost *s, int *dense, int *routed) {
    const double C = d->C, tp = d->tp, k = d->ek;
    const double K = model_capacity_k(d, T), f = K / T;
    int both;
    const int moe = model_stage_moe(d, &both), count[2] = {moe - both, both};
    for (int r = 0; r < 2; r++) { /* the unrouted MoE blocks, then the routed ones */
        const double n = r ? (double)B * K : (double)B * T, t = r ? f * T : T, m = count[r];
        s->flops += m * (n * (6.0 * (attn_weights(d) + k * mlp_weights(d, d->Fe)) + 12.0 * t * C) /
                             tp +
                         n * 6.0 * C * (d->E + d->Nn));
        if (r) /* the MoD router (and predictor) on every token */
            s->flops +=
                m * ((double)B * T * (6.0 * C + (d->predictor ? 6.0 * (C * d->H + d->H) : 0)));
        s->tp_bytes += m * (3 * n + n * k) * C;
        s->ep_rows += m * n * k;
        if (d->recompute == RECOMPUTE_BLOCK) s->tp_bytes += m * (n + n * k) * C; /* the forward's */
        if (d->recompute == RECOMPUTE_ATTENTION) /* ln1, qkv and the heads again */
            s->flops += m * n * (2.0 * qkv_weights(d) + 4.0 * t * C) / tp;
    }
    s->moe = moe;
    *dense -= count[0], *routed -= count[1];
}

/* What recompute adds to the stage's blocks (s holds their cost so far,
 * the MoE blocks' recompute in it): block runs each block's forward again,
 * a third of its FLOPs (2 of the 6 a weight and token) with its 2 tp
 * all-reduces (its MoE blocks' in moe_cost); attention runs ln1, the qkv
 * product and the heads again, without communication. */
static void recompute_cost(const ModelDims *d, int B, int T, int dense, int routed, StageCost *s) {
    const double C = d->C, N = (double)B * T, K = model_capacity_k(d, T);
    if (d->recompute == RECOMPUTE_BLOCK) {
        s->flops *= 4.0 / 3.0;
        s->tp_bytes += 2 * (dense * N + routed * (double)B * K) * C;
        s->tp_calls += 2 * (dense + routed + s->moe);
    } else if (d->recompute == RECOMPUTE_ATTENTION) {
        const double qkv = 2.0 * qkv_weights(d), rows = dense * N * (qkv + 4.0 * T * C);
        s->flops += (rows + routed * (double)B * K * (qkv + 4.0 * K * C)) / d->tp;
    }
}

static StageCost stage_cost(const ModelDims *d, int B, int T) {
    const double C = d->C, N = (double)B * T, tp = d->tp;
    const double K = model_capacity_k(d, T), f = K / T;
    int routed = model_stage_routed(d), dense = model_stage_blocks(d) - routed;
    StageCost s = {0, 0, 0, 0, 0};
    if (model_first_stage(d)) s.tp_bytes += N * C, s.tp_calls++; /* the embedding */
    if (d->E > 0) moe_cost(d, B, T, &s, &dense, &routed);
    /* this stage's blocks: a routed one on its K tokens of a sequence, and
     * its router (and predictor) on every token */
    /* (llama's rotary positions, like the norms, are elementwise: their time
     * is in the calibrated efficiency, their tables in the memory) */
    const double block = 6.0 * (attn_weights(d) + mlp_weights(d, d->F));
    s.flops += dense * (N * (block + 12.0 * T * C) / tp);
    s.flops += routed * (N * f * (block + 12.0 * (f * T) * C) / tp +
                         N * (6.0 * C + (d->predictor ? 6.0 * (C * d->H + d->H) : 0)));
    s.tp_bytes += 4 * (dense * N + routed * (double)B * K) * C; /* 2 forward, 2 backward */
    s.tp_calls += 4 * (dense + routed + s.moe);
    recompute_cost(d, B, T, dense, routed, &s);
    if (model_last_stage(d)) {
        s.flops += N * 6.0 * d->V * C / tp;
        /* the loss: a chunk's row maxima, then its sums with the target
         * logits; the head's backward: ln_f's input gradient */
        const int rows = d->head_rows > 0 ? d->head_rows : HEAD_ROWS;
        s.tp_bytes += 3 * N + N * C, s.tp_calls += 2 * ceil(N / rows) + 1;
    }
    s.tp_bytes *= sizeof(float);
    return s;
}

/* The group alphas and betas: shared memory within a node, else the network. */
static void link(const Cluster *cl, int spans, double *alpha, double *beta) {
    *alpha = (spans ? cl->net_latency_us : cl->shm_latency_us) * 1e-6;
    *beta = (spans ? cl->net_bw_gbs : cl->shm_bw_gbs) * 1e9;
}

/* What of a collective of s seconds overlapping compute stays seen: what
 * outlasts the compute's window, and at least the share of it that keeps
 * the rank's cores busy (every core computes), which the compute then
 * waits for. */
static double unhidden(double s, double window, double cpu_share) {
    const double out = s - window, busy = s * cpu_share;
    return out > busy ? out : busy;
}

/* An axis's size, and the ranks between neighbours of its groups (the
 * product of the axes inside it in the row's order). */
static int axis_size(const PlanRow *r, int a) {
    return a == AXIS_TP ? r->tp : a == AXIS_DP ? r->dp : r->pp;
}
static int axis_inner(const PlanRow *r, int a) {
    int axes[3], inner = 1;
    grid_parse_order(config_order_name(r->order), axes);
    for (int i = 0; i < 3 && axes[i] != a; i++) inner *= axis_size(r, axes[i]);
    return inner;
}

/* Whether a group of n ranks, inner apart in the node-by-node count (the
 * grid's), spans nodes: any of them does when the groups' extent is more
 * than a node, or does not tile one. */
static int group_spans(const Cluster *cl, const PlanRow *r, int inner, int n) {
    const long long extent = (long long)inner * n;
    return cl->nodes > 1 && n > 1 &&
           (extent > r->ranks_per_node || r->ranks_per_node % extent != 0);
}
static int spans(const Cluster *cl, const PlanRow *r, int a) {
    return group_spans(cl, r, axis_inner(r, a), axis_size(r, a));
}

/* Whether an ep group (ep consecutive dp ranks) spans nodes. */
static int ep_spans(const Cluster *cl, const PlanRow *r) {
    return group_spans(cl, r, axis_inner(r, AXIS_DP), r->ep);
}

/* How many of axis a's groups span nodes, as the grid lays them: a group's
 * first rank is where a's coordinate is 0. The pattern repeats every
 * lcm(ranks per node, the group's extent) ranks; past 2^16 of them, all or
 * none as spans() says. */
static int crossing(const Cluster *cl, const PlanRow *r, int a) {
    const long long inner = axis_inner(r, a), n = axis_size(r, a), extent = inner * n;
    const long long world = (long long)cl->nodes * r->ranks_per_node, rpn = r->ranks_per_node;
    if (!spans(cl, r, a)) return 0;
    long long g = extent, h = rpn;
    while (h) {
        const long long t = g % h;
        g = h, h = t;
    }
    const long long period = extent / g * rpn;
    if (period > 1 << 16) return (int)(world / n);
    long long k = 0;
    for (long long base = 0; base < period; base++)
        k += base % extent < inner && base / rpn != (base + inner * (n - 1)) / rpn;
    return (int)(k * (world / period));
}

/* An all-to-all over p ranks sending n bytes to the others: p - 1 messages. */
static double alltoall_s(double n, int p, double alpha, double beta) {
    return p <= 1 ? 0 : (p - 1) * alpha + n / beta;
}

/* Floats of one expert's tensors on a rank (each on 16 floats, as the
 * registry lays them out): GPT-2's four, llama's gate|up and down. */
static double expert_floats(const ModelDims *d) {
    const size_t C = (size_t)d->C, F = (size_t)d->Fel;
#define PAD16(x) (((x) + 15) & ~(size_t)15)
    if (d->arch == ARCH_LLAMA) return (double)(PAD16(C * 2 * F) + PAD16(F * C));
    return (double)(PAD16(C * F) + PAD16(F) + PAD16(F * C) + PAD16(C));
#undef PAD16
}

/* A micro-batch's time on the slowest stage (compute, tp, pp sends, the
 * all-to-alls), and the sum over all stages of theirs. */
typedef struct {
    double compute, tp, pp, ep, all;
} MicroTime;

/* A stage's micro-batch: its time, and the busiest rank's bytes into r. */
static MicroTime stage_time(const Cluster *cl, PlanRow *r, const ModelDims *d, int T, int s,
                            double act) {
    double ta, tb, pa, pb, ea, eb;
    link(cl, spans(cl, r, AXIS_TP), &ta, &tb);
    link(cl, spans(cl, r, AXIS_PP), &pa, &pb);
    const StageCost sc = stage_cost(d, r->micro, T);
    const double rate = r->threads * cl->gflops_per_core * 1e9 * cl->efficiency;
    MicroTime t = {sc.flops / rate, 0, 0, 0, 0};
    if (r->tp > 1) {
        t.tp = sc.tp_calls * 2.0 * (r->tp - 1) * ta + 2.0 * (r->tp - 1) / r->tp * sc.tp_bytes / tb;
        if (sc.tp_bytes * r->n_micro > r->tp_bytes) r->tp_bytes = sc.tp_bytes * r->n_micro;
    }
    double sends = 0; /* activations one way, gradients back, each chunk's */
    for (int k = 0; k < r->vs; k++) {
        const int v = k * r->pp + s;
        sends += (v > 0) + (v < r->pp * r->vs - 1);
    }
    t.pp = sends * (pa + act / pb);
    if (r->pp > 1 && sends * act * r->n_micro > r->pp_bytes) r->pp_bytes = sends * act * r->n_micro;
    if (r->ep > 1 && sc.moe > 0) {
        /* 4 all-to-alls of rows a block, (ep - 1) / ep of them to others,
         * and the forward's of the counts (E ints); recompute = block runs
         * the forward's 2 and its counts' again */
        link(cl, ep_spans(cl, r), &ea, &eb);
        const double part = (r->ep - 1.0) / r->ep, fwd = d->recompute == RECOMPUTE_BLOCK ? 2 : 1;
        const double rows = (2.0 + 2.0 * fwd) * part * sc.ep_rows * d->C * sizeof(float);
        t.ep = (2.0 + 2.0 * fwd) * sc.moe * alltoall_s(0, r->ep, ea, eb) + rows / eb +
               fwd * sc.moe * alltoall_s(part * d->E * sizeof(int), r->ep, ea, eb);
        if (rows * r->n_micro > r->ep_bytes) r->ep_bytes = rows * r->n_micro;
    }
    return t;
}

/* dp: every gradient float (the experts' over their dp / ep replicas only),
 * and the tied embedding between the end stages; the busiest rank's. */
/* A stage's dp bytes: its gradients (the experts' over their own
 * replicas); at dp > 1 the first stage keeps the embedding's rows apart:
 * at most one per token of the step over dp (dp_rows_bytes, an upper
 * bound: the rows are the distinct tokens), and without the head (pp > 1)
 * it reduces only those, not the table; the tied embedding's two copies
 * are summed between the first and last stage. */
static void stage_dp(PlanRow *r, const ModelDims *d, const ModelMemory *mm, int s, int T) {
    int both;
    const double experts =
        r->ep > 1 ? model_stage_moe(d, &both) * (d->El * expert_floats(d) * sizeof(float)) : 0;
    const double ex = r->dp / r->ep > 1 ? experts : 0;
    const double table = (double)d->Vl * d->C * sizeof(float);
    double dpb = r->dp > 1 ? (double)mm->params - experts + ex : 0, rows = 0;
    if (r->dp > 1 && s == 0) {
        const double tokens = (double)r->dp * r->micro * r->n_micro * T;
        rows = (tokens < d->Vl ? tokens : d->Vl) * d->C * sizeof(float);
        dpb += rows - (r->pp > 1 ? table : 0);
    }
    if (r->pp > 1 && (s == 0 || s == r->pp - 1)) dpb += table;
    if (dpb > r->dp_bytes) r->dp_bytes = dpb, r->dp_expert_bytes = ex, r->dp_rows_bytes = rows;
}

/* Per stage: memory, the micro-batch's time, and the busiest rank's bytes.
 * Returns 0 or -1 (a stage split config_validate would refuse). */
static int plan_stages(const Config *cfg, const Cluster *cl, PlanRow *r, MicroTime *slow,
                       size_t *stage_bytes) {
    const int T = cfg->seq_len;
    const PpSchedule sched = cfg->schedule == SCHED_GPIPE ? PP_GPIPE : PP_1F1B;
    int *layers = xcalloc((size_t)r->pp * r->vs, sizeof(int));
    Config c = *cfg;
    c.pp = r->pp;
    c.virtual_stages = r->vs;
    int rc = config_stage_layers(&c, layers, NULL);
    const double act = (double)r->micro * T * cfg->d_model * sizeof(float);
    *slow = (MicroTime){0, 0, 0, 0, 0};
    double all = 0;
    /* every stage measured from the same parts: no registry of its own */
    ModelDims d;
    ModelUnits u;
    model_dims_config(&d, cfg, r->tp, 0);
    model_dims_ep(&d, r->ep, 0); /* every ep rank holds as many experts */
    d.recompute = cfg->recompute; /* what the sets keep, and the working copy */
    if (rc == 0) model_units(&d, r->micro, &u);
    /* the data path's memory is every stage's alike: the spec parsed once */
    const size_t data_mem = ds_memory(cfg->train_data, r->micro * r->n_micro, T, 0);
    int *starts = xmalloc(((size_t)r->pp * r->vs + 1) * sizeof(int));
    if (rc == 0) rc = model_stage_starts(&d, r->pp, r->vs, layers, starts);
    for (int s = 0; s < r->pp && rc == 0; s++) {
        model_dims_stage_at(&d, r->pp, r->vs, s, starts);
        ModelMemory mm;
        const int slots = pp_sets(sched, r->n_micro, r->vs, s, r->pp);
        model_memory_units(&u, &d, slots, 1, &mm);
        if (cfg->dp_overlap && r->dp > 1) { /* the collectives in flight: a chunk each */
            const size_t chunk = (size_t)DP_BUCKET * sizeof(float), grads = mm.grads;
            const size_t tmp = DP_INFLIGHT * (grads < chunk ? grads : chunk);
            mm.scratch = sat_add(mm.scratch, tmp), mm.total = sat_add(mm.total, tmp);
        }
        if (cfg->zero && r->dp > 1) { /* ZeRO-1: a dp rank's share of the moments */
            mm.total -= mm.moments - mm.moments / (size_t)r->dp;
            mm.moments /= (size_t)r->dp;
        }
        if (cfg->ckpt_async && cfg->ckpt_every > 0 && cfg->ckpt_every < cfg->steps) {
            mm.staging = sat_add(mm.params, mm.moments);
            mm.total = sat_add(mm.total, mm.staging);
        }
        mm.data = data_mem;
        mm.total = sat_add(mm.total, mm.data);
        model_memory_threads(&mm, &d, r->threads);
        /* the sets' inputs, and a receive posted ahead each way */
        const size_t comm = r->pp > 1 ? (size_t)(slots + 2) * (size_t)act : 0;
        if (stage_bytes)
            stage_bytes[s] =
                sat_add(sat_add(mm.total, comm), (size_t)(cl->baseline_mib * 1048576.0));
        if (sat_add(mm.total, comm) > sat_add(r->mem.total, r->comm_bytes))
            r->mem = mm, r->comm_bytes = comm;
        const MicroTime t = stage_time(cl, r, &d, T, s, act);
        all += t.compute + t.tp + t.pp + t.ep;
        if (t.compute + t.tp + t.pp + t.ep > slow->compute + slow->tp + slow->pp + slow->ep)
            *slow = t;
        stage_dp(r, &d, &mm, s, T);
    }
    slow->all = all;
    free(starts);
    free(layers);
    return rc;
}

double plan_flops_per_token(const Config *cfg) {
    ModelDims full;
    model_dims_config(&full, cfg, 1, 0);
    const int k = model_capacity_k(&full, cfg->seq_len);
    double *frac = xcalloc(2 * ((size_t)full.L + 1), sizeof(double)), *slots = frac + full.L + 1;
    /* an MoE block keeps the slots a balanced router would: its share of
     * real experts, E / (E + Nn), or what capacity lets through */
    double kept = 1;
    if (full.E > 0) {
        kept = (double)full.E / (full.E + full.Nn);
        if (full.cf < kept) kept = full.cf;
    }
    for (int l = 0; l < full.L; l++) {
        frac[l] = model_is_routed(&full, l) ? (double)k / cfg->seq_len : 1;
        slots[l] = full.ek * kept;
    }
    const double fpt = model_flops_per_token_moe(&full, cfg->seq_len, frac, slots);
    free(frac);
    return fpt;
}

size_t plan_num_params(const Config *cfg) {
    ModelDims full;
    model_dims_config(&full, cfg, 1, 0);
    ParamInfo *reg = NULL;
    const int n = model_registry(&full, &reg);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)reg[i].vocab_rows * reg[i].shape[1];
    free(reg);
    return total;
}

size_t plan_expert_params(const Config *cfg) {
    ModelDims full;
    model_dims_config(&full, cfg, 1, 0);
    const size_t C = (size_t)full.C, F = (size_t)full.Fe;
    return (size_t)model_moe_blocks(&full) * (size_t)full.E * (2 * C * F + F + C);
}

/* What every layout of a config shares: the whole model's FLOPs per token
 * and its weights and moments in bytes (computed once per plan). */
typedef struct {
    double flops_per_token, state_bytes;
} Whole;

static Whole plan_whole(const Config *cfg) {
    ModelDims whole;
    model_dims_config(&whole, cfg, 1, 0);
    ModelMemory wm;
    model_memory(&whole, 1, 1, 1, &wm);
    return (Whole){plan_flops_per_token(cfg), (double)wm.params + (double)wm.moments};
}

/* The dp all-reduce of n bytes over p ranks in DP_BUCKET-float buckets. */
static double dp_time(double n, int p, double alpha, double beta) {
    if (n <= 0) return 0;
    const double buckets = n / ((double)DP_BUCKET * sizeof(float));
    return allreduce_s(n, p, alpha, beta) +
           (p > 1 ? (buckets > 1 ? buckets - 1 : 0) * 2.0 * (p - 1) * alpha : 0);
}

/* Whether tp, pp, dp and ep split the model and the batch. Returns 0, or
 * -1 with err saying what does not. */
static int layout_splits(const Config *cfg, int tp, int pp, int dp, int ep, Err *err) {
    const int vs = pp > 1 ? cfg->virtual_stages : 1;
    if (cfg->n_head % tp != 0 || (long long)pp * vs > cfg->n_layer)
        return err_set(err,
                       "plan: tp %d or pp %d (x virtual_stages %d) does not split n_head %d, "
                       "n_layer %d",
                       tp, pp, vs, cfg->n_head, cfg->n_layer);
    if (cfg->batch_size % dp != 0)
        return err_set(err, "plan: batch_size %d does not split over dp %d", cfg->batch_size, dp);
    if (cfg->n_expert > 0 && (dp % ep != 0 || cfg->n_expert % ep != 0))
        return err_set(err, "plan: ep %d does not divide dp %d and n_expert %d", ep, dp,
                       cfg->n_expert);
    if (cfg->n_expert > 0 && (cfg->expert_d_ff ? cfg->expert_d_ff : config_d_ff(cfg)) % tp != 0)
        return err_set(err, "plan: tp %d does not split the experts' width", tp);
    if (config_kv_heads(cfg) % tp != 0 || config_d_ff(cfg) % tp != 0)
        return err_set(err, "plan: tp %d does not split n_kv_head %d or d_ff %d", tp,
                       config_kv_heads(cfg), config_d_ff(cfg));
    const int local = cfg->batch_size / dp, micro = cfg->micro_batch ? cfg->micro_batch : local;
    if (local % micro != 0)
        return err_set(err, "plan: dp %d leaves %d sequences, not a multiple of micro_batch %d", dp,
                       local, micro);
    if (vs > 1 && cfg->schedule != SCHED_1F1B)
        return err_set(err, "plan: virtual_stages %d interleaves 1F1B, not schedule gpipe", vs);
    if (vs > 1 && local / micro % pp != 0)
        return err_set(err,
                       "plan: virtual_stages %d needs the %d micro-batches of a dp rank to be a "
                       "multiple of pp %d",
                       vs, local / micro, pp);
    return 0;
}

static int layout_order(const Config *cfg, const Cluster *cl, const Whole *w, int tp, int pp,
                        int ep, int ranks_per_node, RankOrder order, PlanRow *row,
                        size_t *stage_bytes, Err *err) {
    memset(row, 0, sizeof *row);
    const long long world = (long long)cl->nodes * ranks_per_node;
    if (world > 1 << 24)
        return err_set(err, "plan: %lld ranks are more than modtrain plans", world);
    if (ranks_per_node < 1 || cl->cores_per_node % ranks_per_node != 0)
        return err_set(err, "plan: %d ranks per node do not share %d cores evenly", ranks_per_node,
                       cl->cores_per_node);
    if (tp < 1 || pp < 1 || world % ((long long)tp * pp) != 0)
        return err_set(err, "plan: tp %d x pp %d does not divide %lld ranks", tp, pp, world);
    const int dp = (int)(world / ((long long)tp * pp));
    if (layout_splits(cfg, tp, pp, dp, ep, err) != 0) return -1;
    const int vs = pp > 1 ? cfg->virtual_stages : 1;
    const int local = cfg->batch_size / dp, micro = cfg->micro_batch ? cfg->micro_batch : local;
    *row = (PlanRow){.tp = tp,
                     .pp = pp,
                     .vs = vs,
                     .dp = dp,
                     .ep = cfg->n_expert > 0 ? ep : 1,
                     .ranks_per_node = ranks_per_node,
                     .threads = cl->cores_per_node / ranks_per_node,
                     .micro = micro,
                     .n_micro = local / micro,
                     .order = order};
    for (int a = 0; a < 3; a++) row->crossing[a] = crossing(cl, row, a);
    MicroTime mt;
    if (plan_stages(cfg, cl, row, &mt, stage_bytes) != 0)
        return err_set(err, "plan: pp %d does not split n_layer %d", pp, cfg->n_layer);
    row->rank_bytes =
        sat_add(sat_add(row->mem.total, row->comm_bytes), (size_t)(cl->baseline_mib * 1048576.0));
    row->fits = (double)row->rank_bytes * ranks_per_node <= cl->mem_per_node_gib * 1073741824.0;
    row->flops_step = w->flops_per_token * (double)cfg->batch_size * cfg->seq_len;
    double a, b;
    link(cl, spans(cl, row, AXIS_DP), &a, &b);
    const int m = row->n_micro;
    row->t_compute = mt.compute * m, row->t_tp = mt.tp * m, row->t_pp = mt.pp * m;
    row->t_ep = mt.ep * m;
    /* the other stages' micro-batches fill and drain the pipeline once:
     * a chunk's, 1/vs of a stage's, under interleaving */
    row->t_bubble = (mt.all - (mt.compute + mt.tp + mt.pp + mt.ep)) / row->vs;
    /* the gradients go in DP_BUCKET-float all-reduces: one latency term
     * each; the experts' over their dp / ep replicas (as spread as dp's) */
    row->t_dp = dp_time(row->dp_bytes - row->dp_expert_bytes, dp, a, b) +
                dp_time(row->dp_expert_bytes, dp / row->ep, a, b);
    if (pp > 1) { /* the tied embedding's gradient, between the first and last stage */
        ModelDims d;
        model_dims_config(&d, cfg, tp, 0);
        link(cl, spans(cl, row, AXIS_PP), &a, &b);
        row->t_dp += allreduce_s((double)d.Vl * d.C * sizeof(float), 2, a, b);
    }
    /* what the backward hides: with dp_overlap, the blocks' buckets reduce
     * while the last micro-batch's backward (two thirds of its compute)
     * goes on, all but the last bucket's; zero 1's all-gather (half of the
     * traffic) follows the optimizer */
    const int zero = cfg->zero && dp > 1;
    row->t_dp_all = row->t_dp;
    /* zero 1's all-gather (half the traffic) stays in flight into the next
     * step's first forward (a third of a micro-batch's compute), which
     * waits at once for the embedding's pieces (on the first stage): at
     * least their share of it shows */
    const double gather = zero ? row->t_dp / 2 : 0;
    const double share = spans(cl, row, AXIS_DP) ? cl->net_cpu_share : cl->shm_cpu_share;
    double gather_shown = 0;
    if (zero) {
        ModelDims d;
        model_dims_config(&d, cfg, tp, 0);
        const double table = (double)d.Vl * d.C * sizeof(float);
        const double first = gather * (table < row->dp_bytes ? table / row->dp_bytes : 1);
        gather_shown = unhidden(gather, mt.compute / 3, share);
        gather_shown = gather_shown > first ? gather_shown : first;
        row->t_dp -= gather - gather_shown;
    }
    if (cfg->dp_overlap && dp > 1) {
        link(cl, spans(cl, row, AXIS_DP), &a, &b);
        const double want = cfg->dp_bucket_mb > 0 ? cfg->dp_bucket_mb * 1048576.0
                                                   : row->dp_bytes * pp / cfg->n_layer; /* a block */
        const double bucket = want < row->dp_bytes ? want : row->dp_bytes;
        const double tail = dp_time(bucket, dp, a, b), window = 2.0 / 3.0 * mt.compute;
        const double reduce = row->t_dp_all - gather;
        const double shown = unhidden(reduce, window, share);
        row->t_dp = (shown > tail ? shown : tail) + gather_shown;
    }
    const double nparams = (double)row->mem.params / sizeof(float);
    row->t_optimizer = nparams * 28.0 / (cl->mem_bw_gbs * 1e9 / ranks_per_node) / (zero ? dp : 1);
    row->t_step = row->t_compute + row->t_tp + row->t_pp + row->t_bubble + row->t_dp +
                  row->t_optimizer + row->t_ep;
    row->tokens_per_s = (double)cfg->batch_size * cfg->seq_len / row->t_step;
    /* the checkpoint: the whole model's weights and both moments at the
     * measured ratio 1.2, packed by every rank at once, then written */
    const double raw = w->state_bytes;
    row->ckpt_bytes = raw / 1.2;
    row->ckpt_s = raw / world / (cl->pack_mbs * 1e6) + row->ckpt_bytes / (cl->fs_bw_gbs * 1e9);
    return 0;
}

/* The layout under cfg's rank_order; auto: tp-dp-pp, or tp-pp-dp where
 * that is faster (dp and pp both above 1, over nodes), as the grid
 * chooses. */
static int layout_row(const Config *cfg, const Cluster *cl, const Whole *w, int tp, int pp, int ep,
                      int ranks_per_node, PlanRow *row, size_t *stage_bytes, Err *err) {
    const RankOrder order = cfg->rank_order == ORDER_AUTO ? ORDER_TP_DP_PP : cfg->rank_order;
    if (layout_order(cfg, cl, w, tp, pp, ep, ranks_per_node, order, row, stage_bytes, err) != 0)
        return -1;
    if (cfg->rank_order != ORDER_AUTO || cl->nodes == 1 || row->dp == 1 || pp == 1) return 0;
    PlanRow other;
    size_t *other_bytes = stage_bytes ? xmalloc((size_t)pp * sizeof *other_bytes) : NULL;
    layout_order(cfg, cl, w, tp, pp, ep, ranks_per_node, ORDER_TP_PP_DP, &other, other_bytes, NULL);
    if (other.t_step < row->t_step) {
        *row = other;
        if (stage_bytes) memcpy(stage_bytes, other_bytes, (size_t)pp * sizeof *other_bytes);
    }
    free(other_bytes);
    return 0;
}

int plan_layout(const Config *cfg, const Cluster *cl, int tp, int pp, int ranks_per_node,
                PlanRow *row, size_t *stage_bytes, Err *err) {
    const Whole w = plan_whole(cfg);
    return layout_row(cfg, cl, &w, tp, pp, cfg->ep, ranks_per_node, row, stage_bytes, err);
}

int plan_parse_layout(const char *v, int *tp, int *pp, int *rpn) {
    int *dst[3] = {tp, pp, rpn};
    for (int k = 0; k < 3; k++) {
        const char *end = strchr(v, ',');
        const size_t n = end ? (size_t)(end - v) : strlen(v);
        char field[24];
        long long x;
        /* fields 1 and 2 end at a comma, field 3 at the end */
        if ((k < 2) != (end != NULL) || n == 0 || n >= sizeof field) return -1;
        memcpy(field, v, n);
        field[n] = '\0';
        if (parse_i64(field, 1, 1 << 20, &x) != 0) return -1;
        *dst[k] = (int)x;
        v = end ? end + 1 : v + n;
    }
    return 0;
}

/* Fitting rows first, then by tokens/s, best first; ties by layout. */
static int row_order(const void *pa, const void *pb) {
    const PlanRow *a = pa, *b = pb;
    if (a->fits != b->fits) return b->fits - a->fits;
    if (a->tokens_per_s != b->tokens_per_s) return a->tokens_per_s < b->tokens_per_s ? 1 : -1;
    if (a->tp != b->tp) return a->tp - b->tp;
    if (a->pp != b->pp) return a->pp - b->pp;
    if (a->ep != b->ep) return a->ep - b->ep;
    return a->ranks_per_node - b->ranks_per_node;
}

/* The divisors of x up to max, ascending, into out (room for max).
 * Returns their count: O(sqrt x), where trying every pp was O(max). */
static int divisors(long long x, int max, int *out) {
    int n = 0, big = 0;
    for (long long i = 1; i * i <= x; i++)
        if (x % i == 0 && i <= max) out[n++] = (int)i;
    for (int k = n - 1; k >= 0; k--) { /* the cofactors, ascending */
        const long long j = x / out[k];
        if (j != out[k] && j <= max) big++, out[n + big - 1] = (int)j;
    }
    return n + big;
}

int plan_candidates(const Config *cfg, const Cluster *cl, PlanRow **rows, Err *err) {
    int n = 0, cap = 64;
    *rows = xmalloc((size_t)cap * sizeof **rows);
    const Whole w = plan_whole(cfg);
    int *pps = xmalloc((size_t)cfg->n_layer * sizeof *pps);
    int *eps = xmalloc(((size_t)cfg->n_expert + 1) * sizeof *eps);
    for (int rpn = 1; rpn <= cl->cores_per_node; rpn++) {
        if (cl->cores_per_node % rpn != 0 || (long long)cl->nodes * rpn > 1 << 24) continue;
        /* tp within a node (dividing its ranks), or across whole nodes */
        const long long world = (long long)cl->nodes * rpn;
        for (int tp = 1; tp <= world && tp <= cfg->n_head; tp++) {
            if ((rpn % tp != 0 && (tp % rpn != 0 || world % tp != 0)) || cfg->n_head % tp != 0 ||
                config_kv_heads(cfg) % tp != 0 || config_d_ff(cfg) % tp != 0)
                continue;
            /* pp divides the ranks over tp, within n_layer */
            const int npp = divisors((long long)cl->nodes * rpn / tp, cfg->n_layer, pps);
            for (int i = 0; i < npp; i++) {
                const int pp = pps[i];
                /* an MoE config: every ep that divides dp and n_expert, or the config's */
                const long long dp = (long long)cl->nodes * rpn / tp / pp;
                const int nep = cfg->n_expert == 0 ? 1
                                : cfg->ep > 1      ? (eps[0] = cfg->ep, dp % cfg->ep == 0)
                                                   : divisors(cfg->n_expert, cfg->n_expert, eps);
                for (int j = 0; j < nep; j++) {
                    const int ep = cfg->n_expert == 0 ? 1 : eps[j];
                    PlanRow r;
                    if (dp % ep != 0 ||
                        layout_row(cfg, cl, &w, tp, pp, ep, rpn, &r, NULL, NULL) != 0)
                        continue;
                    if (n == cap) *rows = xrealloc(*rows, (size_t)(cap *= 2) * sizeof **rows);
                    (*rows)[n++] = r;
                }
            }
        }
    }
    free(pps);
    free(eps);
    if (n == 0) {
        free(*rows);
        *rows = NULL;
        return err_set(err,
                       "plan: no layout of %d node%s x %d cores runs this model (batch_size %d, "
                       "micro_batch %d, n_head %d, n_layer %d)",
                       cl->nodes, cl->nodes == 1 ? "" : "s", cl->cores_per_node, cfg->batch_size,
                       cfg->micro_batch, cfg->n_head, cfg->n_layer);
    }
    qsort(*rows, (size_t)n, sizeof **rows, row_order);
    return n;
}
