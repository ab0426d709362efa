/*
 * record: a metrics.jsonl line and its TensorBoard scalars, from one table
 * of fields.
 */
#include "src/train/record.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/util.h"

#define STEP REC_STEP
#define VAL REC_VAL
#define CKPT REC_CKPT

const MetricInfo metric_fields[MF_N] = {
    [MF_STEP] = {"step", MT_INT, STEP | VAL | CKPT | REC_STALL | REC_NONFINITE, NULL, 0, "",
                 "optimizer steps done: the line is about the state after this step"},
    [MF_SAMPLES] = {"samples", MT_INT, STEP, NULL, 0, "",
                    "global sequences consumed so far, over every launch"},
    [MF_DATA_HASH] = {"data_hash", MT_HEX, STEP, NULL, 0, "",
                      "the sum over the step's samples of a hash of where each lies: summed "
                      "over a run, a fingerprint of the samples read"},
    [MF_LOSS] = {"loss", MT_NUM, STEP, "%.6f", 1, "", "the step's language-model loss alone"},
    [MF_DATA_SHARE] = {"data_share", MT_LIST, STEP, "%.6f", 1, "a blended train_data",
                       "each dataset's share of the samples so far, in the blend's order"},
    [MF_AUX_LOSS] = {"aux_loss", MT_NUM, STEP, "%.6f", 1, "Mixture-of-Depths",
                     "the routers' BCE (aux_loss) or the predictors' (predictor), mean over the "
                     "step's routed blocks"},
    [MF_PREDICTOR_ACCURACY] = {"predictor_accuracy", MT_NUM, STEP | VAL, "%.6f", 1,
                               "Mixture-of-Depths",
                               "how often the causal decision agrees with top-k (on step lines "
                               "the step's tokens, on val lines the validation's)"},
    [MF_EXPERT_LOAD] = {"expert_load", MT_ROWS, STEP, "%.6f", 1, "experts (n_expert > 0)",
                        "per MoE block, the share of its slots each expert kept: the real "
                        "experts, then the no-op ones"},
    [MF_EXPERT_DROP] = {"expert_drop", MT_LIST, STEP, "%.6f", 1, "experts (n_expert > 0)",
                        "per MoE block, the share of its slots dropped by capacity_factor"},
    [MF_MOE_AUX] = {"moe_aux", MT_NUM, STEP, "%.6f", 1, "experts (n_expert > 0)",
                    "the experts' load-balancing loss, mean over MoE blocks"},
    [MF_LR] = {"lr", MT_NUM, STEP, "%.6e", 1, "", "the step's learning rate"},
    [MF_GRAD_NORM] = {"grad_norm", MT_NUM, STEP, "%.6f", 1, "",
                      "the global gradient norm before clipping"},
    [MF_TOKENS_PER_S] = {"tokens_per_s", MT_NUM, STEP, "%.1f", 1, "",
                         "the job's tokens per second over the step"},
    [MF_STEP_TIME_MS] = {"step_time_ms", MT_NUM, STEP, "%.3f", 1, "",
                         "the step alone (its forwards, backwards and update)"},
    [MF_MFU] = {"mfu", MT_NUM, STEP, "%.4f", 1, "",
                "model FLOPs per second over the job's sgemm peak; above 1 the peak was "
                "measured too low, never clamped"},
    [MF_FLOPS_PER_TOKEN] = {"flops_per_token", MT_NUM, STEP, "%.0f", 0, "",
                            "the model FLOPs of a token, forward and backward, as routed"},
    [MF_FLOPS_RATIO_DENSE] = {"flops_ratio_dense", MT_NUM, STEP, "%.4f", 1, "",
                              "flops_per_token over the dense model of the same size"},
    [MF_TP_BYTES] = {"tp_bytes", MT_INT, STEP, NULL, 0, "", "bytes rank 0 sent over tp"},
    [MF_DP_BYTES] = {"dp_bytes", MT_INT, STEP, NULL, 0, "", "bytes rank 0 sent over dp"},
    [MF_PP_BYTES] = {"pp_bytes", MT_INT, STEP, NULL, 0, "",
                     "bytes rank 0 sent to its pipeline neighbours"},
    [MF_EP_BYTES] = {"ep_bytes", MT_INT, STEP, NULL, 0, "", "bytes rank 0 sent over ep"},
    [MF_PP_LIVE] = {"pp_live", MT_INT, STEP, NULL, 0, "",
                    "the most micro-batches of activations a stage held"},
    [MF_PP_BUBBLE] = {"pp_bubble", MT_NUM, STEP, "%.4f", 1, "",
                      "the share of the step the stages waited on their neighbours, averaged"},
    [MF_DP_GATHER_BYTES] = {"dp_gather_bytes", MT_INT, STEP, NULL, 0, "zero = 1",
                            "bytes of parameters rank 0 all-gathered"},
    [MF_DP_GATHER_WAIT_MS] = {"dp_gather_wait_ms", MT_NUM, STEP, "%.3f", 1, "zero = 1",
                              "milliseconds rank 0's forwards waited for the all-gather left in "
                              "flight by the step before: what of it they did not hide"},
    [MF_PEAK_MISMEASURED] = {"peak_mismeasured", MT_TRUE, STEP, NULL, 0, "mfu > 1",
                             "the sgemm peak was measured too low (something else held the "
                             "cores)"},
    [MF_INTERVAL_MS] = {"interval_ms", MT_NUM, STEP, "%.3f", 0, "",
                        "from the end of the previous step's update to the end of this one's, "
                        "mean over ranks"},
    [MF_PHASE_MS] = {"phase_ms", MT_NAMED, STEP, "%.3f", 1, "",
                     "each phase's milliseconds, mean over ranks; they sum to interval_ms"},
    [MF_WAIT_MS] = {"wait_ms", MT_RANGES, STEP, "%.3f", 0, "",
                    "the least and most any rank spent in each phase that waits on others"},
    [MF_GEMM_MS] = {"gemm_ms", MT_NUM, STEP, "%.3f", 1, "",
                    "milliseconds inside sgemm calls, mean over ranks"},
    [MF_VAL_LOSS] = {"val_loss", MT_NUM, VAL, "%.6f", 1, "",
                     "the loss on the first eval_seqs sequences of val_data, top-k routing"},
    [MF_VAL_LOSS_PARTS] = {"val_loss_parts", MT_LIST, VAL, "%.6f", 1, "a blended val_data",
                           "each dataset's validation loss"},
    [MF_VAL_LOSS_CAUSAL] = {"val_loss_causal", MT_NUM, VAL, "%.6f", 1, "Mixture-of-Depths",
                            "the validation loss with the causal decision (as sampling routes)"},
    [MF_VAL_LOSS_CAUSAL_PARTS] = {"val_loss_causal_parts", MT_LIST, VAL, "%.6f", 1,
                                  "Mixture-of-Depths on a blended val_data",
                                  "each dataset's causal validation loss"},
    [MF_NONFINITE] = {"nonfinite", MT_INT, REC_NONFINITE, NULL, 1, "",
                      "1: the step's loss or gradient norm was not finite; no update was made"},
    [MF_BATCH] = {"batch", MT_INT, REC_NONFINITE, NULL, 0, "",
                  "the global batch index of that step (a rollback skips it)"},
    [MF_CKPT_STEP] = {"ckpt_step", MT_INT, CKPT, NULL, 0, "",
                      "the step the checkpoint holds (step: the step it was seen committed at)"},
    [MF_CKPT_ASYNC] = {"ckpt_async", MT_INT, CKPT, NULL, 0, "", "1: written in the background"},
    [MF_CKPT_S] = {"ckpt_s", MT_NUM, CKPT, "%.4f", 1, "",
                   "seconds from the start of the save to the commit"},
    [MF_CKPT_MB_S] = {"ckpt_mb_s", MT_NUM, CKPT, "%.1f", 1, "", "MB of state per second"},
    [MF_CKPT_RATIO] = {"ckpt_ratio", MT_NUM, CKPT, "%.4f", 0, "", "raw over stored bytes"},
    [MF_CKPT_SHARE_MIN_MB] = {"ckpt_share_min_mb", MT_NUM, CKPT, "%.3f", 0, "",
                              "the least state one rank wrote, MB"},
    [MF_CKPT_SHARE_MAX_MB] = {"ckpt_share_max_mb", MT_NUM, CKPT, "%.3f", 0, "",
                              "the most state one rank wrote, MB"},
    [MF_CKPT_RSS_BEFORE_MB] = {"ckpt_rss_before_mb", MT_NUM, CKPT, "%.1f", 0, "",
                               "rank 0's peak RSS before the save, MB"},
    [MF_CKPT_RSS_AFTER_MB] = {"ckpt_rss_after_mb", MT_NUM, CKPT, "%.1f", 0, "",
                              "rank 0's peak RSS after it, MB"},
    [MF_CKPT_STALL_MS] = {"ckpt_stall_ms", MT_NUM, REC_STALL, "%.3f", 1, "",
                          "milliseconds training waited for checkpoint work (the staging copy, "
                          "a save in flight, a synchronous save)"},
};

