/*
 * train: the training loop. A step takes the fixed global batch of the data
 * order, runs it as micro-batches with gradient accumulation, clips, steps
 * AdamW, logs, evaluates and checkpoints.
 */
#define _GNU_SOURCE
#include "train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../checkpoint/ckpt.h"
#include "../mpi/dp.h"
#include "../mpi/grid.h"
#include "../mpi/pipeline.h"
#include "config.h"
#include "data.h"
#include "kernels.h"
#include "model.h"
#include "optim.h"
#include "util.h"

int default_threads(int local_ranks) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    int t = (int)(cores / (local_ranks > 0 ? local_ranks : 1));
    return t > 0 ? t : 1;
}

static double reduce_step_stats(Model *m, double loss_sum, MPI_Comm comm);

double evaluate(Model *m, const Shard *s, int micro, size_t n_seqs, RouteMode mode, int backward,
                float aux_weight) {
    const int T = m->d.maxT;
    size_t avail = shard_num_seqs(s, T);
    if (n_seqs > avail) n_seqs = avail;
    int *inputs = xmalloc((size_t)micro * T * sizeof(int));
    int *targets = xmalloc((size_t)micro * T * sizeof(int));
    const double tokens = (double)n_seqs * T;
    RouteMode saved = m->route;
    m->route = mode;
    model_stats_reset(m);
    model_use_slot(m, 0);
    const int pp = m->d.pp, first = model_first_stage(&m->d), last = model_last_stage(&m->d);
    double total = 0;
    for (size_t w = 0; w < n_seqs;) {
        int B = 0;
        for (; B < micro && w < n_seqs; B++, w++)
            shard_get_seq(s, w, T, inputs + (size_t)B * T, targets + (size_t)B * T);
        const int count = B * T * m->d.C;
        /* a pipeline runs the forward stage after stage; the last has the loss */
        if (pp > 1 && !first)
            MPI_CHECK(MPI_Recv(m->enc, count, MPI_FLOAT, m->d.pp_rank - 1, 0, m->pp_comm,
                               MPI_STATUS_IGNORE));
        total += (double)model_forward(m, inputs, targets, B, T) * B * T;
        if (pp > 1 && !last)
            MPI_CHECK(MPI_Send(model_stage_output(m), count, MPI_FLOAT, m->d.pp_rank + 1, 0,
                               m->pp_comm));
        if (backward) model_backward(m, (float)(1.0 / tokens), aux_weight);
    }
    if (pp > 1) total = reduce_step_stats(m, total, m->pp_comm);
    m->route = saved;
    free(inputs);
    free(targets);
    return total / tokens;
}

/* One training step's micro-batches as pipeline callbacks. */
typedef struct {
    Model *m;
    const Shard *train;
    DataOrder *order;
    const Config *cfg;
    int step, local_batch, micro, T, dp_rank;
    double step_tokens, loss_sum;
    int *inputs, *targets;
} StepCtx;

static void step_forward(void *p, int mb, int slot) {
    StepCtx *c = p;
    const int T = c->T;
    for (int b = 0; b < c->micro; b++) {
        /* the fixed slice of the step's global batch this dp rank takes */
        uint64_t g = (uint64_t)c->step * c->cfg->batch_size + (uint64_t)c->dp_rank * c->local_batch +
                     (uint64_t)mb * c->micro + b;
        shard_get_seq(c->train, order_window(c->order, g), T, c->inputs + (size_t)b * T,
                      c->targets + (size_t)b * T);
    }
    model_use_slot(c->m, slot);
    c->loss_sum += model_forward(c->m, c->inputs, c->targets, c->micro, T) * (double)c->micro * T;
}

static void step_backward(void *p, int mb, int slot) {
    StepCtx *c = p;
    (void)mb;
    model_use_slot(c->m, slot);
    model_backward(c->m, (float)(1.0 / c->step_tokens), (float)c->cfg->aux_weight);
}

static float *step_input(void *p, int slot) { return ((StepCtx *)p)->m->slots[slot].enc; }

static float *step_output(void *p, int slot) {
    StepCtx *c = p;
    model_use_slot(c->m, slot);
    return model_stage_output(c->m);
}

