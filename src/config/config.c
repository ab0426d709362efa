/*
 * config: a table of keys drives parsing, range checks, --help and printing.
 * Errors are one line each and name the source, the key, the value and the
 * accepted range, because a job that dies an hour into a queue wait over a
 * typo is the most expensive kind of error.
 */
#include "src/config/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>

#include "src/base/files.h"
#include "src/base/util.h"

typedef enum { K_INT, K_I64, K_FLOAT, K_STR, K_ENUM } KeyType;

typedef struct {
    const char *name;
    KeyType type;
    int model; /* 1: a model key (shape, routing), recorded in checkpoints; 2: one added
                  later, which older checkpoints lack */
    size_t offset;
    const char *def;
    double min, max;     /* inclusive range for numbers */
    int min_open;        /* 1: min itself is excluded */
    const char *choices; /* K_ENUM: "a|b|c", index is the stored value */
    const char *help;
} KeySpec;

#define OFF(f) offsetof(Config, f)
#define CONFIG_MAX_FILE (1 << 20) /* bytes: a config is a few hundred */
#define BIG 1e18

static const KeySpec keys[] = {
    {"n_layer", K_INT, 1, OFF(n_layer), "4", 1, 4096, 0, NULL, "transformer blocks (L)"},
    {"n_head", K_INT, 1, OFF(n_head), "4", 1, 4096, 0, NULL, "attention heads (NH)"},
    {"d_model", K_INT, 1, OFF(d_model), "128", 1, 1 << 16, 0, NULL, "channels (C)"},
    {"seq_len", K_INT, 1, OFF(seq_len), "256", 1, 1 << 20, 0, NULL, "tokens per sequence (T)"},
    {"vocab_size", K_INT, 1, OFF(vocab_size), "0", 0, MODTRAIN_MAX_VOCAB, 0, NULL,
     "vocabulary (V); 0 = from the data"},
    {"arch", K_ENUM, 2, OFF(arch), "gpt2", 0, 0, 0, "gpt2|llama",
     "the block: gpt2 (LayerNorm, learned positions, GELU, biases) or llama (RMSNorm, rotary "
     "positions, SwiGLU, grouped-query attention, no biases)"},
    {"n_kv_head", K_INT, 2, OFF(n_kv_head), "0", 0, 4096, 0, NULL,
     "key and value heads of grouped-query attention (llama), dividing n_head; 0 = n_head, "
     "1 = multi-query"},
    {"d_ff", K_INT, 2, OFF(d_ff), "0", 0, 1 << 20, 0, NULL,
     "MLP width; 0 = 4 x d_model (gpt2), 8/3 x d_model rounded up to ffn_multiple_of (llama)"},
    {"ffn_multiple_of", K_INT, 2, OFF(ffn_multiple_of), "256", 1, 1 << 20, 0, NULL,
     "llama's default d_ff is rounded up to a multiple of this"},
    {"norm_eps", K_FLOAT, 2, OFF(norm_eps), "1e-5", 0, 1, 1, NULL,
     "RMSNorm's epsilon (llama; GPT-2's LayerNorm keeps 1e-5)"},
    {"rope_theta", K_FLOAT, 2, OFF(rope_theta), "10000", 1, 1e12, 1, NULL,
     "rotary position embeddings' base (llama; Llama 3 uses 500000)"},
    {"tie_embeddings", K_ENUM, 2, OFF(tie_embeddings), "auto", 0, 0, 0, "auto|0|1",
     "1: the head is the token embedding; 0: its own lm_head; auto = 1 for gpt2, 0 for llama"},
    {"train_only", K_ENUM, 2, OFF(train_only), "all", 0, 0, 0, "all|routers",
     "what the optimizer trains: all, or routers (the routers and predictors alone, the rest "
     "frozen: Router-Tuning; AdamW's moments for them only, dp reduces only their gradients)"},
    {"capacity", K_FLOAT, 1, OFF(capacity), "0.125", 0, 1, 1, NULL,
     "fraction of tokens a routed block processes"},
    {"route_every", K_INT, 1, OFF(route_every), "2", 0, 4096, 0, NULL,
     "every n-th block is routed; 0 = dense"},
    {"router_gate", K_ENUM, 1, OFF(router_gate), "raw", 0, 0, 0, "raw|sigmoid",
     "gate g(r) on the routed block's output"},
    {"causal_router", K_ENUM, 1, OFF(causal_router), "aux_loss", 0, 0, 0, "aux_loss|predictor",
     "causal routing decision used for sampling"},
    {"aux_weight", K_FLOAT, 0, OFF(aux_weight), "0.1", 0, BIG, 0, NULL,
     "weight of the router BCE loss"},
    {"predictor_hidden", K_INT, 1, OFF(predictor_hidden), "64", 1, 1 << 16, 0, NULL,
     "hidden width of the causal predictor"},
    {"n_expert", K_INT, 2, OFF(n_expert), "0", 0, 4096, 0, NULL,
     "experts of an MoE block's MLP (E); 0 = a dense MLP"},
    {"n_noop_expert", K_INT, 2, OFF(n_noop_expert), "0", 0, 4096, 0, NULL,
     "no-op experts beside them (integrated MoDE): a token routed to one skips the MLP"},
    {"expert_top_k", K_INT, 2, OFF(expert_top_k), "1", 1, 2, 0, NULL,
     "experts each token chooses (1 as Switch, 2 as GShard)"},
    {"expert_d_ff", K_INT, 2, OFF(expert_d_ff), "0", 0, 1 << 20, 0, NULL,
     "hidden width of an expert MLP; 0 = d_ff"},
    {"capacity_factor", K_FLOAT, 2, OFF(capacity_factor), "1.25", 0, 1e6, 1, NULL,
     "an expert takes at most capacity_factor x rows x expert_top_k / n_expert rows of a "
     "micro-batch; the rest are dropped (they keep their residual stream)"},
    {"moe_every", K_INT, 2, OFF(moe_every), "1", 1, 4096, 0, NULL,
     "every n-th block is an MoE block (when n_expert > 0)"},
    {"moe_aux_weight", K_FLOAT, 0, OFF(moe_aux_weight), "0.01", 0, BIG, 0, NULL,
     "weight of the experts' load-balancing loss"},
    {"tokenizer", K_ENUM, 2, OFF(tokenizer), "auto", 0, 0, 0,
     "auto|byte|gpt2|none|r50k_base|cl100k_base|o200k_base|llama3|hf",
     "how ids map to text; auto = as the training shard's header says"},
    {"tokenizer_hash", K_STR, 2, OFF(tokenizer_hash), "", 0, 0, 0, NULL,
     "the vocabulary's hash (16 hex digits); empty = the shard's"},
    {"batch_size", K_INT, 0, OFF(batch_size), "8", 1, CONFIG_MAX_BATCH, 0, NULL,
     "global sequences per step"},
    {"micro_batch", K_INT, 0, OFF(micro_batch), "0", 0, CONFIG_MAX_BATCH, 0, NULL,
     "sequences per micro-batch; 0 = the whole batch"},
    /* at most 8 digits: checkpoints are step-NNNNNNNN */
    {"steps", K_INT, 0, OFF(steps), "100", 0, CONFIG_MAX_STEP, 0, NULL, "optimizer steps"},
    {"lr", K_FLOAT, 0, OFF(lr), "6e-4", 0, 10, 0, NULL, "peak learning rate"},
    {"min_lr", K_FLOAT, 0, OFF(min_lr), "6e-5", 0, 10, 0, NULL,
     "final learning rate of the cosine"},
    {"warmup_steps", K_INT, 0, OFF(warmup_steps), "10", 0, 1 << 30, 0, NULL, "linear warmup steps"},
    {"weight_decay", K_FLOAT, 0, OFF(weight_decay), "0.1", 0, 10, 0, NULL,
     "AdamW decoupled decay (matrices only)"},
    {"beta1", K_FLOAT, 0, OFF(beta1), "0.9", 0, 0.999999, 0, NULL, "AdamW beta1"},
    {"beta2", K_FLOAT, 0, OFF(beta2), "0.95", 0, 0.999999, 0, NULL, "AdamW beta2"},
    {"adam_eps", K_FLOAT, 0, OFF(adam_eps), "1e-8", 0, 1, 1, NULL, "AdamW epsilon"},
    {"grad_clip", K_FLOAT, 0, OFF(grad_clip), "1.0", 0, BIG, 0, NULL, "max gradient norm; 0 = off"},
    {"seed", K_I64, 0, OFF(seed), "1337", 0, 9.2e18, 0, NULL,
     "seed of the init and the data order"},
    {"train_data", K_STR, 0, OFF(train_data), "data/train_*.bin", 0, 0, 0, NULL,
     "training shards: a shard, a glob, or a blend W:GLOB,W:GLOB"},
    {"val_data", K_STR, 0, OFF(val_data), "data/val_*.bin", 0, 0, 0, NULL,
     "validation shards (as train_data); empty = none"},
    {"eval_every", K_INT, 0, OFF(eval_every), "50", 0, 1 << 30, 0, NULL,
     "validation every n steps; 0 = only at the end"},
    {"eval_seqs", K_INT, 0, OFF(eval_seqs), "256", 1, 1 << 24, 0, NULL,
     "sequences per validation: the first n of val_data (a blend's in its order)"},
    {"tp", K_INT, 0, OFF(tp), "1", 1, 4096, 0, NULL, "tensor-parallel ranks"},
    {"pp", K_INT, 0, OFF(pp), "1", 1, 4096, 0, NULL, "pipeline stages"},
    {"ep", K_INT, 0, OFF(ep), "1", 1, 4096, 0, NULL,
     "expert-parallel ranks: each MoE block's experts spread over ep data-parallel ranks"},
    {"schedule", K_ENUM, 0, OFF(schedule), "1f1b", 0, 0, 0, "1f1b|gpipe", "pipeline schedule"},
    {"rank_order", K_ENUM, 0, OFF(rank_order), "auto", 0, 0, 0,
     "auto|tp-dp-pp|tp-pp-dp|dp-tp-pp|dp-pp-tp|pp-tp-dp|pp-dp-tp",
     "how the grid lays its axes over the ranks, node by node, innermost first: auto = "
     "tp-dp-pp, or tp-pp-dp when ranks span nodes and plan predicts dp outermost faster"},
    {"cluster", K_STR, 0, OFF(cluster), "", 0, 0, 0, NULL,
     "a cluster file (modtrain plan's) whose links rank_order = auto weighs over several "
     "nodes; empty = plan's defaults"},
    {"virtual_stages", K_INT, 0, OFF(virtual_stages), "1", 1, CONFIG_MAX_VIRTUAL_STAGES, 0, NULL,
     "chunks of blocks each pipeline rank holds (interleaved 1F1B, as Megatron's): rank s "
     "holds virtual stages s, s + pp, ...; the bubble shrinks by this factor"},
    {"dp_overlap", K_INT, 0, OFF(dp_overlap), "1", 0, 1, 0, NULL,
     "1 = each bucket of the blocks' gradients is all-reduced over dp as soon as the last "
     "micro-batch's backward finishes it; 0 = everything after the backward"},
    {"zero", K_INT, 0, OFF(zero), "0", 0, 1, 0, NULL,
     "1 = ZeRO-1: AdamW's moments and update sharded over dp (reduce-scatter the "
     "gradients, all-gather the parameters); 0 = replicated"},
    {"dp_bucket_mb", K_FLOAT, 0, OFF(dp_bucket_mb), "25", 0, 1 << 20, 0, NULL,
     "MiB of gradients an overlapped all-reduce bucket holds at least, in whole blocks; "
     "0 = a bucket a block"},
    {"recompute", K_ENUM, 0, OFF(recompute), "none", 0, 0, 0, "none|attention|block",
     "what the backward recomputes instead of keeping (none, attention, block): attention = "
     "each block's attention branch, block = whole blocks, each keeping only its output"},
    {"stage_layers", K_STR, 0, OFF(stage_layers), "", 0, 0, 0, NULL,
     "blocks per pipeline stage (per virtual stage under virtual_stages > 1), e.g. 3,5; "
     "empty = balanced"},
    {"ckpt_dir", K_STR, 0, OFF(ckpt_dir), "", 0, 0, 0, NULL, "checkpoints; empty = run_dir/ckpt"},
    {"ckpt_every", K_INT, 0, OFF(ckpt_every), "500", 0, 1 << 30, 0, NULL,
     "checkpoint every n steps; 0 = only at the end"},
    {"ckpt_keep", K_INT, 0, OFF(ckpt_keep), "3", 1, 1 << 20, 0, NULL, "checkpoints kept"},
    {"ckpt_level", K_INT, 0, OFF(ckpt_level), "6", 0, 9, 0, NULL,
     "zlib level of the byte planes that compress; 0 = store every plane raw"},
    {"ckpt_chunk", K_INT, 0, OFF(ckpt_chunk), "1048576", 64, 1 << 28, 0, NULL,
     "elements per checkpoint chunk (4 bytes each), the unit threads pack"},
    {"ckpt_async", K_INT, 0, OFF(ckpt_async), "1", 0, 1, 0, NULL,
     "1 = periodic saves copy the state and write it in the background"},
    {"resume", K_STR, 0, OFF(resume), "auto", 0, 0, 0, NULL, "auto | never | checkpoint path"},
    {"init_from", K_STR, 0, OFF(init_from), "", 0, 0, 0, NULL,
     "a new run from these weights: a checkpoint, a ckpt_dir, a safetensors file or a Hugging "
     "Face folder (GPT-2's or Llama's); a dense model's for a Mixture-of-Depths run, whose "
     "routers start fresh"},
    {"run_dir", K_STR, 0, OFF(run_dir), "runs/default", 0, 0, 0, NULL, "metrics.jsonl goes here"},
    {"tensorboard", K_INT, 0, OFF(tensorboard), "0", 0, 1, 0, NULL,
     "1 = also write TensorBoard event files to run_dir/tb (rank 0; flushed at each log line)"},
    {"log_every", K_INT, 0, OFF(log_every), "10", 1, 1 << 30, 0, NULL,
     "progress line every n steps"},
    {"time_limit", K_FLOAT, 0, OFF(time_limit), "0", 0, BIG, 0, NULL,
     "seconds: save and exit 75 before the run would pass them; 0 = none; auto = until the "
     "SLURM job's end"},
    {"on_nonfinite", K_ENUM, 0, OFF(on_nonfinite), "stop", 0, 0, 0, "stop|rollback",
     "a NaN/Inf loss: stop (exit 65), or reload the last checkpoint and skip the batches since"},
    {"nonfinite_tries", K_INT, 0, OFF(nonfinite_tries), "3", 1, 1000, 0, NULL,
     "rollbacks onto one checkpoint before giving up (exit 65)"},
    {"watchdog_s", K_FLOAT, 0, OFF(watchdog_s), "0", 0, BIG, 0, NULL,
     "seconds without progress in a step or save that end the job (exit 124); 0 = off"},
    {"data_changed", K_ENUM, 0, OFF(data_changed), "refuse", 0, 0, 0, "refuse|continue",
     "on resume over another seed or train_data: refuse, or read it from the same sample"},
    {"threads", K_INT, 0, OFF(threads), "0", 0, 4096, 0, NULL,
     "threads per rank; 0 = cores / ranks per node"},
    {"peak_gflops", K_FLOAT, 0, OFF(peak_gflops), "0", 0, BIG, 0, NULL,
     "sgemm peak for MFU; 0 = measure at start"},
    {"calibration", K_STR, 0, OFF(calibration), "", 0, 0, 0, NULL,
     "a 'modtrain plan --calibrate' file: its gflops_per_core x threads is the sgemm peak "
     "(when peak_gflops = 0); empty = measure"},
    {"blis_arch", K_STR, 0, OFF(blis_arch), "auto", 0, 0, 0, NULL,
     "BLIS kernels: auto (skx on AVX-512), or a BLIS arch name"},
    {"gemm", K_ENUM, 0, OFF(gemm), "own", 0, 0, 0, "own|blis",
     "matrix products: own = BLIS's micro-kernel with modtrain's packing and thread split, "
     "blis = bli_sgemm_ex"},
    {"debug_checks", K_INT, 0, OFF(debug_checks), "0", 0, 1, 0, NULL,
     "1: check that tp ranks route identically"},
};
#define NKEYS (sizeof keys / sizeof keys[0])

