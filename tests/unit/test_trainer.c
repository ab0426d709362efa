/*
 * test_trainer: drives a trainer in-process through its API (trainer_open,
 * trainer_step, trainer_close): three steps and a save, then a resume from
 * it to the sixth; runs the modtrain binary ($MODTRAIN) on the same config
 * in one go, and compares every step's loss and gradient norm with the
 * binary's, and the last checkpoints with `ckpt diff --tol 0`. The binary
 * runs before MPI_Init and the diff after MPI_Finalize, so that no child
 * process starts inside this one's MPI.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mpi/check.h"
#include "src/base/rng.h"
#include "src/data/data.h"
#include "src/train/trainer.h"
#include "tests/unit/testutil.h"

enum { STEPS = 6, SAVE_AT = 3, MAXLINE = 8192 };

static char dir[256], binary[4096];
static int bin_rc = -1;
static double losses[STEPS + 1];
static int have_losses;

/* The run's arguments (run_dir under dir/NAME), as `modtrain train` takes them. */
static int run_args(const char *name, char **argv, char store[][300]) {
    const char *kv[][2] = {{"--seq_len", "32"},     {"--n_layer", "2"},       {"--n_head", "2"},
                           {"--d_model", "32"},     {"--batch_size", "4"},    {"--micro_batch", "2"},
                           {"--steps", "6"},        {"--ckpt_every", "3"},    {"--lr", "3e-3"},
                           {"--warmup_steps", "2"}, {"--seed", "7"},          {"--log_every", "1000"},
                           {"--peak_gflops", "50"}, {"--threads", "1"},       {"--resume", "auto"},
                           {"--eval_every", "3"},   {"--eval_seqs", "8"},     {"--train_data", ""},
                           {"--val_data", ""},      {"--run_dir", ""}};
    const int n = (int)(sizeof kv / sizeof kv[0]);
    for (int i = 0; i < n; i++) {
        snprintf(store[2 * i], 300, "%s", kv[i][0]);
        if (strcmp(kv[i][0], "--train_data") == 0) snprintf(store[2 * i + 1], 300, "%s/train.bin", dir);
        else if (strcmp(kv[i][0], "--val_data") == 0) snprintf(store[2 * i + 1], 300, "%s/val.bin", dir);
        else if (strcmp(kv[i][0], "--run_dir") == 0) snprintf(store[2 * i + 1], 300, "%s/%s", dir, name);
        else snprintf(store[2 * i + 1], 300, "%s", kv[i][1]);
        argv[2 * i] = store[2 * i];
        argv[2 * i + 1] = store[2 * i + 1];
    }
    return 2 * n;
}

/* A shard of n tokens, runs of letters (a little structure to learn). */
static void write_shard(const char *name, int n, uint64_t seed) {
    uint32_t *tok = malloc((size_t)n * sizeof *tok);
    for (int i = 0; i < n; i++) tok[i] = (uint32_t)('a' + (rng_u64(seed, (uint64_t)i / 5, 0) % 26));
    ShardMeta meta = {.width = 2, .vocab = 256, .tokenizer = SHARD_TOK_BYTE};
    char p[300];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (shard_write(p, tok, (size_t)n, &meta, NULL) != 0) fprintf(stderr, "cannot write %s\n", p);
    free(tok);
}

