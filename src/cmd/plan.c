/*
 * plan: `modtrain plan`, the candidate layouts of a config on a cluster,
 * and `modtrain plan --calibrate`, which measures this machine into a
 * cluster file to start from.
 */
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpi/check.h"
#include "mpi/dp.h"
#include "mpi/pipeline.h"
#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/cmd/doc.h"
#include "src/data/dataset.h"
#include "src/data/data.h"
#include "src/kernels/kernels.h"
#include "src/plan/plan.h"

typedef struct {
    const char *cluster, *out;
    int calibrate, flops, top, tp, pp, rpn;
} PlanArgs;

static void plan_help(void) {
    const CliOpt opts[] = {
        /* help only: plan's loop also takes train's keys */
        {"config", CLI_STR, NULL, "the model and run, as train reads it", "FILE"},
        {"cluster", CLI_STR, NULL, "the cluster (below); without it, the defaults below", "FILE"},
        {"layout", CLI_STR, NULL, "only this layout, with its memory, bytes and time in parts",
         "TP,PP,RPN"},
        {"top", CLI_INT, NULL, "layouts shown (20)"},
        {"flops", CLI_FLAG, NULL, "the model's parameters and FLOPs as JSON"},
        {"calibrate", CLI_FLAG, NULL, "measure this machine into --out FILE"},
        {"out", CLI_STR, NULL, "the cluster file --calibrate writes", "FILE"},
        {NULL},
    };
    cli_print_help(
        "modtrain plan --config FILE [--cluster FILE] [--layout TP,PP,RANKS_PER_NODE]\n"
        "                     [--top N] [--key value ...]\n"
        "       modtrain plan --config FILE --flops [--key value ...]\n"
        "       modtrain plan --calibrate --out FILE   (under mpirun -np 2 to measure MPI)",
        "Prints, for each layout of the config on the cluster: memory per rank, FLOPs\n"
        "and bytes per step, the estimated step time and tokens/s, checkpoint size and\n"
        "save time; the best first, layouts that do not fit marked. --flops prints\n"
        "the model's parameters and training FLOPs per token and per step as JSON.\n"
        "The model is --config FILE's, or the model keys given (--n_layer N, ...);\n"
        "other --key value pairs override the file as for train (modtrain train --help).",
        opts);
    static const char about[] = "key = value lines, # comments; each key, with its default:";
    if (doc_format == DOC_TEXT) printf("\ncluster file: %s\n", about);
    else {
        doc_section("CLUSTER FILE");
        doc_para(about);
    }
    Cluster cl;
    cluster_defaults(&cl);
    char line[160];
    for (int i = 0; cluster_describe(&cl, i, line, sizeof line); i++) {
        if (doc_format == DOC_TEXT) {
            printf("  %s\n", line);
            continue;
        }
        /* "key   = default  # help" */
        char key[64] = "", def[64] = "";
        const char *eq = strstr(line, " = "), *hash = strstr(line, "  # ");
        if (!eq || !hash || hash < eq) continue;
        snprintf(key, sizeof key, "%.*s", (int)strcspn(line, " "), line);
        snprintf(def, sizeof def, "default %.*s", (int)(hash - eq - 3), eq + 3);
        doc_option(key, NULL, def, hash + 4);
    }
    if (doc_format == DOC_MARKDOWN) putchar('\n');
}

/* Value of option arg (typed as arg, or with `=value` in it), from argv[*i
 * + 1] when it has none. Returns NULL after printing that it needs one. */
static const char *plan_value(const char *arg, const char *eqv, int *i, int argc, char **argv) {
    if (eqv) return eqv;
    if (*i + 1 < argc) return argv[++*i];
    errorf("plan: %.*s needs a value (see modtrain plan --help)", cli_typed_len(arg), arg);
    return NULL;
}

/* Takes plan's own options out of argv (the rest are config keys, as for
 * train). Returns 1 to go on, 0 after --help, -1 after an error. */
