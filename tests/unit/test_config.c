/*
 * test_config: key parsing, ranges, files, command-line overrides and the
 * checks between keys.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/config/config.h"
#include "testutil.h"

static void test_defaults(void) {
    Config c;
    config_defaults(&c);
    CU_ASSERT_DOUBLE_EQUAL(c.capacity, 0.125, 0);
    CU_ASSERT_EQUAL(c.route_every, 2);
    CU_ASSERT_EQUAL(c.tp, 1);
    CU_ASSERT_EQUAL(c.pp, 1);
    CU_ASSERT_EQUAL(c.schedule, SCHED_1F1B);
    CU_ASSERT_EQUAL(c.recompute, RECOMPUTE_NONE);
    CU_ASSERT_STRING_EQUAL(c.resume, "auto");
    CU_ASSERT_DOUBLE_EQUAL(c.adam_eps, 1e-8, 0);
}

static void test_set_types_and_ranges(void) {
    Err e;
    Config c;
    config_defaults(&c);
    CU_ASSERT_EQUAL(config_set(&c, "batch_size", "16", "t", &e), 0);
    CU_ASSERT_EQUAL(c.batch_size, 16);
    CU_ASSERT_EQUAL(config_set(&c, "batch-size", "12", "t", &e), 0); /* dashes */
    CU_ASSERT_EQUAL(c.batch_size, 12);
    CU_ASSERT_EQUAL(config_set(&c, "batch_size", "12x", "t", &e), -1);
    CU_ASSERT_EQUAL(config_set(&c, "batch_size", "0", "t", &e), -1);
    CU_ASSERT_EQUAL(c.batch_size, 12); /* a rejected value leaves the key alone */
    CU_ASSERT_EQUAL(config_set(&c, "lr", "3e-4", "t", &e), 0);
    CU_ASSERT_DOUBLE_EQUAL(c.lr, 3e-4, 0);
    CU_ASSERT_EQUAL(config_set(&c, "lr", "nan", "t", &e), -1);
    CU_ASSERT_EQUAL(config_set(&c, "capacity", "0", "t", &e), -1); /* open interval */
    CU_ASSERT_EQUAL(config_set(&c, "capacity", "1", "t", &e), 0);
    CU_ASSERT_EQUAL(config_set(&c, "router_gate", "sigmoid", "t", &e), 0);
    CU_ASSERT_EQUAL(c.router_gate, GATE_SIGMOID);
    CU_ASSERT_EQUAL(config_set(&c, "router_gate", "relu", "t", &e), -1);
    CU_ASSERT_EQUAL(config_set(&c, "recompute", "block", "t", &e), 0);
    CU_ASSERT_EQUAL(c.recompute, RECOMPUTE_BLOCK);
    CU_ASSERT_EQUAL(config_set(&c, "recompute", "everything", "--recompute", &e), -1);
    CU_ASSERT_STRING_EQUAL(
        e.msg, "--recompute: recompute = 'everything' is not one of none/attention/block");
    CU_ASSERT_EQUAL(c.recompute, RECOMPUTE_BLOCK);
    CU_ASSERT_EQUAL(config_set(&c, "batch_size", "0", "t", &e), -1);
    CU_ASSERT_STRING_EQUAL(
        e.msg, "t: batch_size = 0 is out of range (expected an integer in [1, 16777216])");
    CU_ASSERT_EQUAL(config_set(&c, "no_such_key", "1", "t", &e), -1);
    CU_ASSERT_EQUAL(config_set(&c, "eval_evry", "1", "run.conf:3", &e), -1);
    CU_ASSERT_STRING_EQUAL(e.msg,
                           "run.conf:3: unknown key 'eval_evry' (did you mean 'eval_every'?)");
    char buf[64];
    CU_ASSERT_EQUAL(config_get(&c, "router_gate", buf, sizeof buf), 0);
    CU_ASSERT_STRING_EQUAL(buf, "sigmoid");
    /* time_limit: seconds, or auto (the SLURM job's end), which reads back */
    CU_ASSERT_EQUAL(config_set(&c, "time_limit", "auto", "t", &e), 0);
    CU_ASSERT_DOUBLE_EQUAL(c.time_limit, CONFIG_TIME_LIMIT_AUTO, 0);
    CU_ASSERT_EQUAL(config_get(&c, "time_limit", buf, sizeof buf), 0);
    CU_ASSERT_STRING_EQUAL(buf, "auto");
    CU_ASSERT_EQUAL(config_set(&c, "time_limit", "-1", "t", &e), -1); /* the sentinel by number */
    CU_ASSERT_EQUAL(config_set(&c, "time_limit", "Auto", "t", &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "expected a number >= 0, or auto"));
    CU_ASSERT_EQUAL(config_set(&c, "time_limit", "90", "t", &e), 0);
    CU_ASSERT_EQUAL(config_get(&c, "time_limit", buf, sizeof buf), 0);
    CU_ASSERT_STRING_EQUAL(buf, "90");
}