const char *config_model_key(int i) {
    for (size_t k = 0; k < NKEYS; k++)
        if (keys[k].model && i-- == 0) return keys[k].name;
    return NULL;
}

static const char *const order_names[] = {"tp-dp-pp", "tp-dp-pp", "tp-pp-dp", "dp-tp-pp",
                                          "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};

const char *config_order_name(RankOrder order) {
    return order_names[order >= 0 && order <= ORDER_PP_DP_TP ? order : 0];
}

int config_kv_heads(const Config *c) { return c->n_kv_head ? c->n_kv_head : c->n_head; }

int config_d_ff(const Config *c) {
    if (c->d_ff) return c->d_ff;
    if (c->arch == ARCH_GPT2) return 4 * c->d_model;
    const long f = (8L * c->d_model + 2) / 3, k = c->ffn_multiple_of; /* ceil(8/3 C) */
    return (int)((f + k - 1) / k * k);
}

int config_tied(const Config *c) {
    return c->tie_embeddings == TIE_AUTO ? c->arch == ARCH_GPT2 : c->tie_embeddings == TIE_YES;
}

int config_model_value(const Config *c, const char *key, char *buf, size_t n) {
    if (strcmp(key, "n_kv_head") == 0) snprintf(buf, n, "%d", config_kv_heads(c));
    else if (strcmp(key, "d_ff") == 0) snprintf(buf, n, "%d", config_d_ff(c));
    else if (strcmp(key, "tie_embeddings") == 0) snprintf(buf, n, "%d", config_tied(c));
    else if (strcmp(key, "ffn_multiple_of") == 0) snprintf(buf, n, "(in d_ff)");
    else return config_get(c, key, buf, n);
    return 0;
}

int config_tokenizer_is_bpe(Tokenizer t) {
    return t == TOK_GPT2 || t == TOK_R50K || t == TOK_CL100K || t == TOK_O200K || t == TOK_LLAMA3 ||
           t == TOK_HF;
}

const char *config_tokenizer_encoding(Tokenizer t) {
    return t == TOK_R50K     ? "r50k_base"
           : t == TOK_CL100K ? "cl100k_base"
           : t == TOK_O200K  ? "o200k_base"
           : t == TOK_LLAMA3 ? "llama3"
                             : NULL;
}

int config_tokenizer_vocab(Tokenizer t) {
    return t == TOK_BYTE     ? 256
           : t == TOK_GPT2   ? 50257
           : t == TOK_R50K   ? 50257
           : t == TOK_CL100K ? 100277
           : t == TOK_O200K  ? 200019
           : t == TOK_LLAMA3 ? 128256
                             : 0;
}

int config_tokenizer_eot(Tokenizer t) {
    return t == TOK_GPT2 || t == TOK_R50K ? 50256
           : t == TOK_CL100K              ? 100257
           : t == TOK_O200K               ? 199999
           : t == TOK_LLAMA3              ? 128000
                                          : -1;
}

int config_tokenizer_eos(Tokenizer t) { return t == TOK_LLAMA3 ? 128001 : config_tokenizer_eot(t); }

Tokenizer config_tokenizer_for_vocab(int V) {
    return V == 256 ? TOK_BYTE : V == 50257 ? TOK_GPT2 : TOK_NONE;
}

int config_edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    int row[256];
    if (m >= 255) m = 255;
    for (size_t j = 0; j <= m; j++) row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int up = row[j];
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            int best = diag + cost;
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[m];
}

