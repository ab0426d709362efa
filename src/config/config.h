/*
 * config: the training configuration. Every key is one row of a table
 * (config.c) giving its type, default, range and help, so parsing, validation,
 * --help and the checkpoint's record of the config all read the same table.
 */
#ifndef MODTRAIN_CONFIG_H
#define MODTRAIN_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"

#define CONFIG_STR 512 /* longest string value + 1 (paths) */
#define CONFIG_ARCH 64 /* longest blis_arch + 1 */
#define CONFIG_MAX_STEP 99999999 /* checkpoint directories are step-NNNNNNNN */
#define CONFIG_MAX_BATCH (1 << 24)    /* sequences a step: steps x batch_size stays below 2^51 */
#define CONFIG_TIME_LIMIT_AUTO (-1.0) /* time_limit = auto */

typedef enum { GATE_RAW = 0, GATE_SIGMOID = 1 } RouterGate;
/* The block: GPT-2's (LayerNorm, learned positions, GELU, biases) or
 * Llama's (RMSNorm, rotary positions, SwiGLU, grouped-query attention, no
 * biases). */
typedef enum { ARCH_GPT2 = 0, ARCH_LLAMA = 1 } Arch;
/* tie_embeddings: auto = tied for gpt2, untied for llama */
typedef enum { TIE_AUTO = 0, TIE_NO = 1, TIE_YES = 2 } TieEmbeddings;
/* What the optimizer trains: everything, or the routers alone (their
 * predictors and an MoE block's expert router too; Router-Tuning). */
typedef enum { TRAIN_ALL = 0, TRAIN_ROUTERS = 1 } TrainOnly;
typedef enum { CAUSAL_AUX_LOSS = 0, CAUSAL_PREDICTOR = 1 } CausalRouter;
typedef enum { SCHED_1F1B = 0, SCHED_GPIPE = 1 } Schedule;
/* How the grid lays tp, dp and pp over the ranks, innermost first (ranks
 * counted node by node). AUTO: tp-dp-pp, or tp-pp-dp across nodes when
 * plan predicts dp outermost faster. */
typedef enum {
    ORDER_AUTO = 0,
    ORDER_TP_DP_PP = 1,
    ORDER_TP_PP_DP = 2,
    ORDER_DP_TP_PP = 3,
    ORDER_DP_PP_TP = 4,
    ORDER_PP_TP_DP = 5,
    ORDER_PP_DP_TP = 6
} RankOrder;
/* What a block keeps of its forward for its backward; the rest the backward
 * runs again (ordered: each keeps less than the one before). */
typedef enum { RECOMPUTE_NONE = 0, RECOMPUTE_ATTENTION = 1, RECOMPUTE_BLOCK = 2 } Recompute;
typedef enum { NONFINITE_STOP = 0, NONFINITE_ROLLBACK = 1 } OnNonfinite;
typedef enum { DATA_CHANGED_REFUSE = 0, DATA_CHANGED_CONTINUE = 1 } DataChanged;
/* How token ids map to text. AUTO is resolved before training (from the
 * training shard's header) and is never recorded in a checkpoint. GPT2
 * and the tiktoken encodings are byte-level BPE (config_tokenizer_is_bpe). */
typedef enum {
    TOK_AUTO = 0,
    TOK_BYTE = 1,
    TOK_GPT2 = 2,
    TOK_NONE = 3,
    TOK_R50K = 4,
    TOK_CL100K = 5,
    TOK_O200K = 6,
    TOK_LLAMA3 = 7,
    TOK_HF = 8 /* a tokenizer.json: vocabulary and specials from the file */
} Tokenizer;

#define CONFIG_HASH_HEX 16 /* tokenizer_hash: 64 bits in hex */

typedef struct {
    /* model */
    int seq_len, n_layer, n_head, d_model, vocab_size;
    Arch arch;
    int n_kv_head; /* 0 = n_head */
    int d_ff;      /* 0 = 4 d_model (gpt2), Llama's rule (llama) */
    int ffn_multiple_of;
    double norm_eps, rope_theta;
    TieEmbeddings tie_embeddings;
    TrainOnly train_only;
    double capacity;
    int route_every;
    RouterGate router_gate;
    CausalRouter causal_router;
    double aux_weight;
    int predictor_hidden;
    /* Mixture-of-Experts (and, with routing, Mixture-of-Depths-and-Experts) */
    int n_expert, n_noop_expert, expert_top_k, expert_d_ff, moe_every;
    double capacity_factor, moe_aux_weight;
    Tokenizer tokenizer;
    char tokenizer_hash[CONFIG_STR]; /* "" or CONFIG_HASH_HEX lowercase hex digits */
    /* optimisation */
    int batch_size, micro_batch, steps;
    double lr, min_lr;
    int warmup_steps;
    double weight_decay, beta1, beta2, adam_eps, grad_clip;
    long long seed;
    /* data and evaluation */
    char train_data[CONFIG_STR], val_data[CONFIG_STR];
    int eval_every, eval_seqs;
    /* parallel layout */
    int tp, pp, ep;
    Schedule schedule;
    RankOrder rank_order;
    char cluster[CONFIG_STR]; /* plan's cluster file, for rank_order = auto */
    int virtual_stages; /* interleaved 1F1B: chunks of blocks per pipeline rank */
    int dp_overlap;
    int zero; /* ZeRO-1: the optimizer's state sharded over dp */
    double dp_bucket_mb;
    Recompute recompute;
    char stage_layers[CONFIG_STR]; /* "3,5": blocks per pipeline stage; "" balanced */
    /* checkpoints and output */
    char ckpt_dir[CONFIG_STR];
    int ckpt_every, ckpt_keep, ckpt_level, ckpt_chunk, ckpt_async;
    char resume[CONFIG_STR];
    char init_from[CONFIG_STR]; /* "" or the weights a new run starts from */
    char run_dir[CONFIG_STR];
    int log_every;
    int tensorboard;   /* 1: run_dir/tb/events.out.tfevents.* */
    double time_limit; /* seconds; save and stop before the run uses more; 0 = none;
                          CONFIG_TIME_LIMIT_AUTO: the SLURM job's end */
    OnNonfinite on_nonfinite;
    int nonfinite_tries; /* rollbacks onto one checkpoint before giving up */
    double watchdog_s;   /* seconds without progress that end the job; 0 = off */
    DataChanged data_changed; /* on resume over another seed or dataset */
    /* machine */
    int threads;
    double peak_gflops;
    char calibration[CONFIG_STR]; /* a cluster file whose gflops_per_core gives the peak */
    char blis_arch[CONFIG_ARCH];
    int gemm; /* 0 = modtrain's packing on BLIS's micro-kernel, 1 = bli_sgemm_ex */
    int debug_checks;
} Config;