static void test_edit_distance(void) {
    CU_ASSERT_EQUAL(config_edit_distance("eval_evry", "eval_every"), 1);
    CU_ASSERT_EQUAL(config_edit_distance("lr", "lr"), 0);
    CU_ASSERT_EQUAL(config_edit_distance("abc", ""), 3);
}

static void test_file_and_overrides(void) {
    Err e;
    char path[] = "/tmp/modtrain-test-XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    const char *text = "# a comment\n  n_layer = 3   # trailing comment\n\nlr=0.01\n";
    CU_ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    Config c;
    config_defaults(&c);
    char *argv[] = {"--lr", "0.5", "--config", path, "--n-head=2"};
    CU_ASSERT_EQUAL(config_from_args(&c, 5, argv, &e), 0);
    CU_ASSERT_EQUAL(c.n_layer, 3);
    CU_ASSERT_DOUBLE_EQUAL(c.lr, 0.5, 0); /* the command line wins wherever it stands */
    CU_ASSERT_EQUAL(c.n_head, 2);
    char *missing[] = {"--steps"};
    CU_ASSERT_EQUAL(config_from_args(&c, 1, missing, &e), -1);
    char *stray[] = {"steps", "3"};
    CU_ASSERT_EQUAL(config_from_args(&c, 2, stray, &e), -1);
    /* a 0|1 key alone is 1, before another option or at the end; others need a value */
    char *alone[] = {"--tensorboard", "--zero"};
    CU_ASSERT_EQUAL(config_from_args(&c, 2, alone, &e), 0);
    CU_ASSERT(c.tensorboard == 1 && c.zero == 1);
    char *given[] = {"--tensorboard", "0"};
    CU_ASSERT_EQUAL(config_from_args(&c, 2, given, &e), 0);
    CU_ASSERT_EQUAL(c.tensorboard, 0);
    char *bare[] = {"--n_layer", "--lr", "0.1"};
    CU_ASSERT_EQUAL(config_from_args(&c, 3, bare, &e), -1);
    FILE *f = fopen(path, "w");
    fputs("n_layer 3\n", f); /* no '=' */
    fclose(f);
    CU_ASSERT_EQUAL(config_load_file(&c, path, &e), -1);
    unlink(path);
    CU_ASSERT_EQUAL(config_load_file(&c, path, &e), -1); /* missing file */
}

static void test_validate(void) {
    Err e;
    Config c;
    config_defaults(&c);
    c.route_every = 0;
    CU_ASSERT_EQUAL(config_validate(&c, &e), 0);
    c.d_model = 130; /* n_head = 4 */
    CU_ASSERT_EQUAL(config_validate(&c, &e), -1);
    c.d_model = 128;
    c.micro_batch = 3; /* batch_size = 8 */
    CU_ASSERT_EQUAL(config_validate(&c, &e), -1);
    c.micro_batch = 4;
    c.min_lr = 1;
    CU_ASSERT_EQUAL(config_validate(&c, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "min_lr = 1 is above lr"));
    c.min_lr = 0;
    /* the block's keys: kv heads only for llama, dividing n_head, split by tp */
    c.n_kv_head = 2;
    CU_ASSERT_EQUAL(config_validate(&c, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "n_kv_head = 2 needs arch = llama"));
    c.arch = ARCH_LLAMA;
    CU_ASSERT_EQUAL(config_validate(&c, &e), 0);
    c.n_kv_head = 3;
    CU_ASSERT_EQUAL(config_validate(&c, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "choose n_kv_head in {1, 2, 4}"));
    c.n_kv_head = 2, c.tp = 4;
    CU_ASSERT_EQUAL(config_validate(&c, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "choose tp in {1, 2}, or n_kv_head a multiple of 4"));
    c.tp = 1, c.d_model = 12, c.n_head = 4; /* head size 3: no pairs to turn */
    CU_ASSERT_EQUAL(config_validate(&c, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "head size d_model / n_head = 3 is odd"));
    /* Llama's MLP width: 8/3 d_model rounded up; the head untied unless asked */
    c.d_model = 768, c.n_head = 12;
    CU_ASSERT_EQUAL(config_d_ff(&c), 2048);
    c.d_model = 4096, c.ffn_multiple_of = 256;
    CU_ASSERT_EQUAL(config_d_ff(&c), 11008); /* Llama 2 7B's */
    CU_ASSERT_EQUAL(config_tied(&c), 0);
    c.tie_embeddings = TIE_YES;
    CU_ASSERT_EQUAL(config_tied(&c), 1);
    c.arch = ARCH_GPT2, c.tie_embeddings = TIE_AUTO;
    CU_ASSERT_EQUAL(config_d_ff(&c), 4 * 4096);
    CU_ASSERT_EQUAL(config_tied(&c), 1);
    c.d_ff = 100, c.tp = 8, c.n_head = 32, c.n_kv_head = 0;
    CU_ASSERT_EQUAL(config_validate(&c, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "MLP width 100 (d_ff) is not divisible by tp = 8"));
}

