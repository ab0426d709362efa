/*
 * train: `modtrain train`. A run is set up once (config, grid, data, model,
 * resume, metrics), then steps: each takes the fixed global batch of the
 * data order and reads schedule -> sync -> clip -> optimizer; it is logged,
 * sometimes validated, and may end in a save or an early stop. Teardown
 * frees whatever setup reached.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "src/base/files.h"
#include "mpi/check.h"
#include "mpi/dp.h"
#include "mpi/grid.h"
#include "mpi/pipeline.h"
#include "mpi/sync.h"
#include "src/base/fault.h"
#include "src/base/rng.h"
#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/plan/plan.h"
#include "src/train/phases.h"
#include "src/config/config.h"
#include "src/data/dataset.h"
#include "src/kernels/kernels.h"

/* Everything a training run holds. The *_ready flags say what setup reached,
 * so one teardown is right wherever setup stopped. */
typedef struct {
    Config cfg;
    Grid grid;
    int grid_ready;
    char ckpt_dir[CONFIG_STR + 8];
    Dataset train, val; /* val: when have_val */
    int have_val;
    CkKV *data_id; /* (n_data_id) the training data's identity, saved with each checkpoint */
    int n_data_id;
    int T, local_batch, micro, n_micro; /* local_batch: this dp rank's share of a step */
    Model m;
    AdamW opt;
    int model_ready;
    PpSchedule sched;
    int *inputs, *targets; /* (local_batch, T): this rank's sequences of the step */
    double *frac;          /* (L) share of tokens each block processed */
    FILE *metrics;         /* rank 0 only */
    FILE *data_trace;      /* MODTRAIN_DATA_TRACE: every sample this dp rank reads */
    int threads, n_routed, start;
    double peak_gflops, job_peak_gflops, dense_fpt, step_tokens;
    char peak_how[CONFIG_STR + 64]; /* where peak_gflops came from, for the banner */
    /* timing: the first step pays for warm-up and is left out of the ETA */
    double t_start, time_timed, last_save_s;
    int steps_timed;
    /* asynchronous saves (NULL: synchronous); the one in flight's stall
     * and peak RSS at its start */
    CkptAsync *async;
    double async_stall;
    size_t async_rss0;
    ModelMemory mem; /* what the model takes on this rank */
    Phases ph;       /* where the steps' time goes */
    CkptRunState rs; /* batches skipped, rollbacks, the run id: saved with the step */
    /* the checkpoint this run loaded or committed last ("": none yet), which
     * a rollback returns to, and its step (-1) */
    char last_ckpt[CONFIG_STR + 32];
    int last_step;
    /* time_limit's budget before a save or a validation was timed */
    double save_estimate_s, last_eval_s;
    pthread_t watchdog;
    int watchdog_ready, resumed;
    DpOverlap ov; /* dp_overlap: the head's and the blocks' buckets (overlap: in use) */
    int overlap, nhead_seg; /* nhead_seg: the head's segments, before the blocks' */
    int *seg_of;            /* (L) each held block's segment of the overlap */
    EmbRows emb_rows;       /* dp > 1 on the first stage: the embedding's rows apart */
    Zero zero;              /* zero 1 at dp > 1 (use_zero): ZeRO-1's pieces and shard */
    int use_zero;
} Run;

/* What one step measured. */
typedef struct {
    double loss, grad_norm, lr, dt, bubble, fpt;
    unsigned long long tp_bytes, dp_bytes, pp_bytes, ep_bytes;
    unsigned long long dp_gather_bytes; /* zero 1: the parameters all-gathered */
    int live;
    int nonfinite;  /* the loss or gradient was not finite: no update made */
    int data_error; /* a read failed (printed): no step made */
    uint64_t data_hash; /* the sum over the step's samples of a hash of where each lies */
} StepResult;

/* A step's micro-batches as pipeline callbacks. */
typedef struct {
    Run *r;
    int step;
    double loss_sum;
} StepCtx;

/* SIGTERM, SIGUSR1 (a scheduler's warning) and a first SIGINT (Ctrl-C)
 * only set this flag; the ranks act on it together at the next step
 * boundary. A second SIGINT ends the process at once. Read by the
 * training thread, written by whichever thread takes the signal: an
 * atomic (lock-free, so safe in a handler). */
static atomic_int stop_signal;

static void on_stop_signal(int sig) {
    if (sig == SIGINT && atomic_load(&stop_signal) == SIGINT) {
        static const char msg[] = "modtrain: second SIGINT: exiting now, nothing saved\n";
        if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) { /* nothing to do */
        }
        _exit(130);
    }
    int none = 0;
    atomic_compare_exchange_strong(&stop_signal, &none, sig);
}

void train_install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

static const char *signal_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : sig == SIGINT ? "SIGINT" : "a signal";
}

