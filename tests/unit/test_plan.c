/*
 * test_plan: the layout planner's arithmetic. FLOPs are conserved when a
 * pipeline splits the model (one micro-batch: the stages' times add up to
 * the whole model's at the same rate); the tp bytes of a Mixture-of-Depths
 * model follow the count of its all-reduces (routed blocks on their k
 * tokens); layouts that do not fit a node's memory are listed after those
 * that do; cluster files are read strictly, naming the line.
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

int main(void) {
    CU_TestInfo tests[] = {{"a pipeline conserves the FLOPs", test_pipeline_conserves_flops},
                           {"tp bytes of a MoD model, all-reduce by all-reduce", test_tp_bytes_mod},
                           {"fitting layouts first, each by tokens/s", test_fit_order},
                           {"cluster files: strict, line by line, round trip", test_cluster_file},
                           CU_TEST_INFO_NULL};
    return run_suite("plan", tests);
}