/* Writes text to a fresh temporary file; its path goes to path (32 bytes). */
static void temp_config(char *path, const char *text, size_t len) {
    strcpy(path, "/tmp/modtrain-test-XXXXXX");
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT(write(fd, text, len) == (ssize_t)len);
    close(fd);
}

/* Files as a user or an attacker may write them: lines of any length (a
 * long comment's tail is never a setting), quoted empty strings, NUL
 * bytes, endless and directory "files". */
static void test_hostile_files(void) {
    Err e;
    Config c;
    config_defaults(&c);
    char path[32], text[8192];
    memset(text, 0, sizeof text);
    strcpy(text, "# ");
    memset(text + 2, 'x', 3000);
    strcat(text, " lr = 9.5\n");
    memset(text + strlen(text), ' ', 3000);
    strcat(text, "n_layer = 3\nval_data = \"\"\nckpt_dir = \"\"\n");
    temp_config(path, text, strlen(text));
    CU_ASSERT_EQUAL(config_load_file(&c, path, &e), 0);
    CU_ASSERT_DOUBLE_EQUAL(c.lr, 6e-4, 0); /* the comment's tail is not a setting */
    CU_ASSERT_EQUAL(c.n_layer, 3);         /* after 3000 spaces, still one line */
    CU_ASSERT_STRING_EQUAL(c.val_data, "");
    CU_ASSERT_STRING_EQUAL(c.ckpt_dir, "");
    unlink(path);
    temp_config(path, "n_layer = 2\nlr = 0.1\0\n", 21);
    CU_ASSERT_EQUAL(config_load_file(&c, path, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, ":2: holds a NUL byte"));
    CU_ASSERT_EQUAL(truncate(path, (2 << 20) + 1), 0); /* over the bound, by its size */
    CU_ASSERT_EQUAL(config_load_file(&c, path, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "is 2097153 bytes, more than the 1048576"));
    unlink(path);
    CU_ASSERT_EQUAL(config_load_file(&c, "/dev/zero", &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "'/dev/zero' is a character device, not a file"));
    CU_ASSERT_EQUAL(config_load_file(&c, "/tmp", &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "is a directory"));
    temp_config(path, "", 0); /* a fresh name, for a FIFO with no writer: refused, no hang */
    unlink(path);
    CU_ASSERT_FATAL(mkfifo(path, 0600) == 0);
    CU_ASSERT_EQUAL(config_load_file(&c, path, &e), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "is a FIFO, not a file"));
    unlink(path);
}