static const KeySpec *find_key(const char *name) {
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].name, name) == 0) return &keys[i];
    return NULL;
}

int config_model_key_optional(const char *key) {
    const KeySpec *k = find_key(key);
    return k && k->model == 2;
}

/* Normalises "--Eval-Every" style names to "eval_every". */
static void norm_key(char *dst, size_t n, const char *src) {
    size_t i = 0;
    for (; *src && i + 1 < n; src++, i++)
        dst[i] = *src == '-' ? '_' : (char)tolower((unsigned char)*src);
    dst[i] = '\0';
}

static int unknown_key(const char *key, const char *where, Err *err) {
    if (strcmp(key, "eval_batches") == 0) /* counted micro-batches until eval_seqs */
        return err_set(err,
                       "%s: eval_batches was replaced by eval_seqs, which counts sequences, not "
                       "micro-batches (set eval_seqs = eval_batches x micro_batch for as many)",
                       where);
    if (strcmp(key, "dp") == 0)
        return err_set(err,
                       "%s: dp is not a key: it is what the world leaves after tp x pp (dp = "
                       "ranks / (tp x pp)); set tp and pp, and the ranks with mpirun -np",
                       where);
    const char *best = NULL;
    int bestd = 1 << 30;
    for (size_t i = 0; i < NKEYS; i++) {
        int d = config_edit_distance(key, keys[i].name);
        if (d < bestd) bestd = d, best = keys[i].name;
    }
    int limit = (int)strlen(key) / 3 + 1;
    if (best && bestd <= limit)
        return err_set(err, "%s: unknown key '%s' (did you mean '%s'?)", where, key, best);
    return err_set(err, "%s: unknown key '%s' (see 'modtrain train --help' for the keys)", where,
                   key);
}

