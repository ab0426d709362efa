/*
 * test_plan: the layout planner's arithmetic. FLOPs are conserved when a
 * pipeline splits the model (one micro-batch: the stages' times add up to
 * the whole model's at the same rate); the tp bytes of a Mixture-of-Depths
 * model follow the count of its all-reduces (routed blocks on their k
 * tokens); recompute's memory, FLOPs and tp and ep bytes are counted by
 * hand; layouts that do not fit a node's memory are listed after those
 * that do; cluster files are read strictly, naming the line. A stage's
 * memory measured from a block's parts equals its registry's (MoE blocks
 * and ep too); an MoE model's memory, FLOPs, all-to-all bytes and time and
 * ep layouts (test_moe_*) are counted by hand; dp_overlap's hidden
 * reduction and zero 1's moments and all-gather follow their rules; and the
 * planner's work does not grow with the layers per layout (a node of 55440
 * cores and 4096 blocks: 16247 layouts, planned without building a
 * registry for each stage). The groups plan counts as spanning nodes are
 * those of the grid's placement, enumerated rank by rank, in every order
 * (test_crossing).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi/dp.h"
#include "mpi/grid.h"
#include "mpi/pipeline.h"
#include "src/kernels/kernels.h"
#include "src/plan/plan.h"
#include "testutil.h"

static Config small(void) {
    Config c;
    config_defaults(&c);
    c.n_layer = 4, c.n_head = 4, c.d_model = 64, c.seq_len = 32, c.vocab_size = 1000;
    c.batch_size = 4, c.micro_batch = 4, c.ckpt_every = 0;
    return c;
}

static void test_pipeline_conserves_flops(void) {
    Config c = small();
    c.route_every = 0;
    Cluster cl1, cl2; /* one rank of one thread; two ranks of one thread */
    cluster_defaults(&cl1);
    cl1.cores_per_node = 1;
    cl2 = cl1;
    cl2.cores_per_node = 2;
    PlanRow one, two;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl1, 1, 1, 1, &one, NULL, NULL), 0);
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl2, 1, 2, 2, &two, NULL, NULL), 0);
    CU_ASSERT(one.threads == 1 && two.threads == 1);
    CU_ASSERT_EQUAL(one.n_micro, 1);
    /* one micro-batch: the slowest stage plus the other (the bubble, which
     * holds that stage's send too) is the whole model at one thread */
    const double whole = one.t_compute, split = two.t_compute + two.t_bubble - two.t_pp;
    CU_ASSERT_DOUBLE_EQUAL(split, whole, 1e-9 * whole);
    CU_ASSERT(two.t_bubble > 0 && one.t_bubble == 0);
    /* each stage sends one micro-batch of activations (or gradients) */
    CU_ASSERT_DOUBLE_EQUAL(two.pp_bytes, 4.0 * 32 * 64 * sizeof(float), 0.5);
}

static void test_tp_bytes_mod(void) {
    Config c = small();
    c.route_every = 2, c.capacity = 0.25; /* blocks 1 and 3 routed, k = 8 of 32 */
    Cluster cl;
    cluster_defaults(&cl);
    PlanRow r;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 2, 1, 2, &r, NULL, NULL), 0);
    const double N = 4 * 32, K = 4 * 8, C = 64;
    /* embedding, 2 dense blocks x 4 all-reduces of N x C, 2 routed of K x C,
     * the loss's 3 N and the head's N x C */
    const double want = 4 * (N * C + 2 * 4 * N * C + 2 * 4 * K * C + 3 * N + N * C);
    CU_ASSERT_DOUBLE_EQUAL(r.tp_bytes, want, 0.5);
    CU_ASSERT(r.dp_bytes == 0 && r.pp_bytes == 0);
}

static void test_fit_order(void) {
    Config c = small();
    c.d_model = 256, c.n_head = 8, c.vocab_size = 50257;
    Cluster cl;
    cluster_defaults(&cl);
    cl.cores_per_node = 4;
    PlanRow full;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 1, &full, NULL, NULL), 0);
    /* room for one whole model per node, not for 4 of them */
    cl.mem_per_node_gib = 1.5 * (double)full.rank_bytes / 1073741824.0;
    PlanRow *rows;
    const int n = plan_candidates(&c, &cl, &rows, NULL);
    CU_ASSERT_FATAL(n > 2);
    int seen_no = 0, fits = 0, nofit = 0;
    for (int i = 0; i < n; i++) {
        if (!rows[i].fits) {
            seen_no = 1, nofit++;
        } else {
            fits++;
            CU_ASSERT(!seen_no); /* every fitting row before the others */
        }
        if (i > 0 && rows[i].fits == rows[i - 1].fits)
            CU_ASSERT(rows[i].tokens_per_s <= rows[i - 1].tokens_per_s);
        CU_ASSERT(rows[i].tp * rows[i].pp * rows[i].dp == rows[i].ranks_per_node);
    }
    CU_ASSERT(fits > 0 && nofit > 0);
    free(rows);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_cluster_file(void) {
    char path[] = "/tmp/modtrain-test-cluster.XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    Cluster cl;
    Err e;
    cluster_defaults(&cl);
    write_text(path, "# a cluster\n\nnodes = 16  # sixteen\ncores_per_node=64\nnet_bw_gbs = 25\n");
    CU_ASSERT_EQUAL(cluster_load(&cl, path, &e), 0);
    CU_ASSERT(cl.nodes == 16 && cl.cores_per_node == 64 && cl.net_bw_gbs == 25);
    Cluster back;
    cluster_defaults(&back);
    CU_ASSERT_EQUAL(cluster_write(&cl, path, &e), 0);
    CU_ASSERT_EQUAL(cluster_load(&back, path, &e), 0);
    CU_ASSERT(back.nodes == 16 && back.cores_per_node == 64 && back.net_bw_gbs == 25);
    const char *bad[][2] = {{"nodes = 2\n\nnodes = 1.5\n", ":3: nodes = '1.5' is not an integer"},
                            {"efficiency = 2\n", "efficiency = '2' is not a number in [0.001, 1]"},
                            {"cores = 4\n", "unknown key 'cores'"},
                            {"nodes 4\n", ":1: expected 'key = value'"},
                            {"nodes = 4 4\n", "nodes = '4 4' is not an integer"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(path, bad[i][0]);
        CU_ASSERT_EQUAL(cluster_load(&cl, path, &e), -1);
        if (!strstr(e.msg, bad[i][1])) fprintf(stderr, "got '%s'\n", e.msg);
        CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, bad[i][1]));
    }
    remove(path);
    CU_ASSERT_EQUAL(cluster_load(&cl, path, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "cannot open '"));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "cluster file"));
}

