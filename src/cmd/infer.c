/*
 * infer: `modtrain eval` and `modtrain sample` on a checkpoint, over all
 * ranks as pp pipeline stages of tp = world / pp ranks.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "checkpoint/ckpt.h"
#include "mpi/check.h"
#include "mpi/grid.h"
#include "src/base/rng.h"
#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/kernels.h"

/* A checkpoint opened for inference: the grid, and this rank's part of the
 * model. */
typedef struct {
    Grid grid;
    Model m;
    Config cfg;
    int step;
} Infer;

/* Builds the grid for `pp` stages (stdout on rank 0 alone), sets threads
 * and loads this rank's part of the checkpoint for micro-batches of maxB.
 * Returns 0, or -1 after printing why (nothing to free). */
static int infer_open(Infer *in, const char *cmd, const char *ckpt, int pp, int threads, int maxB) {
    int world = 1, rank = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (pp < 1 || world % pp != 0) {
        if (rank == 0)
            errorf("%s: --pp %d does not divide the %d ranks (run a multiple of pp ranks)", cmd, pp,
                   world);
        return -1;
    }
    Err err;
    if (grid_init(&in->grid, world / pp, pp, &err) != 0) {
        if (rank == 0) err_print(&err);
        return -1;
    }
    Grid *g = &in->grid;
    if (g->world_rank != 0 && !freopen("/dev/null", "w", stdout)) {
        grid_free(g);
        return -1;
    }
    kernels_init(threads ? threads : default_threads(g->local_ranks), "auto");
    TpGroup tpg = {g->tp_comm, g->tp, g->tp_rank};
    config_defaults(&in->cfg);
    if (ckpt_open_model(ckpt, &in->m, &in->cfg, maxB, &in->step, &tpg, g->pp, g->pp_rank,
                        g->local_ranks, &err) != 0) {
        err_print(&err);
        grid_free(g);
        return -1;
    }
    in->m.pp_comm = g->pp > 1 ? g->pp_comm : MPI_COMM_NULL;
    return 0;
}

static void infer_close(Infer *in) {
    model_free(&in->m);
    grid_free(&in->grid);
}

/* ------------------------------------------------------------------ eval */

typedef struct {
    const char *ckpt, *data, *grads, *routing;
    int json, batches, micro, threads, pp;
    double aux_weight;
    RouteMode grad_mode;
} EvalArgs;

