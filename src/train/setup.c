/*
 * setup: a run's config and grid (the layout checked against the world
 * and the batch), its data (the vocabulary and tokenizer the shards
 * record), its id, and the checks that a resumed run reads on over the
 * same data.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpi/check.h"
#include "src/kernels/kernels.h"
#include "src/plan/plan.h"
#include "src/train/run.h"

/* Whether the layout fits the world and the batch; err says what would fit
 * when it does not. */
static int layout_check(const Config *c, const Grid *g, Err *err) {
    int dp = g->dp, local = c->batch_size / dp;
    if (c->batch_size % dp != 0) {
        char alts[256] = "";
        for (int k = 1; k <= c->batch_size && k <= 4096; k++)
            if (c->batch_size % k == 0)
                snprintf(alts + strlen(alts), sizeof alts - strlen(alts), "%s%d",
                         alts[0] ? ", " : "", k * c->tp * c->pp);
        return err_set(err,
                       "layout: %d ranks with tp = %d make dp = %d, which does not divide "
                       "batch_size = %d (run %s ranks, or change batch_size)",
                       g->world_size, c->tp, dp, c->batch_size, alts);
    }
    const int micro = c->micro_batch ? c->micro_batch : local;
    if (g->pp > 1 && (double)micro * c->seq_len * c->d_model > INT_MAX)
        return err_set(err,
                       "layout: a micro-batch's activations (micro_batch %d x seq_len %d x "
                       "d_model %d floats) exceed the 2^31 - 1 elements of one MPI message "
                       "between pipeline stages (lower micro_batch)",
                       micro, c->seq_len, c->d_model);
    if (c->micro_batch > 0 && local % c->micro_batch != 0) {
        char alts[256] = "";
        for (int k = 1; k <= local && strlen(alts) < sizeof alts - 16; k++)
            if (local % k == 0)
                snprintf(alts + strlen(alts), sizeof alts - strlen(alts), "%s%d",
                         alts[0] ? ", " : "", k);
        return err_set(err,
                       "layout: each of dp = %d ranks takes %d sequences a step, not a multiple "
                       "of micro_batch = %d (--micro_batch %s would do)",
                       dp, local, c->micro_batch, alts);
    }
    const int n_micro = local / micro, vs = c->virtual_stages;
    if (vs > 1 && n_micro % g->pp != 0)
        return err_set(err,
                       "layout: virtual_stages = %d sends the micro-batches round the pp = %d "
                       "ranks in groups of %d, but each dp rank has %d a step (make batch_size "
                       "/ (dp x micro_batch) a multiple of %d)",
                       vs, g->pp, g->pp, n_micro, g->pp);
    int *ub = NULL, flag = 0;
    MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag));
    if (g->pp > 1 && flag && pp_tags(n_micro, vs) - 1 > *ub)
        return err_set(err,
                       "layout: %d micro-batches a step over %d chunks need %lld message tags "
                       "between pipeline stages, more than MPI's %d (raise micro_batch)",
                       n_micro, vs, pp_tags(n_micro, vs), *ub);
    return 0;
}

/* The grid's order: the config's; under auto, tp-dp-pp on one node, and
 * across nodes what plan predicts faster for them (its cluster file's
 * links, or its defaults'). Collective. Returns 0 or -1 with err set. */
static int grid_order(const Config *c, RankOrder *order, Err *err) {
    *order = c->rank_order == ORDER_AUTO ? ORDER_TP_DP_PP : c->rank_order;
    if (c->rank_order != ORDER_AUTO) return 0;
    int nodes, rpn, world;
    grid_nodes(&nodes, &rpn);
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    const int dp = world / (c->tp * c->pp);
    if (nodes == 1 || rpn == 0 || world % (c->tp * c->pp) != 0 || dp == 1 || c->pp == 1)
        return 0; /* no choice: the one axis across nodes is the outermost */
    Cluster cl;
    cluster_defaults(&cl);
    if (c->cluster[0] && cluster_load(&cl, c->cluster, err) != 0) return -1;
    cl.nodes = nodes;
    cl.cores_per_node = rpn * (c->threads ? c->threads : default_threads(rpn));
    Config pc = *c;
    if (!pc.vocab_size) pc.vocab_size = 50257; /* the data's is not read yet */
    PlanRow row;
    if (plan_layout(&pc, &cl, c->tp, c->pp, rpn, &row, NULL, NULL) == 0) *order = row.order;
    return 0;
}