static int plan_args(PlanArgs *a, int *argc, char **argv) {
    *a = (PlanArgs){.top = 20};
    int n = 0;
    for (int i = 0; i < *argc; i++)
        if (cli_is_help(argv[i])) {
            plan_help();
            return 0;
        }
    for (int i = 0; i < *argc; i++) {
        const char *s = argv[i], *eqv = NULL, *v;
        char name[32];
        long long x = 0;
        if (!cli_option_name(s, name, sizeof name, &eqv)) {
            argv[n++] = argv[i];
            continue;
        }
        char who[96];
        cli_typed_name(who, sizeof who, s, name);
        if (strcmp(name, "calibrate") == 0 && !eqv) a->calibrate = 1;
        else if (strcmp(name, "flops") == 0 && !eqv) a->flops = 1;
        else if (strcmp(name, "cluster") == 0 || strcmp(name, "out") == 0) {
            if (!(v = plan_value(s, eqv, &i, *argc, argv))) return -1;
            *(name[0] == 'c' ? &a->cluster : &a->out) = v;
        } else if (strcmp(name, "top") == 0) {
            if (!(v = plan_value(s, eqv, &i, *argc, argv))) return -1;
            if (parse_i64(v, 1, 1 << 20, &x) != 0) {
                errorf("plan: %s = '%.40s' is not a count in [1, 1048576]", who, v);
                return -1;
            }
            a->top = (int)x;
        } else if (strcmp(name, "layout") == 0) {
            if (!(v = plan_value(s, eqv, &i, *argc, argv))) return -1;
            if (plan_parse_layout(v, &a->tp, &a->pp, &a->rpn) != 0) {
                errorf("plan: %s '%.40s' is not TP,PP,RANKS_PER_NODE (exactly three whole "
                       "numbers >= 1 separated by commas, no empty field, e.g. 2,4,8)",
                       who, v);
                return -1;
            }
        } else if (strcmp(name, "calibrate") == 0 || strcmp(name, "flops") == 0) {
            errorf("plan: %s takes no value (give it alone)", who);
            return -1;
        } else argv[n++] = argv[i];
    }
    *argc = n;
    return 1;
}

/* Whether argv (config arguments) names a model: --config, or a model key.
 * Without one plan would plan the default model, which nobody means. */
static int plan_has_model(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        char name[64];
        if (!cli_option_name(argv[i], name, sizeof name, NULL)) continue;
        if (strcmp(name, "config") == 0) return 1;
        for (int k = 0; config_model_key(k); k++)
            if (strcmp(name, config_model_key(k)) == 0) return 1;
    }
    return 0;
}

/* The vocabulary when the config leaves it to the data: the training
 * shards' headers, else GPT-2's. */
static void plan_vocab(Config *c) {
    if (c->vocab_size) return;
    c->vocab_size = 50257;
    Dataset ds;
    if (ds_open(&ds, c->train_data, c->seq_len, 0, NULL) != 0) return;
    if (ds_meta(&ds)->vocab) c->vocab_size = ds_meta(&ds)->vocab;
    ds_free(&ds);
}