/* model_memory from the parts (model_units) against the registry built
 * row by row, stage by stage, dense, routed and with a predictor. */
static void test_units_match_registry(void) {
    /* route_every, predictor, n_expert (moe_every 2), ep */
    const int routing[][4] = {{0, 0, 0, 1}, {1, 0, 0, 1}, {2, 0, 0, 1}, {3, 1, 0, 1},
                              {5, 1, 0, 1}, {0, 0, 4, 1}, {0, 0, 4, 2}, {3, 0, 4, 4}};
    for (size_t k = 0; k < sizeof routing / sizeof routing[0]; k++) {
        Config c = small();
        c.n_layer = 7, c.route_every = routing[k][0];
        c.causal_router = routing[k][1] ? CAUSAL_PREDICTOR : CAUSAL_AUX_LOSS;
        c.n_expert = routing[k][2], c.moe_every = 2, c.expert_top_k = 2;
        for (int tp = 1; tp <= 2; tp++)
            for (int pp = 1; pp <= 7; pp++)
                for (int s = 0, vs = 1 + (pp * 2 <= 7); s < pp; s++) {
                    ModelDims d;
                    model_dims_config(&d, &c, tp, 0);
                    model_dims_ep(&d, routing[k][3], routing[k][3] - 1);
                    /* two chunks a rank (interleaved) where the blocks allow */
                    CU_ASSERT_EQUAL_FATAL(model_dims_stage(&d, pp, vs, s, NULL), 0);
                    ParamInfo *reg = NULL;
                    const int n = model_registry(&d, &reg);
                    size_t floats = 0;
                    for (int i = 0; i < n; i++) floats += (reg[i].numel + 15) & ~(size_t)15;
                    free(reg);
                    ModelMemory mm;
                    model_memory(&d, 3, 2, 1, &mm);
                    CU_ASSERT_EQUAL(mm.params, floats * sizeof(float));
                    CU_ASSERT_EQUAL(mm.total, mm.params * 4 + mm.acts + mm.scratch);
                }
    }
}

/* The pipeline's schedules, simulated: each rank runs its pp_order, an
 * operation starting when the rank is free and its input has arrived
 * (sends take no time and never block, as pp_run's); a chunk's forward
 * costs tf / v and its backward tb / v. Every schedule completes (no rank
 * waits for an operation that never comes), each chunk runs each
 * micro-batch forward then backward once, in micro-batch order, with at
 * most pp_sets of them in flight, reached; virtual stages take the blocks in
 * order, every block once; the bubble (idle over the step) is within 2
 * points of (p - 1) / (v m + p - 1), and exact for plain 1F1B. */