/* Over several nodes, rank 0 says how the grid lies on them, and warns
 * when tp groups span nodes (every block's all-reduces on the network),
 * naming a layout that keeps them on one. */
static void grid_report(const Run *r) {
    const Grid *g = &r->grid;
    if (g->nodes == 1 || g->world_rank != 0) return;
    say_log(r->say,
            "grid: %d ranks on %d nodes, rank_order %s: groups that span nodes: tp %d of %d, "
            "dp %d of %d, pp %d of %d\n",
            g->world_size, g->nodes, config_order_name(r->cfg.rank_order), g->crossing[AXIS_TP],
            g->groups[AXIS_TP], g->crossing[AXIS_DP], g->groups[AXIS_DP], g->crossing[AXIS_PP],
            g->groups[AXIS_PP]);
    if (!g->crossing[AXIS_TP]) return;
    char better[160];
    const int rpn = g->world_size / g->nodes;
    if (g->axes[0] != AXIS_TP && rpn % g->tp == 0) { /* the other two keep their order */
        const char *name[3] = {"tp", "dp", "pp"}, *rest[2];
        for (int i = 0, k = 0; i < 3; i++)
            if (g->axes[i] != AXIS_TP) rest[k++] = name[g->axes[i]];
        snprintf(better, sizeof better, "rank_order = tp-%s-%s keeps every tp group on one node",
                 rest[0], rest[1]);
    } else {
        int t = 1;
        for (int k = 1; k <= g->tp; k++)
            if (g->tp % k == 0 && rpn % k == 0) t = k;
        snprintf(better, sizeof better,
                 "tp = %d (dp %d) keeps every tp group within a node's %d ranks", t,
                 g->dp * g->tp / t, rpn);
    }
    say_error(r->say,
              "layout: %d of the %d tp groups span nodes, so every block's tp all-reduces cross "
              "the network: %s",
              g->crossing[AXIS_TP], g->groups[AXIS_TP], better);
}

/* MODTRAIN_MAX_STEPS=N caps `steps` at N, as `--steps N` would (the
 * README-commands test shortens the examples that train long with it).
 * Returns 0, or -1 with err set when N is not a positive integer. */
static int apply_steps_cap(const Run *r, Config *c, Err *err) {
    const char *s = getenv("MODTRAIN_MAX_STEPS");
    long long n;
    if (!s) return 0;
    if (parse_i64(s, 1, CONFIG_MAX_STEP, &n) != 0)
        return err_set(err, "MODTRAIN_MAX_STEPS = '%s' is not a step count (1 to %d)", s,
                       CONFIG_MAX_STEP);
    if (c->steps > n) {
        say_log(r->say, "steps = %d capped at %lld by MODTRAIN_MAX_STEPS\n", c->steps, n);
        c->steps = (int)n;
    }
    return 0;
}

/* The config and the grid. Every rank parses the same arguments, so rank 0
 * reports. Returns 0 or -1 with err set (ranks_agree). */