static void range_text(const KeySpec *k, char *buf, size_t n) {
    char lo[32], hi[32];
    if (k->type == K_FLOAT) {
        snprintf(lo, sizeof lo, "%g", k->min);
        snprintf(hi, sizeof hi, "%g", k->max);
    } else {
        snprintf(lo, sizeof lo, "%.0f", k->min);
        snprintf(hi, sizeof hi, "%.0f", k->max);
    }
    if (k->max >= BIG / 2 || (k->type == K_INT && k->max >= (1 << 30)))
        snprintf(buf, n, "%s %s", k->min_open ? ">" : ">=", lo);
    else
        snprintf(buf, n, "in %s%s, %s]", k->min_open ? "(" : "[", lo, hi);
}

int config_set(Config *c, const char *rawkey, const char *value, const char *where, Err *err) {
    char key[128];
    norm_key(key, sizeof key, rawkey);
    const KeySpec *k = find_key(key);
    if (!k) return unknown_key(key, where, err);
    char *field = (char *)c + k->offset;
    char range[96];
    range_text(k, range, sizeof range);
    switch (k->type) {
    case K_INT:
    case K_I64: {
        long long v;
        if (parse_i64(value, LLONG_MIN, LLONG_MAX, &v) != 0)
            return err_set(err, "%s: %s = '%.64s' is not an integer (expected an integer %s)",
                           where, key, value, range);
        if ((double)v < k->min || (double)v > k->max) {
            return err_set(err, "%s: %s = %lld is out of range (expected an integer %s)", where,
                           key, v, range);
        }
        if (k->type == K_INT) *(int *)field = (int)v;
        else *(long long *)field = v;
        return 0;
    }
    case K_FLOAT: {
        double v;
        const int is_tl = strcmp(key, "time_limit") == 0;
        if (is_tl && strcmp(value, "auto") == 0) {
            *(double *)field = CONFIG_TIME_LIMIT_AUTO;
            return 0;
        }
        if (parse_f64(value, &v) != 0)
            return err_set(err, "%s: %s = '%.64s' is not a number (expected a number %s%s)", where,
                           key, value, range, is_tl ? ", or auto" : "");
        if (v < k->min || v > k->max || (k->min_open && v == k->min)) {
            return err_set(err, "%s: %s = %g is out of range (expected a number %s)", where, key, v,
                           range);
        }
        *(double *)field = v;
        return 0;
    }
    case K_STR: {
        size_t cap = strcmp(key, "blis_arch") == 0 ? CONFIG_ARCH : CONFIG_STR;
        if (strlen(value) >= cap) {
            return err_set(err, "%s: %s is longer than %zu characters", where, key, cap - 1);
        }
        memcpy(field, value, strlen(value) + 1);
        return 0;
    }
    case K_ENUM: {
        int idx = 0;
        const char *p = k->choices;
        size_t vl = strlen(value);
        while (p && *p) {
            const char *bar = strchr(p, '|');
            size_t len = bar ? (size_t)(bar - p) : strlen(p);
            if (len == vl && strncmp(p, value, len) == 0) {
                *(int *)field = idx;
                return 0;
            }
            idx++;
            p = bar ? bar + 1 : NULL;
        }
        char alts[128];
        snprintf(alts, sizeof alts, "%s", k->choices);
        for (char *q = alts; *q; q++)
            if (*q == '|') *q = '/';
        return err_set(err, "%s: %s = '%.64s' is not one of %s", where, key, value, alts);
    }
    }
    return -1;
}