static double simulate(int p, int v, int m, double tf, double tb) {
    enum { MAXP = 8, MAXV = 4, MAXM = 32 };
    static PpOp ops[MAXP][2 * MAXM * MAXV];
    static double fdone[MAXP * MAXV][MAXM], bdone[MAXP * MAXV][MAXM];
    int n[MAXP], pos[MAXP] = {0}, left = 0, next_f[MAXP][MAXV] = {{0}}, next_b[MAXP][MAXV] = {{0}};
    int live[MAXP] = {0}, most[MAXP] = {0}, sets[MAXP];
    double clock[MAXP] = {0};
    for (int t = 0; t < p * v; t++)
        for (int mb = 0; mb < m; mb++) fdone[t][mb] = bdone[t][mb] = -1;
    for (int r = 0; r < p; r++) {
        n[r] = pp_order(PP_1F1B, m, v, r, p, ops[r]);
        CU_ASSERT_EQUAL(n[r], 2 * m * v);
        sets[r] = pp_sets(PP_1F1B, m, v, r, p);
        left += n[r];
    }
    while (left > 0) {
        int moved = 0;
        for (int r = 0; r < p; r++)
            while (pos[r] < n[r]) {
                const PpOp o = ops[r][pos[r]];
                const int t = o.chunk * p + r;
                /* the input: the previous virtual stage's forward, the
                 * next one's backward, or the last's own forward */
                const double in = o.fwd ? (t > 0 ? fdone[t - 1][o.mb] : 0)
                                        : (t < p * v - 1 ? bdone[t + 1][o.mb] : fdone[t][o.mb]);
                if (in < 0) break;
                int *next = o.fwd ? &next_f[r][o.chunk] : &next_b[r][o.chunk];
                CU_ASSERT_EQUAL(o.mb, *next); /* in micro-batch order */
                (*next)++;
                live[r] += o.fwd ? 1 : -1;
                if (live[r] > most[r]) most[r] = live[r];
                clock[r] = (clock[r] > in ? clock[r] : in) + (o.fwd ? tf : tb) / v;
                (o.fwd ? fdone : bdone)[t][o.mb] = clock[r];
                pos[r]++, left--, moved = 1;
            }
        if (!moved) {
            CU_FAIL("a pipeline schedule deadlocks");
            return -1;
        }
    }
    double span = 0;
    for (int r = 0; r < p; r++) {
        span = clock[r] > span ? clock[r] : span;
        CU_ASSERT(live[r] == 0 && most[r] == sets[r]);
        /* Megatron's warm-up and one more; plain 1F1B's pp - r */
        const int want = v == 1 ? p - r : (p - r - 1) * 2 + (v - 1) * p + 1;
        CU_ASSERT_EQUAL(sets[r], want < m * v ? want : m * v);
    }
    return 1 - m * (tf + tb) / span; /* every rank computes m (tf + tb) */
}

static void test_pp_schedules(void) {
    double worst = 0;
    for (int p = 2; p <= 8; p++)
        for (int v = 1; v <= 4; v++)
            for (int m = p; m <= 32; m += p) {
                const double want = (p - 1.0) / (v * m + p - 1.0);
                for (int k = 0; k < 2; k++) {
                    const double b = simulate(p, v, m, 1.0, k ? 2.0 : 1.0);
                    if (b < 0) return;
                    CU_ASSERT_DOUBLE_EQUAL(b, want, 1e-9);
                    if (fabs(b - want) > worst) worst = fabs(b - want);
                }
                /* the blocks: virtual stage k p + s is rank s's chunk k */
                Config c = small();
                c.n_layer = p * v + 3;
                int held = 0, next = 0;
                for (int t = 0; t < p * v; t++) {
                    ModelDims d;
                    model_dims_config(&d, &c, 1, 0);
                    CU_ASSERT_EQUAL_FATAL(model_dims_stage(&d, p, v, t % p, NULL), 0);
                    CU_ASSERT_EQUAL(d.nchunk, v);
                    CU_ASSERT_EQUAL(d.c0[t / p], next);
                    next = d.c1[t / p];
                    if (t < p) held += model_stage_blocks(&d);
                }
                CU_ASSERT_EQUAL(next, c.n_layer);
                CU_ASSERT_EQUAL(held, c.n_layer);
            }
    printf("\n  interleaved bubble: at most %.4f from (p - 1) / (v m + p - 1)\n", worst);
    CU_ASSERT(worst <= 0.02);
}

/* A node of 55440 cores (120 divisors) and 4096 blocks: every layout is
 * planned from a few registry rows, not from a registry of every stage (the
 * old planner built over 100 000 rows a layout: minutes for this one). */
static void test_plan_work_bounded(void) {
    Config c = small();
    c.n_layer = 4096, c.n_head = 2520, c.d_model = 5040, c.seq_len = 16, c.vocab_size = 50257;
    c.route_every = 2, c.capacity = 0.5, c.batch_size = 55440 * 302, c.micro_batch = 0;
    Cluster cl;
    cluster_defaults(&cl);
    cl.nodes = 1, cl.cores_per_node = 55440;
    PlanRow *rows;
    const size_t before = model_registry_rows_built();
    const int n = plan_candidates(&c, &cl, &rows, NULL);
    const size_t built = model_registry_rows_built() - before;
    CU_ASSERT_EQUAL_FATAL(n, 16247);
    if (built > 64 * ((size_t)n + 1))
        fprintf(stderr, "%zu registry rows for %d layouts\n", built, n);
    CU_ASSERT(built <= 64 * ((size_t)n + 1));
    CU_ASSERT(rows[0].tp == 1 && rows[0].pp == 1 && rows[0].dp == 1);
    free(rows);
}

/* An MoE model (4 blocks, 4 experts of width 4C, top 2) on 2 ranks, ep 2:
 * the plan's memory is model_memory's of the dims with ep 2 and what
 * model_init allocates; the experts' floats are a hand count of their
 * tensors; the experts' gradients leave dp (dp / ep = 1); FLOPs per token
 * are model_flops_per_token_moe's and a hand count; the all-to-all bytes
 * and time follow 4 all-to-alls of (ep - 1) / ep of micro x T x k rows a
 * block. */
static Config moe_config(void) {
    Config c = small();
    c.route_every = 0, c.micro_batch = 0;
    c.n_expert = 4, c.expert_top_k = 2, c.ep = 2;
    return c;
}