/* Fills every key with its default. */
void config_defaults(Config *c);

/* Sets one key from text. `where` names the source for messages
 * ("run.conf:12" or "--lr"). Returns 0, or -1 with err naming the key, the
 * value and what would be right. */
int config_set(Config *c, const char *key, const char *value, const char *where, Err *err);

/* Reads `key = value` lines (# comments) from path (at most CONFIG_MAX_FILE
 * bytes). Returns 0 or -1 with err set. */
int config_load_file(Config *c, const char *path, Err *err);
/* The same for a config's text already in memory: len bytes at text, which
 * must have one more writable byte (lines are cut in place); name stands for
 * the file in messages. */
int config_load_text(Config *c, char *text, size_t len, const char *name, Err *err);

/* Applies argv: `--config FILE` first, then every `--key value` or
 * `--key=value` in order. Returns 0 or -1 with err set. */
int config_from_args(Config *c, int argc, char **argv, Err *err);

/* Checks relations between keys (d_model % n_head, batch split, ...).
 * Returns 0 or -1 with err naming the first problem. */
int config_validate(const Config *c, Err *err);

/* Writes the value of key into buf; returns 0, or -1 for an unknown key. */
int config_get(const Config *c, const char *key, char *buf, size_t n);

/* Row i of the key table, for --help: 1 with its name, default and help,
 * or 0 past the last. */
int config_describe(int i, const char **name, const char **def, const char **help);
/* What row i's value is, for --help: N, X, the choices of an enumeration
 * (raw|sigmoid), or a name (SPEC, DIR). 1, or 0 past the last row. */
int config_describe_value(int i, char *buf, size_t n);
/* The values row i takes, in words ("an integer in [1, 4096]", "a number in
 * (0, 1]", "one of raw|sigmoid"), and whether it is a model key (recorded
 * in checkpoints). 1, or 0 past the last row. */
int config_describe_range(int i, char *buf, size_t n);
int config_key_is_model(int i);

/* The i-th of the model keys (those that must match between a checkpoint
 * and a run: the shape, the routing, the tokenizer), or NULL past the last. */
const char *config_model_key(int i);
/* 1 for a model key added after the first checkpoints were written: a
 * checkpoint without it means its default (the tokenizer's: see
 * config_tokenizer_for_vocab). */
int config_model_key_optional(const char *key);
/* The tokenizer a vocabulary of V tokens implies when nothing records one:
 * 256 the byte tokenizer, 50257 GPT-2's (llm.c's shards), else none. */
Tokenizer config_tokenizer_for_vocab(int V);
/* Whether ids of t are byte-level BPE (GPT-2's files or a tiktoken
 * encoding); a tiktoken encoding's name (NULL for the others); the
 * vocabulary t's tokens make (0: any). */
int config_tokenizer_is_bpe(Tokenizer t);
const char *config_tokenizer_encoding(Tokenizer t);
int config_tokenizer_vocab(Tokenizer t);
/* The id of t's token before each document (<|endoftext|>, Llama 3's
 * <|begin_of_text|>) and of its end of text (<|endoftext|>, Llama 3's
 * <|end_of_text|>); -1 for a tokenizer without them. */
int config_tokenizer_eot(Tokenizer t);
int config_tokenizer_eos(Tokenizer t);

/* What the shape keys resolve to: n_kv_head (n_head when 0), d_ff (when
 * 0: 4 d_model for gpt2; for llama 8/3 d_model rounded up to a multiple of
 * ffn_multiple_of), whether the head is the embedding (tie_embeddings). */
int config_kv_heads(const Config *c);
int config_d_ff(const Config *c);
/* An order's name, its axes innermost first ("tp-dp-pp" for AUTO). */
const char *config_order_name(RankOrder order);
int config_tied(const Config *c);
/* A model key's value as two models are compared (a checkpoint's and a
 * run's): config_get's, but n_kv_head, d_ff and tie_embeddings resolved as
 * above (ffn_multiple_of then says nothing more). 0, or -1 for an unknown
 * key. */
int config_model_value(const Config *c, const char *key, char *buf, size_t n);

/* The most virtual_stages a pipeline rank may hold. */
enum { CONFIG_MAX_VIRTUAL_STAGES = 8 };

/* Blocks per virtual pipeline stage from stage_layers (or balanced) into
 * layers[0 .. pp * virtual_stages): virtual stage k * pp + s is chunk k of
 * rank s. Returns 0, or -1 with err saying what would fit. */
int config_stage_layers(const Config *c, int *layers, Err *err);

/* Levenshtein distance; exposed for the tests and the command options. */
int config_edit_distance(const char *a, const char *b);

#endif
