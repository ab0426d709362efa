/*
 * train: `modtrain train`: its options and --help, the stop signals, and
 * the messages and exit codes of a run that the trainer (src/train/)
 * makes: its lines printed (rank 0's progress, any rank's errors), its
 * TrainStatus mapped to an exit code, its test hooks that end a rank.
 */
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/cmd/doc.h"
#include "src/config/config.h"
#include "src/train/trainer.h"

/* SIGTERM, SIGUSR1 (a scheduler's warning) and a first SIGINT (Ctrl-C)
 * only set this flag; the ranks act on it together at the next step
 * boundary. A second SIGINT ends the process at once. Read by the
 * training thread, written by whichever thread takes the signal: an
 * atomic (lock-free, so safe in a handler). */
static atomic_int stop_signal;

static void on_stop_signal(int sig) {
    if (sig == SIGINT && atomic_load(&stop_signal) == SIGINT) {
        static const char msg[] = "modtrain: second SIGINT: exiting now, nothing saved\n";
        if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) { /* nothing to do */
        }
        _exit(EXIT_INTERRUPTED);
    }
    int none = 0;
    atomic_compare_exchange_strong(&stop_signal, &none, sig);
}

void train_install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

/* Test hooks: MODTRAIN_FAULT=rank-exit:R:STEP ends rank R abruptly after
 * the backward of STEP, as a crashed node would; hang:R:STEP makes it stop
 * there for good, as a node whose file system or network died would. */
static void fault_rank_exit(void *ctx, int rank, int step) {
    (void)ctx;
    const char *f = getenv("MODTRAIN_FAULT");
    const int hang = f && strncmp(f, "hang:", 5) == 0;
    if (!f || (!hang && strncmp(f, "rank-exit:", 10) != 0)) return;
    char buf[64];
    const char *arg = f + (hang ? 5 : 10);
    if (strlen(arg) >= sizeof buf) return;
    snprintf(buf, sizeof buf, "%s", arg);
    char *colon = strchr(buf, ':');
    long long r, s;
    if (!colon) return;
    *colon = '\0'; /* both numbers parsed whole, as every other input */
    if (parse_i64(buf, 0, INT_MAX, &r) != 0 || parse_i64(colon + 1, 0, INT_MAX, &s) != 0 ||
        r != rank || s != step)
        return;
    fprintf(stderr, "modtrain: MODTRAIN_FAULT: rank %d %s at step %d\n", rank,
            hang ? "hangs" : "exits", step);
    if (!hang) exit(3);
    for (;;) pause();
}

/* The watchdog's verdict: _exit, not MPI_Abort, as MPI itself may be what
 * hangs. */
static void watchdog_exit(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "modtrain: %s\n", line);
    _exit(EXIT_WATCHDOG);
}

static void say_out(void *ctx, const char *text) {
    (void)ctx;
    log0("%s", text);
}

static void say_err(void *ctx, const char *line) {
    (void)ctx;
    errorf("%s", line);
}

static int exit_code(TrainStatus st) {
    switch (st) {
    case TRAIN_STEPPED:
    case TRAIN_DONE: return EXIT_OK;
    case TRAIN_BAD_INPUT: return EXIT_USAGE;
    case TRAIN_STOPPED: return EXIT_REQUEUE;
    case TRAIN_DIVERGED: return EXIT_DIVERGED;
    case TRAIN_FAILED: break;
    }
    return EXIT_FAILURE;
}

static const char train_about[] =
    "Trains a model; run alone or under mpirun/srun. Every configuration key is an option:\n"
    "--key VALUE on the command line (or --key=VALUE; dashes or underscores: --micro-batch is\n"
    "--micro_batch), key = VALUE in a --config file; the command line wins. A 0|1 key alone\n"
    "(--tensorboard) is 1.\n\n"
    "dp is not a key: it is what the world leaves after tp x pp (dp = ranks / (tp x pp));\n"
    "batch_size splits over the dp ranks, each in micro-batches of micro_batch.";

void train_print_keys(void) {
    const char *name, *def, *help;
    char meta[96], range[96], d[160];
    if (doc_format == DOC_MARKDOWN) {
        static const char *const head[] = {"key", "values", "default", "model", "meaning"};
        doc_table(5, head);
    }
    for (int i = 0; config_describe(i, &name, &def, &help); i++) {
        config_describe_value(i, meta, sizeof meta);
        config_describe_range(i, range, sizeof range);
        char flag[200], what[1024];
        const int model = config_key_is_model(i);
        snprintf(what, sizeof what, "%s%s", help, model ? " (a model key)" : "");
        switch (doc_format) {
        case DOC_TEXT:
            snprintf(flag, sizeof flag, "--%s %s", name, meta);
            snprintf(d, sizeof d, "(%s)", def[0] ? def : "\"\"");
            if (strlen(flag) > 30) printf("  %s\n  %-30s %-12s %s\n", flag, "", d, help);
            else printf("  %-30s %-12s %s\n", flag, d, help);
            break;
        case DOC_MARKDOWN: {
            char key[128], dv[128];
            snprintf(key, sizeof key, "`%s`", name);
            snprintf(dv, sizeof dv, "`%s`", def[0] ? def : "\"\"");
            const char *const row[] = {key, range, dv, model ? "yes" : "", help};
            doc_row(row);
            break;
        }
        case DOC_MAN:
            snprintf(flag, sizeof flag, "--%s", name);
            if (strncmp(range, "one of ", 7) == 0) /* the value's name lists them */
                snprintf(d, sizeof d, "default %s", def[0] ? def : "\"\"");
            else snprintf(d, sizeof d, "default %s; %s", def[0] ? def : "\"\"", range);
            doc_option(flag, meta, d, what);
            break;
        }
    }
    if (doc_format == DOC_MARKDOWN) doc_table_end();
}

static void train_help(void) {
    static const char usage[] = "modtrain train [--config FILE] [--key value ...]";
    if (doc_format == DOC_TEXT) {
        printf("usage: %s\n%s\n\nConfig keys (N is an integer, X a number, a|b one of the values "
               "listed; (the default)):\n",
               usage, train_about);
        train_print_keys();
        return;
    }
    doc_usage(usage);
    doc_section("DESCRIPTION");
    doc_para(train_about);
    if (doc_format == DOC_MARKDOWN) {
        doc_para("Its options are the [configuration keys](#configuration-keys).");
        return;
    }
    doc_section("OPTIONS");
    doc_option("--config", "FILE", NULL, "key = VALUE lines; # starts a comment");
    train_print_keys();
}

int train_main(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (cli_is_help(argv[i])) {
            if (util_rank == 0) train_help();
            return EXIT_OK;
        }
    const TrainerOpts opts = {.start_s = cmd_start_s,
                              .stop = &stop_signal,
                              .say = {.log = say_out, .error = say_err},
                              .after_backward = fault_rank_exit,
                              .hang = watchdog_exit,
                              .code_stopped = EXIT_REQUEUE,
                              .code_diverged = EXIT_DIVERGED,
                              .code_watchdog = EXIT_WATCHDOG};
    Trainer *t;
    Err err;
    TrainStatus st = trainer_open(&t, argc, argv, &opts, &err);
    if (st == TRAIN_STEPPED) st = trainer_run(t, &err);
    if (st != TRAIN_DONE && err.msg[0]) err_print(&err);
    trainer_close(t);
    return exit_code(st);
}