static void test_moe_memory(void) {
    Config c = moe_config();
    Cluster cl;
    cluster_defaults(&cl);
    cl.cores_per_node = 2;
    PlanRow r;
    size_t stage[1];
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 2, &r, stage, NULL), 0);
    CU_ASSERT(r.dp == 2 && r.ep == 2 && r.micro == 2);
    ModelDims d;
    model_dims_config(&d, &c, 1, 0);
    model_dims_ep(&d, 2, 1);
    ModelMemory mm;
    model_memory(&d, 2, 1, 1, &mm);
    model_memory_threads(&mm, &d, r.threads); /* each thread's own buffers */
    CU_ASSERT_EQUAL(r.mem.threads, (size_t)r.threads * kernels_thread_bytes(d.hs));
    CU_ASSERT(r.mem.threads > 0);
    CU_ASSERT_EQUAL(r.mem.params, mm.params);
    CU_ASSERT_EQUAL(r.mem.acts, mm.acts);
    /* dp_overlap's collectives in flight: a temporary of a chunk each */
    const size_t chunk = DP_BUCKET * sizeof(float) < mm.grads ? DP_BUCKET * sizeof(float) : mm.grads;
    CU_ASSERT_EQUAL(r.mem.scratch, mm.scratch + DP_INFLIGHT * chunk);
    CU_ASSERT_EQUAL(r.mem.total, mm.total + r.mem.data + DP_INFLIGHT * chunk);
    /* the embedding's rows: at most one per token of the step (over dp) */
    const double rows = (double)(c.batch_size * c.seq_len < d.Vl ? c.batch_size * c.seq_len : d.Vl);
    CU_ASSERT_DOUBLE_EQUAL(r.dp_rows_bytes, rows * d.C * sizeof(float), 0.5);
    Model m;
    model_init(&m, &d, 2, NULL);
    CU_ASSERT_EQUAL(m.nparams * sizeof(float), r.mem.params);
    /* 4 blocks x 2 experts of c_fc (64 x 256, 256) and c_proj (256 x 64, 64) */
    const size_t ex = 4 * 2 * (64 * 256 + 256 + 256 * 64 + 64);
    CU_ASSERT_EQUAL(m.expert_floats, ex);
    CU_ASSERT_EQUAL(plan_expert_params(&c), 2 * ex);
    CU_ASSERT_DOUBLE_EQUAL(r.dp_bytes, (double)(m.nparams - ex) * sizeof(float) + r.dp_rows_bytes, 0.5);
    CU_ASSERT(r.dp_expert_bytes == 0);
    model_free(&m);
    /* ep 1: every expert on each rank, every gradient over dp */
    c.ep = 1;
    PlanRow one;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 2, &one, NULL, NULL), 0);
    model_dims_ep(&d, 1, 0);
    model_memory(&d, 2, 1, 1, &mm);
    CU_ASSERT_EQUAL(one.mem.params, mm.params);
    CU_ASSERT_EQUAL(one.mem.params - r.mem.params, ex * sizeof(float));
    CU_ASSERT_DOUBLE_EQUAL(one.dp_bytes, (double)mm.params + one.dp_rows_bytes, 0.5);
    CU_ASSERT(one.ep == 1 && one.ep_bytes == 0 && one.t_ep == 0);
}

static void test_moe_flops(void) {
    Config c = moe_config();
    c.ep = 1;
    Cluster cl;
    cluster_defaults(&cl);
    cl.cores_per_node = 1;
    ModelDims d;
    model_dims_config(&d, &c, 1, 0);
    const double C = 64, T = 32, Fe = 256, E = 4;
    /* the head, and 4 blocks: attention, 2 experts a token, the router */
    const double hand = 6 * 1000 * C + 4 * (6 * (4 * C * C + 2 * 2 * C * Fe + C * E) + 12 * T * C);
    const double fpt = plan_flops_per_token(&c);
    CU_ASSERT_DOUBLE_EQUAL(fpt, model_flops_per_token_moe(&d, 32, NULL, NULL), 1e-9 * fpt);
    CU_ASSERT_DOUBLE_EQUAL(fpt, hand, 1e-9 * hand);
    PlanRow r;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 1, &r, NULL, NULL), 0);
    CU_ASSERT_DOUBLE_EQUAL(r.flops_step, fpt * 4 * 32, 1e-9 * r.flops_step);
    /* one rank: the step's compute is the model's FLOPs at its rate */
    const double rate = cl.gflops_per_core * 1e9 * cl.efficiency;
    CU_ASSERT_DOUBLE_EQUAL(r.t_compute * rate, r.flops_step, 1e-9 * r.flops_step);
}

/* A llama model (grouped-query attention, 4 heads over 2 kv heads, SwiGLU
 * of width 96, an untied head): FLOPs per token are a hand count of its
 * matrices (q and o C x C, k and v C x 2 hs, gate, up and down C x F, the
 * head) and model_flops_per_token's; its parameters a hand count of its
 * tensors, and the plan's memory model_memory's; tp 2 splits what it
 * should (a kv head each). */