void config_defaults(Config *c) {
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NKEYS; i++)
        /* a default that does not parse is a bug in the table (test_config) */
        if (config_set(c, keys[i].name, keys[i].def, "default", NULL) != 0) abort();
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

/* A config file's bytes, read whole (any line length) up to a bound: a
 * config is a few hundred bytes. A directory, a FIFO or a device is refused
 * (open_regular). Returns the text (NUL-terminated, malloc'd) or NULL with
 * err set. */
static char *read_config_text(const char *path, size_t *len, Err *err) {
    Err e;
    char *text = read_file(path, CONFIG_MAX_FILE, len, &e);
    if (!text)
        err_set(err, "config: %s (pass a config file of key = value lines to --config)", e.msg);
    return text;
}

/* A value in double quotes in a file stands for what is inside them
 * (`val_data = ""` is the empty string). */
static char *unquote(char *v) {
    size_t n = strlen(v);
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') {
        v[n - 1] = '\0';
        return v + 1;
    }
    return v;
}

/* One line of a config file (its comment cut): a `key = value` or nothing. */
static int config_line(Config *c, char *line, const char *where, Err *err) {
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *s = trim(line);
    if (!*s) return 0;
    char *eq = strchr(s, '=');
    if (!eq) return err_set(err, "%s: expected 'key = value', got '%.80s'", where, s);
    *eq = '\0';
    char *key = trim(s), *val = unquote(trim(eq + 1));
    if (!*key) return err_set(err, "%s: missing key before '='", where);
    return config_set(c, key, val, where, err);
}