static float *step_grad(void *p) { return ((StepCtx *)p)->m->dres; }

/* Tries one checkpoint: its config must match the run's (a mismatch is the
 * user's error, not a damaged checkpoint: *fatal is set), then every rank
 * loads its slices. Returns 1 when all ranks loaded it. */
static int try_resume(const char *dir, const Config *cfg, Model *m, AdamW *opt, int *start,
                      MPI_Comm comm, int *fatal) {
    Config ck = *cfg;
    char err[1024] = "";
    int step = 0, had_m = 0;
    int ok = ckpt_read_config(dir, &ck, &step, err, sizeof err) == 0;
    if (ok && ckpt_check_model_config(&ck, cfg, dir) != 0) {
        *fatal = 1;
        return 0;
    }
    if (ok) ok = ckpt_load(dir, m, opt, &had_m, err, sizeof err) == 0;
    int all = 0;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm));
    if (!all) {
        if (!ok) errorf("resume: skipping %s: %s", dir, err);
        return 0;
    }
    *start = step;
    log0("resume: loaded %s (step %d)%s\n", dir, step,
         had_m ? "" : "; it has no optimizer state, so AdamW starts from zero moments");
    return 1;
}

/* Restores the run from a checkpoint as `resume` says: auto (the newest
 * checkpoint of ckpt_dir that loads, falling back to older ones), never, or
 * a path. Returns 1 loaded, 0 start fresh, -1 error (printed). */
static int resume_run(const Config *cfg, const char *ckpt_dir, Model *m, AdamW *opt, int *start,
                      MPI_Comm comm) {
    if (strcmp(cfg->resume, "never") == 0) return 0;
    int fatal = 0;
    if (strcmp(cfg->resume, "auto") != 0) {
        char dir[1100];
        if (ckpt_resolve(cfg->resume, dir, sizeof dir) != 0) return -1;
        if (try_resume(dir, cfg, m, opt, start, comm, &fatal)) return 1;
        errorf("resume: cannot resume from '%s' (see above)", cfg->resume);
        return -1;
    }
    char **names;
    int n = ckpt_list_steps(ckpt_dir, &names), r = 0;
    for (int i = 0; i < n && r == 0 && !fatal; i++) {
        char dir[1100];
        snprintf(dir, sizeof dir, "%s/%s", ckpt_dir, names[i]);
        r = try_resume(dir, cfg, m, opt, start, comm, &fatal);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (fatal) return -1;
    if (n > 0 && r == 0) {
        errorf("resume: none of the %d checkpoints in '%s' loads (see above); move them away, "
               "or set resume = never or a ckpt_dir of its own",
               n, ckpt_dir);
        return -1;
    }
    return r;
}

/* SIGTERM and SIGUSR1 (a scheduler's warning) only set this flag; the ranks
 * act on it together at the next step boundary. */
static volatile sig_atomic_t stop_signal = 0;

static void on_stop_signal(int sig) { stop_signal = sig; }

static void install_stop_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

/* 1 when ok is true on every rank: collective decisions never hang on one
 * rank's failure (it printed its own message). */
static int all_ok(int ok, MPI_Comm comm) {
    int all = 0;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm));
    return all;
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

/* Whether the layout fits the world and the batch; one line saying what
 * would fit when it does not. */
static int layout_check(const Config *c, const Grid *g) {
    int dp = g->dp, local = c->batch_size / dp;
    if (c->batch_size % dp != 0) {
        char alts[256] = "";
        for (int k = 1; k <= c->batch_size && k <= 4096; k++)
            if (c->batch_size % k == 0)
                snprintf(alts + strlen(alts), sizeof alts - strlen(alts), "%s%d", alts[0] ? ", " : "",
                         k * c->tp * c->pp);
        errorf("layout: %d ranks with tp = %d make dp = %d, which does not divide batch_size = %d "
               "(run %s ranks, or change batch_size)",
               g->world_size, c->tp, dp, c->batch_size, alts);
        return -1;
    }
    if (c->micro_batch > 0 && local % c->micro_batch != 0) {
        errorf("layout: each of dp = %d ranks takes %d sequences a step, not a multiple of "
               "micro_batch = %d (choose a divisor of %d)",
               dp, local, c->micro_batch, local);
        return -1;
    }
    return 0;
}