static void test_llama_plan(void) {
    Config c = small();
    c.route_every = 0, c.arch = ARCH_LLAMA, c.n_kv_head = 2, c.d_ff = 96;
    Cluster cl;
    cluster_defaults(&cl);
    cl.cores_per_node = 1;
    ModelDims d;
    model_dims_config(&d, &c, 1, 0);
    const double C = 64, T = 32, F = 96, kv = 2 * 16, V = 1000;
    const double hand = 6 * V * C + 4 * (6 * (2 * C * C + 2 * C * kv + 3 * C * F) + 12 * T * C);
    const double fpt = plan_flops_per_token(&c);
    CU_ASSERT_DOUBLE_EQUAL(fpt, model_flops_per_token(&d, 32, NULL), 1e-9 * fpt);
    CU_ASSERT_DOUBLE_EQUAL(fpt, hand, 1e-9 * hand);
    PlanRow r;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 1, &r, NULL, NULL), 0);
    const double rate = cl.gflops_per_core * 1e9 * cl.efficiency;
    CU_ASSERT_DOUBLE_EQUAL(r.t_compute * rate, r.flops_step, 1e-9 * r.flops_step);
    /* wte and lm_head, 4 blocks of two norms, qkv (C x (C + 2 kv)), o, gate|up, down; ln_f */
    const size_t floats = (size_t)(2 * V * C + 4 * (2 * C + C * (C + 2 * kv) + C * C + C * 2 * F + F * C) + C);
    Model m;
    model_init(&m, &d, 4, NULL);
    CU_ASSERT_EQUAL(m.nparams, floats);
    CU_ASSERT_EQUAL(model_num_params(&m), floats);
    model_free(&m);
    ModelMemory mm;
    model_memory(&d, 4, 1, 1, &mm);
    CU_ASSERT_EQUAL(r.mem.params, mm.params);
    CU_ASSERT_EQUAL(r.mem.acts, mm.acts);
    /* tp 2: half of every split tensor, the norms whole on each rank */
    Cluster cl2 = cl;
    cl2.cores_per_node = 2;
    PlanRow two;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl2, 2, 1, 2, &two, NULL, NULL), 0);
    const size_t half = (size_t)(V * C + 4 * (2 * C + (C * (C + 2 * kv) + C * C + C * 2 * F + F * C) / 2) + C);
    CU_ASSERT_EQUAL(two.mem.params, half * sizeof(float));
    /* a kv head each: tp 4 would split 2 kv heads, no plan */
    Err e;
    c.n_head = 4;
    Cluster cl4 = cl;
    cl4.cores_per_node = 4;
    CU_ASSERT_EQUAL(plan_layout(&c, &cl4, 4, 1, 4, &two, NULL, &e), -1);
}

/* Interleaved 1F1B in the plan: at pp 2 over 4 micro-batches, v = 2 halves
 * the fill and drain (the same blocks a rank, in two chunks), crosses three
 * boundaries a micro-batch on each rank where plain 1F1B crosses one, and
 * keeps the sets pp_sets counts, each of a chunk's blocks; gpipe,
 * and micro-batches that are not a multiple of pp, are refused. */
static void test_interleaved(void) {
    Config c = small();
    c.batch_size = 8, c.micro_batch = 2, c.vocab_size = 64, c.route_every = 0;
    Cluster cl;
    cluster_defaults(&cl);
    cl.cores_per_node = 2;
    PlanRow one, two;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 2, 2, &one, NULL, NULL), 0);
    c.virtual_stages = 2;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 2, 2, &two, NULL, NULL), 0);
    CU_ASSERT(one.vs == 1 && two.vs == 2 && one.n_micro == 4);
    CU_ASSERT(one.t_bubble > 0);
    /* the other stage's micro-batch over 2, its three sends a micro-batch
     * where plain 1F1B has one */
    CU_ASSERT_DOUBLE_EQUAL(2 * two.t_bubble, one.t_bubble + 2 * one.t_pp / 4, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(two.t_compute, one.t_compute, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(two.pp_bytes, 3 * one.pp_bytes, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(two.t_pp, 3 * one.t_pp, 1e-12 + 1e-9 * two.t_pp);
    /* rank 0 has at most 5 chunks of micro-batches in flight: 5 sets of
     * a block (and a set's own rows) against 2 sets of 2 blocks */
    CU_ASSERT_EQUAL(pp_sets(PP_1F1B, 4, 2, 0, 2), 5);
    CU_ASSERT(two.mem.acts > one.mem.acts);
    /* pp 1: no interleaving to do */
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 2, &one, NULL, NULL), 0);
    CU_ASSERT_EQUAL(one.vs, 1);
    Err err;
    c.batch_size = 6;
    CU_ASSERT_EQUAL(plan_layout(&c, &cl, 1, 2, 2, &two, NULL, &err), -1);
    CU_ASSERT(strstr(err.msg, "multiple of pp 2") != NULL);
    c.batch_size = 8, c.schedule = SCHED_GPIPE;
    CU_ASSERT_EQUAL(plan_layout(&c, &cl, 1, 2, 2, &two, NULL, &err), -1);
    c.schedule = SCHED_1F1B, c.virtual_stages = 4; /* 8 virtual stages of 4 blocks */
    CU_ASSERT_EQUAL(plan_layout(&c, &cl, 1, 2, 2, &two, NULL, &err), -1);
}

