/*
 * metrics: what a run tells: the banner (model, memory, layout and the
 * sgemm peak MFU is measured against), metrics.jsonl (rank 0's, one JSON
 * line a step) and the progress line every log_every steps.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/files.h"
#include "src/kernels/kernels.h"
#include "src/plan/cluster.h"
#include "src/plan/plan.h"
#include "src/train/run.h"

void run_emit(Run *r) {
    Record *rec = &r->rec;
    record_end(rec);
    if (r->metrics) fwrite(rec->json, 1, rec->len, r->metrics);
    tb_add(r->tb, rec);
}

/* Rank 0's metrics reach the file system at each step's end. When they
 * cannot (a full file system, an I/O error), training is worth more than
 * its log: one warning, and the run goes on without metrics.jsonl, its
 * checkpoints and exit code unaffected. */
static void run_metrics_lost(const Run *r, const char *why) {
    say_error(r->say, "metrics: %s; the run goes on without metrics.jsonl (training and checkpoints are "
           "unaffected)",
           why);
}

void run_flush_metrics(Run *r) {
    if (!r->metrics || (fflush(r->metrics) == 0 && !ferror(r->metrics))) return;
    char why[CONFIG_STR + 128];
    snprintf(why, sizeof why, "cannot write '%s/metrics.jsonl': %s", r->cfg.run_dir,
             strerror(errno));
    fclose(r->metrics);
    r->metrics = NULL;
    run_metrics_lost(r, why);
}

/* As the metrics: a TensorBoard file that cannot be written is one warning,
 * and the run goes on without it. */
void run_flush_tb(Run *r) {
    Err err;
    if (!r->tb || tb_flush(r->tb, &err) == 0) return;
    say_error(r->say, "tensorboard: %s; the run goes on without its event file", err.msg);
    tb_close(r->tb, NULL);
    r->tb = NULL;
}

void run_close_metrics(Run *r) {
    char path[CONFIG_STR + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->cfg.run_dir);
    Err err;
    if (r->metrics && close_output(r->metrics, path, &err) != 0) run_metrics_lost(r, err.msg);
    r->metrics = NULL;
    if (r->tb && tb_close(r->tb, &err) != 0)
        say_error(r->say, "tensorboard: %s; its event file may lack the last steps", err.msg);
    r->tb = NULL;
    record_free(&r->rec);
}

/* Rank 0 alone writes the metrics. Returns 0 or -1 with err set (ranks_agree). */
int run_open_metrics(Run *r, Err *err) {
    Err why;
    int rc = 0;
    if (r->grid.world_rank == 0) {
        char path[CONFIG_STR + 32];
        snprintf(path, sizeof path, "%s/metrics.jsonl", r->cfg.run_dir);
        if (mkdirs(r->cfg.run_dir) != 0)
            rc = err_set(err, "run_dir: cannot create '%s': %s", r->cfg.run_dir, strerror(errno));
        else if (!(r->metrics = open_output(path, 1, &why)))
            rc = err_set(err, "run_dir: %s (metrics.jsonl must be a regular file)", why.msg);
        snprintf(path, sizeof path, "%s/tb", r->cfg.run_dir);
        /* the launch's first record is step start + 1: TensorBoard drops
         * what earlier launches wrote from there on */
        if (rc == 0 && r->cfg.tensorboard && !(r->tb = tb_open(path, r->start + 1, &why)))
            rc = err_set(err, "tensorboard: %s (run_dir/tb must be a folder modtrain may write)",
                         why.msg);
    }
    return ranks_agree(rc, err, r->grid.world);
}

/* The sgemm peak of one rank running `threads` threads, for MFU: the
 * config's peak_gflops, else its calibration file's gflops_per_core x
 * threads, else MODTRAIN_PEAK_GFLOPS, else measured now; how (n bytes)
 * says which, for the banner. Returns 0, or -1 with err set (the file, the
 * variable). */
