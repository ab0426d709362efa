/*
 * stage: this rank's stage of the model and its optimizer: its memory
 * checked against the node's, the gradient buckets that overlap the
 * backward (dp_overlap) and ZeRO-1's shard, then restored from a
 * checkpoint (resume, init_from) or freshly initialised.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/train/run.h"

/* Whether the run makes periodic saves in the background (the final save
 * and a stop's are synchronous: nothing is left to overlap them with). */
int run_saves_async(const Config *c) {
    return c->ckpt_async && c->ckpt_every > 0 && c->ckpt_every < c->steps;
}
/* dp_overlap: the segments of the gradient buffer that the last
 * micro-batch's backward finishes one by one: on the last stage the
 * head's share of the tied embedding and ln_f, then this stage's blocks,
 * the last first (each block's shared tensors; its experts reduce after
 * the backward over their own replicas). The embedding's rows are kept
 * apart (EmbRows) and reduce at the end. A block whose tensors are not one
 * range makes the reduction wait for the backward, as with dp_overlap 0. */
static void overlap_mark(void *ctx, int l) {
    Run *r = ctx;
    if (l == r->m.d.L) {
        for (int i = 0; i < r->nhead_seg; i++) dp_overlap_mark(&r->ov, i);
    } else {
        dp_overlap_mark(&r->ov, r->seg_of[l]);
    }
}

/* A tensor's range of the gradients, padded as the registry lays it out. */
static size_t param_end(const ParamInfo *p) { return p->offset + ((p->numel + 15) & ~(size_t)15); }

static void run_overlap_setup(Run *r) {
    Model *m = &r->m;
    const ModelDims *d = &m->d;
    const int nhead = model_last_stage(d) ? 2 : 0, nseg = nhead + model_stage_blocks(d);
    if (nseg < 1) return;
    /* the blocks the last first: under interleaved 1F1B too, the last
     * micro-batch leaves a later chunk's blocks before an earlier one's */
    r->seg_of = xmalloc((size_t)d->L * sizeof(int));
    for (int l = d->L - 1, i = nhead; l >= 0; l--) r->seg_of[l] = model_holds(d, l) ? i++ : -1;
    size_t *lo = xmalloc((size_t)nseg * sizeof(size_t)), *hi = xmalloc((size_t)nseg * sizeof(size_t));
    int ok = 1;
    if (nhead) { /* the head's weights (tied: the embedding, its rows apart), then ln_f's
                  * weight and bias (gpt2) */
        const ParamInfo *w = model_head_param(m), *fw = model_find_param(m, "ln_f.weight"),
                        *fb = model_find_param(m, "ln_f.bias");
        lo[0] = w->offset, hi[0] = param_end(w);
        lo[1] = fw->offset, hi[1] = param_end(fb ? fb : fw);
        ok = !fb || param_end(fw) == fb->offset;
    }
    for (int l = d->L - 1; l >= 0 && ok; l--) {
        const int i = r->seg_of[l];
        if (i < 0) continue;
        size_t a = SIZE_MAX, b = 0, sum = 0;
        for (int k = 0; k < m->nreg; k++) {
            const ParamInfo *p = &m->reg[k];
            if (p->layer != l || p->expert >= 0) continue;
            a = p->offset < a ? p->offset : a;
            b = param_end(p) > b ? param_end(p) : b;
            sum += param_end(p) - p->offset;
        }
        ok = a < b && sum == b - a; /* the block's tensors and nothing else */
        lo[i] = a, hi[i] = b;
    }
    r->nhead_seg = nhead;
    const size_t bucket = (size_t)(r->cfg.dp_bucket_mb * (1 << 18)); /* MiB in floats */
    r->overlap = ok && dp_overlap_init(&r->ov, r->grid.dp_comm, m->grads, lo, hi, nseg, bucket,
                                       r->n_micro) == 0;
    free(lo);
    free(hi);
    if (r->overlap) {
        m->block_done = overlap_mark;
        m->block_done_ctx = r;
    } else {
        say_log(r->say, "train: dp_overlap: a block's or ln_f's tensors are not one range of the "
             "gradients; they are reduced after the backward\n");
    }
}

/* Before the forward reads block l's parameters (-1: the embedding's, L:
 * the head's): their pieces of the all-gather in flight. */
static void zero_needs(void *ctx, int l) {
    Run *r = ctx;
    zero_gather_wait(&r->zero, r->zero_need[l + 1]);
}

/* AdamW updated this rank's parts below hi: their pieces may be gathered. */
static void zero_range_done(void *ctx, size_t hi) { zero_gather_ready(ctx, hi); }