/* Parses eval's options. Returns 1 to go on, or an exit code. */
static int eval_args(EvalArgs *a, int argc, char **argv) {
    Config defaults;
    config_defaults(&defaults);
    *a = (EvalArgs){.routing = "topk", .micro = 8, .pp = 1, .aux_weight = defaults.aux_weight};
    CliOpt opts[] = {
        {"ckpt", CLI_STR, &a->ckpt, "checkpoint: a ckpt_dir (its newest) or a step directory"},
        {"data", CLI_STR, &a->data, "token shard to evaluate on"},
        {"json", CLI_FLAG, &a->json, "print one JSON object"},
        {"batches", CLI_INT, &a->batches, "micro-batches to evaluate; 0 = the whole shard (0)"},
        {"micro_batch", CLI_INT, &a->micro, "sequences per forward (8)"},
        {"threads", CLI_INT, &a->threads, "threads; 0 = all cores (0)"},
        {"grads", CLI_STR, &a->grads, "also write the loss gradients as safetensors to this file"},
        {"routing", CLI_STR, &a->routing, "routing for --grads: topk or causal (topk)"},
        {"aux_weight", CLI_FLOAT, &a->aux_weight, "weight of the router's BCE in --grads (0.1)"},
        {"pp", CLI_INT, &a->pp, "pipeline stages over the ranks; the rest is tensor-parallel (1)"},
        {NULL, 0, NULL, NULL}};
    int h = cli_parse("eval", "modtrain eval --ckpt DIR --data FILE [--json]",
                      "Mean next-token loss of a checkpoint on a token shard; for a "
                      "Mixture-of-Depths model under top-k and under causal routing.",
                      opts, argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (!a->ckpt || !a->data) {
        errorf("eval: --ckpt and --data are required (see modtrain eval --help)");
        return EXIT_USAGE;
    }
    if (a->micro < 1 || a->batches < 0 || a->threads < 0) {
        errorf("eval: --micro_batch must be >= 1, --batches and --threads >= 0");
        return EXIT_USAGE;
    }
    if (strcmp(a->routing, "topk") != 0 && strcmp(a->routing, "causal") != 0) {
        errorf("eval: --routing '%s' is not one of topk/causal", a->routing);
        return EXIT_USAGE;
    }
    if (a->grads && a->pp > 1) {
        errorf("eval: --grads needs the whole model on each rank (--pp 1)");
        return EXIT_USAGE;
    }
    a->grad_mode = strcmp(a->routing, "causal") == 0 ? ROUTE_CAUSAL : ROUTE_TOPK;
    return 1;
}

/* Prints the fraction of tokens each routed block processed, as JSON. */
static void print_fractions(const Model *m) {
    printf("[");
    for (int l = 0, first = 1; l < m->d.L; l++) {
        if (!model_is_routed(&m->d, l)) continue;
        printf("%s%.6f", first ? "" : ",", (double)m->stats.processed[l] / m->stats.tokens);
        first = 0;
    }
    printf("]");
}

/* Evaluates under top-k and, for a routed model, causal routing, and
 * prints the result. Returns the exit code. */
static int eval_run(Infer *in, const EvalArgs *a, const Shard *s, size_t total) {
    Model *m = &in->m;
    const double tokens = (double)total * in->cfg.seq_len;
    const int routed = in->cfg.route_every > 0;
    if (a->grads) model_zero_grad(m);
    double loss = evaluate(m, s, a->micro, total, ROUTE_TOPK,
                           a->grads && a->grad_mode == ROUTE_TOPK, (float)a->aux_weight);
    if (!isfinite(loss)) { /* finite weights whose products overflow */
        errorf("eval: the loss on '%s' is %f (the model's activations overflow)", a->data, loss);
        return EXIT_FAILURE;
    }
    double acc = m->stats.decisions ? (double)m->stats.agree / (double)m->stats.decisions : 1.0;
    if (a->json) {
        printf("{\"loss\":%.6f", loss);
        if (routed) {
            printf(",\"processed_topk\":");
            print_fractions(m);
        }
    } else {
        printf("eval: loss %.4f over %.0f tokens (%zu sequences), checkpoint step %d\n", loss,
               tokens, total, in->step);
    }
    if (routed) {
        double lc = evaluate(m, s, a->micro, total, ROUTE_CAUSAL,
                             a->grads && a->grad_mode == ROUTE_CAUSAL, (float)a->aux_weight);
        if (a->json) {
            printf(",\"loss_causal\":%.6f,\"predictor_accuracy\":%.6f,\"processed_causal\":", lc,
                   acc);
            print_fractions(m);
        } else {
            printf("eval: loss_causal %.4f (causal routing by %s), predictor accuracy %.2f%%\n", lc,
                   in->cfg.causal_router == CAUSAL_PREDICTOR ? "the predictor" : "the router",
                   100 * acc);
            for (int l = 0; l < m->d.L; l++)
                if (model_is_routed(&m->d, l))
                    printf("eval: block %d processed %.2f%% of tokens under causal routing\n", l,
                           100.0 * m->stats.processed[l] / m->stats.tokens);
        }
    }
    if (a->json)
        printf(",\"tokens\":%.0f,\"sequences\":%zu,\"step\":%d}\n", tokens, total, in->step);
    Err err;
    if (a->grads && ckpt_export_grads(a->grads, m, &in->cfg, &err) != 0) {
        err_print(&err);
        return EXIT_FAILURE;
    }
    return EXIT_OK;
}

int eval_main(int argc, char **argv) {
    EvalArgs a;
    int rc = eval_args(&a, argc, argv);
    if (rc != 1) return rc;
    Shard s;
    Err err;
    if (shard_load(&s, a.data, &err) != 0) {
        err_print(&err);
        return EXIT_USAGE;
    }
    Infer in;
    if (infer_open(&in, "eval", a.ckpt, a.pp, a.threads, a.micro) != 0) {
        shard_free(&s);
        return EXIT_USAGE;
    }
    const int T = in.cfg.seq_len;
    size_t n_seqs = shard_num_seqs(&s, T);
    size_t total = a.batches ? (size_t)a.batches * a.micro : n_seqs;
    if (total > n_seqs) total = n_seqs;
    rc = EXIT_USAGE;
    if (s.max_token >= in.m.d.V)
        errorf("eval: '%s' holds token %d, outside the model's vocab_size = %d", a.data,
               s.max_token, in.m.d.V);
    else if (n_seqs == 0)
        errorf("eval: '%s' has %zu tokens, fewer than the model's seq_len + 1 = %d", a.data,
               s.n_tokens, T + 1);
    else
        rc = eval_run(&in, &a, &s, total);
    shard_free(&s);
    infer_close(&in);
    return rc;
}

/* ---------------------------------------------------------------- sample */

/* Draws a token from the last position's logits. */
static int draw(float *logits, int V, double temperature, int top_k, Rng *rng) {
    if (temperature <= 0) {
        int best = 0;
        for (int j = 1; j < V; j++)
            if (logits[j] > logits[best]) best = j;
        return best;
    }
    float cutoff = -INFINITY;
    if (top_k > 0 && top_k < V) {
        /* the k-th largest logit: partial selection on a copy */
        float *tmp = xmalloc((size_t)V * sizeof(float));
        memcpy(tmp, logits, (size_t)V * sizeof(float));
        for (int i = 0; i < top_k; i++) {
            int b = i;
            for (int j = i + 1; j < V; j++)
                if (tmp[j] > tmp[b]) b = j;
            float t = tmp[i];
            tmp[i] = tmp[b];
            tmp[b] = t;
        }
        cutoff = tmp[top_k - 1];
        free(tmp);
    }
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = logits[j] > mx ? logits[j] : mx;
    double sum = 0;
    for (int j = 0; j < V; j++) {
        double p = logits[j] >= cutoff ? exp((logits[j] - mx) / temperature) : 0.0;
        logits[j] = (float)p;
        sum += p;
    }
    double u = rng_next_uniform(rng) * sum, acc = 0;
    for (int j = 0; j < V; j++) {
        acc += logits[j];
        if (u < acc) return j;
    }
    return V - 1;
}

typedef struct {
    const char *ckpt, *prompt;
    int tokens, top_k, threads, stats, pp;
    double temperature;
    long long seed;
} SampleArgs;

/* Parses sample's options. Returns 1 to go on, or an exit code. */
static int sample_args(SampleArgs *a, int argc, char **argv) {
    *a = (SampleArgs){.prompt = "", .tokens = 256, .pp = 1, .temperature = 1.0, .seed = 42};
    CliOpt opts[] = {
        {"ckpt", CLI_STR, &a->ckpt, "checkpoint: a ckpt_dir (its newest) or a step directory"},
        {"prompt", CLI_STR, &a->prompt, "text to continue (\"\")"},
        {"tokens", CLI_INT, &a->tokens, "tokens to generate (256)"},
        {"temperature", CLI_FLOAT, &a->temperature, "softmax temperature; 0 = greedy (1.0)"},
        {"top_k", CLI_INT, &a->top_k, "sample from the k likeliest tokens; 0 = all (0)"},
        {"seed", CLI_I64, &a->seed, "sampling seed (42)"},
        {"threads", CLI_INT, &a->threads, "threads; 0 = all cores (0)"},
        {"stats", CLI_FLAG, &a->stats, "print tokens/s to stderr at the end"},
        {"pp", CLI_INT, &a->pp, "pipeline stages over the ranks; the rest is tensor-parallel (1)"},
        {NULL, 0, NULL, NULL}};
    int h = cli_parse("sample", "modtrain sample --ckpt DIR [--prompt TEXT] [--tokens N]",
                      "Generates text from a checkpoint (byte tokenizer).", opts, argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (!a->ckpt) {
        errorf("sample: --ckpt is required (see modtrain sample --help)");
        return EXIT_USAGE;
    }
    if (a->tokens < 0 || a->top_k < 0 || a->temperature < 0 || a->threads < 0) {
        errorf("sample: --tokens, --top_k, --temperature and --threads must be >= 0");
        return EXIT_USAGE;
    }
    return 1;
}

/* The text being generated, and where decoding stands in it. Only the
 * newest tokens are kept: a context refill needs the last T / 2. */
typedef struct {
    int *seq; /* (cap) the prompt's tokens, then the generated ones */
    size_t n, cap;
    int pos; /* position of the next token in the model's context */
    int T;
} Text;

/* Appends a token; when the buffer is full, its newest T tokens move to
 * the front, so --tokens costs no memory of its own. */
static void text_push(Text *tx, int tok) {
    if (tx->n == tx->cap) {
        memmove(tx->seq, tx->seq + tx->n - (size_t)tx->T, (size_t)tx->T * sizeof(int));
        tx->n = (size_t)tx->T;
    }
    tx->seq[tx->n++] = tok;
}

/* Draws the next token on the last stage (every tp rank gathers all logits
 * and, with the same seed, draws the same token) and gives it to every
 * stage. */
static int next_token(Infer *in, const SampleArgs *a, const float *logits, float *probs, Rng *rng) {
    Model *m = &in->m;
    int tok = 0;
    if (model_last_stage(&m->d)) {
        tp_allgather(probs, logits, (size_t)m->d.Vl, &m->tp);
        tok = draw(probs, m->d.V, a->temperature, a->top_k, rng);
    }
    if (in->grid.pp > 1) MPI_CHECK(MPI_Bcast(&tok, 1, MPI_INT, in->grid.pp - 1, in->grid.pp_comm));
    return tok;
}

/* Generates a->tokens tokens after the prompt, printing each. Returns the
 * seconds it took. */
static double generate(Infer *in, const SampleArgs *a, DecodeState *ds, Text *tx) {
    Model *m = &in->m;
    const int T = m->d.maxT;
    /* The prompt goes through the cache token by token; its last T tokens
     * fit the position table. */
    const float *logits = NULL;
    for (size_t i = tx->n > (size_t)T ? tx->n - T : 0; i < tx->n; i++)
        logits = decode_step(m, ds, tx->seq[i], tx->pos++);
    float *probs = xmalloc((size_t)m->d.Vp * sizeof(float));
    Rng rng;
    rng_seed(&rng, (uint64_t)a->seed);
    double t0 = now_s();
    memset(ds->processed, 0, (size_t)m->d.L * sizeof(long long));
    ds->steps = 0;
    for (int i = 0; i < a->tokens; i++) {
        int tok = next_token(in, a, logits, probs, &rng);
        text_push(tx, tok);
        putchar(tok);
        if (i + 1 == a->tokens) break;
        if (tx->pos == T) {
            /* the context is full: start over from the newest half */
            decode_reset(ds, m);
            tx->pos = 0;
            for (size_t j = tx->n - (size_t)T / 2; j < tx->n - 1; j++)
                decode_step(m, ds, tx->seq[j], tx->pos++);
        }
        logits = decode_step(m, ds, tok, tx->pos++);
    }
    putchar('\n');
    fflush(stdout);
    free(probs);
    return now_s() - t0;
}

int sample_main(int argc, char **argv) {
    SampleArgs a;
    int rc = sample_args(&a, argc, argv);
    if (rc != 1) return rc;
    Infer in;
    if (infer_open(&in, "sample", a.ckpt, a.pp, a.threads, 1) != 0) return EXIT_USAGE;
    Model *m = &in.m;
    if (m->d.V != 256) {
        errorf("sample: the model has vocab_size = %d; text prompts need the byte tokenizer "
               "(vocab_size = 256)",
               m->d.V);
        infer_close(&in);
        return EXIT_USAGE;
    }
    size_t plen = strlen(a.prompt);
    const size_t T = (size_t)m->d.maxT;
    Text tx = {NULL, 0, (plen > T ? plen : T) + T + 1, 0, (int)T};
    tx.seq = xmalloc(tx.cap * sizeof(int));
    if (plen == 0) tx.seq[tx.n++] = '\n'; /* a newline starts a fresh passage */
    for (size_t i = 0; i < plen; i++) tx.seq[tx.n++] = (unsigned char)a.prompt[i];
    fwrite(a.prompt, 1, plen, stdout);
    DecodeState ds;
    decode_init(&ds, m);
    const long long prompt_steps = (long long)(tx.n > (size_t)m->d.maxT ? (size_t)m->d.maxT : tx.n);
    double dt = generate(&in, &a, &ds, &tx);
    if (a.stats && in.grid.world_rank == 0) {
        fprintf(stderr, "sample: %d tokens in %.3fs, %.1f tokens/s (prompt: %lld tokens)\n",
                a.tokens, dt, a.tokens / (dt > 0 ? dt : 1e-9), prompt_steps);
        for (int l = 0; l < m->d.L; l++)
            if (model_is_routed(&m->d, l))
                fprintf(stderr, "sample: block %d processed %.1f%% of tokens\n", l,
                        ds.steps ? 100.0 * ds.processed[l] / ds.steps : 0.0);
    }
    decode_free(&ds, m);
    free(tx.seq);
    infer_close(&in);
    return EXIT_OK;
}