/* fprintf to the metrics file, which only rank 0 has open. */
static void mprintf(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mprintf(FILE *f, const char *fmt, ...) {
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
}

/* Rank 0's metrics reach the file system at each step's end. When they
 * cannot (a full file system, an I/O error), training is worth more than
 * its log: one warning, and the run goes on without metrics.jsonl, its
 * checkpoints and exit code unaffected. */
static void run_metrics_lost(const char *why) {
    errorf("metrics: %s; the run goes on without metrics.jsonl (training and checkpoints are "
           "unaffected)",
           why);
}

static void run_flush_metrics(Run *r) {
    if (!r->metrics || (fflush(r->metrics) == 0 && !ferror(r->metrics))) return;
    char why[CONFIG_STR + 128];
    snprintf(why, sizeof why, "cannot write '%s/metrics.jsonl': %s", r->cfg.run_dir,
             strerror(errno));
    fclose(r->metrics);
    r->metrics = NULL;
    run_metrics_lost(why);
}

/* Test hooks: MODTRAIN_FAULT=rank-exit:R:STEP ends rank R abruptly after
 * the backward of STEP, as a crashed node would; hang:R:STEP makes it stop
 * there for good, as a node whose file system or network died would. */
static void fault_rank_exit(int rank, int step) {
    const char *f = getenv("MODTRAIN_FAULT");
    const int hang = f && strncmp(f, "hang:", 5) == 0;
    if (!f || (!hang && strncmp(f, "rank-exit:", 10) != 0)) return;
    char buf[64];
    const char *arg = f + (hang ? 5 : 10);
    if (strlen(arg) >= sizeof buf) return;
    snprintf(buf, sizeof buf, "%s", arg);
    char *colon = strchr(buf, ':');
    long long r, s;
    if (!colon) return;
    *colon = '\0'; /* both numbers parsed whole, as every other input */
    if (parse_i64(buf, 0, INT_MAX, &r) != 0 || parse_i64(colon + 1, 0, INT_MAX, &s) != 0 ||
        r != rank || s != step)
        return;
    fprintf(stderr, "modtrain: MODTRAIN_FAULT: rank %d %s at step %d\n", rank,
            hang ? "hangs" : "exits", step);
    if (!hang) exit(3);
    for (;;) pause();
}

/* Test hook: MODTRAIN_FAULT=nan-batch:B makes the loss of the step that
 * trains on global batch B NaN (bad data); nan-from:B every batch from B. */
static int fault_nan_batch(long long batch) {
    const char *f = getenv("MODTRAIN_FAULT");
    long long b;
    if (f && strncmp(f, "nan-batch:", 10) == 0 && parse_i64(f + 10, 0, LLONG_MAX, &b) == 0)
        return batch == b;
    if (f && strncmp(f, "nan-from:", 9) == 0 && parse_i64(f + 9, 0, LLONG_MAX, &b) == 0)
        return batch >= b;
    return 0;
}

/* ------------------------------------------------------------------ setup */

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

/* MODTRAIN_MAX_STEPS=N caps `steps` at N, as `--steps N` would (the
 * README-commands test shortens the examples that train long with it).
 * Returns 0, or -1 with err set when N is not a positive integer. */
static int apply_steps_cap(Config *c, Err *err) {
    const char *s = getenv("MODTRAIN_MAX_STEPS");
    long long n;
    if (!s) return 0;
    if (parse_i64(s, 1, CONFIG_MAX_STEP, &n) != 0)
        return err_set(err, "MODTRAIN_MAX_STEPS = '%s' is not a step count (1 to %d)", s,
                       CONFIG_MAX_STEP);
    if (c->steps > n) {
        log0("steps = %d capped at %lld by MODTRAIN_MAX_STEPS\n", c->steps, n);
        c->steps = (int)n;
    }
    return 0;
}

/* The config and the grid. Every rank parses the same arguments, so rank 0
 * reports. Returns 0 or -1 (printed). */
static int run_setup_layout(Run *r, int argc, char **argv) {
    Err err;
    config_defaults(&r->cfg);
    int rc = config_from_args(&r->cfg, argc, argv, &err);
    if (rc == 0) rc = config_validate(&r->cfg, &err);
    if (rc == 0) rc = apply_steps_cap(&r->cfg, &err);
    if (rc == 0) rc = kernels_check_arch(r->cfg.blis_arch, &err);
    if (cmd_agree(rc, &err, MPI_COMM_WORLD) != 0) return -1;
    rc = grid_init(&r->grid, r->cfg.tp, r->cfg.pp, &err);
    r->grid_ready = rc == 0;
    if (rc == 0) rc = layout_check(&r->cfg, &r->grid, &err);
    if (rc == 0) rc = grid_init_ep(&r->grid, r->cfg.ep, r->cfg.n_expert, &err);
    if (cmd_agree(rc, &err, MPI_COMM_WORLD) != 0) return -1;
    const Config *c = &r->cfg;
    if (c->ckpt_dir[0]) snprintf(r->ckpt_dir, sizeof r->ckpt_dir, "%s", c->ckpt_dir);
    else snprintf(r->ckpt_dir, sizeof r->ckpt_dir, "%s/ckpt", c->run_dir);
    r->threads = c->threads ? c->threads : default_threads(r->grid.local_ranks);
    kernels_init(r->threads, c->blis_arch);
    kernels_set_gemm(c->gemm == 0);
    warn_oversubscribed(r->threads, MPI_COMM_WORLD);
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
    if (t->tokenizer == SHARD_TOK_GPT2) {
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
 * config leaves them to the data. Returns 0 or -1 (printed once). */
static int run_setup_data(Run *r) {
    Config *c = &r->cfg;
    Err err;
    const uint64_t seed = (uint64_t)c->seed;
    if (ds_open_shared(&r->train, c->train_data, r->T, seed, r->grid.world) != 0) return -1;
    if (c->val_data[0]) {
        if (ds_open_shared(&r->val, c->val_data, r->T, seed, r->grid.world) != 0) return -1;
        r->have_val = 1;
    }
    int rc = resolve_vocab(c, &r->train, &err);
    if (rc == 0) rc = resolve_tokenizer(c, &r->train, r->have_val ? &r->val : NULL, &err);
    if (rc == 0) ds_identity(&r->train, add_identity, r);
    return cmd_agree(rc, &err, r->grid.world);
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
 * data_changed = continue. Returns 0 or -1 (printed). */
static int run_check_data(Run *r, CkptRunState *rs, const char *what) {
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
            errorf("resume: the checkpoint of step %d records no state.samples, and its "
                   "state.step + state.batch_offset = %lld batches of batch_size %d is more than "
                   "2^62 samples (a checkpoint's run reads at most 2^62; is its index edited?)",
                   r->start, batches, c->batch_size);
            return -1;
        }
        rs->samples = samples;
    }
    if (rs->seed >= 0 && rs->seed != c->seed) {
        if (!cont) {
            errorf("%s: seed = %lld, but the checkpoint's run used seed = %lld, which fixes "
                   "its data order (set seed = %lld, or data_changed = continue to read a new "
                   "order from sample %lld)",
                   what, c->seed, rs->seed, rs->seed, rs->samples);
            return -1;
        }
        log0("%s: data_changed = continue: seed %lld replaces the checkpoint's %lld; reading "
             "the new order from sample %lld\n",
             what, c->seed, rs->seed, rs->samples);
    }
    const int got = ds_identity_compare(&r->train, look_identity, rs, &why);
    if (got < 0 && !cont) {
        errorf("%s: train_data = '%s' is not the data the checkpoint's run read: %s (set "
               "data_changed = continue to carry on over it from sample %lld)",
               what, c->train_data, why.msg, rs->samples);
        rc = -1;
    } else if (got < 0) {
        log0("%s: data_changed = continue: %s; carrying on over the new data from sample "
             "%lld\n",
             what, why.msg, rs->samples);
    } else if (got > 0) {
        log0("%s: the checkpoint does not record its data (written before it did); reading on "
             "from sample %lld\n",
             what, rs->samples);
    }
    return rc;
}

/* A fresh start draws the run's id (rank 0, shared): every checkpoint of its
 * line, through resumes and requeues, carries it. */
static void run_new_id(Run *r) {
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
static void run_resume_notice(const Run *r) {
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
    log0("resume: %s: the new values apply from step %d (lr %.3e there, where the checkpoint's "
         "schedule gave %.3e%s)\n",
         what, r->start + 1, lr_at(c, r->start), lr_at(&old, r->start), batch);
}

/* Whether the run makes periodic saves in the background (the final save
 * and a stop's are synchronous: nothing is left to overlap them with). */
static int run_saves_async(const Config *c) {
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
    if (nhead) { /* the tied embedding (its rows apart), then ln_f's weight and bias */
        const ParamInfo *w = model_tied_param(m), *fw = model_find_param(m, "ln_f.weight"),
                        *fb = model_find_param(m, "ln_f.bias");
        lo[0] = w->offset, hi[0] = param_end(w);
        lo[1] = fw->offset, hi[1] = param_end(fb);
        ok = param_end(fw) == fb->offset;
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
        log0("train: dp_overlap: a block's or ln_f's tensors are not one range of the "
             "gradients; they are reduced after the backward\n");
    }
}

/* zero 1: ZeRO-1's pieces, cut where the overlap's buckets and the tied
 * embedding's range begin and end (so that a bucket in flight is whole
 * pieces, and both stages' copies of the embedding are cut alike). */
static void run_zero_setup(Run *r) {
    const Model *m = &r->m;
    const Grid *g = &r->grid;
    const int nb = r->overlap ? r->ov.nbucket : 0;
    size_t *cut = xmalloc((2 * (size_t)nb + 2) * sizeof(size_t));
    int n = 0;
    for (int b = 0; b < nb; b++) cut[n++] = r->ov.blo[b], cut[n++] = r->ov.bhi[b];
    const ParamInfo *tied = model_tied_param(m);
    if (tied) cut[n++] = tied->offset, cut[n++] = tied->offset + tied->numel;
    const size_t shared = m->nparams - (g->ep > 1 ? m->expert_floats : 0);
    zero_init(&r->zero, m->nparams, shared, cut, n, g->dp_comm,
              g->ep > 1 ? g->edp_comm : MPI_COMM_NULL);
    free(cut);
    if (r->overlap) dp_overlap_set_zero(&r->ov, g->dp, g->dp_rank);
    r->use_zero = 1;
}



/* This rank's stage of the model and its optimizer, restored from a
 * checkpoint or freshly initialised. Returns 0 or -1 (printed). */
static int run_setup_model(Run *r) {
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
    Err err;
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
                            &err);
    if (rc != 0) {
        Err why = err;
        err_set(&err, "train: %s", why.msg);
    }
    if (cmd_agree(rc, &err, MPI_COMM_WORLD) != 0) return -1;
    TpGroup tpg = {g->tp_comm, g->tp, g->tp_rank};
    model_init(&r->m, &d, r->micro, &tpg);
    r->m.ep = (EpGroup){g->ep_comm, g->ep, g->ep_rank};
    r->m.moe_aux_weight = (float)c->moe_aux_weight;
    r->m.pp_comm = g->pp > 1 ? g->pp_comm : MPI_COMM_NULL;
    model_set_slots(&r->m, slots);
    r->m.check_routing = c->debug_checks;
    if (g->dp > 1 && model_first_stage(&d)) { /* a step's tokens: at most as many rows */
        const size_t tokens = (size_t)r->local_batch * r->T;
        emb_rows_init(&r->emb_rows, d.Vl, d.C, tokens < (size_t)d.Vl ? (int)tokens : d.Vl);
        r->m.emb_rows = &r->emb_rows;
    }
    if (c->dp_overlap && g->dp > 1) run_overlap_setup(r);
    if (c->zero && g->dp > 1) run_zero_setup(r);
    adamw_init_shard(&r->opt, &r->m, r->use_zero ? &r->zero.shard : NULL);
    if (r->use_zero) { /* the moments as allocated: this rank's shard */
        const size_t real = 2 * r->opt.n * sizeof(float);
        r->mem.total = r->mem.total - r->mem.moments + real;
        if (r->mem.staging) r->mem.total = r->mem.total - r->mem.staging + r->mem.params + real;
        if (r->mem.staging) r->mem.staging = r->mem.params + real;
        r->mem.moments = real;
    }
    r->model_ready = 1;
    if (init_from_check(c, r->ckpt_dir, g->world) != 0) return -1;
    int resumed = resume_run(c, r->ckpt_dir, &r->m, &r->opt, &r->start, &r->rs, r->last_ckpt,
                             sizeof r->last_ckpt, g->world);
    if (resumed < 0) return -1;
    r->resumed = resumed;
    r->last_step = resumed ? r->start : -1;
    r->rs.rollbacks = 0; /* counted onto the checkpoint loaded, not the next ones */
    if (!r->rs.run_id[0]) run_new_id(r); /* a fresh start, or a checkpoint older than lines */
    if (resumed && run_check_data(r, &r->rs, "resume") != 0) return -1;
    if (resumed) run_resume_notice(r);
    if (init_from_load(c, r->ckpt_dir, &r->m, resumed, r->start, g->world) != 0) return -1;
    ckpt_run_state_free(&r->rs); /* the checkpoint's record of its data: ours from now on */
    r->rs.data = r->data_id;
    r->rs.n_data = r->n_data_id;
    if (resumed == 0 && !c->init_from[0]) model_init_weights(&r->m, (uint64_t)c->seed);
    for (int l = 0; l < d.L; l++) r->n_routed += model_is_routed(&d, l);
    r->dense_fpt = model_flops_per_token(&d, r->T, NULL);
    return 0;
}

/* The parameters of this rank's stage, every expert counted: the registry
 * holds this rank's El of each MoE block's E experts (ep ranks hold the
 * rest, each as many of the same shape). */
static size_t stage_params(const Model *m) {
    size_t n = 0;
    for (int i = 0; i < m->nreg; i++) {
        const ParamInfo *p = &m->reg[i];
        n += (size_t)p->vocab_rows * p->shape[1] * (p->expert >= 0 ? (size_t)m->d.ep : 1);
    }
    return n;
}

/* The banner's line on the model's kind: dense, Mixture-of-Depths,
 * Mixture-of-Experts, staged MoDE (routed blocks beside MoE blocks) or
 * integrated MoDE (no-op experts: an MoE block's depth routing). */
static void run_banner_kind(const Run *r, size_t total) {
    const ModelDims *d = &r->m.d;
    const int moe = model_moe_blocks(d);
    if (moe == 0) {
        log0("model: %s\n", r->n_routed ? "Mixture-of-Depths" : "dense");
        return;
    }
    const char *kind = r->n_routed && d->Nn ? "staged and integrated MoDE"
                       : r->n_routed        ? "staged MoDE (routed blocks beside MoE blocks)"
                       : d->Nn              ? "integrated MoDE (no-op experts)"
                                            : "Mixture-of-Experts";
    /* one expert's MLP, global: c_fc (C, Fe) + (Fe), c_proj (Fe, C) + (C) */
    const double one = 2.0 * d->C * d->Fe + d->Fe + d->C;
    const double experts = one * d->E * moe, active = one * d->ek * moe;
    char noop[64] = "";
    if (d->Nn) snprintf(noop, sizeof noop, " + %d no-op", d->Nn);
    log0("model: %s | %d of %d blocks MoE: %d experts%s, top-%d, width %d, capacity factor %g "
         "(%d rows an expert of a %d-row micro-batch), ep %d | experts %.2fM of the %.2fM "
         "parameters, %.2fM active a token\n",
         kind, moe, d->L, d->E, noop, d->ek, d->Fe, d->cf,
         model_expert_capacity(d, r->micro * r->T), r->micro * r->T, d->ep, experts / 1e6,
         total / 1e6, ((double)total - experts + active) / 1e6);
}

static void run_banner(const Run *r) {
    const Config *c = &r->cfg;
    const ModelDims *d = &r->m.d;
    /* the whole model's count, not the stage's this rank holds; every
     * expert of it, whatever ep (plan_num_params builds the registry at ep 1) */
    Config whole = *c;
    whole.vocab_size = d->V;
    char stage[64] = "";
    if (r->grid.pp > 1)
        snprintf(stage, sizeof stage, " (%.2fM on stage 0)", stage_params(&r->m) / 1e6);
    log0("modtrain %s | %.2fM parameters%s | L=%d C=%d NH=%d T=%d V=%d | batch %d x %d tokens, "
         "micro-batch %d\n",
         PACKAGE_VERSION, plan_num_params(&whole) / 1e6, stage, d->L, d->C, d->NH, r->T, d->V,
         c->batch_size, r->T, r->micro);
    run_banner_kind(r, plan_num_params(&whole));
    if (r->n_routed)
        log0("Mixture-of-Depths: %d of %d blocks routed, capacity %g (k = %d of %d), gate %s, "
             "causal routing by %s\n",
             r->n_routed, d->L, c->capacity, model_capacity_k(d, r->T), r->T,
             c->router_gate == GATE_SIGMOID ? "sigmoid" : "raw",
             d->predictor ? "predictor" : "aux_loss");
    char tot[32], pg[32], mo[32], ac[32];
    format_bytes(tot, sizeof tot, r->mem.total);
    format_bytes(pg, sizeof pg, r->mem.params + r->mem.grads);
    format_bytes(mo, sizeof mo, r->mem.moments);
    format_bytes(ac, sizeof ac, r->mem.acts + r->mem.scratch);
    char sg[160] = "", b[32];
    if (r->mem.staging) {
        format_bytes(b, sizeof b, r->mem.staging);
        snprintf(sg, sizeof sg, " + checkpoint staging %s", b);
    }
    format_bytes(b, sizeof b, r->mem.data);
    snprintf(sg + strlen(sg), sizeof sg - strlen(sg), " + data path %s", b);
    format_bytes(b, sizeof b, r->mem.threads);
    snprintf(sg + strlen(sg), sizeof sg - strlen(sg), " + the threads' buffers %s", b);
    char rc[32];
    config_get(c, "recompute", rc, sizeof rc);
    log0("memory (rank 0): %s = parameters and gradients %s + AdamW moments %s + activations "
         "%s (recompute %s)%s (%zu bytes)\n",
         tot, pg, mo, ac, rc, sg, r->mem.total);
    char ep[64] = "";
    if (r->grid.ep > 1) snprintf(ep, sizeof ep, " ep=%d", r->grid.ep);
    if (c->virtual_stages > 1) /* interleaved 1F1B */
        snprintf(ep + strlen(ep), sizeof ep - strlen(ep), " (%d chunks a rank)", c->virtual_stages);
    log0("layout dp=%d tp=%d pp=%d%s | %d thread%s a rank | BLIS %s kernels | "
         "sgemm peak %.1f GFLOP/s (%s), %.1f over the job\n",
         r->grid.dp, r->grid.tp, r->grid.pp, ep, r->threads, r->threads == 1 ? "" : "s",
         kernels_blis_arch(), r->peak_gflops, r->peak_how, r->job_peak_gflops);
}

/* Rank 0 alone writes the metrics. Returns 0 or -1 (printed). */
static int run_open_metrics(Run *r) {
    Err err, why;
    int rc = 0;
    if (r->grid.world_rank == 0) {
        char path[CONFIG_STR + 32];
        snprintf(path, sizeof path, "%s/metrics.jsonl", r->cfg.run_dir);
        if (mkdirs(r->cfg.run_dir) != 0)
            rc = err_set(&err, "run_dir: cannot create '%s': %s", r->cfg.run_dir, strerror(errno));
        else if (!(r->metrics = open_output(path, 1, &why)))
            rc = err_set(&err, "run_dir: %s (metrics.jsonl must be a regular file)", why.msg);
    }
    return cmd_agree(rc, &err, r->grid.world);
}

/* time_limit's budget for the stop's save before any save was timed: a
 * probe write into ckpt_dir (see ckpt_probe_save) scaled to the state of
 * every rank. Returns 0 or -1 (printed). */
static int run_probe_save(Run *r) {
    double mine = 12.0 * (double)r->m.nparams / r->grid.dp, all = 0; /* weights, 2 moments */
    MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, r->grid.world));
    Err err;
    const int rc = ckpt_probe_save(r->ckpt_dir, all, r->grid.world, &r->save_estimate_s, &err);
    if (rc != 0 && r->grid.world_rank == 0) err_print(&err);
    return rc;
}

