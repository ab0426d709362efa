/*
 * eval: `modtrain eval` on a checkpoint: the loss over a dataset or blend,
 * and on request the routing of each token (--routing), the first
 * sequence's last logits (--logits) or the loss gradients (--grads).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <string.h>

#include "checkpoint/ckpt.h"
#include "src/base/files.h"
#include "mpi/check.h"
#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/cmd/infer.h"

typedef struct {
    const char *ckpt, *data, *grads, *grads_routing, *routing, *vocab, *logits;
    int json, seqs, micro, threads, pp, routing_seqs;
    double aux_weight, moe_aux_weight;
    RouteMode grad_mode;
} EvalArgs;

/* Parses eval's options. Returns 1 to go on, or an exit code. */
static int eval_args(EvalArgs *a, int argc, char **argv) {
    Config defaults;
    config_defaults(&defaults);
    *a = (EvalArgs){.grads_routing = "topk",
                    .micro = 8,
                    .seqs = 256,
                    .pp = 1,
                    .routing_seqs = 4,
                    .aux_weight = defaults.aux_weight,
                    .moe_aux_weight = defaults.moe_aux_weight};
    CliOpt opts[] = {
        {"ckpt", CLI_STR, &a->ckpt, "checkpoint: a ckpt_dir (its newest) or a step directory",
         "DIR"},
        {"data", CLI_STR, &a->data,
         "shards to evaluate on: a shard, a glob, or a blend W:GLOB,W:GLOB (each dataset's "
         "first sequences, in order)",
         "SPEC"},
        {"json", CLI_FLAG, &a->json, "print one JSON object"},
        {"seqs", CLI_INT, &a->seqs,
         "sequences to evaluate: the first N of the data, a blend's in its own order (each "
         "dataset's share from its first, in order); 0 = all of every dataset (256)",
         "N", 0, 1 << 30},
        {"micro_batch", CLI_INT, &a->micro, "sequences per forward (8)", NULL, 1, 1 << 24},
        {"threads", CLI_INT, &a->threads,
         "threads; 0 = OMP_NUM_THREADS, else the cores over the node's ranks (0)", NULL, 0, 4096},
        {"grads", CLI_STR, &a->grads, "also write the loss gradients as safetensors to this file",
         "FILE"},
        {"grads_routing", CLI_STR, &a->grads_routing, "routing for --grads: topk or causal (topk)",
         "topk|causal"},
        {"routing", CLI_STR, &a->routing,
         "also write each routed block's decision for every token of the first sequences to "
         "this file",
         "FILE"},
        {"logits", CLI_STR, &a->logits,
         "also write the logits of the first sequence's last token, one a line, from a forward "
         "that routes as sampling decodes (causal routing) to this file",
         "FILE"},
        {"routing_seqs", CLI_INT, &a->routing_seqs, "sequences --routing covers (4)", NULL, 1,
         1 << 30},
        {"vocab", CLI_STR, &a->vocab,
         "folder with encoder.json and vocab.bpe (gpt2), or the rank file, to decode BPE tokens in "
         "--routing",
         "PATH"},
        {"aux_weight", CLI_FLOAT, &a->aux_weight, "weight of the router's BCE in --grads (0.1)",
         NULL, 0, 1e18},
        {"moe_aux_weight", CLI_FLOAT, &a->moe_aux_weight,
         "weight of the experts' load-balancing loss in --grads (0.01)", NULL, 0, 1e18},
        {"pp", CLI_INT, &a->pp, "pipeline stages over the ranks; the rest is tensor-parallel (1)",
         NULL, 1, 4096},
        {NULL, 0, NULL, NULL}};
    for (int i = 0; i < argc; i++) {
        char name[16];
        if (cli_option_name(argv[i], name, sizeof name, NULL) && strcmp(name, "batches") == 0) {
            errorf("eval: --batches was replaced by --seqs N, which counts sequences, not "
                   "micro-batches (--seqs = batches x micro_batch reads as many)");
            return EXIT_USAGE;
        }
    }
    int h = cli_parse("eval", "modtrain eval --ckpt DIR --data FILE [--seqs N] [--json]",
                      "Mean next-token loss of a checkpoint over the first --seqs sequences "
                      "(256) of token shards, the same under every layout and, but for "
                      "experts (whose capacity is per micro-batch), every --micro_batch; for "
                      "a Mixture-of-Depths model under top-k and under causal routing.",
                      opts, argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (!a->ckpt || !a->data) {
        errorf("eval: --ckpt and --data are required (see modtrain eval --help)");
        return EXIT_USAGE;
    }
    if (strcmp(a->grads_routing, "topk") != 0 && strcmp(a->grads_routing, "causal") != 0) {
        errorf("eval: --grads_routing '%s' is not one of topk/causal", a->grads_routing);
        return EXIT_USAGE;
    }
    if ((a->grads || a->routing || a->logits) && a->pp > 1) {
        errorf("eval: --%s needs the whole model on each rank (--pp 1)",
               a->grads ? "grads" : a->routing ? "routing" : "logits");
        return EXIT_USAGE;
    }
    if (a->vocab && !a->routing) {
        errorf(
            "eval: --vocab decodes the tokens of --routing FILE; without --routing leave it out");
        return EXIT_USAGE;
    }
    a->grad_mode = strcmp(a->grads_routing, "causal") == 0 ? ROUTE_CAUSAL : ROUTE_TOPK;
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

/* An MoE model's mean load-balancing loss (over MoE blocks and
 * micro-batches) and the share of its expert slots dropped. */
static void print_expert_load(const Model *m) {
    const ModelDims *d = &m->d;
    if (d->E == 0) return;
    const int w = d->E + d->Nn + 2;
    long long dropped = 0, slots = 0;
    for (int l = 0; l < d->L; l++) {
        dropped += m->stats.moe[(size_t)l * w + w - 2];
        slots += m->stats.moe[(size_t)l * w + w - 1];
    }
    printf(",\"moe_aux\":%.6f,\"expert_drop\":%.6f",
           m->stats.moe_forwards ? m->stats.moe_aux_sum / (double)m->stats.moe_forwards : 0.0,
           slots ? (double)dropped / (double)slots : 0.0);
}

/* The loss under `mode` of each dataset's share of the first `total`
 * sequences (val_seqs; 0 = all) into part[], *seqs the sequences read;
 * returns their blend by weight, or NAN with *failed set (printed). */
static double eval_blend(Infer *in, const EvalArgs *a, Dataset *ds, size_t total, RouteMode mode,
                         double *part, size_t *seqs, int *failed) {
    double loss = 0;
    *seqs = 0;
    for (int d = 0; d < ds->n_parts; d++) {
        const int grads = a->grads && a->grad_mode == mode;
        const size_t n = (size_t)val_seqs(ds, d, total);
        part[d] = evaluate(&in->m, ds, d, a->micro, n, mode, grads, (float)a->aux_weight, failed);
        if (*failed) return NAN;
        loss += ds->parts[d].weight * part[d];
        *seqs += n;
    }
    return loss;
}

static void print_parts(const char *key, const double *v, int n) {
    if (n < 2) return;
    printf(",\"%s\":[", key);
    for (int d = 0; d < n; d++) printf("%s%.6f", d ? "," : "", v[d]);
    printf("]");
}

/* Evaluates under top-k and, for a routed model, causal routing, and
 * prints the result. Returns the exit code. */
static int eval_run(Infer *in, const EvalArgs *a, Dataset *ds, size_t total) {
    Model *m = &in->m;
    const int routed = in->cfg.route_every > 0, np = ds->n_parts;
    double part[DS_MAX_PARTS], cpart[DS_MAX_PARTS];
    size_t seqs;
    int failed = 0;
    if (a->grads) model_zero_grad(m);
    m->moe_aux_weight = (float)a->moe_aux_weight;
    double loss = eval_blend(in, a, ds, total, ROUTE_TOPK, part, &seqs, &failed);
    if (failed) return EXIT_USAGE;
    const double tokens = (double)seqs * in->cfg.seq_len;
    if (!isfinite(loss)) { /* finite weights whose products overflow: alike on every rank */
        if (in->grid.world_rank == 0)
            errorf("eval: the loss on '%s' is %f (the model's activations overflow)", a->data,
                   loss);
        return EXIT_FAILURE;
    }
    double acc = m->stats.decisions ? (double)m->stats.agree / (double)m->stats.decisions : 1.0;
    if (a->json) {
        printf("{\"loss\":%.6f", loss);
        print_parts("loss_parts", part, np);
        if (routed) {
            printf(",\"processed_topk\":");
            print_fractions(m);
        }
        print_expert_load(m);
    } else {
        for (int d = 0; np > 1 && d < np; d++)
            printf("eval: dataset %d ('%s', weight %.4g): loss %.4f\n", d, ds->parts[d].pattern,
                   ds->parts[d].weight, part[d]);
        printf("eval: loss %.4f%s over %.0f tokens (%zu sequences), checkpoint step %d\n", loss,
               np > 1 ? " (the blend by weight)" : "", tokens, seqs, in->step);
    }
    if (routed) {
        double lc = eval_blend(in, a, ds, total, ROUTE_CAUSAL, cpart, &seqs, &failed);
        if (failed) return EXIT_USAGE;
        if (a->json) {
            printf(",\"loss_causal\":%.6f", lc);
            print_parts("loss_causal_parts", cpart, np);
            printf(",\"predictor_accuracy\":%.6f,\"processed_causal\":", acc);
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
        printf(",\"tokens\":%.0f,\"sequences\":%zu,\"step\":%d}\n", tokens, seqs, in->step);
    Err err;
    const int rc = a->grads ? ckpt_export_grads(a->grads, m, &in->cfg, &err) : 0;
    return cmd_agree(rc, &err, MPI_COMM_WORLD) == 0 ? EXIT_OK : EXIT_FAILURE;
}

/* Warns (ids below the model's vocabulary still evaluate) when the shards'
 * headers name another vocabulary or tokenizer than the model's. */
static void warn_vocab(const Dataset *ds, const Infer *in) {
    const ShardMeta *sm = ds_meta(ds);
    const char *path = ds->parts[0].shards[0].path;
    const Config *c = &in->cfg;
    if (sm->vocab && sm->vocab != in->m.d.V)
        errorf("warning: eval: '%s' was written for a %d-token vocabulary, but the model has "
               "vocab_size = %d",
               path, sm->vocab, in->m.d.V);
    const int mine = shard_code_of_tokenizer(c->tokenizer);
    char hex[CONFIG_HASH_HEX + 1], what[64];
    format_vocab_hash(sm->vocab_hash, hex);
    shard_describe_tokenizer(sm, what, sizeof what);
    if (sm->tokenizer &&
        (sm->tokenizer != mine ||
         (mine >= SHARD_TOK_GPT2 && c->tokenizer_hash[0] && strcmp(hex, c->tokenizer_hash) != 0)))
        errorf(
            "warning: eval: '%s' was tokenized by %s, but the model was trained on %s tokens%s%s%s",
            path, what, shard_tokenizer_name(mine), c->tokenizer_hash[0] ? " (vocabulary " : "",
            c->tokenizer_hash, c->tokenizer_hash[0] ? ")" : "");
}

/* A token's text in a routing dump's tab-separated column: bytes as they
 * are, except backslash, tab, newline and other control bytes (and a lone
 * byte above 0x7f, not UTF-8 by itself), which are escaped. */
static void put_text(FILE *f, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const int c = p[i];
        if (c == '\\') fputs("\\\\", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20 || c == 0x7f || (c > 0x7f && n == 1)) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
}

/* Block l's MoE choices for row j of its rows, as the routing file's
 * experts column: per choice, best first, "E" for expert E, "dE" for
 * expert E over its capacity (dropped), "nJ" for no-op J. */
static void put_experts(FILE *f, const ModelDims *d, const BlockActs *A, int j) {
    for (int c = 0; c < d->ek; c++) {
        const int e = A->mch[(size_t)j * d->ek + c], s = A->mslot[(size_t)j * d->ek + c];
        if (c) fputc(',', f);
        if (s == MOE_NOOP) fprintf(f, "n%d", e - d->E);
        else if (s == MOE_DROPPED) fprintf(f, "d%d", e);
        else fprintf(f, "%d", e);
    }
}

/* One token's MoD columns (topk, router, weight, causal) of block l: "-"
 * for a block that is not routed (an MoE block's row). */
static void put_mod(FILE *f, const ModelDims *d, const BlockActs *A, int l, size_t i) {
    if (!model_is_routed(d, l)) {
        fputs("\t-\t-\t-\t-", f);
        return;
    }
    const float z = d->predictor ? A->plogit[i] : 0.f;
    fprintf(f, "\t%d\t%.9g\t%.9g\t%d", A->topk[i], A->r[i], model_gate(d, A->r[i]),
            model_causal(d, A->r[i], z));
}

/* One micro-batch's decisions: every routed or MoE block of every
 * sequence, one line per token; an MoE model's lines end in the experts
 * column (put_experts; "skip" for a token a routed MoE block left out, "-"
 * in a block without experts). */
static void routing_rows(FILE *f, const Model *m, const int *inputs, int B, int T, size_t seq0,
                         const Bpe *bpe) {
    const ModelDims *d = &m->d;
    for (int b = 0; b < B; b++)
        for (int l = 0; l < d->L; l++) {
            const int routed = model_is_routed(d, l), moe = model_is_moe(d, l);
            if (!routed && !moe) continue;
            const BlockActs *A = &m->cur->acts[l];
            int j = routed ? A->off[b] : 0; /* the next of the block's rows in sequence b */
            for (int t = 0; t < T; t++) {
                const size_t i = (size_t)b * T + t;
                const int tok = inputs[i];
                fprintf(f, "%zu\t%d\t%d\t%d\t", seq0 + b, t, l, tok);
                size_t n = 1;
                const uint8_t byte = (uint8_t)tok, *text = bpe ? bpe_token(bpe, tok, &n) : &byte;
                if (bpe || d->V == 256) put_text(f, text, text ? n : 0);
                put_mod(f, d, A, l, i);
                if (d->E > 0) fputc('\t', f);
                if (d->E > 0 && !moe) fputc('-', f);
                else if (d->E > 0 && !routed) put_experts(f, d, A, (int)i);
                else if (d->E > 0 && j < A->off[b + 1] && (size_t)A->sel[j] == i) put_experts(f, d, A, j++);
                else if (d->E > 0) fputs("skip", f);
                fputc('\n', f);
            }
        }
}

/* The routing file's first two lines: what the model and the file are (an
 * MoE model's experts too), then the columns. */
static void eval_routing_header(FILE *f, const Infer *in, const Bpe *bpe, size_t n) {
    const ModelDims *d = &in->m.d;
    const int T = in->cfg.seq_len;
    fprintf(f,
            "# modtrain routing: checkpoint step %d, seq_len %d, k %d, capacity %g, route_every "
            "%d, causal_router %s, tokenizer %s%s, %zu sequences",
            in->step, T, model_capacity_k(d, T), in->cfg.capacity, in->cfg.route_every,
            in->cfg.causal_router == CAUSAL_PREDICTOR ? "predictor" : "aux_loss",
            in->cfg.tokenizer == TOK_NONE
                ? "none"
                : shard_tokenizer_name(shard_code_of_tokenizer(in->cfg.tokenizer)),
            config_tokenizer_is_bpe(in->cfg.tokenizer) && !bpe ? " (no --vocab: text left empty)"
                                                               : "",
            n);
    if (d->E > 0)
        fprintf(f,
                ", n_expert %d, n_noop_expert %d, expert_top_k %d, capacity_factor %g, moe_every "
                "%d (experts: E expert E, dE dropped over its capacity, nJ no-op J, skip not "
                "routed to the block, - no experts)",
                d->E, d->Nn, d->ek, d->cf, d->moe_every);
    fprintf(f, "\nseq\tpos\tblock\ttoken\ttext\ttopk\trouter\tweight\tcausal%s\n",
            d->E > 0 ? "\texperts" : "");
}

/* --routing: the top-k forward of the first --routing_seqs sequences, and
 * each routed block's decision for each of their tokens, written by rank 0
 * (the tp ranks route alike) through a temporary file renamed into place.
 * Returns the exit code. */
static int eval_routing(Infer *in, const EvalArgs *a, Dataset *ds, size_t n_seqs) {
    Model *m = &in->m;
    const int T = in->cfg.seq_len, rank0 = in->grid.world_rank == 0;
    Err err = {0};
    Bpe *bpe = NULL;
    int vdraw, rc = 0;
    if (in->cfg.tokenizer == TOK_BYTE || a->vocab)
        rc = infer_tokenizer(in, "eval", a->vocab, &bpe, &vdraw, &err);
    char tmp[4096];
    FILE *f = NULL;
    if (rc == 0 && rank0) {
        struct stat st; /* the table replaces a file: never a FIFO, device or folder */
        Err why;
        snprintf(tmp, sizeof tmp, "%s.tmp", a->routing);
        if (stat(a->routing, &st) == 0 && !S_ISREG(st.st_mode))
            rc = err_set(&err, "eval: --routing: '%s' is %s, not a file", a->routing,
                         file_kind(st.st_mode));
        else if (!(f = open_output(tmp, 0, &why)))
            rc = err_set(&err, "eval: --routing: %s", why.msg);
    }
    if (cmd_agree(rc, &err, MPI_COMM_WORLD) != 0) {
        bpe_free(bpe);
        return EXIT_USAGE;
    }
    const size_t n = (size_t)a->routing_seqs < n_seqs ? (size_t)a->routing_seqs : n_seqs;
    if (f) eval_routing_header(f, in, bpe, n);
    int *inputs = xmalloc((size_t)a->micro * T * sizeof(int));
    int *targets = xmalloc((size_t)a->micro * T * sizeof(int));
    const RouteMode saved = m->route;
    m->route = ROUTE_TOPK;
    model_use_slot(m, 0);
    for (size_t w = 0; w < n && rc == 0;) {
        const size_t seq0 = w;
        int B = 0;
        for (; B < a->micro && w < n && rc == 0; B++, w++) {
            DsSample s;
            ds_locate_seq(ds, 0, w, &s);
            rc = ds_read(ds, &s, m->d.V, inputs + (size_t)B * T, targets + (size_t)B * T, &err);
        }
        if (cmd_agree(rc, &err, MPI_COMM_WORLD) != 0) {
            rc = -1;
            break;
        }
        model_forward(m, inputs, targets, B, T);
        check_model_fault(m);
        if (f) routing_rows(f, m, inputs, B, T, seq0, bpe);
    }
    m->route = saved;
    free(inputs);
    free(targets);
    bpe_free(bpe);
    if (rc != 0) { /* a read failed: printed */
        if (f) {
            fclose(f);
            remove(tmp);
        }
        return EXIT_USAGE;
    }
    Err why;
    if (f && close_output(f, tmp, &why) != 0) rc = err_set(&err, "eval: --routing: %s", why.msg);
    else if (f && rename(tmp, a->routing) != 0)
        rc =
            err_set(&err, "eval: cannot rename '%s' to '%s': %s", tmp, a->routing, strerror(errno));
    if (rc != 0 && f) remove(tmp);
    return cmd_agree(rc, &err, MPI_COMM_WORLD) == 0 ? EXIT_OK : EXIT_FAILURE;
}

/* --logits: a forward of the first sequence without targets, routed
 * causally as decoding is, and its last token's logits into the file.
 * Returns the exit code. */
static int eval_logits(Infer *in, const EvalArgs *a, Dataset *ds) {
    Model *m = &in->m;
    const int T = in->cfg.seq_len;
    int *inputs = xmalloc((size_t)T * sizeof(int)), *targets = xmalloc((size_t)T * sizeof(int));
    Err err = {0};
    DsSample s;
    ds_locate_seq(ds, 0, 0, &s);
    int rc = ds_read(ds, &s, m->d.V, inputs, targets, &err);
    if (cmd_agree(rc, &err, MPI_COMM_WORLD) == 0) {
        const RouteMode saved = m->route;
        m->route = ROUTE_CAUSAL;
        model_use_slot(m, 0);
        model_forward(m, inputs, NULL, 1, T);
        check_model_fault(m);
        m->route = saved;
        rc = write_logits(a->logits, m, model_logits(m, T - 1, 1), &err);
        rc = cmd_agree(rc, &err, MPI_COMM_WORLD) == 0 ? EXIT_OK : EXIT_FAILURE;
    } else rc = EXIT_USAGE;
    free(inputs);
    free(targets);
    return rc;
}

int eval_main(int argc, char **argv) {
    EvalArgs a;
    quiet_above_rank0(1);
    int rc = eval_args(&a, argc, argv);
    quiet_above_rank0(0);
    if (rc != 1) return rc;
    Infer in;
    if (infer_open(&in, "eval", a.ckpt, a.pp, a.threads, a.micro) != 0) return EXIT_USAGE;
    if (a.routing && in.cfg.route_every == 0 && in.m.d.E == 0) { /* alike on every rank */
        if (in.grid.world_rank == 0)
            errorf("eval: --routing needs routed blocks or experts, and '%s' is a dense model "
                   "(route_every = 0, n_expert = 0): leave --routing out, or give a "
                   "Mixture-of-Depths or Mixture-of-Experts checkpoint",
                   a.ckpt);
        infer_close(&in);
        return EXIT_USAGE;
    }
    Dataset ds;
    if (ds_open_shared(&ds, a.data, in.cfg.seq_len, 0, MPI_COMM_WORLD) != 0) {
        infer_close(&in);
        return EXIT_USAGE;
    }
    if (a.grads && ds.n_parts > 1) { /* alike on every rank */
        if (in.grid.world_rank == 0)
            errorf("eval: --grads takes one dataset, not a blend of %d", ds.n_parts);
        ds_free(&ds);
        infer_close(&in);
        return EXIT_USAGE;
    }
    if (in.grid.world_rank == 0) warn_vocab(&ds, &in);
    const size_t total = (size_t)a.seqs;
    /* the routing file first: its refusals (tokenizer, path) come before the work */
    rc = a.routing ? eval_routing(&in, &a, &ds, (size_t)ds.parts[0].n_seqs) : EXIT_OK;
    if (rc == EXIT_OK && a.logits) rc = eval_logits(&in, &a, &ds);
    if (rc == EXIT_OK) rc = eval_run(&in, &a, &ds, total);
    ds_free(&ds);
    infer_close(&in);
    return rc;
}