int config_load_text(Config *c, char *text, size_t len, const char *name, Err *err) {
    char where[1100];
    int lineno = 0, rc = 0;
    for (char *line = text; rc == 0 && line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        char *end = nl ? nl : text + len;
        lineno++;
        snprintf(where, sizeof where, "%s:%d", name, lineno);
        if (memchr(line, '\0', (size_t)(end - line)))
            rc = err_set(err, "%s: holds a NUL byte (a config is text)", where);
        *end = '\0';
        if (rc == 0) rc = config_line(c, line, where, err);
        line = end + 1;
    }
    return rc;
}

int config_load_file(Config *c, const char *path, Err *err) {
    size_t len = 0;
    char *text = read_config_text(path, &len, err);
    if (!text) return -1;
    int rc = config_load_text(c, text, len, path, err);
    free(text);
    return rc;
}

/* 1 when a is --config (any case), 2 when it is --config=FILE, else 0. */
static int config_opt(const char *a) {
    char key[16];
    if (strncmp(a, "--", 2) != 0) return 0;
    const size_t n = strcspn(a + 2, "=");
    if (n != 6) return 0;
    snprintf(key, sizeof key, "%.6s", a + 2);
    norm_key(key, sizeof key, key);
    if (strcmp(key, "config") != 0) return 0;
    return a[8] == '=' ? 2 : 1;
}

