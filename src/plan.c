/*
 * plan: memory, bytes and an estimated step time per layout (see plan.h).
 */
#include "src/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/dp.h"
#include "mpi/pipeline.h"
#include "src/dataset.h"

/* ------------------------------------------------------------- the model */

/* Ring all-reduce of n bytes over p ranks. */
static double allreduce_s(double n, int p, double alpha, double beta) {
    return p <= 1 ? 0 : 2.0 * (p - 1) * alpha + 2.0 * (p - 1) / p * n / beta;
}

/* One stage's figures per micro-batch of B sequences on one rank. */
typedef struct {
    double flops, tp_bytes;
    int tp_calls;
} StageCost;

static StageCost stage_cost(const ModelDims *d, int B, int T) {
    const double C = d->C, N = (double)B * T, tp = d->tp;
    const double K = model_capacity_k(d, T), f = K / T;
    const int routed = model_stage_routed(d), dense = d->l1 - d->l0 - routed;
    StageCost s = {0, 0, 0};
    if (model_first_stage(d)) s.tp_bytes += N * C, s.tp_calls++; /* the embedding */
    /* this stage's blocks: a routed one on its K tokens of a sequence, and
     * its router (and predictor) on every token */
    s.flops += dense * (N * (6.0 * 12.0 * C * C + 12.0 * T * C) / tp);
    s.flops += routed * (N * f * (6.0 * 12.0 * C * C + 12.0 * (f * T) * C) / tp +
                         N * (6.0 * C + (d->predictor ? 6.0 * (C * d->H + d->H) : 0)));
    s.tp_bytes += 4 * (dense * N + routed * (double)B * K) * C; /* 2 forward, 2 backward */
    s.tp_calls += 4 * (dense + routed);
    if (model_last_stage(d)) {
        s.flops += N * 6.0 * d->V * C / tp;
        s.tp_bytes += 3 * N + N * C, s.tp_calls += 4; /* the loss's max and sums, the head */
    }
    s.tp_bytes *= sizeof(float);
    return s;
}

/* The group alphas and betas: shared memory within a node, else the network. */
static void link(const Cluster *cl, int spans, double *alpha, double *beta) {
    *alpha = (spans ? cl->net_latency_us : cl->shm_latency_us) * 1e-6;
    *beta = (spans ? cl->net_bw_gbs : cl->shm_bw_gbs) * 1e9;
}

/* Whether the pipeline's neighbours sit on different nodes: a stage is
 * tp x dp consecutive ranks. */
static int pp_spans(const Cluster *cl, const PlanRow *r) {
    return cl->nodes > 1 && r->tp * r->dp >= r->ranks_per_node &&
           r->tp * r->pp * r->dp > r->ranks_per_node;
}

/* A micro-batch's time on the slowest stage (compute, tp, pp sends), and
 * the sum over all stages of theirs. */
typedef struct {
    double compute, tp, pp, all;
} MicroTime;

/* Per stage: memory, the micro-batch's time, and the busiest rank's bytes.
 * Returns 0 or -1 (a stage split config_validate would refuse). */