int run_setup_layout(Run *r, int argc, char **argv, Err *err) {
    config_defaults(&r->cfg);
    int rc = config_from_args(&r->cfg, argc, argv, err);
    if (rc == 0) rc = config_validate(&r->cfg, err);
    if (rc == 0) rc = apply_steps_cap(r, &r->cfg, err);
    if (rc == 0) rc = kernels_check_arch(r->cfg.blis_arch, err);
    if (ranks_agree(rc, err, MPI_COMM_WORLD) != 0) return -1;
    RankOrder order;
    int axes[3];
    /* BLIS takes its kernels at its first call, which plan may make */
    kernels_init(1, r->cfg.blis_arch);
    rc = grid_order(&r->cfg, &order, err);
    if (ranks_agree(rc, err, MPI_COMM_WORLD) != 0) return -1;
    grid_parse_order(config_order_name(order), axes);
    rc = grid_init(&r->grid, r->cfg.tp, r->cfg.pp, axes, err);
    r->grid_ready = rc == 0;
    if (rc == 0) r->cfg.rank_order = order;
    if (rc == 0) rc = layout_check(&r->cfg, &r->grid, err);
    if (rc == 0) rc = grid_init_ep(&r->grid, r->cfg.ep, r->cfg.n_expert, err);
    if (ranks_agree(rc, err, MPI_COMM_WORLD) != 0) return -1;
    grid_report(r);
    const Config *c = &r->cfg;
    if (c->ckpt_dir[0]) snprintf(r->ckpt_dir, sizeof r->ckpt_dir, "%s", c->ckpt_dir);
    else snprintf(r->ckpt_dir, sizeof r->ckpt_dir, "%s/ckpt", c->run_dir);
    r->threads = c->threads ? c->threads : default_threads(r->grid.local_ranks);
    kernels_init(r->threads, c->blis_arch);
    kernels_set_gemm(c->gemm == 0);
    char warn[1024];
    if (oversubscribed(r->threads, MPI_COMM_WORLD, warn, sizeof warn)) say_error(r->say, "%s", warn);
    r->T = c->seq_len;
    r->local_batch = c->batch_size / r->grid.dp;
    r->micro = c->micro_batch ? c->micro_batch : r->local_batch;
    r->n_micro = r->local_batch / r->micro;
    r->step_tokens = (double)c->batch_size * r->T;
    r->sched = c->schedule == SCHED_GPIPE ? PP_GPIPE : PP_1F1B;
    return 0;
}

/* The tokenizer the config names, checked against what the shards' headers
 * record, and resolved where the config leaves it to them (tokenizer =
 * auto, an empty tokenizer_hash). Returns 0 or -1 with err set. */
static int resolve_tokenizer(Config *c, const Dataset *train, const Dataset *val, Err *err) {
    const ShardMeta *t = ds_meta(train);
    const char *tpath = train->parts[0].shards[0].path;
    if (val && ds_meta(val)->width != t->width)
        return err_set(
            err,
            "data: '%s' holds uint%d tokens but '%s' uint%d; prep both with the same tokenizer",
            val->parts[0].shards[0].path, 8 * ds_meta(val)->width, tpath, 8 * t->width);
    if (val && ds_meta(val)->tokenizer &&
        (ds_meta(val)->tokenizer != t->tokenizer || ds_meta(val)->vocab_hash != t->vocab_hash)) {
        char v[64], w[64];
        shard_describe_tokenizer(ds_meta(val), v, sizeof v);
        shard_describe_tokenizer(t, w, sizeof w);
        return err_set(err,
                       "data: '%s' was tokenized by %s but '%s' by %s; prep both with the same one",
                       val->parts[0].shards[0].path, v, tpath, w);
    }
    const Tokenizer from_shard = tokenizer_of_shard(t->tokenizer);
    if (c->tokenizer == TOK_AUTO)
        c->tokenizer =
            from_shard != TOK_AUTO ? from_shard : config_tokenizer_for_vocab(c->vocab_size);
    else if (from_shard != TOK_AUTO && c->tokenizer != from_shard) {
        char name[16];
        config_get(c, "tokenizer", name, sizeof name);
        return err_set(err,
                       "config: tokenizer = %s, but '%s' was written by 'modtrain prep "
                       "--tokenizer %s' (set tokenizer = %s, or auto)",
                       name, tpath, shard_tokenizer_name(t->tokenizer),
                       shard_tokenizer_name(t->tokenizer));
    }
    if (t->tokenizer >= SHARD_TOK_GPT2) { /* a BPE vocabulary: its hash */
        char hex[CONFIG_HASH_HEX + 1];
        format_vocab_hash(t->vocab_hash, hex);
        if (!c->tokenizer_hash[0]) snprintf(c->tokenizer_hash, sizeof c->tokenizer_hash, "%s", hex);
        else if (strcmp(c->tokenizer_hash, hex) != 0)
            return err_set(err,
                           "config: tokenizer_hash = %s, but '%s' was tokenized with the "
                           "vocabulary %s (set tokenizer_hash = %s, or leave it empty)",
                           c->tokenizer_hash, tpath, hex, hex);
    }
    return 0;
}