/* zero 1: ZeRO-1's pieces, cut where the overlap's buckets and the
 * embedding's range begin and end (so that a bucket in flight is whole
 * pieces, the embedding's rows reduced apart are too, and both stages'
 * copies of a tied embedding are cut alike). */
static void run_zero_setup(Run *r) {
    const Model *m = &r->m;
    const Grid *g = &r->grid;
    const int nb = r->overlap ? r->ov.nbucket : 0;
    size_t *cut = xmalloc((2 * (size_t)nb + 2) * sizeof(size_t));
    int n = 0;
    for (int b = 0; b < nb; b++) cut[n++] = r->ov.blo[b], cut[n++] = r->ov.bhi[b];
    /* the embedding as step.c reduces it (its rows apart); an untied head
     * is one more tensor of the overlap's first bucket, never cut apart */
    const ParamInfo *emb = m->d.tied ? model_tied_param(m) : model_embed_param(m);
    if (emb) cut[n++] = emb->offset, cut[n++] = emb->offset + emb->numel;
    const size_t shared = m->nparams - (g->ep > 1 ? m->expert_floats : 0);
    zero_init(&r->zero, m->nparams, shared, cut, n, g->dp_comm,
              g->ep > 1 ? g->edp_comm : MPI_COMM_NULL);
    free(cut);
    if (r->overlap) dp_overlap_set_zero(&r->ov, g->dp, g->dp_rank);
    r->use_zero = 1;
    /* what each block needs: the parameters up to the end of its last
     * tensor (its experts lie past every block's shared ones), and what
     * came before it; the embedding, its tensors (those of no block that lie
     * before the first block's); the head, everything */
    const int L = m->d.L;
    size_t first = SIZE_MAX;
    for (int k = 0; k < m->nreg; k++)
        if (m->reg[k].layer >= 0 && m->reg[k].offset < first) first = m->reg[k].offset;
    r->zero_need = xcalloc((size_t)L + 2, sizeof(size_t));
    for (int k = 0; k < m->nreg; k++) {
        const ParamInfo *p = &m->reg[k];
        const int at = p->layer >= L || (p->layer < 0 && p->offset > first) ? L + 1
                       : p->layer < 0                                       ? 0
                                                                            : p->layer + 1;
        if (param_end(p) > r->zero_need[at]) r->zero_need[at] = param_end(p);
    }
    for (int i = 1; i <= L; i++)
        if (r->zero_need[i - 1] > r->zero_need[i]) r->zero_need[i] = r->zero_need[i - 1];
    r->zero_need[L + 1] = SIZE_MAX;
    r->zero.pump = g->crossing[AXIS_DP] > 0;
    r->m.block_needs = zero_needs;
    r->m.block_done_ctx = r;
}

/* train_only = routers: the ranges of the routers' and predictors'
 * tensors, the only ones AdamW keeps moments for and dp reduces. */
static void run_routers_setup(Run *r) {
    const Model *m = &r->m;
    ZeroShard *t = &r->trained;
    t->lo = xmalloc(((size_t)m->nreg + 1) * sizeof(size_t));
    t->hi = xmalloc(((size_t)m->nreg + 1) * sizeof(size_t));
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        if (!param_is_routing(p->name)) continue;
        t->lo[t->n] = p->offset, t->hi[t->n] = p->offset + p->numel;
        t->floats += p->numel;
        t->n++;
    }
    t->dp = r->grid.dp, t->dp_rank = r->grid.dp_rank;
}

/* This rank's stage of the model and its optimizer, restored from a
 * checkpoint or freshly initialised. Returns 0 or -1 with err set. */