int train_peak_gflops(const Config *c, int threads, double *peak, char *how, size_t n, Err *err) {
    if (c->peak_gflops > 0) {
        *peak = c->peak_gflops;
        snprintf(how, n, "given");
        return 0;
    }
    if (!c->calibration[0]) {
        /* the test suite's hundreds of short runs would each spend 0.2 s
         * measuring a peak no test reads */
        const char *env = getenv("MODTRAIN_PEAK_GFLOPS");
        if (env && *env) {
            double g;
            if (parse_f64(env, &g) != 0 || !(g > 0) || g > 1e12)
                return err_set(
                    err,
                    "MODTRAIN_PEAK_GFLOPS = '%s' is not a peak in GFLOP/s (a number > 0; "
                    "unset it to measure)",
                    env);
            *peak = g;
            snprintf(how, n, "MODTRAIN_PEAK_GFLOPS");
            return 0;
        }
        *peak = kernels_measure_peak_gflops();
        snprintf(how, n, "measured on rank 0");
        return 0;
    }
    Cluster cl;
    cluster_defaults(&cl);
    Err why;
    if (cluster_load(&cl, c->calibration, &why) != 0)
        return err_set(err, "config: calibration = '%s': %s", c->calibration,
                       why.msg + (strncmp(why.msg, "plan: ", 6) == 0 ? 6 : 0));
    *peak = cl.gflops_per_core * threads;
    snprintf(how, n, "%s's gflops_per_core x %d threads", c->calibration, threads);
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
        say_log(r->say, "model: %s\n", r->n_routed ? "Mixture-of-Depths" : "dense");
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
    say_log(r->say, "model: %s | %d of %d blocks MoE: %d experts%s, top-%d, width %d, capacity factor %g "
         "(%d rows an expert of a %d-row micro-batch), ep %d | experts %.2fM of the %.2fM "
         "parameters, %.2fM active a token\n",
         kind, moe, d->L, d->E, noop, d->ek, d->Fe, d->cf,
         model_expert_capacity(d, r->micro * r->T), r->micro * r->T, d->ep, experts / 1e6,
         total / 1e6, ((double)total - experts + active) / 1e6);
}

