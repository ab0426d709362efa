/*
 * modtrain: the command-line entry point. Subcommands: prep, data,
 * tokenize, train, eval, sample, ckpt, plan; exit codes in src/cmd/cmd.h.
 */
#include <blis.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "mpi/check.h"
#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/kernels/kernels.h"

static void usage(FILE *f) {
    fprintf(f, "usage: modtrain <command> [options]\n\n"
               "commands:\n"
               "  prep     text, JSON Lines (.gz, .zst) -> token shards (train_000000.bin, ...)\n"
               "  data     what a dataset spec holds; which sequence each sample reads\n"
               "  tokenize text -> GPT-2 BPE token ids, and back\n"
               "  train    train a model (alone or under mpirun/srun)\n"
               "  eval     loss of a checkpoint on token shards\n"
               "  sample   generate text from a checkpoint\n"
               "  ckpt     list | verify | inspect | diff | export | import checkpoints\n"
               "  plan     memory, traffic and step time of each layout on a cluster\n\n"
               "'modtrain <command> --help' describes each; 'modtrain --version' the build.\n");
}

int main(int argc, char **argv) {
    cmd_start_s = now_s();
    if (argc < 2 || cli_is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : EXIT_OK;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0) {
        char mpiv[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(mpiv, &len);
        mpiv[strcspn(mpiv, ",\n")] = '\0';
        kernels_init(1, "auto"); /* the kernels a run would use here */
        printf("modtrain %s (BLIS %s with %s kernels: BLIS_ARCH_TYPE=%d, zlib %s, %s)\n",
               PACKAGE_VERSION, bli_info_get_version_str(), kernels_blis_arch(),
               kernels_blis_arch_id(), zlibVersion(), mpiv);
        return EXIT_OK;
    }
    if (strcmp(cmd, "prep") == 0) return prep_main(argc - 2, argv + 2);
    if (strcmp(cmd, "tokenize") == 0) return tokenize_main(argc - 2, argv + 2);
    if (strcmp(cmd, "data") == 0) return data_main(argc - 2, argv + 2);
    int (*run)(int, char **) = strcmp(cmd, "train") == 0    ? train_main
                               : strcmp(cmd, "eval") == 0   ? eval_main
                               : strcmp(cmd, "sample") == 0 ? sample_main
                               : strcmp(cmd, "ckpt") == 0   ? ckpt_main
                               : strcmp(cmd, "plan") == 0   ? plan_main
                                                            : NULL;
    if (!run) {
        errorf("unknown command '%s' (expected prep, data, tokenize, train, eval, sample, ckpt or plan)",
               cmd);
        return EXIT_USAGE;
    }
    /* MPI is called from the main thread, also inside OpenMP regions (a
     * checkpoint's writes while the other threads pack the next round);
     * training's asynchronous saves call it from a thread of their own too */
    if (run == train_main) train_install_signals();
    mpi_env_defaults();
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, run == train_main ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED,
                    &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &util_rank);
    int rc = run(argc - 2, argv + 2);
    MPI_Finalize();
    return rc;
}