/* The vocabulary: the config's, or the one the shards' headers record; a
 * header that records none (llm.c's) needs vocab_size given, and one that
 * records more tokens than vocab_size does not fit. Returns 0 or -1. */
static int resolve_vocab(Config *c, const Dataset *ds, Err *err) {
    const ShardMeta *m = ds_meta(ds);
    const char *path = ds->parts[0].shards[0].path;
    if (!c->vocab_size && !m->vocab)
        return err_set(err,
                       "data: '%s' does not record its vocabulary (an llm.c shard); set "
                       "vocab_size (50257 for GPT-2's tokens)",
                       path);
    if (!c->vocab_size) c->vocab_size = m->vocab;
    if (m->vocab > c->vocab_size)
        return err_set(err,
                       "data: '%s' was written for a vocabulary of %d tokens, more than "
                       "vocab_size = %d (set vocab_size >= %d, or 0 to take the shards')",
                       path, m->vocab, c->vocab_size, m->vocab);
    return 0;
}

static void add_identity(void *ctx, const char *key, const char *value) {
    Run *r = ctx;
    if (r->n_data_id % 64 == 0)
        r->data_id = xrealloc(r->data_id, ((size_t)r->n_data_id + 64) * sizeof(CkKV));
    CkKV *kv = &r->data_id[r->n_data_id++];
    snprintf(kv->key, sizeof kv->key, "%.63s", key);
    snprintf(kv->value, sizeof kv->value, "%.255s", value);
}

/* The datasets (headers only), and the vocabulary and tokenizer when the
 * config leaves them to the data. Returns 0 or -1 with err set (ranks_agree). */
int run_setup_data(Run *r, Err *err) {
    Config *c = &r->cfg;
    const uint64_t seed = (uint64_t)c->seed;
    if (ds_open_agreed(&r->train, c->train_data, r->T, seed, r->grid.world, err) != 0) return -1;
    if (c->val_data[0]) {
        if (ds_open_agreed(&r->val, c->val_data, r->T, seed, r->grid.world, err) != 0) return -1;
        r->have_val = 1;
    }
    int rc = resolve_vocab(c, &r->train, err);
    if (rc == 0) rc = resolve_tokenizer(c, &r->train, r->have_val ? &r->val : NULL, err);
    if (rc == 0) ds_identity(&r->train, add_identity, r);
    return ranks_agree(rc, err, r->grid.world);
}

static const char *look_identity(void *ctx, const char *key) {
    const CkptRunState *rs = ctx;
    for (int i = 0; i < rs->n_data; i++)
        if (strcmp(rs->data[i].key, key) == 0) return rs->data[i].value;
    return NULL;
}

/* A resumed run (or a rollback: `what` names which) reads on from the
 * checkpoint's samples consumed, over the same data in the same order: a
 * changed seed or dataset (rs's, the checkpoint's) is refused unless
 * data_changed = continue. Returns 0 or -1 with err set (on every rank). */