void run_banner(const Run *r) {
    const Config *c = &r->cfg;
    const ModelDims *d = &r->m.d;
    /* the whole model's count, not the stage's this rank holds; every
     * expert of it, whatever ep (plan_num_params builds the registry at ep 1) */
    Config whole = *c;
    whole.vocab_size = d->V;
    char stage[64] = "";
    if (r->grid.pp > 1)
        snprintf(stage, sizeof stage, " (%.2fM on stage 0)", stage_params(&r->m) / 1e6);
    say_log(r->say, "modtrain %s | %.2fM parameters%s | L=%d C=%d NH=%d T=%d V=%d | batch %d x %d tokens, "
         "micro-batch %d\n",
         PACKAGE_VERSION, plan_num_params(&whole) / 1e6, stage, d->L, d->C, d->NH, r->T, d->V,
         c->batch_size, r->T, r->micro);
    run_banner_kind(r, plan_num_params(&whole));
    if (r->n_routed)
        say_log(r->say, "Mixture-of-Depths: %d of %d blocks routed, capacity %g (k = %d of %d), gate %s, "
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
    say_log(r->say, "memory (rank 0): %s = parameters and gradients %s + AdamW moments %s + activations "
         "%s (recompute %s)%s (%zu bytes)\n",
         tot, pg, mo, ac, rc, sg, r->mem.total);
    char ep[64] = "";
    if (r->grid.ep > 1) snprintf(ep, sizeof ep, " ep=%d", r->grid.ep);
    if (c->virtual_stages > 1) /* interleaved 1F1B */
        snprintf(ep + strlen(ep), sizeof ep - strlen(ep), " (%d chunks a rank)", c->virtual_stages);
    say_log(r->say, "layout dp=%d tp=%d pp=%d%s | %d thread%s a rank | BLIS %s kernels | "
         "sgemm peak %.1f GFLOP/s (%s), %.1f over the job\n",
         r->grid.dp, r->grid.tp, r->grid.pp, ep, r->threads, r->threads == 1 ? "" : "s",
         kernels_blis_arch(), r->peak_gflops, r->peak_how, r->job_peak_gflops);
}

/* The step's FLOPs per token, from what its blocks computed (r->frac and
 * the reduced stats): an MoE block costs the real experts' slots it kept
 * per token it processed, not expert_top_k. */
double run_step_flops(Run *r) {
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

/* An MoE model's expert load on the step's metrics line: per MoE block the
 * share of its slots each expert kept (real ones, then no-ops) and the share
 * dropped, and the mean load-balancing loss. Returns the drop rate over
 * every MoE block (0 without experts). */
static double run_log_moe(Run *r) {
    const ModelDims *d = &r->m.d;
    const RouteStats *st = &r->m.stats;
    if (d->E == 0) return 0;
    const int w = d->E + d->Nn + 2;
    const int cols = d->E + d->Nn;
    long long dropped = 0, all = 0;
    double *load = xmalloc((size_t)d->L * (size_t)cols * sizeof(double));
    double *drop = xmalloc((size_t)d->L * sizeof(double));
    int k = 0;
    for (int l = 0; l < d->L; l++) {
        if (!model_is_moe(d, l)) continue;
        const long long *v = st->moe + (size_t)l * w;
        const double n = v[w - 1] > 0 ? (double)v[w - 1] : 1.0;
        for (int e = 0; e < cols; e++) load[(size_t)k * cols + e] = v[e] / n;
        drop[k++] = v[w - 1] > 0 ? (double)v[w - 2] / (double)v[w - 1] : 0.0;
        dropped += v[w - 2], all += v[w - 1];
    }
    record_rows(&r->rec, MF_EXPERT_LOAD, load, k, cols);
    record_list(&r->rec, MF_EXPERT_DROP, drop, k);
    record_num(&r->rec, MF_MOE_AUX,
               st->moe_forwards ? st->moe_aux_sum / (double)st->moe_forwards : 0.0);
    free(load);
    free(drop);
    return all > 0 ? (double)dropped / (double)all : 0.0;
}

/* The step's metrics line, and the progress line every log_every steps. */
void run_log(Run *r, int step, const StepResult *s) {
    const Config *c = &r->cfg;
    const RouteStats *st = &r->m.stats;
    const int done = step + 1;
    const double tps = r->step_tokens / s->dt, mfu = s->fpt * tps / (r->job_peak_gflops * 1e9);
    double aux = 0, acc = 0;
    Record *rec = &r->rec;
    record_begin(rec, REC_STEP, done);
    record_int(rec, MF_SAMPLES, r->rs.samples);
    record_hex(rec, MF_DATA_HASH, s->data_hash);
    record_num(rec, MF_LOSS, s->loss);
    if (r->train.n_parts > 1) { /* each dataset's share of the samples so far */
        double share[DS_MAX_PARTS];
        for (int d = 0; d < r->train.n_parts; d++)
            share[d] = (double)ds_part_count(&r->train, d, (uint64_t)r->rs.samples) /
                       (double)r->rs.samples;
        record_list(rec, MF_DATA_SHARE, share, r->train.n_parts);
    }
    if (r->n_routed) {
        aux = (r->m.d.predictor ? st->pred_sum : st->aux_sum) / (double)st->decisions;
        acc = (double)st->agree / (double)st->decisions;
        record_num(rec, MF_AUX_LOSS, aux);
        record_num(rec, MF_PREDICTOR_ACCURACY, acc);
    }
    const double drop = run_log_moe(r);
    record_num(rec, MF_LR, s->lr);
    record_num(rec, MF_GRAD_NORM, s->grad_norm);
    record_num(rec, MF_TOKENS_PER_S, tps);
    record_num(rec, MF_STEP_TIME_MS, s->dt * 1e3);
    record_num(rec, MF_MFU, mfu);
    record_num(rec, MF_FLOPS_PER_TOKEN, s->fpt);
    record_num(rec, MF_FLOPS_RATIO_DENSE, s->fpt / r->dense_fpt);
    record_int(rec, MF_TP_BYTES, (long long)s->tp_bytes);
    record_int(rec, MF_DP_BYTES, (long long)s->dp_bytes);
    record_int(rec, MF_PP_BYTES, (long long)s->pp_bytes);
    record_int(rec, MF_EP_BYTES, (long long)s->ep_bytes);
    record_int(rec, MF_PP_LIVE, s->live);
    record_num(rec, MF_PP_BUBBLE, s->bubble);
    if (r->use_zero) {
        record_int(rec, MF_DP_GATHER_BYTES, (long long)s->dp_gather_bytes);
        record_num(rec, MF_DP_GATHER_WAIT_MS, s->gather_wait_s * 1e3);
    }
    /* above 100%: the peak was measured too low (outside load), never clamped */
    if (mfu > 1) record_true(rec, MF_PEAK_MISMEASURED);
    phases_record(&r->ph, r->grid.world, rec);
    run_emit(r);
    if (done % c->log_every != 0 && done != c->steps && step != r->start) return;
    run_flush_tb(r);
    char eta[32], mod[160] = "";
    double per = r->steps_timed ? r->time_timed / r->steps_timed : s->dt;
    format_duration(eta, sizeof eta, per * (c->steps - done));
    if (r->n_routed)
        snprintf(mod, sizeof mod, " | aux %.4f acc %.1f%% | FLOPs %.2fx dense", aux, 100 * acc,
                 s->fpt / r->dense_fpt);
    if (r->m.d.E > 0)
        snprintf(mod + strlen(mod), sizeof mod - strlen(mod), " | experts drop %.1f%%", 100 * drop);
    say_log(r->say, "step %*d/%d | loss %.4f%s | lr %.2e | %.0f tok/s | MFU %.1f%%%s | ETA %s\n",
         (int)snprintf(NULL, 0, "%d", c->steps), done, c->steps, s->loss, mod, s->lr, tps,
         100 * mfu, mfu > 1 ? " (over 100%: the peak was mismeasured)" : "", eta);
}