/* moe: the layout's ep after dp, and its all-to-all MB after pp MB. */
static void print_row(const PlanRow *r, int moe) {
    char mem[32], ep[16] = "", epmb[16] = "";
    format_bytes(mem, sizeof mem, r->rank_bytes);
    if (moe) {
        snprintf(ep, sizeof ep, " %3d", r->ep);
        snprintf(epmb, sizeof epmb, " %9.1f", r->ep_bytes / 1e6);
    }
    /* the groups that span nodes under the grid's order: "dp 2/2,pp 4/4" */
    char across[96] = "";
    const int size[3] = {r->tp, r->dp, r->pp};
    const char *name[3] = {"tp", "dp", "pp"};
    for (int a = 0; a < 3; a++)
        if (r->crossing[a])
            snprintf(across + strlen(across), sizeof across - strlen(across), "%s%s %d/%d",
                     across[0] ? "," : "", name[a], r->crossing[a],
                     r->tp * r->dp * r->pp / size[a]);
    printf("%3d %3d %4d%s %4d %4d %11s %-4s %9.1f %9.1f %9.1f %9.1f%s %9.3f %6.1f%% %11.0f %8.2f "
           "%7.1f  %-8s %s\n",
           r->tp, r->pp, r->dp, ep, r->ranks_per_node, r->threads, mem, r->fits ? "yes" : "NO",
           r->flops_step / 1e12, r->tp_bytes / 1e6, r->dp_bytes / 1e6, r->pp_bytes / 1e6, epmb,
           r->t_step, 100 * r->t_bubble / r->t_step, r->tokens_per_s, r->ckpt_bytes / 1e9,
           r->ckpt_s, config_order_name(r->order), across[0] ? across : "-");
}

/* The one layout's exact figures (the tests compare them). */
static void print_parts(const PlanRow *one, const size_t *stage, int pp, int moe) {
    const ModelMemory *mm = &one->mem;
    char b[10][32];
    const size_t parts[10] = {mm->params,      mm->grads,
                              mm->moments,     mm->acts,
                              mm->scratch,     mm->threads,
                              one->comm_bytes, mm->staging,
                              mm->data,        one->rank_bytes - mm->total - one->comm_bytes};
    for (int i = 0; i < 10; i++) format_bytes(b[i], sizeof b[i], parts[i]);
    printf("memory of the largest stage's rank: parameters %s, gradients %s, AdamW moments %s, "
           "activations %s, scratch %s, the threads' buffers %s, pipeline buffers %s, "
           "checkpoint staging %s, data path %s, baseline %s\n",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9]);
    printf("bytes per step of the busiest rank: tp %.0f, dp %.0f, pp %.0f", one->tp_bytes,
           one->dp_bytes, one->pp_bytes);
    if (one->dp_rows_bytes > 0) /* an upper bound: the rows are the step's distinct tokens */
        printf(" (dp: the embedding's rows at most %.0f of it)", one->dp_rows_bytes);
    if (moe) printf(", ep %.0f (dp of the experts %.0f)", one->ep_bytes, one->dp_expert_bytes);
    if (one->vs > 1) printf(" (interleaved: virtual_stages %d, %d chunks a rank)", one->vs, one->vs);
    printf("\nstep %.6f s: compute %.6f, tp %.6f, pp %.6f, bubble %.6f, dp %.6f, optimizer %.6f",
           one->t_step, one->t_compute, one->t_tp, one->t_pp, one->t_bubble, one->t_dp,
           one->t_optimizer);
    if (moe) printf(", all-to-all %.6f", one->t_ep);
    printf("\n");
    for (int s = 0; s < pp; s++) printf("stage %d: %zu bytes per rank\n", s, stage[s]);
}