static int plan_stages(const Config *cfg, const Cluster *cl, PlanRow *r, MicroTime *slow,
                       size_t *stage_bytes) {
    const int T = cfg->seq_len;
    const PpSchedule sched = cfg->schedule == SCHED_GPIPE ? PP_GPIPE : PP_1F1B;
    int *layers = xcalloc((size_t)r->pp, sizeof(int));
    Config c = *cfg;
    c.pp = r->pp;
    int rc = config_stage_layers(&c, layers, NULL);
    double ta, tb, pa, pb;
    link(cl, r->tp > r->ranks_per_node, &ta, &tb);
    link(cl, pp_spans(cl, r), &pa, &pb);
    const double act = (double)r->micro * T * cfg->d_model * sizeof(float);
    *slow = (MicroTime){0, 0, 0, 0};
    double all = 0;
    /* every stage measured from the same parts: no registry of its own */
    ModelDims d;
    ModelUnits u;
    model_dims_config(&d, cfg, r->tp, 0);
    if (rc == 0) model_units(&d, r->micro, &u);
    d.pp = r->pp;
    /* the data path's memory is every stage's alike: the spec parsed once */
    const size_t data_mem = ds_memory(cfg->train_data, r->micro * r->n_micro, T, 0);
    for (int s = 0, l0 = 0; s < r->pp && rc == 0; l0 += layers[s++]) {
        if (layers[s] < 1 || l0 + layers[s] > cfg->n_layer) {
            rc = -1;
            break;
        }
        d.pp_rank = s, d.l0 = l0, d.l1 = l0 + layers[s];
        ModelMemory mm;
        const int slots = pp_slots(sched, r->n_micro, s, r->pp);
        model_memory_units(&u, &d, slots, 1, &mm);
        if (cfg->ckpt_async && cfg->ckpt_every > 0 && cfg->ckpt_every < cfg->steps) {
            mm.staging = sat_add(mm.params, mm.moments);
            mm.total = sat_add(mm.total, mm.staging);
        }
        mm.data = data_mem;
        mm.total = sat_add(mm.total, mm.data);
        const size_t comm = r->pp > 1 ? (size_t)slots * (size_t)act : 0;
        if (stage_bytes)
            stage_bytes[s] =
                sat_add(sat_add(mm.total, comm), (size_t)(cl->baseline_mib * 1048576.0));
        if (sat_add(mm.total, comm) > sat_add(r->mem.total, r->comm_bytes))
            r->mem = mm, r->comm_bytes = comm;
        const StageCost sc = stage_cost(&d, r->micro, T);
        const double rate = r->threads * cl->gflops_per_core * 1e9 * cl->efficiency;
        MicroTime t = {sc.flops / rate, 0, 0, 0};
        if (r->tp > 1) {
            t.tp =
                sc.tp_calls * 2.0 * (r->tp - 1) * ta + 2.0 * (r->tp - 1) / r->tp * sc.tp_bytes / tb;
            if (sc.tp_bytes * r->n_micro > r->tp_bytes) r->tp_bytes = sc.tp_bytes * r->n_micro;
        }
        const double sends = (s > 0) + (s < r->pp - 1); /* activations one way, gradients back */
        t.pp = sends * (pa + act / pb);
        if (r->pp > 1 && sends * act * r->n_micro > r->pp_bytes)
            r->pp_bytes = sends * act * r->n_micro;
        all += t.compute + t.tp + t.pp;
        if (t.compute + t.tp + t.pp > slow->compute + slow->tp + slow->pp) *slow = t;
        /* dp: every gradient float, and the tied embedding between the end stages */
        double dpb = r->dp > 1 ? (double)mm.params : 0;
        if (r->pp > 1 && (s == 0 || s == r->pp - 1)) dpb += (double)d.Vl * d.C * sizeof(float);
        if (dpb > r->dp_bytes) r->dp_bytes = dpb;
    }
    slow->all = all;
    free(layers);
    return rc;
}