int run_check_data(Run *r, CkptRunState *rs, const char *what, Err *err) {
    const Config *c = &r->cfg;
    Err why;
    int rc = 0;
    const int cont = c->data_changed == DATA_CHANGED_CONTINUE;
    if (rs->samples == 0 && r->start > 0) { /* older than state.data_cursor: steps of this batch */
        /* state.batch_offset may be up to 2^50 and batch_size 2^24: checked, and bounded as a
         * checkpoint's own state.samples is, so the cursor cannot wrap into a plausible one */
        const long long batches = (long long)r->start + rs->batch_offset;
        long long samples;
        if (__builtin_mul_overflow(batches, (long long)c->batch_size, &samples) ||
            samples > 1LL << 62) {
            return err_set(err, "resume: the checkpoint of step %d records no state.samples, and its "
                   "state.step + state.batch_offset = %lld batches of batch_size %d is more than "
                   "2^62 samples (a checkpoint's run reads at most 2^62; is its index edited?)",
                   r->start, batches, c->batch_size);
        }
        rs->samples = samples;
    }
    if (rs->seed >= 0 && rs->seed != c->seed) {
        if (!cont) {
            return err_set(err, "%s: seed = %lld, but the checkpoint's run used seed = %lld, which fixes "
                   "its data order (set seed = %lld, or data_changed = continue to read a new "
                   "order from sample %lld)",
                   what, c->seed, rs->seed, rs->seed, rs->samples);
        }
        say_log(r->say, "%s: data_changed = continue: seed %lld replaces the checkpoint's %lld; reading "
             "the new order from sample %lld\n",
             what, c->seed, rs->seed, rs->samples);
    }
    const int got = ds_identity_compare(&r->train, look_identity, rs, &why);
    if (got < 0 && !cont) {
        rc = err_set(err, "%s: train_data = '%s' is not the data the checkpoint's run read: %s (set "
               "data_changed = continue to carry on over it from sample %lld)",
               what, c->train_data, why.msg, rs->samples);
    } else if (got < 0) {
        say_log(r->say, "%s: data_changed = continue: %s; carrying on over the new data from sample "
             "%lld\n",
             what, why.msg, rs->samples);
    } else if (got > 0) {
        say_log(r->say, "%s: the checkpoint does not record its data (written before it did); reading on "
             "from sample %lld\n",
             what, rs->samples);
    }
    return rc;
}

/* A fresh start draws the run's id (rank 0, shared): every checkpoint of its
 * line, through resumes and requeues, carries it. */
void run_new_id(Run *r) {
    uint64_t v[2] = {0, 0};
    if (r->grid.world_rank == 0) {
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(v, sizeof v, 1, f) != 1) { /* no device: the clock and the process */
            v[0] = (uint64_t)(now_s() * 1e9) ^ ((uint64_t)getpid() << 32);
            v[1] = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ULL;
        }
        if (f) fclose(f);
    }
    MPI_CHECK(MPI_Bcast(v, 2, MPI_UINT64_T, 0, r->grid.world));
    snprintf(r->rs.run_id, sizeof r->rs.run_id, "%016llx%016llx", (unsigned long long)v[0],
             (unsigned long long)v[1]);
}

/* A resumed run whose lr schedule or batch_size differs from its
 * checkpoint's says, in one line, what the change does (run_before_steps
 * speaks for a run with nothing left to train). */
void run_resume_notice(const Run *r) {
    const Config *c = &r->cfg;
    const CkptRunState *rs = &r->rs;
    if (r->start >= c->steps) return;
    Config old = *c; /* the checkpoint's schedule, where it records one */
    const struct {
        const char *name;
        double mine, theirs; /* theirs < 0: not recorded */
    } keys[] = {{"lr", c->lr, rs->lr},
                {"min_lr", c->min_lr, rs->min_lr},
                {"warmup_steps", c->warmup_steps, rs->warmup_steps},
                {"steps", c->steps, rs->steps},
                {"batch_size", c->batch_size, rs->batch_size}};
    char what[512] = "";
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (keys[i].theirs < 0 || keys[i].theirs == keys[i].mine) continue;
        char v[64];
        snprintf(v, sizeof v, "%.17g", keys[i].theirs);
        config_set(&old, keys[i].name, v, "checkpoint", NULL); /* read from an index: valid */
        snprintf(what + strlen(what), sizeof what - strlen(what),
                 "%s%s %g differs from the checkpoint's %g", what[0] ? ", " : "", keys[i].name,
                 keys[i].mine, keys[i].theirs);
    }
    if (!what[0]) return;
    char batch[128] = "";
    if (old.batch_size != c->batch_size)
        snprintf(batch, sizeof batch, "; each step reads %d sequences, on from sample %lld",
                 c->batch_size, rs->samples);
    say_log(r->say, "resume: %s: the new values apply from step %d (lr %.3e there, where the checkpoint's "
         "schedule gave %.3e%s)\n",
         what, r->start + 1, lr_at(c, r->start), lr_at(&old, r->start), batch);
}