static void test_moe_alltoall(void) {
    Config c = moe_config();
    Cluster cl;
    cluster_defaults(&cl);
    cl.cores_per_node = 2;
    PlanRow r;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 2, &r, NULL, NULL), 0);
    /* 4 blocks x 4 all-to-alls x 1/2 of 2 x 32 x 2 rows of 64 floats */
    CU_ASSERT_DOUBLE_EQUAL(r.ep_bytes, 4 * 4 * 0.5 * (2 * 32 * 2) * 64 * 4, 0.5);
    const double a = cl.shm_latency_us * 1e-6, b = cl.shm_bw_gbs * 1e9;
    const double t = 4 * (4 * a + 4 * 0.5 * 128 * 64 * 4 / b) + 4 * (a + 0.5 * 4 * 4 / b);
    CU_ASSERT_DOUBLE_EQUAL(r.t_ep, t, 1e-9 * t);
    CU_ASSERT(r.t_step > r.t_compute + r.t_ep);
    /* MoDE: blocks 1 and 3 routed at 8 of 32 tokens send their k x 8 rows */
    c.route_every = 2, c.capacity = 0.25;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 2, &r, NULL, NULL), 0);
    CU_ASSERT_DOUBLE_EQUAL(r.ep_bytes, 4 * 0.5 * (2 * 128 + 2 * 32) * 64 * 4, 0.5);
    /* across nodes (tp x ep = 2 ranks over 1 a node): the network's */
    c.route_every = 0;
    cl.nodes = 2, cl.cores_per_node = 1;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 1, &r, NULL, NULL), 0);
    const double na = cl.net_latency_us * 1e-6, nb = cl.net_bw_gbs * 1e9;
    const double tn = 4 * (4 * na + 4 * 0.5 * 128 * 64 * 4 / nb) + 4 * (na + 0.5 * 4 * 4 / nb);
    CU_ASSERT_DOUBLE_EQUAL(r.t_ep, tn, 1e-9 * tn);
}

/* Recompute: a stage's activations are model_memory's of the mode (none >
 * attention > block); block runs every block's forward again, a third of
 * its FLOPs, with its 2 tp all-reduces (a routed block's of its k
 * tokens) and an MoE block's 2 all-to-alls of rows; attention runs ln1, the
 * qkv product and the heads again, without communication. */
static void test_recompute(void) {
    Config c = small();
    c.route_every = 2, c.capacity = 0.25; /* blocks 1 and 3 routed, k = 8 of 32 */
    Cluster cl;
    cluster_defaults(&cl);
    PlanRow r[3];
    for (Recompute rc = RECOMPUTE_NONE; rc <= RECOMPUTE_BLOCK; rc++) {
        c.recompute = rc;
        CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 2, 1, 2, &r[rc], NULL, NULL), 0);
        ModelDims d;
        model_dims_config(&d, &c, 2, 0);
        d.recompute = rc;
        ModelMemory mm;
        model_memory(&d, 4, 1, 1, &mm);
        CU_ASSERT_EQUAL(r[rc].mem.acts, mm.acts);
    }
    CU_ASSERT(r[0].mem.acts > r[1].mem.acts && r[1].mem.acts > r[2].mem.acts);
    const double N = 4 * 32, K = 4 * 8, C = 64, T = 32, k = 8;
    CU_ASSERT_DOUBLE_EQUAL(r[1].tp_bytes, r[0].tp_bytes, 0.5);
    CU_ASSERT_DOUBLE_EQUAL(r[2].tp_bytes - r[0].tp_bytes, 4 * (2 * 2 * N * C + 2 * 2 * K * C), 0.5);
    /* the FLOPs a rank adds: 2 dense blocks, 2 routed on K rows (the router on N) */
    const double rate = r[0].threads * cl.gflops_per_core * 1e9 * cl.efficiency / r[0].n_micro;
    const double att = (2 * N * (6 * C * C + 4 * T * C) + 2 * K * (6 * C * C + 4 * k * C)) / 2;
    const double blk =
        (2 * N * (24 * C * C + 4 * T * C) + 2 * K * (24 * C * C + 4 * k * C)) / 2 + 2 * N * 2 * C;
    CU_ASSERT_DOUBLE_EQUAL((r[1].t_compute - r[0].t_compute) * rate, att, 1e-6 * att);
    CU_ASSERT_DOUBLE_EQUAL((r[2].t_compute - r[0].t_compute) * rate, blk, 1e-6 * blk);
    CU_ASSERT(r[0].flops_step == r[2].flops_step); /* the model's FLOPs, for MFU */
    /* MoE under ep 2: 6 all-to-alls of rows a block instead of 4 */
    c = moe_config();
    PlanRow e[3];
    cl.cores_per_node = 2;
    for (Recompute rc = RECOMPUTE_NONE; rc <= RECOMPUTE_BLOCK; rc++) {
        c.recompute = rc;
        CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 2, &e[rc], NULL, NULL), 0);
    }
    CU_ASSERT_DOUBLE_EQUAL(e[1].ep_bytes, e[0].ep_bytes, 0.5);
    CU_ASSERT_DOUBLE_EQUAL(e[2].ep_bytes, 1.5 * e[0].ep_bytes, 0.5);
    CU_ASSERT(e[0].ep_bytes > 0 && e[2].t_ep > e[0].t_ep);
}