/* Test hook: MODTRAIN_FAULT=rank-exit:R:STEP ends rank R abruptly after the
 * backward of STEP, as a crashed node would. */
static void fault_rank_exit(int rank, int step) {
    const char *f = getenv("MODTRAIN_FAULT");
    int r, s;
    if (f && sscanf(f, "rank-exit:%d:%d", &r, &s) == 2 && r == rank && s == step) {
        fprintf(stderr, "modtrain: MODTRAIN_FAULT: rank %d exits at step %d\n", rank, step);
        exit(3);
    }
}

/* Sums the step's loss and routing counters over the dp group; returns the
 * loss sum. */
static double reduce_step_stats(Model *m, double loss_sum, MPI_Comm dp_comm) {
    const int L = m->d.L;
    double *v = xcalloc((size_t)L + 6, sizeof(double));
    RouteStats *st = &m->stats;
    v[0] = loss_sum, v[1] = st->aux_sum, v[2] = st->pred_sum, v[3] = (double)st->decisions;
    v[4] = (double)st->agree, v[5] = (double)st->tokens;
    for (int l = 0; l < L; l++) v[6 + l] = (double)st->processed[l];
    dp_allreduce_sum_d(v, L + 6, dp_comm);
    st->aux_sum = v[1], st->pred_sum = v[2], st->decisions = (long long)v[3];
    st->agree = (long long)v[4], st->tokens = (long long)v[5];
    for (int l = 0; l < L; l++) st->processed[l] = (long long)v[6 + l];
    double loss = v[0];
    free(v);
    return loss;
}

static int check_tokens(const Shard *s, int V) {
    if (s->max_token >= V) {
        errorf("data: '%s' holds token %d, outside vocab_size = %d (set vocab_size > %d)",
               s->path, s->max_token, V, s->max_token);
        return -1;
    }
    return 0;
}