static int plan_print(const Config *c, const Cluster *cl, const PlanArgs *a) {
    Err err;
    PlanRow *rows = NULL, one;
    int n;
    size_t *stage = a->tp ? xcalloc((size_t)a->pp, sizeof(size_t)) : NULL;
    if (a->tp) {
        n = plan_layout(c, cl, a->tp, a->pp, a->rpn, &one, stage, &err) == 0 ? 1 : -1;
        rows = &one;
    } else n = plan_candidates(c, cl, &rows, &err);
    if (n < 0) {
        err_print(&err);
        free(stage);
        return EXIT_USAGE;
    }
    const int moe = c->n_expert > 0;
    char experts[96] = "";
    if (moe)
        snprintf(experts, sizeof experts, " E=%d+%d k=%d every %d", c->n_expert,
                 c->n_noop_expert, c->expert_top_k, c->moe_every);
    printf("plan: L=%d C=%d NH=%d T=%d V=%d%s, batch %d; %d node%s x %d cores, %.0f GiB, %.1f "
           "GFLOP/s a core at %.0f%%\n",
           c->n_layer, c->d_model, c->n_head, c->seq_len, c->vocab_size, experts, c->batch_size,
           cl->nodes, cl->nodes == 1 ? "" : "s", cl->cores_per_node, cl->mem_per_node_gib,
           cl->gflops_per_core, 100 * cl->efficiency);
    printf("%3s %3s %4s%s %4s %4s %11s %-4s %9s %9s %9s %9s%s %9s %7s %11s %8s %7s  %-8s %s\n",
           "tp", "pp", "dp", moe ? "  ep" : "", "rpn", "thr", "mem/rank", "fits", "TFLOP", "tp MB",
           "dp MB", "pp MB", moe ? "     ep MB" : "", "step s", "bubble", "tokens/s", "ckpt GB",
           "save s", "order", "across nodes");
    for (int i = 0; i < n && i < a->top; i++) print_row(&rows[i], moe);
    if (n > a->top) printf("(%d more; --top N shows more)\n", n - a->top);
    if (stage) print_parts(&one, stage, a->pp, moe);
    free(stage);
    if (rows != &one) free(rows);
    return EXIT_OK;
}

/* The model's size and FLOPs as one JSON line (what an isoFLOP sweep needs
 * to choose its steps): routed blocks at their realised capacity. */
static int plan_flops(const Config *c) {
    ModelDims d;
    model_dims_config(&d, c, 1, 0);
    const double fpt = plan_flops_per_token(c), tokens = (double)c->batch_size * c->seq_len;
    printf("{\"params\":%zu,\"flops_per_token\":%.0f,\"dense_flops_per_token\":%.0f,"
           "\"tokens_per_step\":%.0f,\"flops_per_step\":%.0f,\"k\":%d,\"seq_len\":%d",
           plan_num_params(c), fpt, model_flops_per_token(&d, c->seq_len, NULL), tokens,
           fpt * tokens, c->route_every ? model_capacity_k(&d, c->seq_len) : c->seq_len,
           c->seq_len);
    if (c->n_expert > 0) /* the experts' share, and what a token's k of them leave active */
        printf(",\"n_expert\":%d,\"expert_top_k\":%d,\"moe_blocks\":%d,\"expert_params\":%zu,"
               "\"active_params\":%zu",
               c->n_expert, c->expert_top_k, model_moe_blocks(&d), plan_expert_params(c),
               plan_num_params(c) - plan_expert_params(c) / c->n_expert * (c->n_expert - c->expert_top_k));
    printf("}\n");
    return EXIT_OK;
}

/* Memory bandwidth: the best of a few passes of a[i] = b[i] + s*c[i] over
 * 3 x 64 MiB on all threads (bytes moved: 3 per element, as STREAM). */
static double measure_mem_bw(void) {
    const size_t n = (size_t)16 << 20;
    float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float)),
          *z = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = (float)i, z[i] = 1.f, x[i] = 0.f;
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        const double t0 = now_s();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) x[i] = y[i] + 0.5f * z[i];
        const double dt = now_s() - t0, gbs = 3.0 * n * sizeof(float) / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    free(x), free(y), free(z);
    return best;
}

/* MPI between two ranks (of one node): latency from an 8-byte ping-pong;
 * bandwidth from 8 MiB each way at once, as a ring all-reduce and 1F1B's
 * two directions load a link (a one-way ping-pong's overstated it where
 * a link did not carry both ways at once, or the transport's own work
 * took the cores); and the share of an all-reduce's time that keeps its
 * ranks' cores busy. Each the best of several. */
static void measure_shm(double *lat_us, double *bw_gbs, double *cpu_share) {
    const int big = 8 << 20;
    const double small = pp_pingpong(MPI_COMM_WORLD, 8, 1000);
    const double large = pp_exchange(MPI_COMM_WORLD, big, 10);
    if (small > 0) *lat_us = small * 1e6;
    if (large > 0) *bw_gbs = big / large / 1e9;
    int p = 1;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &p));
    if (p > 1) *cpu_share = dp_allreduce_cpu_share(MPI_COMM_WORLD, DP_BUCKET, 5);
}

