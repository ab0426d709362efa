/*
 * dims: a model's shape (ModelDims) from the configuration and the layout:
 * the stages and the blocks each holds, which blocks are routed or MoE, a
 * routed block's capacity, the routing statistics as one vector, and the
 * FLOPs a token costs.
 */
#include "src/model/model_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/config/config.h"
#include "src/base/util.h"

void model_dims(ModelDims *d, int V, int maxT, int L, int NH, int C, int tp, int tp_rank) {
    memset(d, 0, sizeof *d);
    d->V = V;
    d->Vp = (V + tp - 1) / tp * tp;
    d->maxT = maxT;
    d->L = L;
    d->NH = NH;
    d->C = C;
    d->tp = tp;
    d->tp_rank = tp_rank;
    d->NHl = NH / tp;
    d->hs = C / NH;
    d->Cl = d->NHl * d->hs;
    model_dims_arch(d, ARCH_GPT2, NH, 4 * C, 1e-5, 10000.0, 1);
    d->Vl = d->Vp / tp;
    d->v0 = tp_rank * d->Vl;
    d->capacity = 1.0;
    d->ek = 1;
    d->moe_every = 1;
    d->cf = 1.0;
    d->ep = 1;
    model_dims_whole(d);
    d->head_rows = HEAD_ROWS;
}

void model_dims_arch(ModelDims *d, Arch arch, int KV, int F, double eps, double theta, int tied) {
    d->arch = arch;
    d->KV = KV;
    d->KVl = KV / d->tp;
    d->qkvl = (d->NHl + 2 * d->KVl) * d->hs;
    d->F = F;
    d->Fl = F / d->tp;
    d->eps = (float)eps;
    d->theta = theta;
    d->tied = tied;
}

void model_dims_whole(ModelDims *d) {
    d->pp = 1, d->pp_rank = 0, d->nchunk = 1;
    d->c0[0] = 0, d->c1[0] = d->L;
}

int model_stage_starts(const ModelDims *d, int pp, int vs, const int *layers, int *starts) {
    if (vs < 1 || vs > MODEL_MAX_CHUNKS || pp < 1) return -1;
    const int nv = pp * vs;
    starts[0] = 0;
    for (int t = 0; t < nv; t++) { /* virtual stage t = chunk * pp + rank */
        const int n = layers ? layers[t] : d->L / nv + (t < d->L % nv);
        if (n < 1 || n > d->L - starts[t]) return -1;
        starts[t + 1] = starts[t] + n;
    }
    return starts[nv] == d->L ? 0 : -1;
}

void model_dims_stage_at(ModelDims *d, int pp, int vs, int pp_rank, const int *starts) {
    for (int k = 0; k < vs; k++) {
        d->c0[k] = starts[k * pp + pp_rank];
        d->c1[k] = starts[k * pp + pp_rank + 1];
    }
    d->pp = pp;
    d->pp_rank = pp_rank;
    d->nchunk = vs;
}

int model_dims_stage(ModelDims *d, int pp, int vs, int pp_rank, const int *layers) {
    if (vs < 1 || vs > MODEL_MAX_CHUNKS || pp < 1) return -1;
    int *starts = xmalloc(((size_t)pp * vs + 1) * sizeof(int));
    const int rc = model_stage_starts(d, pp, vs, layers, starts);
    if (rc == 0) model_dims_stage_at(d, pp, vs, pp_rank, starts);
    free(starts);
    return rc;
}

int model_next_held(const ModelDims *d, int l) {
    int best = d->L;
    for (int k = 0; k < d->nchunk; k++)
        if (d->c1[k] > l) {
            const int at = d->c0[k] > l ? d->c0[k] : l;
            best = at < best ? at : best;
        }
    return best;
}

int model_holds(const ModelDims *d, int l) {
    for (int k = 0; k < d->nchunk; k++)
        if (l >= d->c0[k] && l < d->c1[k]) return 1;
    return 0;
}

int model_stage_blocks(const ModelDims *d) {
    int n = 0;
    for (int k = 0; k < d->nchunk; k++) n += d->c1[k] - d->c0[k];
    return n;
}

void model_dims_mod(ModelDims *d, int route_every, double capacity, RouterGate gate, int predictor,
                    int H) {
    d->route_every = route_every;
    d->capacity = capacity;
    d->gate = gate;
    d->predictor = route_every > 0 && predictor;
    d->H = H;
}

void model_dims_moe(ModelDims *d, int n_expert, int n_noop, int top_k, int expert_d_ff,
                    double capacity_factor, int moe_every) {
    d->E = n_expert;
    d->Nn = n_expert > 0 ? n_noop : 0;
    d->ek = top_k;
    d->Fe = n_expert > 0 ? (expert_d_ff > 0 ? expert_d_ff : d->F) : 0;
    d->Fel = d->Fe / d->tp;
    d->cf = capacity_factor;
    d->moe_every = moe_every > 0 ? moe_every : 1;
    model_dims_ep(d, d->ep, d->ep_rank);
}

void model_dims_ep(ModelDims *d, int ep, int ep_rank) {
    d->ep = ep;
    d->ep_rank = ep_rank;
    d->El = d->E / ep;
    d->e0 = ep_rank * d->El;
}

