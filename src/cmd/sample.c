/*
 * sample: `modtrain sample` on a checkpoint: text generated from a prompt,
 * one token at a time on a KV cache, by temperature and top-k.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mpi/check.h"
#include "src/base/files.h"
#include "src/base/rng.h"
#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/cmd/infer.h"

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
    const char *ckpt, *prompt, *vocab, *ids, *logits;
    int tokens, top_k, threads, stats, pp;
    double temperature;
    long long seed;
} SampleArgs;

/* Parses sample's options. Returns 1 to go on, or an exit code. */
static int sample_args(SampleArgs *a, int argc, char **argv) {
    *a = (SampleArgs){.prompt = "", .tokens = 256, .pp = 1, .temperature = 1.0, .seed = 42};
    CliOpt opts[] = {
        {"ckpt", CLI_STR, &a->ckpt, "checkpoint: a ckpt_dir (its newest) or a step directory",
         "DIR"},
        {"prompt", CLI_STR, &a->prompt, "text to continue (\"\")", "TEXT"},
        {"tokens", CLI_INT, &a->tokens, "tokens to generate (256)", NULL, 0, 1 << 30},
        {"temperature", CLI_FLOAT, &a->temperature, "softmax temperature; 0 = greedy (1.0)", "T", 0,
         1e6},
        {"top_k", CLI_INT, &a->top_k, "sample from the k likeliest tokens; 0 = all (0)", "K", 0,
         1 << 30},
        {"seed", CLI_I64, &a->seed, "sampling seed (42)", "S", 0, 9.2e18},
        {"vocab", CLI_STR, &a->vocab,
         "folder with encoder.json and vocab.bpe (gpt2), or the rank file, for a model trained on "
         "BPE tokens",
         "PATH"},
        {"ids", CLI_STR, &a->ids, "also write the generated token ids to this file, one a line",
         "FILE"},
        {"threads", CLI_INT, &a->threads,
         "threads; 0 = OMP_NUM_THREADS, else the cores over the node's ranks (0)", NULL, 0, 4096},
        {"logits", CLI_STR, &a->logits,
         "also write the logits the first token is drawn from (the prompt's last token's), one "
         "a line, to this file",
         "FILE"},
        {"stats", CLI_FLAG, &a->stats, "print tokens/s to stderr at the end"},
        {"pp", CLI_INT, &a->pp, "pipeline stages over the ranks; the rest is tensor-parallel (1)",
         NULL, 1, 4096},
        {NULL, 0, NULL, NULL}};
    int h = cli_parse("sample", "modtrain sample --ckpt DIR [--prompt TEXT] [--tokens N]",
                      "Generates text from a checkpoint, with the tokenizer it was trained with "
                      "(byte, or GPT-2's BPE from --vocab).",
                      opts, argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (!a->ckpt) {
        errorf("sample: --ckpt is required (see modtrain sample --help)");
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
    int vdraw; /* ids drawn from: those with text */
    Bpe *bpe;  /* GPT-2's tokens, or NULL for bytes */
    FILE *ids; /* --ids, or NULL */
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
static int next_token(Infer *in, const SampleArgs *a, int vdraw, const float *logits, float *probs,
                      Rng *rng) {
    Model *m = &in->m;
    int tok = 0;
    if (model_last_stage(&m->d)) {
        tp_allgather(probs, logits, (size_t)m->d.Vl, &m->tp);
        tok = draw(probs, vdraw, a->temperature, a->top_k, rng);
    }
    if (in->grid.pp > 1) MPI_CHECK(MPI_Bcast(&tok, 1, MPI_INT, in->grid.pp - 1, in->grid.pp_comm));
    return tok;
}

/* Prints a generated token's text, and its id to --ids. */
static void emit(const Text *tx, int tok) {
    if (tx->bpe) {
        size_t len = 0;
        const uint8_t *p = bpe_token(tx->bpe, tok, &len); /* tok < vdraw: never NULL */
        fwrite(p, 1, len, stdout);
    } else putchar(tok);
    if (tx->ids) fprintf(tx->ids, "%d\n", tok);
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
    Err err = {0};
    if (a->logits && model_last_stage(&m->d) && write_logits(a->logits, m, logits, &err) != 0)
        errorf("sample: --logits: %s", err.msg);
    Rng rng;
    rng_seed(&rng, (uint64_t)a->seed);
    double t0 = now_s();
    memset(ds->processed, 0, (size_t)m->d.L * sizeof(long long));
    ds->steps = 0;
    for (int i = 0; i < a->tokens; i++) {
        int tok = next_token(in, a, tx->vdraw, logits, probs, &rng);
        text_push(tx, tok);
        emit(tx, tok);
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

/* The prompt's tokens into tx (a fresh passage when it is empty: a newline,
 * or <|endoftext|>), echoed to stdout. */
static void sample_prompt(Text *tx, const char *prompt) {
    const size_t plen = strlen(prompt);
    if (tx->bpe) {
        BpeIds ids = {0};
        bpe_encode(tx->bpe, prompt, plen, &ids);
        if (ids.n == 0) tx->seq[tx->n++] = bpe_eot(tx->bpe);
        for (size_t i = 0; i < ids.n; i++) tx->seq[tx->n++] = ids.ids[i];
        free(ids.ids);
    } else {
        if (plen == 0) tx->seq[tx->n++] = '\n';
        for (size_t i = 0; i < plen; i++) tx->seq[tx->n++] = (unsigned char)prompt[i];
    }
    fwrite(prompt, 1, plen, stdout);
}

int sample_main(int argc, char **argv) {
    SampleArgs a;
    quiet_above_rank0(1);
    int rc = sample_args(&a, argc, argv);
    quiet_above_rank0(0);
    if (rc != 1) return rc;
    Infer in;
    if (infer_open(&in, "sample", a.ckpt, a.pp, a.threads, 1) != 0) return EXIT_USAGE;
    Model *m = &in.m;
    Bpe *bpe = NULL;
    Err err;
    const int root = in.grid.world_rank == 0;
    Text tx = {.T = m->d.maxT};
    rc = infer_tokenizer(&in, "sample", a.vocab, &bpe, &tx.vdraw, &err);
    Err why;
    if (rc == 0 && root && a.ids && !(tx.ids = open_output(a.ids, 0, &why)))
        rc = err_set(&err, "sample: --ids: %s", why.msg);
    if (cmd_agree(rc, &err, MPI_COMM_WORLD) != 0) {
        if (tx.ids) fclose(tx.ids);
        bpe_free(bpe);
        infer_close(&in);
        return EXIT_USAGE;
    }
    tx.bpe = bpe;
    const size_t plen = strlen(a.prompt), T = (size_t)m->d.maxT; /* ids <= bytes + 1 */
    tx.cap = (plen > T ? plen : T) + T + 1;
    tx.seq = xmalloc(tx.cap * sizeof(int));
    sample_prompt(&tx, a.prompt);
    DecodeState ds;
    decode_init(&ds, m);
    const long long prompt_steps = (long long)(tx.n > T ? T : tx.n);
    double dt = generate(&in, &a, &ds, &tx);
    if (a.stats && root) {
        fprintf(stderr, "sample: %d tokens in %.3fs, %.1f tokens/s (prompt: %lld tokens)\n",
                a.tokens, dt, a.tokens / (dt > 0 ? dt : 1e-9), prompt_steps);
        for (int l = 0; l < m->d.L; l++)
            if (model_is_routed(&m->d, l))
                fprintf(stderr, "sample: block %d processed %.1f%% of tokens\n", l,
                        ds.steps ? 100.0 * ds.processed[l] / ds.steps : 0.0);
    }
    rc = EXIT_OK;
    if (tx.ids && close_output(tx.ids, a.ids, &why) != 0) {
        errorf("sample: --ids: %s", why.msg);
        rc = EXIT_FAILURE;
    }
    decode_free(&ds, m);
    free(tx.seq);
    bpe_free(bpe);
    infer_close(&in);
    return rc;
}