/* dp's reduction: dp_overlap 0 waits for all of it; dp_overlap 1 hides up
 * to the last micro-batch's backward (two thirds of its compute), never
 * the last bucket, nor the share of it that keeps the cores busy; zero 1
 * holds a dp rank's share of the moments, updates its share, and waits
 * for the all-gather (half the traffic) besides. */
static void test_dp_overlap_zero(void) {
    Config c = small();
    c.batch_size = 16, c.micro_batch = 4;
    Cluster cl;
    cluster_defaults(&cl);
    cl.cores_per_node = 4;
    cl.shm_cpu_share = 0; /* a transport that moves the bytes by itself */
    PlanRow after, over, zero;
    c.dp_overlap = 0;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 4, &after, NULL, NULL), 0);
    CU_ASSERT_EQUAL(after.dp, 4);
    CU_ASSERT(after.t_dp > 0 && after.t_dp == after.t_dp_all);
    c.dp_overlap = 1;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 4, &over, NULL, NULL), 0);
    CU_ASSERT(over.t_dp == after.t_dp); /* one 25 MiB bucket holds every gradient: nothing hides */
    c.dp_bucket_mb = 0; /* a bucket a block */
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 4, &over, NULL, NULL), 0);
    const double window = 2.0 / 3.0 * over.t_compute / over.n_micro;
    CU_ASSERT_DOUBLE_EQUAL(over.t_dp_all, after.t_dp_all, 1e-15);
    CU_ASSERT(over.t_dp > 0 && over.t_dp >= after.t_dp - window - 1e-12);
    CU_ASSERT(over.t_dp < after.t_dp);
    CU_ASSERT_DOUBLE_EQUAL(over.t_step, after.t_step - (after.t_dp - over.t_dp), 1e-12);
    /* the cores busy with it: that share stays seen, all of it at 1 */
    PlanRow busy;
    cl.shm_cpu_share = 0.9;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 4, &busy, NULL, NULL), 0);
    CU_ASSERT_DOUBLE_EQUAL(busy.t_dp, 0.9 * after.t_dp, 1e-12 * after.t_dp);
    cl.shm_cpu_share = 1;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 4, &busy, NULL, NULL), 0);
    CU_ASSERT_DOUBLE_EQUAL(busy.t_dp, after.t_dp, 1e-12 * after.t_dp);
    cl.shm_cpu_share = 0;
    c.zero = 1;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 4, &zero, NULL, NULL), 0);
    CU_ASSERT_EQUAL(zero.mem.moments, over.mem.moments / 4);
    CU_ASSERT_EQUAL(zero.mem.total, over.mem.total - (over.mem.moments - over.mem.moments / 4));
    CU_ASSERT_DOUBLE_EQUAL(zero.t_optimizer, over.t_optimizer / 4, 1e-15);
    /* without the overlap: the reduce-scatter (half the traffic) shows
     * whole; the all-gather hides behind a third of the next micro-batch's
     * compute, but for the embedding's share of it, which the forward
     * waits for first */
    c.dp_overlap = 0;
    PlanRow zs;
    CU_ASSERT_EQUAL_FATAL(plan_layout(&c, &cl, 1, 1, 4, &zs, NULL, NULL), 0);
    ModelDims d;
    model_dims_config(&d, &c, 1, 0);
    const double gather = zs.t_dp_all / 2, fwd = zs.t_compute / zs.n_micro / 3;
    const double first = gather * ((double)d.Vl * d.C * sizeof(float) / zs.dp_bytes);
    CU_ASSERT(first > 0 && first < gather);
    CU_ASSERT_DOUBLE_EQUAL(zs.t_dp, gather + (gather - fwd > first ? gather - fwd : first),
                           1e-12 * zs.t_dp_all);
    CU_ASSERT(zs.t_dp < zs.t_dp_all);
}

/* The candidates of an MoE config: ep over the divisors of dp that divide
 * n_expert (1 always); the config's ep above 1 keeps its own. */
static void test_moe_candidates(void) {
    Config c = moe_config();
    c.ep = 1, c.batch_size = 8;
    Cluster cl;
    cluster_defaults(&cl);
    cl.cores_per_node = 4;
    PlanRow *rows;
    int n = plan_candidates(&c, &cl, &rows, NULL);
    CU_ASSERT_FATAL(n > 0);
    int seen[5] = {0, 0, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        CU_ASSERT(rows[i].dp % rows[i].ep == 0 && 4 % rows[i].ep == 0);
        if (rows[i].dp == 4) seen[rows[i].ep]++;
    }
    CU_ASSERT(seen[1] == 1 && seen[2] == 1 && seen[4] == 1);
    free(rows);
    c.ep = 2;
    n = plan_candidates(&c, &cl, &rows, NULL);
    CU_ASSERT_FATAL(n > 0);
    for (int i = 0; i < n; i++) CU_ASSERT(rows[i].ep == 2);
    free(rows);
    /* a dense config: ep 1 everywhere, as before */
    c = small();
    n = plan_candidates(&c, &cl, &rows, NULL);
    for (int i = 0; i < n; i++) CU_ASSERT(rows[i].ep == 1 && rows[i].ep_bytes == 0);
    free(rows);
}

