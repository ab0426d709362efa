/*
 * record: one line of metrics.jsonl, built field by field from the table
 * of fields (metric_fields), which is also the schema the reference
 * prints. The same fields become TensorBoard scalars (tboard.h) under
 * "KIND/NAME" tags: train/loss, val/val_loss, ckpt/ckpt_s, ...
 */
#ifndef MODTRAIN_RECORD_H
#define MODTRAIN_RECORD_H

#include <stddef.h>

/* The kinds of line; a field's table row says in which it appears. */
typedef enum {
    REC_STEP = 1,      /* every step */
    REC_VAL = 2,       /* after a validation */
    REC_CKPT = 4,      /* after a checkpoint */
    REC_STALL = 8,     /* a step boundary that waited for checkpoint work */
    REC_NONFINITE = 16 /* a step whose loss or gradient was not finite */
} RecordKind;

typedef enum {
    MT_INT,    /* an integer */
    MT_NUM,    /* a number */
    MT_HEX,    /* 16 hex digits in a string */
    MT_TRUE,   /* true, present only when it holds */
    MT_LIST,   /* [numbers] */
    MT_ROWS,   /* [[numbers], ...] */
    MT_NAMED,  /* {"name": number, ...} */
    MT_RANGES  /* {"name": [min, max], ...} */
} MetricType;

typedef enum {
    MF_STEP,
    MF_SAMPLES,
    MF_DATA_HASH,
    MF_LOSS,
    MF_DATA_SHARE,
    MF_AUX_LOSS,
    MF_PREDICTOR_ACCURACY,
    MF_EXPERT_LOAD,
    MF_EXPERT_DROP,
    MF_MOE_AUX,
    MF_LR,
    MF_GRAD_NORM,
    MF_TOKENS_PER_S,
    MF_STEP_TIME_MS,
    MF_MFU,
    MF_FLOPS_PER_TOKEN,
    MF_FLOPS_RATIO_DENSE,
    MF_TP_BYTES,
    MF_DP_BYTES,
    MF_PP_BYTES,
    MF_EP_BYTES,
    MF_PP_LIVE,
    MF_PP_BUBBLE,
    MF_DP_GATHER_BYTES,
    MF_DP_GATHER_WAIT_MS,
    MF_PEAK_MISMEASURED,
    MF_INTERVAL_MS,
    MF_PHASE_MS,
    MF_WAIT_MS,
    MF_GEMM_MS,
    MF_VAL_LOSS,
    MF_VAL_LOSS_PARTS,
    MF_VAL_LOSS_CAUSAL,
    MF_VAL_LOSS_CAUSAL_PARTS,
    MF_NONFINITE,
    MF_BATCH,
    MF_CKPT_STEP,
    MF_CKPT_ASYNC,
    MF_CKPT_S,
    MF_CKPT_MB_S,
    MF_CKPT_RATIO,
    MF_CKPT_SHARE_MIN_MB,
    MF_CKPT_SHARE_MAX_MB,
    MF_CKPT_RSS_BEFORE_MB,
    MF_CKPT_RSS_AFTER_MB,
    MF_CKPT_STALL_MS,
    MF_N
} MetricField;

typedef struct {
    const char *name;
    MetricType type;
    int kinds;         /* RecordKind bits: the lines that carry it */
    const char *fmt;   /* a number's printf format (MT_NUM and the numbers of lists) */
    int scalar;        /* 1: a TensorBoard scalar (each element of a list, row or object) */
    const char *when;  /* when it is present, "" when always */
    const char *help;
} MetricInfo;

extern const MetricInfo metric_fields[MF_N];
/* A record kind's name: "step", "val", "ckpt", "stall", "nonfinite"; the
 * TensorBoard tags' prefix ("train" for step lines). */
const char *record_kind_name(RecordKind k);
const char *record_kind_tag(RecordKind k);

/* A TensorBoard scalar of a record. */
typedef struct {
    char tag[80];
    float value;
} RecordScalar;

typedef struct {
    RecordKind kind;
    int step;
    char *json; /* the line, without its closing brace until record_end */
    size_t len, cap;
    RecordScalar *sc;
    int nsc, capsc;
} Record;

/* Starts a line of kind `kind` for `step` ({"step":N). */
void record_begin(Record *r, RecordKind kind, int step);
void record_int(Record *r, MetricField f, long long v);
void record_num(Record *r, MetricField f, double v);
void record_hex(Record *r, MetricField f, unsigned long long v);
void record_true(Record *r, MetricField f);
void record_list(Record *r, MetricField f, const double *v, int n);
/* rows x cols numbers, row-major, as a list of rows (scalars NAME/ROW/COL) */
void record_rows(Record *r, MetricField f, const double *v, int rows, int cols);
void record_named(Record *r, MetricField f, const char *const *names, const double *v, int n);
void record_ranges(Record *r, MetricField f, const char *const *names, const double *lo,
                   const double *hi, int n);
/* Closes the line ("}\n" ends r->json). */
void record_end(Record *r);
void record_free(Record *r);

#endif