void model_dims_config(ModelDims *d, const Config *c, int tp, int tp_rank) {
    model_dims(d, c->vocab_size, c->seq_len, c->n_layer, c->n_head, c->d_model, tp, tp_rank);
    model_dims_arch(d, c->arch, config_kv_heads(c), config_d_ff(c), c->norm_eps, c->rope_theta,
                    config_tied(c));
    model_dims_mod(d, c->route_every, c->capacity, c->router_gate,
                   c->causal_router == CAUSAL_PREDICTOR, c->predictor_hidden);
    model_dims_moe(d, c->n_expert, c->n_noop_expert, c->expert_top_k, c->expert_d_ff,
                   c->capacity_factor, c->moe_every);
}

int model_is_moe(const ModelDims *d, int l) {
    return d->E > 0 && l % d->moe_every == d->moe_every - 1;
}

int model_moe_blocks(const ModelDims *d) { return d->E > 0 ? d->L / d->moe_every : 0; }

int model_is_routed(const ModelDims *d, int l) {
    return d->route_every > 0 && l % d->route_every == d->route_every - 1;
}

/* Blocks l of the stage's chunks with l % g == g - 1 (blocks l < x: x / g
 * of them). */
static int stage_every(const ModelDims *d, long g) {
    int n = 0;
    for (int k = 0; k < d->nchunk; k++) n += (int)(d->c1[k] / g - d->c0[k] / g);
    return n;
}

int model_stage_routed(const ModelDims *d) {
    return d->route_every > 0 ? stage_every(d, d->route_every) : 0;
}

int model_stage_moe(const ModelDims *d, int *routed) {
    *routed = 0;
    if (d->E == 0) return 0;
    const long m = d->moe_every;
    if (d->route_every > 0) { /* both: l + 1 a multiple of lcm(route_every, moe_every) */
        long a = d->route_every, b = m;
        while (b) {
            const long t = a % b;
            a = b, b = t;
        }
        const long g = d->route_every / a * m;
        *routed = stage_every(d, g);
    }
    return stage_every(d, m);
}

int model_capacity_k(const ModelDims *d, int T) {
    long k = lround(d->capacity * T);
    return k < 1 ? 1 : (k > T ? T : (int)k);
}

int route_stats_len(const ModelDims *d) {
    return ROUTE_STATS_FIXED + d->L + d->L * (d->E > 0 ? d->E + d->Nn + 2 : 0);
}

void route_stats_to_vec(const RouteStats *st, const ModelDims *d, double *v) {
    v[0] = st->aux_sum, v[1] = st->pred_sum, v[2] = (double)st->decisions;
    v[3] = (double)st->agree, v[4] = (double)st->tokens;
    v[5] = st->moe_aux_sum, v[6] = (double)st->moe_forwards;
    for (int l = 0; l < d->L; l++) v[ROUTE_STATS_FIXED + l] = (double)st->processed[l];
    const int n = d->E > 0 ? d->L * (d->E + d->Nn + 2) : 0;
    for (int i = 0; i < n; i++) v[ROUTE_STATS_FIXED + d->L + i] = (double)st->moe[i];
}

void route_stats_from_vec(RouteStats *st, const ModelDims *d, const double *v) {
    st->aux_sum = v[0], st->pred_sum = v[1], st->decisions = (long long)v[2];
    st->agree = (long long)v[3], st->tokens = (long long)v[4];
    st->moe_aux_sum = v[5], st->moe_forwards = (long long)v[6];
    for (int l = 0; l < d->L; l++) st->processed[l] = (long long)v[ROUTE_STATS_FIXED + l];
    const int n = d->E > 0 ? d->L * (d->E + d->Nn + 2) : 0;
    for (int i = 0; i < n; i++) st->moe[i] = (long long)v[ROUTE_STATS_FIXED + d->L + i];
}

double model_flops_per_token(const ModelDims *d, int T, const double *frac) {
    return model_flops_per_token_moe(d, T, frac, NULL);
}

double model_flops_per_token_moe(const ModelDims *d, int T, const double *frac,
                                 const double *slots) {
    /* 6 FLOPs per matmul weight per token (forward 2, backward 4), plus the
     * attention products (q@k^T and p@v, 4TC forward, 8TC backward, over the
     * whole causal square as is customary). A routed block does that work
     * for the fraction of tokens it processes, over a sequence of as many;
     * its router (and predictor) run on every token. An MoE block's MLP
     * costs one expert (its matrices' weights) per slot kept, and its
     * router C (E + Nn) on every token it processes. Llama's MLP has three
     * matrices (gate, up, down), GPT-2's two; its k and v have KV heads. */
    const double C = d->C, mats = d->arch == ARCH_LLAMA ? 3.0 : 2.0;
    const double attn = 2.0 * C * C + 2.0 * C * d->KV * d->hs;
    double flops = 6.0 * d->V * C;
    for (int l = 0; l < d->L; l++) {
        double f = frac ? frac[l] : 1.0;
        double mlp = mats * C * d->F;
        if (model_is_moe(d, l))
            mlp = (slots ? slots[l] : d->ek) * mats * C * d->Fe + C * (d->E + d->Nn);
        flops += f * (6.0 * (attn + mlp) + 12.0 * (f * T) * C);
        if (frac && model_is_routed(d, l))
            flops += 6.0 * C + (d->predictor ? 6.0 * (C * d->H + d->H) : 0.0);
    }
    return flops;
}