static void test_parse_layout(void) {
    int tp = 0, pp = 0, rpn = 0;
    CU_ASSERT(plan_parse_layout("2,4,8", &tp, &pp, &rpn) == 0 && tp == 2 && pp == 4 && rpn == 8);
    const char *bad[] = {"1,,2,2",
                         "1,2,2,",
                         ",1,2",
                         "1,2",
                         "1,2,2,2",
                         "",
                         ",,",
                         "1,2,x",
                         "1,2,2.0",
                         " 1,2,2",
                         "1,2,0",
                         "1,2,1048577",
                         "1,2,99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CU_ASSERT_EQUAL(plan_parse_layout(bad[i], &tp, &pp, &rpn), -1);
}

/* Rank by rank, as the grid places them: the slot's coordinates in the
 * order, and for each axis the groups whose members sit on more than one
 * node (a group: the ranks equal in the other two coordinates). */
static void naive_crossing(int nodes, int rpn, const int size[3], const int axes[3], int out[3]) {
    const int world = nodes * rpn;
    int coord[64][3];
    for (int slot = 0; slot < world; slot++)
        for (int i = 0, stride = 1; i < 3; stride *= size[axes[i]], i++)
            coord[slot][axes[i]] = slot / stride % size[axes[i]];
    for (int a = 0; a < 3; a++) {
        out[a] = 0;
        for (int first = 0; first < world; first++) {
            if (coord[first][a] != 0) continue; /* a group, by its first member */
            int crosses = 0;
            for (int r = 0; r < world; r++) {
                int same = 1;
                for (int b = 0; b < 3; b++) same &= b == a || coord[r][b] == coord[first][b];
                crosses |= same && r / rpn != first / rpn;
            }
            out[a] += crosses;
        }
    }
}

static void test_crossing(void) {
    Config c = small();
    c.n_layer = 12, c.n_head = 12, c.d_model = 96, c.d_ff = 96 * 4, c.batch_size = 48;
    c.micro_batch = 0;
    int compared = 0, spanning = 0;
    for (int nodes = 2; nodes <= 4; nodes++)
        for (int rpn = 1; rpn <= 6; rpn++)
            for (int tp = 1; tp <= nodes * rpn; tp++)
                for (int pp = 1; pp <= nodes * rpn / tp; pp++)
                    for (int order = ORDER_TP_DP_PP; order <= ORDER_PP_DP_TP; order++) {
                        Cluster cl;
                        cluster_defaults(&cl);
                        cl.nodes = nodes, cl.cores_per_node = rpn;
                        c.rank_order = (RankOrder)order;
                        PlanRow r;
                        if (plan_layout(&c, &cl, tp, pp, rpn, &r, NULL, NULL) != 0) continue;
                        int axes[3], want[3];
                        const int size[3] = {r.tp, r.dp, r.pp};
                        CU_ASSERT_EQUAL_FATAL(grid_parse_order(config_order_name(r.order), axes),
                                              0);
                        naive_crossing(nodes, rpn, size, axes, want);
                        for (int a = 0; a < 3; a++) {
                            CU_ASSERT_EQUAL(r.crossing[a], want[a]);
                            spanning += want[a] > 0;
                        }
                        compared++;
                    }
    CU_ASSERT(compared > 300 && spanning > 300);
    int axes[3];
    const char *bad[] = {"tp-dp", "tp-tp-pp", "tp-dp-pp-", "TP-DP-PP", "tp_dp_pp", "", "tp-dp-px"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CU_ASSERT_EQUAL(grid_parse_order(bad[i], axes), -1);
    CU_ASSERT(grid_parse_order("pp-tp-dp", axes) == 0 && axes[0] == AXIS_PP && axes[2] == AXIS_DP);
}

int main(void) {
    CU_TestInfo tests[] = {
        {"a pipeline conserves the FLOPs", test_pipeline_conserves_flops},
        {"tp bytes of a MoD model, all-reduce by all-reduce", test_tp_bytes_mod},
        {"recompute: memory, FLOPs, tp and ep bytes", test_recompute},
        {"fitting layouts first, each by tokens/s", test_fit_order},
        {"cluster files: strict, line by line, round trip", test_cluster_file},
        {"stage memory from its parts is the registry's", test_units_match_registry},
        {"pipeline schedules: complete, in order, the bubble", test_pp_schedules},
        {"interleaved 1F1B: the bubble over v, v times the boundaries", test_interleaved},
        {"the planner's work does not grow with the layers", test_plan_work_bounded},
        {"--layout: exactly three whole numbers", test_parse_layout},
        {"MoE under ep 2: memory is model_memory's and model_init's", test_moe_memory},
        {"MoE FLOPs: one expert a slot and the router", test_moe_flops},
        {"llama: FLOPs, parameters and tp by hand", test_llama_plan},
        {"MoE all-to-all bytes and time by hand", test_moe_alltoall},
        {"MoE candidates search ep", test_moe_candidates},
        {"dp_overlap hides the reduction, zero 1 shards the moments", test_dp_overlap_zero},
        {"groups across nodes are the grid's, in every order", test_crossing},
        CU_TEST_INFO_NULL};
    return run_suite("plan", tests);
}