/* time_limit = auto: the seconds from the process's start to the SLURM
 * job's end, found by rank 0 and shared; outside a job, or when SLURM
 * gives no end, no limit (logged). The stop's save is budgeted before it
 * as for any time_limit. A malformed SLURM_JOB_ID or SLURM_JOB_END_TIME
 * is an error: returns -1 (printed), else 0. */
static int run_time_limit_auto(Run *r) {
    Config *c = &r->cfg;
    if (c->time_limit != CONFIG_TIME_LIMIT_AUTO) return 0;
    double limit = 0;
    char why[256] = "", when[64] = "";
    time_t end = 0;
    int found = 0;
    if (r->grid.world_rank == 0) found = cmd_slurm_end_time(&end, why, sizeof why);
    if (found > 0) {
        const double left = difftime(end, time(NULL));
        limit = (now_s() - cmd_start_s) + (left > 1 ? left : 1);
        struct tm tm;
        if (!localtime_r(&end, &tm) || !strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm))
            snprintf(when, sizeof when, "%lld s since 1970", (long long)end);
    }
    Err err;
    if (found < 0) err_set(&err, "time_limit = auto: %s", why);
    if (cmd_agree(found < 0 ? -1 : 0, &err, r->grid.world) != 0) return -1;
    MPI_CHECK(MPI_Bcast(&limit, 1, MPI_DOUBLE, 0, r->grid.world));
    c->time_limit = limit;
    char d[32];
    format_duration(d, sizeof d, limit);
    if (limit > 0)
        log0("train: time_limit = auto: job %s ends at %s (%s): %.0f s from the start, %s\n",
             getenv("SLURM_JOB_ID"), when, why, limit, d);
    else log0("train: time_limit = auto: %s: no time limit\n", why);
    return 0;
}

