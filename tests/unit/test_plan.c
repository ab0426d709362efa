/*
 * test_plan: the layout planner's arithmetic. FLOPs are conserved when a
 * pipeline splits the model (one micro-batch: the stages' times add up to
 * the whole model's at the same rate); the tp bytes of a Mixture-of-Depths
 * model follow the count of its all-reduces (routed blocks on their k
 * tokens); layouts that do not fit a node's memory are listed after those
 * that do; cluster files are read strictly, naming the line. A stage's
 * memory measured from a block's parts equals its registry's; and the
 * planner's work does not grow with the layers per layout (a node of 55440
 * cores and 4096 blocks: 16247 layouts, planned without building a
 * registry for each stage).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/plan.h"
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
    const int routing[][2] = {{0, 0}, {1, 0}, {2, 0}, {3, 1}, {5, 1}};
    for (size_t k = 0; k < sizeof routing / sizeof routing[0]; k++) {
        Config c = small();
        c.n_layer = 7, c.route_every = routing[k][0];
        c.causal_router = routing[k][1] ? CAUSAL_PREDICTOR : CAUSAL_AUX_LOSS;
        for (int tp = 1; tp <= 2; tp++)
            for (int pp = 1; pp <= 7; pp++)
                for (int s = 0; s < pp; s++) {
                    ModelDims d;
                    model_dims_config(&d, &c, tp, 0);
                    CU_ASSERT_EQUAL_FATAL(model_dims_stage(&d, pp, s, NULL), 0);
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

int main(void) {
    CU_TestInfo tests[] = {
        {"a pipeline conserves the FLOPs", test_pipeline_conserves_flops},
        {"tp bytes of a MoD model, all-reduce by all-reduce", test_tp_bytes_mod},
        {"fitting layouts first, each by tokens/s", test_fit_order},
        {"cluster files: strict, line by line, round trip", test_cluster_file},
        {"stage memory from its parts is the registry's", test_units_match_registry},
        {"the planner's work does not grow with the layers", test_plan_work_bounded},
        {"--layout: exactly three whole numbers", test_parse_layout},
        CU_TEST_INFO_NULL};
    return run_suite("plan", tests);
}