const char *record_kind_name(RecordKind k) {
    switch (k) {
    case REC_STEP: return "step";
    case REC_VAL: return "val";
    case REC_CKPT: return "ckpt";
    case REC_STALL: return "stall";
    case REC_NONFINITE: return "nonfinite";
    }
    return "?";
}

const char *record_kind_tag(RecordKind k) { return k == REC_STEP ? "train" : record_kind_name(k); }

static void put(Record *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Record *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (r->len + (size_t)n + 1 > r->cap) {
        r->cap = 2 * (r->len + (size_t)n + 1) + 256;
        r->json = xrealloc(r->json, r->cap);
    }
    va_start(ap, fmt);
    vsnprintf(r->json + r->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    r->len += (size_t)n;
}

/* A number in its field's format (the table's literals, one conversion of a double). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
static void put_num(Record *r, MetricField f, double v) {
    char b[64];
    snprintf(b, sizeof b, metric_fields[f].fmt, v);
    put(r, "%s", b);
}
#pragma GCC diagnostic pop

/* The scalar KIND/NAME[/a[/b]] = v, for the fields the table marks. */
static void scalar(Record *r, MetricField f, const char *a, const char *b, double v) {
    if (!metric_fields[f].scalar) return;
    if (r->nsc == r->capsc) {
        r->capsc = 2 * r->capsc + 16;
        r->sc = xrealloc(r->sc, (size_t)r->capsc * sizeof *r->sc);
    }
    RecordScalar *s = &r->sc[r->nsc++];
    snprintf(s->tag, sizeof s->tag, "%s/%s%s%s%s%s", record_kind_tag(r->kind),
             metric_fields[f].name, a ? "/" : "", a ? a : "", b ? "/" : "", b ? b : "");
    s->value = (float)v;
}

static void key(Record *r, MetricField f) { put(r, ",\"%s\":", metric_fields[f].name); }

void record_begin(Record *r, RecordKind kind, int step) {
    r->kind = kind, r->step = step, r->len = 0, r->nsc = 0;
    put(r, "{\"step\":%d", step);
}

void record_int(Record *r, MetricField f, long long v) {
    key(r, f);
    put(r, "%lld", v);
    scalar(r, f, NULL, NULL, (double)v);
}

void record_num(Record *r, MetricField f, double v) {
    key(r, f);
    put_num(r, f, v);
    scalar(r, f, NULL, NULL, v);
}

void record_hex(Record *r, MetricField f, unsigned long long v) {
    key(r, f);
    put(r, "\"%016llx\"", v);
}

void record_true(Record *r, MetricField f) {
    key(r, f);
    put(r, "true");
}

static void list(Record *r, MetricField f, const double *v, int n, const char *row) {
    put(r, "[");
    for (int i = 0; i < n; i++) {
        char at[16];
        snprintf(at, sizeof at, "%d", i);
        put(r, "%s", i ? "," : "");
        put_num(r, f, v[i]);
        scalar(r, f, row ? row : at, row ? at : NULL, v[i]);
    }
    put(r, "]");
}

void record_list(Record *r, MetricField f, const double *v, int n) {
    key(r, f);
    list(r, f, v, n, NULL);
}

void record_rows(Record *r, MetricField f, const double *v, int rows, int cols) {
    key(r, f);
    put(r, "[");
    for (int i = 0; i < rows; i++) {
        char row[16];
        snprintf(row, sizeof row, "%d", i);
        put(r, "%s", i ? "," : "");
        list(r, f, v + (size_t)i * (size_t)cols, cols, row);
    }
    put(r, "]");
}

void record_named(Record *r, MetricField f, const char *const *names, const double *v, int n) {
    key(r, f);
    put(r, "{");
    for (int i = 0; i < n; i++) {
        put(r, "%s\"%s\":", i ? "," : "", names[i]);
        put_num(r, f, v[i]);
        scalar(r, f, names[i], NULL, v[i]);
    }
    put(r, "}");
}

void record_ranges(Record *r, MetricField f, const char *const *names, const double *lo,
                   const double *hi, int n) {
    key(r, f);
    put(r, "{");
    for (int i = 0; i < n; i++) {
        put(r, "%s\"%s\":[", i ? "," : "", names[i]);
        put_num(r, f, lo[i]);
        put(r, ",");
        put_num(r, f, hi[i]);
        put(r, "]");
        scalar(r, f, names[i], "min", lo[i]);
        scalar(r, f, names[i], "max", hi[i]);
    }
    put(r, "}");
}

void record_end(Record *r) { put(r, "}\n"); }

void record_free(Record *r) {
    free(r->json);
    free(r->sc);
    memset(r, 0, sizeof *r);
}