/* The watchdog: a thread that ends the job when neither training nor a
 * save has made progress (fault_progress) for watchdog_s seconds, naming
 * the rank and the phase: a peer stuck in a collective, a file system that
 * stopped answering. _exit, not MPI_Abort: MPI itself may be what hangs. */
static atomic_int watch_step;

/* The watchdog ends cleanly: teardown sets watch_stop under watch_lock and
 * wakes it, then joins it (a cancelled thread is what sanitizers misread). */
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_wake = PTHREAD_COND_INITIALIZER;
static int watch_stop;

static void *watchdog_main(void *arg) {
    const Run *r = arg;
    const double limit = r->cfg.watchdog_s;
    pthread_mutex_lock(&watch_lock);
    while (!watch_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&watch_wake, &watch_lock, &until);
        if (watch_stop) break;
        const char *phase;
        const double idle = now_s() - fault_last_progress(&phase);
        if (idle <= limit) continue;
        fprintf(stderr,
                "modtrain: watchdog: rank %d made no progress for %.0f s in %s (step %d, "
                "watchdog_s = %g); ending the job (exit %d)\n",
                r->grid.world_rank, idle, phase, atomic_load(&watch_step), limit, EXIT_WATCHDOG);
        _exit(EXIT_WATCHDOG);
    }
    pthread_mutex_unlock(&watch_lock);
    return NULL;
}

static void watchdog_start(Run *r) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* signals go to the training thread */
    fault_phase("setup");
    r->watchdog_ready = pthread_create(&r->watchdog, NULL, watchdog_main, r) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Everything before the first step. Returns EXIT_OK, or the exit code. */
static int run_setup(Run *r, int argc, char **argv) {
    if (run_setup_layout(r, argc, argv) != 0 || run_setup_data(r) != 0 || run_setup_model(r) != 0)
        return EXIT_USAGE;
    Err err;
    const int rc = cmd_peak_gflops(&r->cfg, r->threads, &r->peak_gflops, r->peak_how,
                                   sizeof r->peak_how, &err);
    if (cmd_agree(rc, &err, r->grid.world) != 0) return EXIT_USAGE;
    /* MFU is the job's model FLOPs over the job's peak: every rank's */
    MPI_CHECK(MPI_Allreduce(&r->peak_gflops, &r->job_peak_gflops, 1, MPI_DOUBLE, MPI_SUM,
                            r->grid.world));
    run_banner(r);
    if (run_open_metrics(r) != 0) return EXIT_USAGE;
    if (run_saves_async(&r->cfg)) {
        r->async = ckpt_async_new(r->grid.world, r->m.nparams + 2 * r->opt.n, r->threads, &err);
        if (!r->async && r->grid.world_rank == 0) err_print(&err);
    }
    if (run_time_limit_auto(r) != 0) return EXIT_USAGE;
    if (r->cfg.time_limit > 0 && run_probe_save(r) != 0) return EXIT_USAGE;
    if (r->cfg.watchdog_s > 0) watchdog_start(r);
    const char *trace = getenv("MODTRAIN_DATA_TRACE");
    if (trace && *trace) { /* a test's view of the reads: FILE.DP_RANK */
        char p[4200];
        snprintf(p, sizeof p, "%.4096s.%d", trace, r->grid.dp_rank);
        r->data_trace = fopen(p, "a");
    }
    r->inputs = xmalloc((size_t)r->local_batch * r->T * sizeof(int));
    r->targets = xmalloc((size_t)r->local_batch * r->T * sizeof(int));
    r->frac = xcalloc((size_t)r->m.d.L, sizeof(double));
    r->t_start = cmd_start_s; /* time_limit counts from the process's start */
    return EXIT_OK;
}

static void run_teardown(Run *r) {
    if (r->watchdog_ready) {
        pthread_mutex_lock(&watch_lock);
        watch_stop = 1;
        pthread_cond_signal(&watch_wake);
        pthread_mutex_unlock(&watch_lock);
        pthread_join(r->watchdog, NULL);
    }
    ckpt_async_free(r->async);
    char path[CONFIG_STR + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->cfg.run_dir);
    Err err;
    if (r->metrics && close_output(r->metrics, path, &err) != 0) run_metrics_lost(err.msg);
    r->metrics = NULL;
    if (r->data_trace) fclose(r->data_trace);
    free(r->inputs);
    free(r->targets);
    free(r->frac);
    if (r->overlap) dp_overlap_free(&r->ov);
    free(r->seg_of);
    if (r->emb_rows.slot) emb_rows_free(&r->emb_rows);
    if (r->use_zero) zero_free(&r->zero);
    if (r->model_ready) {
        adamw_free(&r->opt);
        model_free(&r->m);
    }
    ds_free(&r->train);
    ds_free(&r->val);
    free(r->data_id);
    if (r->grid_ready) grid_free(&r->grid);
}

/* ------------------------------------------------------------------- step */

static void step_forward(void *p, int chunk, int mb, int slot) {
    StepCtx *c = p;
    Run *r = c->r;
    const int T = r->T;
    const double t0 = now_s(), tp0 = tp_time_s + ep_time_s;
    const size_t at = (size_t)mb * r->micro * T;
    model_use_chunk(&r->m, slot, chunk);
    fault_phase("forward");
    /* step_backward follows with this dloss: the head does its backward in
     * the forward, without the logits' product a second time */
    model_expect_backward(&r->m, (float)(1.0 / r->step_tokens));
    c->loss_sum +=
        model_forward(&r->m, r->inputs + at, r->targets + at, r->micro, T) * (double)r->micro * T;
    check_model_fault(&r->m);
    phases_add(&r->ph, PH_FORWARD, now_s() - t0 - (tp_time_s + ep_time_s - tp0));
}

static void step_backward(void *p, int mb, int slot) {
    StepCtx *c = p;
    (void)mb;
    const double t0 = now_s(), tp0 = tp_time_s + ep_time_s;
    model_use_slot(&c->r->m, slot);
    fault_phase("backward");
    model_backward(&c->r->m, (float)(1.0 / c->r->step_tokens), (float)c->r->cfg.aux_weight);
    phases_add(&c->r->ph, PH_BACKWARD, now_s() - t0 - (tp_time_s + ep_time_s - tp0));
}

static float *step_input(void *p, int slot) { return ((StepCtx *)p)->r->m.slots[slot].enc; }

static float *step_output(void *p, int slot) {
    Model *m = &((StepCtx *)p)->r->m;
    model_use_slot(m, slot);
    return model_stage_output(m);
}

static float *step_grad(void *p) { return ((StepCtx *)p)->r->m.s.dres; }

/* This rank's sequences of the step that starts at sample r->rs.samples:
 * the fixed slice of the global batch its dp rank takes, the same on its
 * tp and pp peers. A failed read (a shard truncated or changed while in
 * use) on any rank ends the run on all of them. Returns 0 or -1 (printed
 * by the first rank that failed). */