/* A key whose values are 0 and 1, which alone on the command line means 1. */
static int is_switch(const char *name) {
    char n[128];
    norm_key(n, sizeof n, name);
    const KeySpec *k = find_key(n);
    return k && k->type == K_INT && k->min == 0 && k->max == 1;
}

int config_from_args(Config *c, int argc, char **argv, Err *err) {
    /* The file first, so that command-line keys override it wherever they are. */
    for (int i = 0; i < argc; i++) {
        const int opt = config_opt(argv[i]);
        if (opt == 1) {
            if (i + 1 >= argc) {
                return err_set(err, "%s: missing file name", argv[i]);
            }
            if (config_load_file(c, argv[i + 1], err) != 0) return -1;
        } else if (opt == 2) {
            if (config_load_file(c, argv[i] + 9, err) != 0) return -1;
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const int opt = config_opt(a);
        if (opt == 1) {
            i++;
            continue;
        }
        if (opt == 2) continue;
        if (strncmp(a, "--", 2) != 0 || !a[2]) {
            return err_set(err, "unexpected argument '%s' (expected --key value)", a);
        }
        char key[128], where[160];
        const char *eq = strchr(a, '=');
        const char *val;
        if (eq) {
            snprintf(key, sizeof key, "%.*s", (int)(eq - a - 2), a + 2);
            val = eq + 1;
        } else {
            snprintf(key, sizeof key, "%s", a + 2);
            if (is_switch(key) && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
                val = "1"; /* a 0|1 key alone: --tensorboard */
            } else if (i + 1 >= argc) {
                return err_set(err, "--%s: missing value", key);
            } else {
                val = argv[++i];
            }
        }
        snprintf(where, sizeof where, "--%s", key);
        if (config_set(c, key, val, where, err) != 0) return -1;
    }
    return 0;
}

int config_get(const Config *c, const char *key, char *buf, size_t n) {
    const KeySpec *k = find_key(key);
    if (!k) return -1;
    const char *field = (const char *)c + k->offset;
    switch (k->type) {
    case K_INT: snprintf(buf, n, "%d", *(const int *)field); break;
    case K_I64: snprintf(buf, n, "%lld", *(const long long *)field); break;
    case K_FLOAT:
        if (strcmp(key, "time_limit") == 0 && *(const double *)field == CONFIG_TIME_LIMIT_AUTO)
            snprintf(buf, n, "auto");
        else snprintf(buf, n, "%.17g", *(const double *)field);
        break;
    case K_STR: snprintf(buf, n, "%s", field); break;
    case K_ENUM: {
        int idx = *(const int *)field;
        const char *p = k->choices;
        for (int i = 0; i < idx && p; i++) {
            p = strchr(p, '|');
            if (p) p++;
        }
        const char *bar = p ? strchr(p, '|') : NULL;
        snprintf(buf, n, "%.*s", p ? (bar ? (int)(bar - p) : (int)strlen(p)) : 0, p ? p : "");
        break;
    }
    }
    return 0;
}

int config_describe(int i, const char **name, const char **def, const char **help) {
    if (i < 0 || (size_t)i >= NKEYS) return 0;
    *name = keys[i].name;
    *def = keys[i].def;
    *help = keys[i].help;
    return 1;
}

/* The value's name in --help for the string keys that are not free text. */
static const char *str_meta(const char *name) {
    static const char *const metas[][2] = {
        {"train_data", "SPEC"},     {"val_data", "SPEC"},      {"stage_layers", "N,N,..."},
        {"ckpt_dir", "DIR"},        {"run_dir", "DIR"},        {"resume", "auto|never|PATH"},
        {"blis_arch", "auto|ARCH"}, {"tokenizer_hash", "HEX"}, {"init_from", "CKPT"},
    };
    for (size_t i = 0; i < sizeof metas / sizeof metas[0]; i++)
        if (strcmp(metas[i][0], name) == 0) return metas[i][1];
    return "S";
}

int config_describe_range(int i, char *buf, size_t n) {
    if (i < 0 || (size_t)i >= NKEYS) return 0;
    const KeySpec *k = &keys[i];
    switch (k->type) {
    case K_INT:
    case K_I64:
        if (k->max >= BIG) snprintf(buf, n, "an integer >= %.0f", k->min);
        else snprintf(buf, n, "an integer in [%.0f, %.0f]", k->min, k->max);
        break;
    case K_FLOAT:
        if (k->max >= BIG) snprintf(buf, n, "a number %s %g", k->min_open ? ">" : ">=", k->min);
        else snprintf(buf, n, "a number in %c%g, %g]", k->min_open ? '(' : '[', k->min, k->max);
        break;
    case K_STR:
        snprintf(buf, n, "%s", str_meta(k->name)[0] == 'S' ? "a string" : str_meta(k->name));
        break;
    case K_ENUM: snprintf(buf, n, "one of %s", k->choices); break;
    }
    return 1;
}

int config_key_is_model(int i) { return i >= 0 && (size_t)i < NKEYS && keys[i].model != 0; }

int config_describe_value(int i, char *buf, size_t n) {
    if (i < 0 || (size_t)i >= NKEYS) return 0;
    const KeySpec *k = &keys[i];
    switch (k->type) {
    case K_INT:
    case K_I64: snprintf(buf, n, "N"); break;
    case K_FLOAT: snprintf(buf, n, "X"); break;
    case K_STR: snprintf(buf, n, "%s", str_meta(k->name)); break;
    case K_ENUM: snprintf(buf, n, "%s", k->choices); break;
    }
    return 1;
}