int train_main(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (util_rank == 0) {
                printf("usage: modtrain train [--config FILE] [--key value ...]\n"
                       "Trains a model; run alone or under mpirun/srun.\n\n");
                config_print_help();
            }
            return 0;
        }
    Config cfg;
    config_defaults(&cfg);
    /* every rank finds the same config and layout errors: one line of them */
    util_quiet = 1;
    if (config_from_args(&cfg, argc, argv) != 0 || config_validate(&cfg) != 0) return 2;
    Grid grid;
    if (grid_init(&grid, cfg.tp, cfg.pp) != 0) return 2;
    int rc = 2;
    if (layout_check(&cfg, &grid) != 0) {
        grid_free(&grid);
        return 2;
    }
    util_quiet = 0;
    int threads = cfg.threads ? cfg.threads : default_threads(grid.local_ranks);
    kernels_init(threads, cfg.blis_arch);

    char ckpt_dir[CONFIG_STR + 8];
    if (cfg.ckpt_dir[0]) snprintf(ckpt_dir, sizeof ckpt_dir, "%s", cfg.ckpt_dir);
    else snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", cfg.run_dir);

    Shard train = {0}, val = {0};
    int have_val = cfg.val_data[0] != '\0';
    if (shard_load(&train, cfg.train_data) != 0) return 2;
    if (have_val && shard_load(&val, cfg.val_data) != 0) {
        shard_free(&train);
        return 2;
    }
    const int T = cfg.seq_len;
    int V = cfg.vocab_size ? cfg.vocab_size
                           : train.vocab_hint ? train.vocab_hint
                                              : (train.max_token < 256 ? 256 : 50257);
    cfg.vocab_size = V;
    const int local_batch = cfg.batch_size / grid.dp; /* this dp rank's share of a step */
    const int micro = cfg.micro_batch ? cfg.micro_batch : local_batch;
    size_t n_train = shard_num_seqs(&train, T);
    Model m;
    AdamW opt;
    DataOrder order;
    int *inputs = NULL, *targets = NULL;
    double *frac = NULL;
    FILE *metrics = NULL;
    int model_ready = 0;
    int data_ok = check_tokens(&train, V) == 0 && (!have_val || check_tokens(&val, V) == 0);
    if (data_ok && n_train == 0) {
        errorf("data: '%s' has %zu tokens, fewer than seq_len + 1 = %d (lower seq_len or give "
               "more text)",
               cfg.train_data, train.n_tokens, T + 1);
        data_ok = 0;
    }
    if (data_ok && have_val && shard_num_seqs(&val, T) == 0) {
        errorf("data: '%s' has %zu tokens, fewer than seq_len + 1 = %d (lower seq_len or give "
               "more validation text)",
               cfg.val_data, val.n_tokens, T + 1);
        data_ok = 0;
    }
    if (!all_ok(data_ok, grid.world)) goto out;

    ModelDims d;
    model_dims_config(&d, &cfg, grid.tp, grid.tp_rank);
    int layers[4096];
    config_stage_layers(&cfg, layers);
    model_dims_stage(&d, grid.pp, grid.pp_rank, layers);
    TpGroup tpg = {grid.tp_comm, grid.tp, grid.tp_rank};
    model_init(&m, &d, micro, &tpg);
    m.pp_comm = grid.pp > 1 ? grid.pp_comm : MPI_COMM_NULL;
    const PpSchedule sched = cfg.schedule == SCHED_GPIPE ? PP_GPIPE : PP_1F1B;
    model_set_slots(&m, pp_slots(sched, local_batch / micro, grid.pp_rank, grid.pp));
    m.check_routing = cfg.debug_checks;
    adamw_init(&opt, &m);
    model_ready = 1;
    int start = 0;
    int r = resume_run(&cfg, ckpt_dir, &m, &opt, &start, grid.world);
    if (r < 0) goto out;
    if (r == 0) model_init_weights(&m, (uint64_t)cfg.seed);

    double peak = cfg.peak_gflops > 0 ? cfg.peak_gflops : kernels_measure_peak_gflops();
    const double dense_fpt = model_flops_per_token(&d, T, NULL);
    int n_routed = 0;
    for (int l = 0; l < d.L; l++) n_routed += model_is_routed(&d, l);
    log0("modtrain %s | %.2fM parameters | L=%d C=%d NH=%d T=%d V=%d | batch %d x %d tokens, "
         "micro-batch %d\n",
         PACKAGE_VERSION, model_num_params(&m) / 1e6, d.L, d.C, d.NH, T, V, cfg.batch_size, T,
         micro);
    if (n_routed)
        log0("Mixture-of-Depths: %d of %d blocks routed, capacity %g (k = %d of %d), gate %s, "
             "causal routing by %s\n",
             n_routed, d.L, cfg.capacity, model_capacity_k(&d, T), T,
             cfg.router_gate == GATE_SIGMOID ? "sigmoid" : "raw",
             d.predictor ? "predictor" : "aux_loss");
    log0("layout dp=%d tp=%d pp=%d | %d threads | BLIS %s kernels | sgemm peak %.1f GFLOP/s%s\n",
         grid.dp, grid.tp, grid.pp, threads, kernels_blis_arch(), peak,
         cfg.peak_gflops > 0 ? " (given)" : " (measured)");

    int run_ok = 1;
    if (grid.world_rank == 0) { /* rank 0 alone writes the metrics */
        char mpath[CONFIG_STR + 32];
        snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", cfg.run_dir);
        if (mkdirs(cfg.run_dir) != 0) {
            errorf("run_dir: cannot create '%s': %s", cfg.run_dir, strerror(errno));
            run_ok = 0;
        } else if (!(metrics = fopen(mpath, "a"))) {
            errorf("run_dir: cannot open '%s': %s", mpath, strerror(errno));
            run_ok = 0;
        }
    }
    if (!all_ok(run_ok, grid.world)) goto out;

    rc = 1; /* from here on a failure happens while working */
    install_stop_handlers();
    double last_save_s = 0;
    order_init(&order, (uint64_t)cfg.seed, n_train);
    inputs = xmalloc((size_t)micro * T * sizeof(int));
    targets = xmalloc((size_t)micro * T * sizeof(int));
    frac = xcalloc((size_t)d.L, sizeof(double));
    const int n_micro = local_batch / micro;
    const double step_tokens = (double)cfg.batch_size * T;
    double t_start = now_s();
    int steps_timed = 0;
    double time_timed = 0;

    for (int step = start; step < cfg.steps; step++) {
        double t0 = now_s();
        unsigned long long tp0 = tp_bytes, dp0 = dp_bytes;
        model_zero_grad(&m);
        model_stats_reset(&m);
        StepCtx sc = {&m, &train, &order, &cfg, step, local_batch, micro, T, grid.dp_rank,
                      step_tokens, 0, inputs, targets};
        PpStage st = {&sc, step_forward, step_backward, step_input, step_output, step_grad,
                      step_grad, (size_t)micro * T * d.C};
        int live = 0;
        double wait0 = pp_wait_s;
        pp_run(sched, n_micro, grid.pp > 1 ? grid.pp_comm : MPI_COMM_NULL, &st, &live);
        fault_rank_exit(grid.world_rank, step + 1);
        /* the tied wte: first and last stage add their gradients */
        const ParamInfo *wte = model_find_param(&m, "wte.weight");
        if (grid.emb_comm != MPI_COMM_NULL && wte)
            dp_allreduce_sum(m.grads + wte->offset, wte->numel, grid.emb_comm);
        /* each dp rank holds the gradient of its share of the mean: sum them */
        dp_allreduce_sum(m.grads, m.nparams, grid.dp_comm);
        double loss = reduce_step_stats(&m, sc.loss_sum, grid.dp_comm);
        if (grid.pp > 1) {
            loss = reduce_step_stats(&m, loss, grid.pp_comm);
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &live, 1, MPI_INT, MPI_MAX, grid.pp_comm));
        }
        loss /= step_tokens;
        double norm = grad_norm(&m);
        float scale = cfg.grad_clip > 0 && norm > cfg.grad_clip ? (float)(cfg.grad_clip / norm)
                                                                  : 1.f;
        double lr = lr_at(&cfg, step);
        adamw_step(&opt, &m, lr, cfg.beta1, cfg.beta2, 1e-8, cfg.weight_decay, step + 1, scale);
        double dt = now_s() - t0;
        unsigned long long step_tp = tp_bytes - tp0, step_dp = dp_bytes - dp0;
        /* the pipeline bubble: the share of the step each stage spent waiting
         * on its neighbours, averaged over the stages */
        double bubble = (pp_wait_s - wait0) / dt;
        if (grid.pp > 1) {
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &bubble, 1, MPI_DOUBLE, MPI_SUM, grid.pp_comm));
            bubble /= grid.pp;
        }
        if (step > start) { /* the first step pays for warm-up; leave it out of the ETA */
            steps_timed++;
            time_timed += dt;
        }
        for (int l = 0; l < d.L; l++) frac[l] = (double)m.stats.processed[l] / m.stats.tokens;
        double fpt = model_flops_per_token(&d, T, n_routed ? frac : NULL);
        double tps = step_tokens / dt;
        double mfu = fpt * tps / (peak * 1e9);
        int done = step + 1;
        if (!isfinite(loss)) {
            errorf("train: loss is %f at step %d (lower lr, or check the data)", loss, done);
            goto out;
        }
        mprintf(metrics, "{\"step\":%d,\"loss\":%.6f", done, loss);
        double aux = 0, acc = 0;
        if (n_routed) {
            const RouteStats *st = &m.stats;
            aux = (d.predictor ? st->pred_sum : st->aux_sum) / (double)st->decisions;
            acc = (double)st->agree / (double)st->decisions;
            mprintf(metrics, ",\"aux_loss\":%.6f,\"predictor_accuracy\":%.6f", aux, acc);
        }
        mprintf(metrics,
                ",\"lr\":%.6e,\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"step_time_ms\":%.3f,"
                "\"mfu\":%.4f,\"flops_per_token\":%.0f,\"flops_ratio_dense\":%.4f,"
                "\"tp_bytes\":%llu,\"dp_bytes\":%llu,\"pp_live\":%d,\"pp_bubble\":%.4f}\n",
                lr, norm, tps, dt * 1e3, mfu, fpt, fpt / dense_fpt, step_tp, step_dp, live, bubble);
        if (done % cfg.log_every == 0 || done == cfg.steps || step == start) {
            char eta[32], mod[96] = "";
            double per = steps_timed ? time_timed / steps_timed : dt;
            format_duration(eta, sizeof eta, per * (cfg.steps - done));
            if (n_routed)
                snprintf(mod, sizeof mod, " | aux %.4f acc %.1f%% | FLOPs %.2fx dense", aux,
                         100 * acc, fpt / dense_fpt);
            log0("step %*d/%d | loss %.4f%s | lr %.2e | %.0f tok/s | MFU %.1f%% | ETA %s\n",
                 (int)snprintf(NULL, 0, "%d", cfg.steps), done, cfg.steps, loss, mod, lr, tps,
                 100 * mfu, eta);
        }
        int last = done == cfg.steps;
        if (have_val && ((cfg.eval_every && done % cfg.eval_every == 0) || last)) {
            size_t n_val = (size_t)cfg.eval_batches * micro;
            double vl = evaluate(&m, &val, micro, n_val, ROUTE_TOPK, 0, 0.f);
            mprintf(metrics, "{\"step\":%d,\"val_loss\":%.6f", done, vl);
            if (n_routed) {
                double acc_v = (double)m.stats.agree / (double)m.stats.decisions;
                double vc = evaluate(&m, &val, micro, n_val, ROUTE_CAUSAL, 0, 0.f);
                mprintf(metrics, ",\"val_loss_causal\":%.6f,\"predictor_accuracy\":%.6f", vc, acc_v);
                log0("step %d | val_loss %.4f | val_loss_causal %.4f | predictor accuracy %.2f%%\n",
                     done, vl, vc, 100 * acc_v);
            } else {
                log0("step %d | val_loss %.4f\n", done, vl);
            }
            mprintf(metrics, "}\n");
        }
        if (metrics) fflush(metrics);
        /* stop early, all ranks together: on a signal, or when the next
         * step and a save would not fit in time_limit */
        double per_step = steps_timed ? time_timed / steps_timed : dt;
        int stop = stop_signal;
        if (cfg.time_limit > 0 && now_s() - t_start + per_step + 2 * last_save_s + 1 > cfg.time_limit)
            stop = -1;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, grid.world));
        if (stop && !last) {
            if (ckpt_save(ckpt_dir, &m, &opt, &cfg, done, grid.world, grid.dp_rank == 0) != 0) goto out;
            log0("stopping at step %d/%d on %s: checkpoint %s/step-%08d saved; exit %d (requeue "
                 "to continue)\n",
                 done, cfg.steps, stop > 0 ? (stop == SIGTERM ? "SIGTERM" : "SIGUSR1") : "time_limit",
                 ckpt_dir, done, EXIT_REQUEUE);
            rc = EXIT_REQUEUE;
            goto out;
        }
        if (cfg.ckpt_every && done % cfg.ckpt_every == 0 && !last) {
            /* a failed periodic save is reported and training goes on: the
             * state is in memory and the next save may succeed */
            double ts = now_s();
            if (ckpt_save(ckpt_dir, &m, &opt, &cfg, done, grid.world, grid.dp_rank == 0) == 0) {
                last_save_s = now_s() - ts;
                log0("checkpoint: %s/step-%08d (%.2fs)\n", ckpt_dir, done, last_save_s);
            }
        }
    }
    int final_step = cfg.steps > start ? cfg.steps : start;
    if (ckpt_save(ckpt_dir, &m, &opt, &cfg, final_step, grid.world, grid.dp_rank == 0) != 0) {
        rc = 1;
        goto out;
    }
    log0("checkpoint: %s/step-%08d | %.1fs in all\n", ckpt_dir, final_step, now_s() - t_start);
    rc = 0;
out:
    if (metrics) fclose(metrics);
    if (inputs) order_free(&order);
    free(inputs);
    free(targets);
    free(frac);
    if (model_ready) {
        adamw_free(&opt);
        model_free(&m);
    }
    shard_free(&train);
    shard_free(&val);
    grid_free(&grid);
    return rc;
}