static int run_read_batch(Run *r, uint64_t *hash) {
    const double t0 = now_s();
    fault_phase("data");
    const uint64_t first = (uint64_t)r->rs.samples + (uint64_t)r->grid.dp_rank * r->local_batch;
    Err err;
    int rc = 0;
    uint64_t h = 0;
    for (int b = 0; b < r->local_batch && rc == 0; b++) {
        DsSample s;
        const uint64_t g = first + (uint64_t)b;
        ds_locate(&r->train, g, &s);
        const size_t at = (size_t)b * r->T;
        rc = ds_read(&r->train, &s, r->cfg.vocab_size, r->inputs + at, r->targets + at, &err);
        h += rng_u64(g, (uint64_t)s.part << 32 ^ s.epoch, s.seq);
        if (rc == 0 && r->data_trace && r->grid.tp_rank == 0 && r->grid.pp_rank == 0) {
            fprintf(r->data_trace, "{\"sample\":%" PRIu64 ",\"dataset\":%d,\"shard\":%d,"
                    "\"offset\":%" PRIu64 ",\"epoch\":%" PRIu64 ",\"tokens\":[",
                    g, s.part, s.shard, s.offset, s.epoch);
            for (int t = 0; t < 8 && t < r->T; t++)
                fprintf(r->data_trace, "%s%d", t ? "," : "", r->inputs[at + (size_t)t]);
            fprintf(r->data_trace, "]}\n");
        }
    }
    if (r->data_trace) fflush(r->data_trace);
    for (int b = 0; b < r->local_batch && rc == 0; b++) { /* the next step's, in the background */
        DsSample s;
        ds_locate(&r->train, first + (uint64_t)r->cfg.batch_size + (uint64_t)b, &s);
        ds_prefetch(&r->train, &s);
    }
    phases_add(&r->ph, PH_DATA, now_s() - t0);
    if (cmd_agree(rc, &err, r->grid.world) != 0) return -1;
    /* the step's samples over the dp ranks: which were read, not by whom */
    MPI_CHECK(MPI_Allreduce(&h, hash, 1, MPI_UINT64_T, MPI_SUM, r->grid.dp_comm));
    return 0;
}

/* The step's FLOPs per token, from what its blocks computed (r->frac and
 * the reduced stats): an MoE block costs the real experts' slots it kept
 * per token it processed, not expert_top_k. */
static double run_step_flops(Run *r) {
    const Model *m = &r->m;
    const ModelDims *d = &m->d;
    if (d->E == 0) return model_flops_per_token(d, r->T, r->n_routed ? r->frac : NULL);
    const int w = d->E + d->Nn + 2;
    double *slots = xcalloc((size_t)d->L, sizeof(double));
    for (int l = 0; l < d->L; l++) {
        const long long *st = m->stats.moe + (size_t)l * w, all = st[w - 1];
        long long kept = 0;
        for (int e = 0; e < d->E; e++) kept += st[e];
        /* tokens the block processed = its slots / k */
        slots[l] = all > 0 ? (double)kept * d->ek / (double)all : 0.0;
    }
    const double fpt = model_flops_per_token_moe(d, r->T, r->n_routed ? r->frac : NULL, slots);
    free(slots);
    return fpt;
}

/* The whole model's gradient norm: this rank's sums of squares (under
 * zero 1 of its parts, completed over their groups), then over tp, ep and
 * pp. */
static double run_grad_norm(Run *r) {
    double split[2], replicated[2];
    if (r->use_zero) {
        model_grad_sumsq_ranges(&r->m, r->zero.shard.lo, r->zero.shard.hi, r->zero.shard.n,
                                split, replicated);
        zero_sumsq_reduce(split, replicated, &r->zero);
    } else {
        model_grad_sumsq(&r->m, split, replicated);
    }
    return grads_norm(split, replicated, &r->grid);
}

/* One optimizer step: schedule -> sync -> clip -> optimizer. */
static void run_step(Run *r, int step, StepResult *out) {
    Model *m = &r->m;
    const Grid *g = &r->grid;
    const double t0 = now_s(), wait0 = pp_wait_s, tp_s0 = tp_time_s, ep_s0 = ep_time_s;
    const unsigned long long tp0 = tp_bytes, dp0 = dp_bytes, pp0 = pp_bytes, ep0 = ep_bytes,
                             ag0 = dp_gather_bytes;
    if (run_read_batch(r, &out->data_hash) != 0) {
        out->data_error = 1;
        return;
    }
    model_zero_grad(m);
    model_stats_reset(m);
    /* schedule: the micro-batches' forwards and backwards */
    StepCtx sc = {r, step, 0};
    PpStage st = {.ctx = &sc,
                  .forward = step_forward,
                  .backward = step_backward,
                  .input = step_input,
                  .output = step_output,
                  .grad_out = step_grad,
                  .grad_in = step_grad,
                  .count = (size_t)r->micro * r->T * m->d.C,
                  .chunks = m->d.nchunk};
    pp_run(r->sched, r->n_micro, g->pp > 1 ? g->pp_comm : MPI_COMM_NULL, &st, &out->live);
    fault_rank_exit(g->world_rank, step + 1);
    /* sync: gradients, then the loss and routing counters */
    fault_phase("gradient all-reduce");
    double t1 = now_s(), tp1 = tp_time_s;
    const ParamInfo *tied = model_tied_param(m);
    const EmbRows *er = m->emb_rows;
    const TiedGrad tg = {.offset = tied ? tied->offset : 0,
                         .numel = tied ? tied->numel : 0,
                         .head = model_last_stage(&m->d),
                         .slot = er ? er->slot : NULL,
                         .rows = er ? er->rows : NULL,
                         .Vl = m->d.Vl,
                         .C = m->d.C};
    grads_sync(m->grads, m->nparams, m->expert_floats, tied ? &tg : NULL, g,
               r->overlap ? &r->ov : NULL, r->use_zero ? &r->zero : NULL);
    if (m->emb_rows) emb_rows_clear(m->emb_rows);
    double loss = reduce_step_stats(m, sc.loss_sum, g->dp_comm);
    if (g->pp > 1) {
        loss = reduce_step_stats(m, loss, g->pp_comm);
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &out->live, 1, MPI_INT, MPI_MAX, g->pp_comm));
    }
    out->loss = loss / r->step_tokens;
    if (fault_nan_batch(step + r->rs.batch_offset)) out->loss = NAN;
    phases_add(&r->ph, PH_DP, now_s() - t1 - (tp_time_s - tp1));
    t1 = now_s(), tp1 = tp_time_s;
    /* clip */
    out->grad_norm = run_grad_norm(r);
    const Config *c = &r->cfg;
    /* a non-finite loss or gradient: no update, so the weights stay those
     * of the last good step (every rank sees the same reduced values) */
    out->nonfinite = !isfinite(out->loss) || !isfinite(out->grad_norm);
    if (out->nonfinite) return;
    fault_phase("optimizer");
    float scale = c->grad_clip > 0 && out->grad_norm > c->grad_clip
                      ? (float)(c->grad_clip / out->grad_norm)
                      : 1.f;
    /* optimizer */
    out->lr = lr_at(c, step);
    adamw_step(&r->opt, m, out->lr, c->beta1, c->beta2, c->adam_eps, c->weight_decay, step + 1,
               scale);
    phases_add(&r->ph, PH_OPTIMIZER, now_s() - t1 - (tp_time_s - tp1));
    if (r->use_zero) { /* every rank's updated parts, to every rank */
        t1 = now_s();
        zero_gather(&r->zero, m->params);
        phases_add(&r->ph, PH_DP, now_s() - t1);
    }
    phases_add(&r->ph, PH_TP, tp_time_s - tp_s0);
    phases_add(&r->ph, PH_EP, ep_time_s - ep_s0);
    phases_add(&r->ph, PH_PP_WAIT, pp_wait_s - wait0);
    out->dt = now_s() - t0;
    out->tp_bytes = tp_bytes - tp0;
    out->dp_bytes = dp_bytes - dp0;
    out->dp_gather_bytes = dp_gather_bytes - ag0;
    out->pp_bytes = pp_bytes - pp0;
    out->ep_bytes = ep_bytes - ep0;
    /* the pipeline bubble: the share of the step each stage spent waiting on
     * its neighbours, averaged over the stages */
    out->bubble = (pp_wait_s - wait0) / out->dt;
    if (g->pp > 1) {
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &out->bubble, 1, MPI_DOUBLE, MPI_SUM, g->pp_comm));
        out->bubble /= g->pp;
    }
    for (int l = 0; l < m->d.L; l++) r->frac[l] = (double)m->stats.processed[l] / m->stats.tokens;
    out->fpt = run_step_flops(r);
    if (step > r->start) {
        r->steps_timed++;
        r->time_timed += out->dt;
    }
    phases_end_step(&r->ph);
}

