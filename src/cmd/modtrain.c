/*
 * modtrain: the command-line entry point: the commands and exit codes of
 * src/cmd/commands.c.
 */
#include <blis.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "mpi/check.h"
#include "mpi/pipeline.h"
#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/cmd/doc.h"
#include "src/kernels/kernels.h"

static void usage(FILE *f) {
    fprintf(f, "usage: modtrain <command> [options]\n\ncommands:\n");
    for (const Command *c = commands; c->name; c++) fprintf(f, "  %-9s %s\n", c->name, c->summary);
    fprintf(f, "\n'modtrain <command> --help' describes each; 'modtrain --version' the build;\n"
               "'modtrain reference' all of it (commands, configuration keys, exit codes,\n"
               "environment, files), as in docs/reference.md and the man pages.\n\nexit codes:\n");
    for (const ExitCode *e = exit_codes; e->meaning; e++) {
        fprintf(f, "  %3d  ", e->code);
        doc_wrap(f, e->meaning, 7, 7, 79);
    }
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
    const Command *run = NULL;
    for (const Command *c = commands; c->name && !run; c++)
        if (strcmp(cmd, c->name) == 0) run = c;
    if (!run) {
        errorf("unknown command '%s' (expected prep, data, tokenize, train, eval, sample, ckpt, "
               "plan or reference)",
               cmd);
        return EXIT_USAGE;
    }
    if (!run->mpi) return run->main(argc - 2, argv + 2);
    /* MPI is called from the main thread, also inside OpenMP regions (a
     * checkpoint's writes while the other threads pack the next round);
     * training's asynchronous saves call it from a thread of their own too */
    if (run->mpi == 2) train_install_signals();
    mpi_env_defaults();
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, run->mpi == 2 ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED,
                    &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &util_rank);
    pp_connect_peers();
    int rc = run->main(argc - 2, argv + 2);
    MPI_Finalize();
    return rc;
}