/* Numbers are parsed whole and in range; stage_layers counts cannot wrap. */
static void test_strict_numbers(void) {
    Err e;
    Config c;
    config_defaults(&c);
    long long v;
    CU_ASSERT_EQUAL(parse_i64("12", 0, 100, &v), 0);
    CU_ASSERT_EQUAL(v, 12);
    const char *bad[] = {"", " 5", "5 ", "12abc", "0x10", "9223372036854775808", "101", "-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CU_ASSERT_EQUAL(parse_i64(bad[i], 0, 100, &v), -1);
    double d;
    CU_ASSERT_EQUAL(parse_f64("1e-3", &d), 0);
    CU_ASSERT_EQUAL(parse_f64("inf", &d), -1);
    CU_ASSERT_EQUAL(parse_f64("1e999", &d), -1);
    CU_ASSERT_EQUAL(config_set(&c, "steps", "100000000", "t", &e), -1); /* 9 digits */
    CU_ASSERT_EQUAL(config_set(&c, "steps", "99999999", "t", &e), 0);
    c.n_layer = 6;
    c.pp = 2;
    int layers[2];
    const char *splits[] = {"4294967295,5",          "-1,7", "3,,3", "3,3,",
                            "2147483647,2147483647", "7,-1"};
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        snprintf(c.stage_layers, sizeof c.stage_layers, "%s", splits[i]);
        CU_ASSERT_EQUAL(config_stage_layers(&c, layers, &e), -1);
    }
    /* digits between single commas only, each refused with the message that shows the shape
     * (a leading comma or a sign used to pass as 4,2) */
    const char *shapes[] = {",4,2", "4,2,", "4,,2", " 4,2", "4, 2",  "4 ,2",
                            "+4,2", "4,+2", ",",    "4,2 ", "4,\t2", "4;2"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        snprintf(c.stage_layers, sizeof c.stage_layers, "%s", shapes[i]);
        CU_ASSERT_EQUAL(config_stage_layers(&c, layers, &e), -1);
        CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "separated by single commas"));
        CU_ASSERT_PTR_NULL(strchr(e.msg, '\n'));
    }
    snprintf(c.stage_layers, sizeof c.stage_layers, "%s", "4,2");
    CU_ASSERT_EQUAL(config_stage_layers(&c, layers, &e), 0);
    CU_ASSERT(layers[0] == 4 && layers[1] == 2);
}

/* The model keys are the table's flagged rows: the shape, the routing, the
 * experts, the tokenizer, the block and what trains (train_only: the
 * moments a checkpoint holds), nothing else of the optimizer or the
 * layout; only those added later (the experts', the tokenizer's, the
 * block's, train_only) may be missing from a checkpoint. */
static void test_model_keys(void) {
    const char *want[] = {
        "n_layer",   "n_head",          "d_model",        "seq_len",       "vocab_size",
        "capacity",  "route_every",     "router_gate",    "causal_router", "predictor_hidden",
        "n_expert",  "n_noop_expert",   "expert_top_k",   "expert_d_ff",   "capacity_factor",
        "moe_every", "tokenizer",       "tokenizer_hash", "arch",          "n_kv_head",
        "d_ff",      "ffn_multiple_of", "norm_eps",       "rope_theta",    "tie_embeddings",
        "train_only"};
    const size_t n = sizeof want / sizeof want[0];
    size_t i = 0;
    for (const char *k; (k = config_model_key((int)i)); i++) {
        int found = 0;
        for (size_t j = 0; j < n; j++) found |= strcmp(k, want[j]) == 0;
        CU_ASSERT(found);
    }
    CU_ASSERT_EQUAL(i, n);
    CU_ASSERT_PTR_NULL(config_model_key((int)n + 5));
    for (size_t j = 0; j < n; j++)
        CU_ASSERT_EQUAL(config_model_key_optional(want[j]), j >= 10);
    CU_ASSERT(config_tokenizer_for_vocab(256) == TOK_BYTE &&
              config_tokenizer_for_vocab(50257) == TOK_GPT2 &&
              config_tokenizer_for_vocab(50304) == TOK_NONE);
    Config c;
    config_defaults(&c);
    Err e;
    CU_ASSERT_EQUAL(config_set(&c, "tokenizer_hash", "bd6033949ec1ca1d", "t", &e), 0);
    CU_ASSERT_EQUAL(config_validate(&c, &e), 0);
    const char *bad[] = {"BD6033949EC1CA1D", "bd6033949ec1ca1", "bd6033949ec1ca1dd",
                         "zz6033949ec1ca1d"};
    for (size_t j = 0; j < 4; j++) {
        config_set(&c, "tokenizer_hash", bad[j], "t", &e);
        CU_ASSERT_EQUAL(config_validate(&c, &e), -1);
        CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "16 lowercase hex digits"));
    }
}

int main(void) {
    CU_TestInfo tests[] = {
        {"defaults", test_defaults},
        {"types, ranges, enums, unknown keys", test_set_types_and_ranges},
        {"edit distance for suggestions", test_edit_distance},
        {"files, comments and overrides", test_file_and_overrides},
        {"relations between keys", test_validate},
        {"model keys are flagged in the table", test_model_keys},
        {"long lines, quotes, NUL bytes, /dev/zero, directories", test_hostile_files},
        {"strict numbers; stage_layers cannot wrap", test_strict_numbers},
        CU_TEST_INFO_NULL};
    return run_suite("config", tests);
}