static int plan_calibrate(const PlanArgs *a) {
    int rank, size;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    if (!a->out) {
        if (rank == 0) errorf("plan: --calibrate needs --out FILE (the cluster file it writes)");
        return EXIT_USAGE;
    }
    Cluster cl;
    cluster_defaults(&cl);
    /* the baseline: MPI is up; BLIS and OpenMP start with the sgemm below,
     * whose own three matrices (8 MiB) are not part of it */
    kernels_init(1, "auto");
    cl.gflops_per_core = kernels_measure_peak_gflops();
    const size_t mats = (size_t)8 << 20, rss = peak_rss();
    const size_t baseline = rss > mats ? rss - mats : rss;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cl.cores_per_node = cores > 0 ? (int)cores : 1;
    cl.mem_per_node_gib = (double)machine_memory() / 1073741824.0;
    kernels_init(cl.cores_per_node, "auto");
    if (rank == 0) cl.mem_bw_gbs = measure_mem_bw();
    measure_shm(&cl.shm_latency_us, &cl.shm_bw_gbs, &cl.shm_cpu_share);
    cl.baseline_mib = (double)baseline / 1048576.0;
    Err err;
    int rc = rank == 0 ? cluster_write(&cl, a->out, &err) : 0;
    if (cmd_agree(rc, &err, MPI_COMM_WORLD) != 0) return EXIT_FAILURE;
    if (rank == 0)
        printf("plan: wrote %s: %d cores, %.1f GiB, sgemm %.1f GFLOP/s a core, memory %.1f GB/s, "
               "MPI on a node %.2f us and %.2f GB/s, all-reduces %.0f%% on the cores%s; the "
               "network, file system and efficiency "
               "are stated defaults to edit\n",
               a->out, cl.cores_per_node, cl.mem_per_node_gib, cl.gflops_per_core, cl.mem_bw_gbs,
               cl.shm_latency_us, cl.shm_bw_gbs, 100 * cl.shm_cpu_share,
               size < 2 ? " (defaults: run under mpirun -np 2 to measure)" : "");
    return EXIT_OK;
}

int plan_main(int argc, char **argv) {
    PlanArgs a;
    int h = plan_args(&a, &argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (a.calibrate) return plan_calibrate(&a);
    int rank;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    Config c;
    config_defaults(&c);
    Cluster cl;
    cluster_defaults(&cl);
    Err err;
    if (!plan_has_model(argc, argv)) {
        if (rank == 0)
            errorf("plan: no model to plan: give --config FILE (or model keys: --n_layer N "
                   "--d_model N ...); without them plan would plan the default model");
        return EXIT_USAGE;
    }
    /* virtual_stages holds for each layout of pp > 1 (plan_layout checks it
     * there), whatever pp the config names */
    Config checked;
    if (config_from_args(&c, argc, argv, &err) != 0 ||
        (checked = c, checked.virtual_stages = 1, config_validate(&checked, &err)) != 0 ||
        (a.cluster && cluster_load(&cl, a.cluster, &err) != 0)) {
        if (rank == 0) err_print(&err);
        return EXIT_USAGE;
    }
    plan_vocab(&c);
    if (rank != 0) return EXIT_OK;
    if (!a.cluster && !a.flops)
        fprintf(stderr,
                "plan: no --cluster FILE: assuming %d node of %d cores, %.0f GiB, %.0f GFLOP/s a "
                "core at %.0f%% (the defaults 'modtrain plan --help' lists; 'plan --calibrate' "
                "measures this machine)\n",
                cl.nodes, cl.cores_per_node, cl.mem_per_node_gib, cl.gflops_per_core,
                100 * cl.efficiency);
    return a.flops ? plan_flops(&c) : plan_print(&c, &cl, &a);
}