/* An MoE model's expert load on the step's metrics line: per MoE block the
 * share of its slots each expert kept (real ones, then no-ops) and the share
 * dropped, and the mean load-balancing loss. Returns the drop rate over
 * every MoE block (0 without experts). */
static double run_log_moe(const Run *r) {
    const ModelDims *d = &r->m.d;
    const RouteStats *st = &r->m.stats;
    if (d->E == 0) return 0;
    const int w = d->E + d->Nn + 2;
    long long dropped = 0, all = 0;
    mprintf(r->metrics, ",\"expert_load\":[");
    for (int l = 0, k = 0; l < d->L; l++) {
        if (!model_is_moe(d, l)) continue;
        const long long *v = st->moe + (size_t)l * w;
        const double n = v[w - 1] > 0 ? (double)v[w - 1] : 1.0;
        mprintf(r->metrics, "%s[", k++ ? "," : "");
        for (int e = 0; e < d->E + d->Nn; e++) mprintf(r->metrics, "%s%.6f", e ? "," : "", v[e] / n);
        mprintf(r->metrics, "]");
        dropped += v[w - 2], all += v[w - 1];
    }
    mprintf(r->metrics, "],\"expert_drop\":[");
    for (int l = 0, k = 0; l < d->L; l++) {
        if (!model_is_moe(d, l)) continue;
        const long long *v = st->moe + (size_t)l * w;
        mprintf(r->metrics, "%s%.6f", k++ ? "," : "",
                v[w - 1] > 0 ? (double)v[w - 2] / (double)v[w - 1] : 0.0);
    }
    mprintf(r->metrics, "],\"moe_aux\":%.6f",
            st->moe_forwards ? st->moe_aux_sum / (double)st->moe_forwards : 0.0);
    return all > 0 ? (double)dropped / (double)all : 0.0;
}

/* The step's metrics line, and the progress line every log_every steps. */
static void run_log(Run *r, int step, const StepResult *s) {
    const Config *c = &r->cfg;
    const RouteStats *st = &r->m.stats;
    const int done = step + 1;
    const double tps = r->step_tokens / s->dt, mfu = s->fpt * tps / (r->job_peak_gflops * 1e9);
    double aux = 0, acc = 0;
    mprintf(r->metrics, "{\"step\":%d,\"samples\":%lld,\"data_hash\":\"%016" PRIx64
            "\",\"loss\":%.6f",
            done, r->rs.samples, s->data_hash, s->loss);
    if (r->train.n_parts > 1) { /* each dataset's share of the samples so far */
        mprintf(r->metrics, ",\"data_share\":[");
        for (int d = 0; d < r->train.n_parts; d++)
            mprintf(r->metrics, "%s%.6f", d ? "," : "",
                    (double)ds_part_count(&r->train, d, (uint64_t)r->rs.samples) /
                        (double)r->rs.samples);
        mprintf(r->metrics, "]");
    }
    if (r->n_routed) {
        aux = (r->m.d.predictor ? st->pred_sum : st->aux_sum) / (double)st->decisions;
        acc = (double)st->agree / (double)st->decisions;
        mprintf(r->metrics, ",\"aux_loss\":%.6f,\"predictor_accuracy\":%.6f", aux, acc);
    }
    const double drop = run_log_moe(r);
    mprintf(r->metrics,
            ",\"lr\":%.6e,\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"step_time_ms\":%.3f,"
            "\"mfu\":%.4f,\"flops_per_token\":%.0f,\"flops_ratio_dense\":%.4f,"
            "\"tp_bytes\":%llu,\"dp_bytes\":%llu,\"pp_bytes\":%llu,\"ep_bytes\":%llu,"
            "\"pp_live\":%d,\"pp_bubble\":%.4f",
            s->lr, s->grad_norm, tps, s->dt * 1e3, mfu, s->fpt, s->fpt / r->dense_fpt, s->tp_bytes,
            s->dp_bytes, s->pp_bytes, s->ep_bytes, s->live, s->bubble);
    /* above 100%: the peak was measured too low (outside load), never clamped */
    if (r->use_zero) mprintf(r->metrics, ",\"dp_gather_bytes\":%llu", s->dp_gather_bytes);
    if (mfu > 1) mprintf(r->metrics, ",\"peak_mismeasured\":true");
    phases_json(&r->ph, r->grid.world, r->metrics);
    mprintf(r->metrics, "}\n");
    if (done % c->log_every != 0 && done != c->steps && step != r->start) return;
    char eta[32], mod[160] = "";
    double per = r->steps_timed ? r->time_timed / r->steps_timed : s->dt;
    format_duration(eta, sizeof eta, per * (c->steps - done));
    if (r->n_routed)
        snprintf(mod, sizeof mod, " | aux %.4f acc %.1f%% | FLOPs %.2fx dense", aux, 100 * acc,
                 s->fpt / r->dense_fpt);
    if (r->m.d.E > 0)
        snprintf(mod + strlen(mod), sizeof mod - strlen(mod), " | experts drop %.1f%%", 100 * drop);
    log0("step %*d/%d | loss %.4f%s | lr %.2e | %.0f tok/s | MFU %.1f%%%s | ETA %s\n",
         (int)snprintf(NULL, 0, "%d", c->steps), done, c->steps, s->loss, mod, s->lr, tps,
         100 * mfu, mfu > 1 ? " (over 100%: the peak was mismeasured)" : "", eta);
}

/* The validation loss under `mode`: each dataset's share of the first
 * eval_seqs sequences (val_seqs: from its first, in order, whatever the
 * layout) into part[], and their blend by weight. Returns the blend, or
 * NAN when a read failed (printed). */
static double run_val_loss(Run *r, RouteMode mode, double *part) {
    double total = 0;
    for (int d = 0; d < r->val.n_parts; d++) {
        int failed = 0;
        const size_t n = (size_t)val_seqs(&r->val, d, (uint64_t)r->cfg.eval_seqs);
        part[d] = evaluate(&r->m, &r->val, d, r->micro, n, mode, 0, 0.f, &failed);
        if (failed) return NAN;
        total += r->val.parts[d].weight * part[d];
    }
    return total;
}

static void print_parts(FILE *f, const char *key, const double *v, int n) {
    if (n < 2) return;
    mprintf(f, ",\"%s\":[", key);
    for (int d = 0; d < n; d++) mprintf(f, "%s%.6f", d ? "," : "", v[d]);
    mprintf(f, "]");
}

/* Validation every eval_every steps and after the last. Returns 0, or -1
 * when a read failed (printed). */
static int run_validate(Run *r, int done) {
    const Config *c = &r->cfg;
    if (!r->have_val || !((c->eval_every && done % c->eval_every == 0) || done == c->steps))
        return 0;
    const double t0 = now_s();
    fault_phase("validation");
    Model *m = &r->m;
    double parts[DS_MAX_PARTS], causal[DS_MAX_PARTS];
    const int np = r->val.n_parts;
    const double vl = run_val_loss(r, ROUTE_TOPK, parts);
    if (isnan(vl)) return -1;
    const double acc = r->n_routed ? (double)m->stats.agree / (double)m->stats.decisions : 0;
    mprintf(r->metrics, "{\"step\":%d,\"val_loss\":%.6f", done, vl);
    print_parts(r->metrics, "val_loss_parts", parts, np);
    char each[DS_MAX_PARTS * 24] = "";
    for (int d = 0; np > 1 && d < np; d++)
        snprintf(each + strlen(each), sizeof each - strlen(each), "%s%.4f", d ? ", " : " (", parts[d]);
    if (np > 1) strcat(each, ")");
    if (r->n_routed) {
        const double vc = run_val_loss(r, ROUTE_CAUSAL, causal);
        if (isnan(vc)) return -1;
        mprintf(r->metrics, ",\"val_loss_causal\":%.6f,\"predictor_accuracy\":%.6f", vc, acc);
        print_parts(r->metrics, "val_loss_causal_parts", causal, np);
        log0("step %d | val_loss %.4f%s | val_loss_causal %.4f | predictor accuracy %.2f%%\n",
             done, vl, each, vc, 100 * acc);
    } else {
        log0("step %d | val_loss %.4f%s\n", done, vl, each);
    }
    mprintf(r->metrics, "}\n");
    r->last_eval_s = now_s() - t0;
    phases_add(&r->ph, PH_EVAL, now_s() - t0);
    return 0;
}