double plan_flops_per_token(const Config *cfg) {
    ModelDims full;
    model_dims_config(&full, cfg, 1, 0);
    const int k = model_capacity_k(&full, cfg->seq_len);
    double *frac = xcalloc((size_t)full.L + 1, sizeof(double));
    for (int l = 0; l < full.L; l++)
        frac[l] = model_is_routed(&full, l) ? (double)k / cfg->seq_len : 1;
    const double fpt = model_flops_per_token(&full, cfg->seq_len, frac);
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

static int layout_row(const Config *cfg, const Cluster *cl, const Whole *w, int tp, int pp,
                      int ranks_per_node, PlanRow *row, size_t *stage_bytes, Err *err) {
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
    if (cfg->n_head % tp != 0 || pp > cfg->n_layer)
        return err_set(err, "plan: tp %d or pp %d does not split n_head %d, n_layer %d", tp, pp,
                       cfg->n_head, cfg->n_layer);
    if (cfg->batch_size % dp != 0)
        return err_set(err, "plan: batch_size %d does not split over dp %d", cfg->batch_size, dp);
    const int local = cfg->batch_size / dp, micro = cfg->micro_batch ? cfg->micro_batch : local;
    if (local % micro != 0)
        return err_set(err, "plan: dp %d leaves %d sequences, not a multiple of micro_batch %d", dp,
                       local, micro);
    *row = (PlanRow){.tp = tp,
                     .pp = pp,
                     .dp = dp,
                     .ranks_per_node = ranks_per_node,
                     .threads = cl->cores_per_node / ranks_per_node,
                     .micro = micro,
                     .n_micro = local / micro};
    MicroTime mt;
    if (plan_stages(cfg, cl, row, &mt, stage_bytes) != 0)
        return err_set(err, "plan: pp %d does not split n_layer %d", pp, cfg->n_layer);
    row->rank_bytes =
        sat_add(sat_add(row->mem.total, row->comm_bytes), (size_t)(cl->baseline_mib * 1048576.0));
    row->fits = (double)row->rank_bytes * ranks_per_node <= cl->mem_per_node_gib * 1073741824.0;
    row->flops_step = w->flops_per_token * (double)cfg->batch_size * cfg->seq_len;
    double a, b;
    link(cl, cl->nodes > 1 && tp * dp > ranks_per_node, &a, &b);
    const int m = row->n_micro;
    row->t_compute = mt.compute * m, row->t_tp = mt.tp * m, row->t_pp = mt.pp * m;
    /* the other stages' micro-batches fill and drain the pipeline once */
    row->t_bubble = mt.all - (mt.compute + mt.tp + mt.pp);
    /* the gradients go in DP_BUCKET-float all-reduces: one latency term each */
    const double buckets = row->dp_bytes / ((double)DP_BUCKET * sizeof(float));
    row->t_dp = allreduce_s(row->dp_bytes, dp, a, b) +
                (dp > 1 ? (buckets > 1 ? buckets - 1 : 0) * 2.0 * (dp - 1) * a : 0);
    if (pp > 1) { /* the tied embedding's gradient, between the first and last stage */
        ModelDims d;
        model_dims_config(&d, cfg, tp, 0);
        link(cl, pp_spans(cl, row), &a, &b);
        row->t_dp += allreduce_s((double)d.Vl * d.C * sizeof(float), 2, a, b);
    }
    const double nparams = (double)row->mem.params / sizeof(float);
    row->t_optimizer = nparams * 28.0 / (cl->mem_bw_gbs * 1e9 / ranks_per_node);
    row->t_step =
        row->t_compute + row->t_tp + row->t_pp + row->t_bubble + row->t_dp + row->t_optimizer;
    row->tokens_per_s = (double)cfg->batch_size * cfg->seq_len / row->t_step;
    /* the checkpoint: the whole model's weights and both moments at the
     * measured ratio 1.2, packed by every rank at once, then written */
    const double raw = w->state_bytes;
    row->ckpt_bytes = raw / 1.2;
    row->ckpt_s = raw / world / (cl->pack_mbs * 1e6) + row->ckpt_bytes / (cl->fs_bw_gbs * 1e9);
    return 0;
}

int plan_layout(const Config *cfg, const Cluster *cl, int tp, int pp, int ranks_per_node,
                PlanRow *row, size_t *stage_bytes, Err *err) {
    const Whole w = plan_whole(cfg);
    return layout_row(cfg, cl, &w, tp, pp, ranks_per_node, row, stage_bytes, err);
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
    for (int rpn = 1; rpn <= cl->cores_per_node; rpn++) {
        if (cl->cores_per_node % rpn != 0 || (long long)cl->nodes * rpn > 1 << 24) continue;
        for (int tp = 1; tp <= rpn && tp <= cfg->n_head; tp++) {
            if (rpn % tp != 0 || cfg->n_head % tp != 0) continue;
            /* pp divides the ranks over tp, within n_layer */
            const int npp = divisors((long long)cl->nodes * rpn / tp, cfg->n_layer, pps);
            for (int i = 0; i < npp; i++) {
                const int pp = pps[i];
                PlanRow r;
                if (layout_row(cfg, cl, &w, tp, pp, rpn, &r, NULL, NULL) != 0) continue;
                if (n == cap) *rows = xrealloc(*rows, (size_t)(cap *= 2) * sizeof **rows);
                (*rows)[n++] = r;
            }
        }
    }
    free(pps);
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