/* The binary's whole run, before this process starts MPI. */
static void run_binary(void) {
    char store[48][300], *argv[48];
    const int n = run_args("binary", argv, store);
    char cmd[MAXLINE];
    int at = snprintf(cmd, sizeof cmd, "'%s' train", binary);
    for (int i = 0; i < n; i++) at += snprintf(cmd + at, sizeof cmd - (size_t)at, " '%s'", argv[i]);
    snprintf(cmd + at, sizeof cmd - (size_t)at, " > '%s/binary.log' 2>&1", dir);
    const int st = system(cmd);
    bin_rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void quiet(void *ctx, const char *text) { (void)ctx, (void)text; }
static void loud(void *ctx, const char *line) { (void)ctx, fprintf(stderr, "trainer: %s\n", line); }

static Trainer *open_run(TrainStatus *st) {
    char store[48][300], *argv[48];
    const int n = run_args("inproc", argv, store);
    const TrainerOpts o = {.start_s = now_s(), .say = {.log = quiet, .error = loud},
                           .code_stopped = 75, .code_diverged = 65, .code_watchdog = 124};
    Trainer *t;
    Err err;
    *st = trainer_open(&t, n, argv, &o, &err);
    if (*st != TRAIN_STEPPED) fprintf(stderr, "trainer_open: %s\n", err.msg);
    return t;
}

/* Three steps and the save at the third, then a resume to the sixth. */
static void test_steps_save_resume(void) {
    TrainStatus st;
    Err err;
    Trainer *t = open_run(&st);
    CU_ASSERT_EQUAL_FATAL(st, TRAIN_STEPPED);
    CU_ASSERT_EQUAL(trainer_config(t)->steps, STEPS);
    for (int i = 1; i <= SAVE_AT; i++) {
        CU_ASSERT_EQUAL(trainer_step(t, &err), TRAIN_STEPPED);
        CU_ASSERT_EQUAL(trainer_last(t)->step, i);
        losses[i] = trainer_last(t)->loss;
    }
    trainer_close(t); /* abandoned after the save of step 3 */
    t = open_run(&st);
    CU_ASSERT_EQUAL_FATAL(st, TRAIN_STEPPED);
    for (int i = SAVE_AT + 1; i <= STEPS; i++) {
        st = trainer_step(t, &err);
        CU_ASSERT_EQUAL(st, i < STEPS ? TRAIN_STEPPED : TRAIN_DONE);
        CU_ASSERT_EQUAL(trainer_last(t)->step, i);
        losses[i] = trainer_last(t)->loss;
    }
    CU_ASSERT_EQUAL(trainer_step(t, &err), TRAIN_DONE); /* an ended run stays ended */
    trainer_close(t);
    have_losses = 1;
}

/* A metrics.jsonl's value of key on its line of step `step` ("" when none). */
static void metric(const char *run, int step, const char *key, char *out, size_t n) {
    char p[300], line[MAXLINE], want[64], k[64];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", dir, run);
    snprintf(want, sizeof want, "{\"step\":%d,\"samples\":", step);
    snprintf(k, sizeof k, "\"%s\":", key);
    out[0] = '\0';
    FILE *f = fopen(p, "r");
    while (f && fgets(line, sizeof line, f)) {
        const char *v = strstr(line, k);
        if (strncmp(line, want, strlen(want)) != 0 || !v) continue;
        v += strlen(k);
        snprintf(out, n, "%.*s", (int)strcspn(v, ",}"), v);
    }
    if (f) fclose(f);
}

/* Every step's loss, as the binary printed it: the in-process run's bits
 * print the same, and its own metrics lines carry the same loss and
 * gradient norm. */
static void test_losses_match_binary(void) {
    CU_ASSERT_EQUAL_FATAL(bin_rc, 0);
    CU_ASSERT_FATAL(have_losses);
    for (int s = 1; s <= STEPS; s++) {
        char b[64], mine[64], in[64], gb[64], gi[64];
        metric("binary", s, "loss", b, sizeof b);
        metric("inproc", s, "loss", in, sizeof in);
        metric("binary", s, "grad_norm", gb, sizeof gb);
        metric("inproc", s, "grad_norm", gi, sizeof gi);
        snprintf(mine, sizeof mine, "%.6f", losses[s]);
        CU_ASSERT(b[0] != '\0');
        CU_ASSERT_STRING_EQUAL(mine, b);
        CU_ASSERT_STRING_EQUAL(in, b);
        CU_ASSERT_STRING_EQUAL(gi, gb);
        if (strcmp(mine, b) != 0) fprintf(stderr, "step %d: loss %s (%a) in-process, %s binary\n", s, mine, losses[s], b);
    }
}

static int run_cmd(const char *cmd) {
    const int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* After MPI_Finalize: the resumed checkpoint is the binary's, bit for bit. */
static void test_ckpt_diff(void) {
    char cmd[MAXLINE];
    snprintf(cmd, sizeof cmd,
             "'%s' ckpt diff --tol 0 --a '%s/inproc/ckpt/step-%08d' --b '%s/binary/ckpt/step-%08d' > "
             "'%s/diff.log' 2>&1",
             binary, dir, STEPS, dir, STEPS, dir);
    const int rc = run_cmd(cmd);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s/diff.log' >&2", dir);
        run_cmd(cmd);
    }
}

int main(int argc, char **argv) {
    const char *m = getenv("MODTRAIN"), *tmp = getenv("TMPDIR");
    snprintf(binary, sizeof binary, "%s", m && *m ? m : "./modtrain");
    snprintf(dir, sizeof dir, "%s/test_trainer.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return 99;
    write_shard("train.bin", 20000, 7);
    write_shard("val.bin", 2000, 8);
    run_binary();
    int provided;
    mpi_env_defaults();
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    CU_TestInfo inproc[] = {{"three steps, a save, a resume to six", test_steps_save_resume},
                            {"every loss is the binary's", test_losses_match_binary},
                            CU_TEST_INFO_NULL};
    int rc = run_suite("trainer", inproc);
    MPI_Finalize();
    CU_TestInfo diff[] = {{"ckpt diff --tol 0 with the binary's", test_ckpt_diff}, CU_TEST_INFO_NULL};
    const int rc2 = run_suite("trainer checkpoint", diff);
    if (rc == 0 && rc2 == 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        run_cmd(cmd);
    }
    return rc ? rc : rc2;
}