/* Logs a committed save of `step` (seen at step `done`) and gives the
 * metrics its figures: its time (for an asynchronous one, from the copy to
 * the commit, of which `stall` held training up; stall < 0: synchronous),
 * rate, ratio, shares and the peak RSS before it and now. */
static void run_report_save(Run *r, int done, int step, double dt, double stall, const CkStats *st,
                            size_t rss0) {
    const double ratio = st->stored > 0 ? st->raw / st->stored : 0;
    const double mb_s = st->raw / 1e6 / (dt > 0 ? dt : 1e-9);
    const int async = stall >= 0;
    r->last_save_s = dt;
    const size_t rss1 = peak_rss();
    char raw[32], lo[32], hi[32], p0[32], p1[32], how[64] = "";
    format_bytes(raw, sizeof raw, (size_t)st->raw);
    format_bytes(lo, sizeof lo, (size_t)st->share_min);
    format_bytes(hi, sizeof hi, (size_t)st->share_max);
    format_bytes(p0, sizeof p0, rss0);
    format_bytes(p1, sizeof p1, rss1);
    if (async) snprintf(how, sizeof how, " in the background, stall %.2fs", stall);
    log0("checkpoint: %s/step-%08d | %.2fs%s | %s of state at %.1f MB/s, ratio %.3f (%lld of "
         "%lld byte planes deflated) | written by %d rank%s, %s to %s each | peak RSS %s, %s "
         "after\n",
         r->ckpt_dir, step, dt, how, raw, mb_s, ratio, st->planes_deflated, st->planes,
         r->grid.world_size, r->grid.world_size == 1 ? "" : "s", lo, hi, p0, p1);
    mprintf(r->metrics,
            "{\"step\":%d,\"ckpt_step\":%d,\"ckpt_async\":%d,\"ckpt_s\":%.4f,\"ckpt_mb_s\":%.1f,"
            "\"ckpt_ratio\":%.4f,\"ckpt_share_min_mb\":%.3f,\"ckpt_share_max_mb\":%.3f,"
            "\"ckpt_rss_before_mb\":%.1f,\"ckpt_rss_after_mb\":%.1f}\n",
            done, step, async, dt, mb_s, ratio, st->share_min / 1e6, st->share_max / 1e6,
            rss0 / 1e6, rss1 / 1e6);
}

/* The metrics record of a step boundary that waited for checkpoint work,
 * which the next step's phases count. */
static void run_log_stall(Run *r, int done, double stall) {
    mprintf(r->metrics, "{\"step\":%d,\"ckpt_stall_ms\":%.3f}\n", done, stall * 1e3);
    phases_add(&r->ph, PH_CKPT, stall);
}

/* A save of `step` committed: what a rollback returns to from now on. */
static void run_committed(Run *r, int step) {
    snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s/step-%08d", r->ckpt_dir, step);
    r->last_step = step;
}

/* Saves the state after `step` now and logs what the save did. Returns 0
 * or -1 with err set. */
static int run_save(Run *r, int step, Err *err) {
    const double t0 = now_s();
    const size_t rss0 = peak_rss();
    CkStats st;
    fault_phase("checkpoint");
    r->rs.parent_step = r->last_step;
    const int rc = ckpt_save(r->ckpt_dir, &r->m, &r->opt, &r->cfg, step, &r->rs, r->grid.world,
                             r->grid.dp, r->grid.dp_rank, &st, err);
    if (rc < 0) return -1;
    if (rc > 0 && r->grid.world_rank == 0) err_print(err); /* committed, with a warning */
    run_committed(r, step);
    const double dt = now_s() - t0;
    run_log_stall(r, step, dt);
    run_report_save(r, step, step, dt, -1, &st, rss0);
    return 0;
}

/* At step `done`: when an asynchronous save is in flight and `block` or it
 * has finished, waits for it (adding the wait to *stall) and reports it.
 * A failed save is printed; training goes on (the state is in memory).
 * Returns 0, or -1 when it failed. */
static int run_finish_async(Run *r, int done, int block, double *stall) {
    const int step = ckpt_async_step(r->async);
    if (step < 0 || (!block && !ckpt_async_ready(r->async))) return 0;
    const double t0 = now_s();
    CkStats st;
    double dt;
    Err err;
    fault_phase("checkpoint wait");
    const int rc = ckpt_async_wait(r->async, &st, &dt, &err);
    if (block) *stall += now_s() - t0; /* joining a finished thread is no wait */
    if (rc != 0 && r->grid.world_rank == 0) err_print(&err); /* > 0: committed, a warning */
    if (rc < 0) return -1;
    run_committed(r, step);
    run_report_save(r, done, step, dt, r->async_stall, &st, r->async_rss0);
    return 0;
}

/* A periodic save at step `done`: started in the background (after the one
 * still in flight, if any, finishes), or made now. */
static void run_periodic_save(Run *r, int done, double *stall) {
    Err err;
    if (!r->async) {
        if (run_save(r, done, &err) != 0 && r->grid.world_rank == 0) err_print(&err);
        return;
    }
    run_finish_async(r, done, 1, stall);
    const double t0 = now_s();
    r->async_rss0 = peak_rss();
    r->rs.parent_step = r->last_step;
    ckpt_async_start(r->async, r->ckpt_dir, &r->m, &r->opt, &r->cfg, done, &r->rs, r->grid.dp,
                     r->grid.dp_rank, r->threads);
    r->async_stall = now_s() - t0;
    *stall += r->async_stall;
}

/* What validating after step `done` would take: as timed last, or before
 * any, its forwards at a third of a training step's sequence each (two
 * passes for a MoD model: top-k and causal). */
static double run_eval_estimate(const Run *r, int done, double per_step) {
    const Config *c = &r->cfg;
    if (!r->have_val || !((c->eval_every && done % c->eval_every == 0) || done == c->steps))
        return 0;
    if (r->last_eval_s > 0) return r->last_eval_s;
    return per_step / r->local_batch / 3 * c->eval_seqs * (r->n_routed ? 2 : 1);
}

/* Whether the next step (and its validation), the save in flight and a
 * save at the stop would overrun time_limit, counted from the process's
 * start. Before any save has been timed, the stop's save is budgeted from
 * the probe write made at setup. */
static int run_out_of_time(const Run *r, int done, double per_step) {
    const Config *c = &r->cfg;
    if (c->time_limit <= 0) return 0;
    const double save = r->last_save_s > 0 ? r->last_save_s : r->save_estimate_s;
    double left = 0; /* what the save in flight may still take */
    if (ckpt_async_step(r->async) >= 0) {
        const double t = ckpt_async_elapsed(r->async);
        left = (save > t ? save : 2 * t) - t;
    }
    const double next = per_step + run_eval_estimate(r, done + 1, per_step);
    return now_s() - r->t_start + next + left + 2 * save + 1 > c->time_limit;
}

/* After step `done` (not the last): stop early, all ranks together, on a
 * signal or when the next step and a save would not fit in time_limit; or
 * save periodically. A save in flight that finished is reported. Returns
 * -1 to go on, or the exit code to stop with. */
static int run_maybe_save_or_stop(Run *r, int done, double dt) {
    const Config *c = &r->cfg;
    Err err;
    double stall = 0;
    run_finish_async(r, done, 0, &stall);
    double per_step = r->steps_timed ? r->time_timed / r->steps_timed : dt;
    int stop = atomic_load(&stop_signal);
    if (run_out_of_time(r, done, per_step)) stop = -1;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, r->grid.world));
    if (stop) {
        /* the save in flight commits first: it is the older checkpoint */
        run_finish_async(r, done, 1, &stall);
        if (stall > 0) run_log_stall(r, done, stall);
        if (run_save(r, done, &err) != 0) {
            if (r->grid.world_rank == 0) err_print(&err);
            return EXIT_FAILURE;
        }
        log0("stopping at step %d/%d on %s: checkpoint %s/step-%08d saved; exit %d (requeue "
             "to continue)\n",
             done, c->steps, stop > 0 ? signal_name(stop) : "time_limit", r->ckpt_dir, done,
             EXIT_REQUEUE);
        return EXIT_REQUEUE;
    }
    if (c->ckpt_every && done % c->ckpt_every == 0) run_periodic_save(r, done, &stall);
    if (stall > 0) run_log_stall(r, done, stall);
    return -1;
}

