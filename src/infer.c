/*
 * infer: `modtrain eval` and `modtrain sample` on a checkpoint.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checkpoint/ckpt.h"
#include "../mpi/grid.h"
#include "cli.h"
#include "data.h"
#include "kernels.h"
#include "model.h"
#include "rng.h"
#include "train.h"
#include "util.h"

/* Inference runs over all ranks as pp stages of tp = world / pp ranks: the
 * grid, and stdout on rank 0 alone. Returns 0, or -1 after printing why. */
static int inference_grid(Grid *g, const char *cmd, int pp) {
    int world = 1, rank = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (pp < 1 || world % pp != 0) {
        if (rank == 0)
            errorf("%s: --pp %d does not divide the %d ranks (run a multiple of pp ranks)", cmd, pp,
                   world);
        return -1;
    }
    if (grid_init(g, world / pp, pp) != 0) return -1;
    if (g->world_rank != 0 && !freopen("/dev/null", "w", stdout)) return -1;
    return 0;
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

int eval_main(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *grads = NULL, *routing = "topk";
    int json = 0, batches = 0, micro = 8, threads = 0, pp = 1;
    Config cfg;
    config_defaults(&cfg);
    double aux_weight = cfg.aux_weight;
    CliOpt opts[] = {
        {"ckpt", CLI_STR, &ckpt, "checkpoint: a ckpt_dir (its newest) or a step directory"},
        {"data", CLI_STR, &data, "token shard to evaluate on"},
        {"json", CLI_FLAG, &json, "print one JSON object"},
        {"batches", CLI_INT, &batches, "micro-batches to evaluate; 0 = the whole shard (0)"},
        {"micro_batch", CLI_INT, &micro, "sequences per forward (8)"},
        {"threads", CLI_INT, &threads, "threads; 0 = all cores (0)"},
        {"grads", CLI_STR, &grads, "also write the loss gradients as safetensors to this file"},
        {"routing", CLI_STR, &routing, "routing for --grads: topk or causal (topk)"},
        {"aux_weight", CLI_FLOAT, &aux_weight, "weight of the router's BCE in --grads (0.1)"},
        {"pp", CLI_INT, &pp, "pipeline stages over the ranks; the rest is tensor-parallel (1)"},
        {NULL, 0, NULL, NULL}};
    int h = cli_parse("eval", "modtrain eval --ckpt DIR --data FILE [--json]",
                      "Mean next-token loss of a checkpoint on a token shard; for a "
                      "Mixture-of-Depths model under top-k and under causal routing.",
                      opts, argc, argv);
    if (h != 1) return h == 0 ? 0 : 2;
    if (!ckpt || !data) {
        errorf("eval: --ckpt and --data are required (see modtrain eval --help)");
        return 2;
    }
    if (micro < 1 || batches < 0 || threads < 0) {
        errorf("eval: --micro_batch must be >= 1, --batches and --threads >= 0");
        return 2;
    }
    RouteMode grad_mode = ROUTE_TOPK;
    if (strcmp(routing, "causal") == 0) grad_mode = ROUTE_CAUSAL;
    else if (strcmp(routing, "topk") != 0) {
        errorf("eval: --routing '%s' is not one of topk/causal", routing);
        return 2;
    }
    if (grads && pp > 1) {
        errorf("eval: --grads needs the whole model on each rank (--pp 1)");
        return 2;
    }
    Grid grid;
    if (inference_grid(&grid, "eval", pp) != 0) return 2;
    TpGroup tpg = {grid.tp_comm, grid.tp, grid.tp_rank};
    kernels_init(threads ? threads : default_threads(grid.local_ranks), "auto");
    Model m;
    int step = 0;
    Shard s;
    if (shard_load(&s, data) != 0) {
        grid_free(&grid);
        return 2;
    }
    if (ckpt_open_model(ckpt, &m, &cfg, micro, &step, &tpg, grid.pp, grid.pp_rank) != 0) {
        shard_free(&s);
        grid_free(&grid);
        return 2;
    }
    int rc = 2;
    const int T = cfg.seq_len;
    size_t n_seqs = shard_num_seqs(&s, T);
    if (s.max_token >= m.d.V) {
        errorf("eval: '%s' holds token %d, outside the model's vocab_size = %d", data, s.max_token,
               m.d.V);
        goto out;
    }
    if (n_seqs == 0) {
        errorf("eval: '%s' has %zu tokens, fewer than the model's seq_len + 1 = %d", data,
               s.n_tokens, T + 1);
        goto out;
    }
    size_t total = batches ? (size_t)batches * micro : n_seqs;
    if (total > n_seqs) total = n_seqs;
    const double tokens = (double)total * T;
    int routed = cfg.route_every > 0;
    m.pp_comm = grid.pp > 1 ? grid.pp_comm : MPI_COMM_NULL;
    if (grads) model_zero_grad(&m);
    double loss = evaluate(&m, &s, micro, total, ROUTE_TOPK, grads && grad_mode == ROUTE_TOPK,
                           (float)aux_weight);
    double acc = m.stats.decisions ? (double)m.stats.agree / (double)m.stats.decisions : 1.0;
    if (json) {
        printf("{\"loss\":%.6f", loss);
        if (routed) {
            printf(",\"processed_topk\":");
            print_fractions(&m);
        }
    } else {
        printf("eval: loss %.4f over %.0f tokens (%zu sequences), checkpoint step %d\n", loss,
               tokens, total, step);
    }
    if (routed) {
        double lc = evaluate(&m, &s, micro, total, ROUTE_CAUSAL, grads && grad_mode == ROUTE_CAUSAL,
                             (float)aux_weight);
        if (json) {
            printf(",\"loss_causal\":%.6f,\"predictor_accuracy\":%.6f,\"processed_causal\":", lc,
                   acc);
            print_fractions(&m);
        } else {
            printf("eval: loss_causal %.4f (causal routing by %s), predictor accuracy %.2f%%\n", lc,
                   cfg.causal_router == CAUSAL_PREDICTOR ? "the predictor" : "the router",
                   100 * acc);
            for (int l = 0; l < m.d.L; l++)
                if (model_is_routed(&m.d, l))
                    printf("eval: block %d processed %.2f%% of tokens under causal routing\n", l,
                           100.0 * m.stats.processed[l] / m.stats.tokens);
        }
    }
    if (json) printf(",\"tokens\":%.0f,\"sequences\":%zu,\"step\":%d}\n", tokens, total, step);
    if (grads && ckpt_export_grads(grads, &m, &cfg) != 0) goto out;
    rc = 0;
out:
    shard_free(&s);
    model_free(&m);
    grid_free(&grid);
    return rc;
}

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

int sample_main(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = "";
    int tokens = 256, top_k = 0, threads = 0, stats = 0, pp = 1;
    double temperature = 1.0;
    long long seed = 42;
    CliOpt opts[] = {
        {"ckpt", CLI_STR, &ckpt, "checkpoint: a ckpt_dir (its newest) or a step directory"},
        {"prompt", CLI_STR, &prompt, "text to continue (\"\")"},
        {"tokens", CLI_INT, &tokens, "tokens to generate (256)"},
        {"temperature", CLI_FLOAT, &temperature, "softmax temperature; 0 = greedy (1.0)"},
        {"top_k", CLI_INT, &top_k, "sample from the k likeliest tokens; 0 = all (0)"},
        {"seed", CLI_I64, &seed, "sampling seed (42)"},
        {"threads", CLI_INT, &threads, "threads; 0 = all cores (0)"},
        {"stats", CLI_FLAG, &stats, "print tokens/s to stderr at the end"},
        {"pp", CLI_INT, &pp, "pipeline stages over the ranks; the rest is tensor-parallel (1)"},
        {NULL, 0, NULL, NULL}};
    int h = cli_parse("sample", "modtrain sample --ckpt DIR [--prompt TEXT] [--tokens N]",
                      "Generates text from a checkpoint (byte tokenizer).", opts, argc, argv);
    if (h != 1) return h == 0 ? 0 : 2;
    if (!ckpt) {
        errorf("sample: --ckpt is required (see modtrain sample --help)");
        return 2;
    }
    if (tokens < 0 || top_k < 0 || temperature < 0 || threads < 0) {
        errorf("sample: --tokens, --top_k, --temperature and --threads must be >= 0");
        return 2;
    }
    Grid grid;
    if (inference_grid(&grid, "sample", pp) != 0) return 2;
    TpGroup tpg = {grid.tp_comm, grid.tp, grid.tp_rank};
    kernels_init(threads ? threads : default_threads(grid.local_ranks), "auto");
    Config cfg;
    config_defaults(&cfg);
    Model m;
    if (ckpt_open_model(ckpt, &m, &cfg, 1, NULL, &tpg, grid.pp, grid.pp_rank) != 0) {
        grid_free(&grid);
        return 2;
    }
    if (m.d.V != 256) {
        errorf("sample: the model has vocab_size = %d; text prompts need the byte tokenizer "
               "(vocab_size = 256)",
               m.d.V);
        model_free(&m);
        grid_free(&grid);
        return 2;
    }
    const int T = m.d.maxT;
    size_t plen = strlen(prompt);
    size_t cap = plen + (size_t)tokens + 1;
    int *seq = xmalloc(cap * sizeof(int));
    size_t n = 0;
    if (plen == 0) seq[n++] = '\n'; /* a newline starts a fresh passage */
    for (size_t i = 0; i < plen; i++) seq[n++] = (unsigned char)prompt[i];
    fwrite(prompt, 1, plen, stdout);
    Rng rng;
    rng_seed(&rng, (uint64_t)seed);
    m.pp_comm = grid.pp > 1 ? grid.pp_comm : MPI_COMM_NULL;
    DecodeState ds;
    decode_init(&ds, &m);
    /* The prompt goes through the cache token by token; its last T tokens
     * fit the position table. */
    size_t first = n > (size_t)T ? n - T : 0;
    int pos = 0;
    const float *logits = NULL;
    for (size_t i = first; i < n; i++) logits = decode_step(&m, &ds, seq[i], pos++);
    long long prompt_steps = ds.steps;
    memset(ds.processed, 0, (size_t)m.d.L * sizeof(long long));
    ds.steps = 0;
    /* the vocabulary is split over tp: every rank gathers all logits and,
     * with the same seed, draws the same token */
    float *probs = xmalloc((size_t)m.d.Vp * sizeof(float));
    double t0 = now_s();
    const int last = model_last_stage(&m.d);
    for (int i = 0; i < tokens; i++) {
        int tok = 0;
        if (last) {
            tp_allgather(probs, logits, (size_t)m.d.Vl, &m.tp);
            tok = draw(probs, m.d.V, temperature, top_k, &rng);
        }
        /* the last stage drew it; every stage needs it for the next step */
        if (grid.pp > 1) MPI_CHECK(MPI_Bcast(&tok, 1, MPI_INT, grid.pp - 1, grid.pp_comm));
        seq[n++] = tok;
        putchar(tok);
        if (i + 1 == tokens) break;
        if (pos == T) {
            /* the context is full: start over from the newest half */
            decode_reset(&ds, &m);
            pos = 0;
            for (size_t j = n - (size_t)T / 2; j < n - 1; j++) decode_step(&m, &ds, seq[j], pos++);
        }
        logits = decode_step(&m, &ds, tok, pos++);
    }
    putchar('\n');
    fflush(stdout);
    double dt = now_s() - t0;
    if (stats && grid.world_rank == 0) {
        fprintf(stderr, "sample: %d tokens in %.3fs, %.1f tokens/s (prompt: %lld tokens)\n",
                tokens, dt, tokens / (dt > 0 ? dt : 1e-9), prompt_steps);
        for (int l = 0; l < m.d.L; l++)
            if (model_is_routed(&m.d, l))
                fprintf(stderr, "sample: block %d processed %.1f%% of tokens\n", l,
                        ds.steps ? 100.0 * ds.processed[l] / ds.steps : 0.0);
    }
    free(probs);
    decode_free(&ds, &m);
    grid_free(&grid);
    free(seq);
    model_free(&m);
    return 0;
}