int run_setup_model(Run *r, Err *err) {
    const Config *c = &r->cfg;
    const Grid *g = &r->grid;
    ModelDims d;
    model_dims_config(&d, c, g->tp, g->tp_rank);
    model_dims_ep(&d, g->ep, g->ep_rank);
    d.recompute = c->recompute;
    const int vs = c->virtual_stages;
    int *layers = xcalloc((size_t)g->pp * vs, sizeof(int));
    int rc = config_stage_layers(c, layers, NULL); /* validated with the config */
    if (rc == 0) rc = model_dims_stage(&d, g->pp, vs, g->pp_rank, layers);
    free(layers);
    if (rc != 0) return -1; /* config_validate checked the split: not reached */
    const int slots = pp_sets(r->sched, r->n_micro, vs, g->pp_rank, g->pp);
    model_memory(&d, r->micro, slots, 1, &r->mem);
    if (c->zero && g->dp > 1) { /* ZeRO-1: about a dp rank's share (set exactly below) */
        r->mem.total -= r->mem.moments - r->mem.moments / (size_t)g->dp;
        r->mem.moments /= (size_t)g->dp;
    }
    if (run_saves_async(c)) { /* the copy an asynchronous save writes from */
        r->mem.staging = sat_add(r->mem.params, r->mem.moments);
        r->mem.total = sat_add(r->mem.total, r->mem.staging);
    }
    size_t shards = 0;
    for (int k = 0; k < r->train.n_parts; k++) shards += (size_t)r->train.parts[k].n_shards;
    r->mem.data = ds_memory(c->train_data, r->local_batch, r->T, shards);
    r->mem.total = sat_add(r->mem.total, r->mem.data);
    model_memory_threads(&r->mem, &d, r->threads);
    rc = model_memory_check(&r->mem, machine_memory() / (size_t)g->local_ranks, g->local_ranks,
                            err);
    if (rc != 0) {
        Err why = *err;
        err_set(err, "train: %s", why.msg);
    }
    if (ranks_agree(rc, err, MPI_COMM_WORLD) != 0) return -1;
    TpGroup tpg = {g->tp_comm, g->tp, g->tp_rank};
    model_init(&r->m, &d, r->micro, &tpg);
    r->m.ep = (EpGroup){g->ep_comm, g->ep, g->ep_rank};
    r->m.moe_aux_weight = (float)c->moe_aux_weight;
    r->m.pp_comm = g->pp > 1 ? g->pp_comm : MPI_COMM_NULL;
    model_set_slots(&r->m, slots);
    r->m.check_routing = c->debug_checks;
    const int routers_only = c->train_only == TRAIN_ROUTERS;
    if (routers_only) run_routers_setup(r);
    if (g->dp > 1 && model_first_stage(&d) &&
        !routers_only) { /* a step's tokens: at most as many rows */
        const size_t tokens = (size_t)r->local_batch * r->T;
        emb_rows_init(&r->emb_rows, d.Vl, d.C, tokens < (size_t)d.Vl ? (int)tokens : d.Vl);
        r->m.emb_rows = &r->emb_rows;
    }
    /* (train_only = routers: their gradients are a few KB, reduced after the backward) */
    if (c->dp_overlap && g->dp > 1 && !routers_only) run_overlap_setup(r);
    if (c->zero && g->dp > 1) run_zero_setup(r);
    adamw_init_shard(&r->opt, &r->m,
                     r->use_zero    ? &r->zero.shard
                     : routers_only ? &r->trained
                                    : NULL);
    if (r->use_zero) { /* a piece's all-gather starts once its part is updated */
        r->opt.range_done = zero_range_done;
        r->opt.range_ctx = &r->zero;
    }
    if (r->use_zero || routers_only) { /* the moments as allocated: this rank's shard */
        const size_t real = 2 * r->opt.n * sizeof(float);
        r->mem.total = r->mem.total - r->mem.moments + real;
        if (r->mem.staging) r->mem.total = r->mem.total - r->mem.staging + r->mem.params + real;
        if (r->mem.staging) r->mem.staging = r->mem.params + real;
        r->mem.moments = real;
    }
    r->model_ready = 1;
    if (init_from_check(c, r->ckpt_dir, g->world, err) != 0) return -1;
    int resumed = resume_run(c, r->ckpt_dir, &r->m, &r->opt, &r->start, &r->rs, r->last_ckpt,
                             sizeof r->last_ckpt, g->world, r->say, err);
    if (resumed < 0) return -1;
    r->resumed = resumed;
    r->last_step = resumed ? r->start : -1;
    r->rs.rollbacks = 0; /* counted onto the checkpoint loaded, not the next ones */
    if (!r->rs.run_id[0]) run_new_id(r); /* a fresh start, or a checkpoint older than lines */
    if (resumed && run_check_data(r, &r->rs, "resume", err) != 0) return -1;
    if (resumed) run_resume_notice(r);
    if (init_from_load(c, r->ckpt_dir, &r->m, resumed, r->start, g->world, r->say, err) != 0)
        return -1;
    ckpt_run_state_free(&r->rs); /* the checkpoint's record of its data: ours from now on */
    r->rs.data = r->data_id;
    r->rs.n_data = r->n_data_id;
    if (resumed == 0 && !c->init_from[0]) model_init_weights(&r->m, (uint64_t)c->seed);
    for (int l = 0; l < d.L; l++) r->n_routed += model_is_routed(&d, l);
    r->dense_fpt = model_flops_per_token(&d, r->T, NULL);
    return 0;
}