/* Before the first step: a run already at `steps` whose ckpt_dir holds
 * that step (a chain job or a requeue after the end, under any layout)
 * ends without training or writing (one that loaded a checkpoint from
 * elsewhere saves it into its ckpt_dir: a copy, or a new layout's); a stop signal
 * that came during setup stops it with nothing lost (the state is the
 * checkpoint just loaded, or the seed's). Returns -1 to train, or the
 * exit code. */
static int run_before_steps(Run *r) {
    const Config *c = &r->cfg;
    char have[CONFIG_STR + 32];
    struct stat st;
    snprintf(have, sizeof have, "%s/step-%08d/index", r->ckpt_dir, r->start);
    if (r->resumed && r->start >= c->steps && stat(have, &st) == 0) {
        log0("resume: steps = %d is at or below the checkpoint's step %d: nothing to train or "
             "save, exiting 0\n",
             c->steps, r->start);
        return EXIT_OK;
    }
    if (r->resumed && r->start >= c->steps)
        log0("resume: steps = %d is at or below the checkpoint's step %d: nothing to train; "
             "saving it into %s\n",
             c->steps, r->start, r->ckpt_dir);
    int stop = atomic_load(&stop_signal);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, r->grid.world));
    if (!stop) return -1;
    log0("stopping before step %d/%d on %s: nothing to save (%s); exit %d (requeue to "
         "continue)\n",
         r->start + 1, c->steps, signal_name(stop),
         r->resumed ? "the state is the checkpoint loaded" : "no step trained yet", EXIT_REQUEUE);
    return EXIT_REQUEUE;
}

/* After step index *step found a non-finite loss or gradient (no update
 * made): stop (exit EXIT_DIVERGED), or roll back: reload the checkpoint this
 * run loaded or committed last (the seed's init when there is none; never
 * another run's, nor one outside this launch's steps), skip the global batches
 * of the steps since it, record that in a re-save of its step (so a
 * requeued job skips them too) and go on from there; after nonfinite_tries
 * rollbacks onto one checkpoint, give up. Returns -1 to go on (*step set
 * so that the loop continues at the checkpoint's step), or the exit code. */
static int run_nonfinite(Run *r, int *step, const StepResult *s) {
    const Config *c = &r->cfg;
    const int done = *step + 1, rank0 = r->grid.world_rank == 0;
    mprintf(r->metrics, "{\"step\":%d,\"nonfinite\":1,\"batch\":%lld}\n", done,
            (long long)*step + r->rs.batch_offset);
    if (c->on_nonfinite == NONFINITE_STOP) {
        if (rank0)
            errorf("train: loss %g, gradient norm %g at step %d: no update made; stopping with "
                   "exit %d (lower lr, check the data, or set on_nonfinite = rollback)",
                   s->loss, s->grad_norm, done, EXIT_DIVERGED);
        return EXIT_DIVERGED;
    }
    double stall = 0;
    int got_bad = 0;
    run_finish_async(r, done, 1, &stall); /* the save in flight commits first */
    fault_phase("rollback");
    CkptRunState had = {0};
    int to = 0;
    const int got = rollback_run(c, r->ckpt_dir, r->last_ckpt, sizeof r->last_ckpt, r->rs.run_id,
                                 r->start, *step, &r->m, &r->opt, &to, &had, r->grid.world);
    if (got > 0 && run_check_data(r, &had, "rollback") != 0) got_bad = 1;
    ckpt_run_state_free(&had); /* its samples are skipped: the cursor stays past this step */
    if (got < 0 || got_bad) return EXIT_FAILURE;
    if (got == 0) { /* nothing loaded or saved yet: back to the seed's init, or init_from's */
        if (!c->init_from[0]) model_init_weights(&r->m, (uint64_t)c->seed);
        else if (init_from_load(c, r->ckpt_dir, &r->m, -1, 0, r->grid.world) != 0)
            return EXIT_FAILURE;
        adamw_reset(&r->opt);
    }
    r->last_step = got ? had.parent_step : -1; /* the re-save below descends as it did */
    if (had.rollbacks >= c->nonfinite_tries) {
        if (rank0)
            errorf("train: loss %g at step %d after %d rollbacks onto step %d: giving up with "
                   "exit %d, which the job scripts do not requeue (lower lr, or check the data)",
                   s->loss, done, had.rollbacks, to, EXIT_DIVERGED);
        return EXIT_DIVERGED;
    }
    r->rs.batch_offset = had.batch_offset + (done - to);
    r->rs.rollbacks = had.rollbacks + 1;
    log0("train: loss %g at step %d: rolled back to step %d, skipping the batches of steps %d-%d "
         "(rollback %d of %d onto it)\n",
         s->loss, done, to, to + 1, done, r->rs.rollbacks, c->nonfinite_tries);
    Err err;
    if (run_save(r, to, &err) != 0) {
        if (rank0) err_print(&err);
        return EXIT_FAILURE;
    }
    r->rs.rollbacks = 0; /* later checkpoints: none onto them yet */
    *step = to - 1;
    return -1;
}

/* The steps from the run's start; returns the exit code. */
static int run_steps(Run *r) {
    const Config *c = &r->cfg;
    int rc = run_before_steps(r);
    if (rc >= 0) return rc;
    phases_start(&r->ph);
    for (int step = r->start; step < c->steps; step++) {
        StepResult s = {0};
        fault_phase("step");
        atomic_store(&watch_step, step + 1);
        run_step(r, step, &s);
        if (s.data_error) return EXIT_USAGE;
        r->rs.samples += c->batch_size; /* a skipped step's too: a rollback skips them */
        if (s.nonfinite) {
            rc = run_nonfinite(r, &step, &s);
            if (rc >= 0) return rc;
            continue;
        }
        run_log(r, step, &s);
        if (run_validate(r, step + 1) != 0) return EXIT_USAGE;
        run_flush_metrics(r);
        if (step + 1 == c->steps) break;
        rc = run_maybe_save_or_stop(r, step + 1, s.dt);
        if (rc == EXIT_REQUEUE) phases_summary(&r->ph, r->grid.world);
        if (rc >= 0) return rc;
    }
    const int final_step = c->steps > r->start ? c->steps : r->start;
    Err err;
    double stall = 0;
    run_finish_async(r, final_step, 1, &stall);
    if (stall > 0) run_log_stall(r, final_step, stall);
    if (run_save(r, final_step, &err) != 0) {
        if (r->grid.world_rank == 0) err_print(&err);
        return EXIT_FAILURE;
    }
    phases_summary(&r->ph, r->grid.world);
    log0("done: step %d, %.1fs in all\n", final_step,
         now_s() - r->t_start);
    return EXIT_OK;
}

/* The config keys (name, value, default, help) for --help. */
static void print_config_keys(void) {
    printf("Config keys: --key VALUE on the command line (or --key=VALUE; dashes or\n"
           "underscores: --micro-batch is --micro_batch), key = VALUE in a --config file.\n"
           "N is an integer, X a number, a|b one of the values listed; (the default).\n");
    const char *name, *def, *help;
    for (int i = 0; config_describe(i, &name, &def, &help); i++) {
        char flag[96], meta[64], d[64];
        config_describe_value(i, meta, sizeof meta);
        snprintf(flag, sizeof flag, "--%s %s", name, meta);
        snprintf(d, sizeof d, "(%s)", def[0] ? def : "\"\"");
        if (strlen(flag) > 30) printf("  %s\n  %-30s %-12s %s\n", flag, "", d, help);
        else printf("  %-30s %-12s %s\n", flag, d, help);
    }
    printf("dp is not a key: it is what the world leaves after tp x pp (dp = ranks / (tp x pp));\n"
           "batch_size splits over the dp ranks, each in micro-batches of micro_batch.\n");
}

int train_main(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (cli_is_help(argv[i])) {
            if (util_rank == 0) {
                printf("usage: modtrain train [--config FILE] [--key value ...]\n"
                       "Trains a model; run alone or under mpirun/srun.\n\n");
                print_config_keys();
            }
            return EXIT_OK;
        }
    Run r;
    memset(&r, 0, sizeof r);
    int rc = run_setup(&r, argc, argv);
    if (rc == EXIT_OK) rc = run_steps(&r);
    run_teardown(&r);
    return rc;
}
