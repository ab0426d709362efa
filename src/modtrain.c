/*
 * modtrain: the command-line entry point. Subcommands: prep, train, eval,
 * sample, ckpt. Exit codes: 0 success, 1 failure while working, 2 bad input
 * (config, arguments, data, checkpoint) found before work started.
 */
#define _GNU_SOURCE
#include <blis.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "cli.h"
#include "config.h"
#include "data.h"
#include "train.h"
#include "util.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: modtrain <command> [options]\n\n"
            "commands:\n"
            "  prep     text files -> token shards (train.bin, val.bin)\n"
            "  train    train a model (alone or under mpirun/srun)\n"
            "  eval     loss of a checkpoint on a token shard\n"
            "  sample   generate text from a checkpoint\n"
            "  ckpt     export | import checkpoints as safetensors\n\n"
            "'modtrain <command> --help' describes each; 'modtrain --version' the build.\n");
}

static int prep_main(int argc, char **argv) {
    const char *out = NULL, *tokenizer = "byte";
    double val_fraction = 0.1;
    char **files = xcalloc((size_t)argc + 1, sizeof(char *));
    int nfiles = 0, rc = 2;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: modtrain prep --out DIR [--val-fraction F] [--tokenizer byte] FILE...\n"
                   "Tokenises text files into llm.c shards DIR/train.bin and DIR/val.bin.\n\n"
                   "options:\n"
                   "  --out DIR            output directory (created)\n"
                   "  --val-fraction F     fraction of 4096-token chunks for val.bin (0.1)\n"
                   "  --tokenizer byte     byte-level tokens, vocab_size 256\n");
            rc = 0;
            goto done;
        }
        if (strncmp(a, "--", 2) == 0) {
            if (i + 1 >= argc) {
                errorf("prep: %s needs a value", a);
                goto done;
            }
            const char *v = argv[++i];
            if (strcmp(a, "--out") == 0) out = v;
            else if (strcmp(a, "--tokenizer") == 0) tokenizer = v;
            else if (strcmp(a, "--val-fraction") == 0 || strcmp(a, "--val_fraction") == 0) {
                char *end;
                val_fraction = strtod(v, &end);
                if (end == v || *end || val_fraction < 0 || val_fraction >= 1) {
                    errorf("prep: --val-fraction = '%s' is not a number in [0, 1)", v);
                    goto done;
                }
            } else {
                errorf("prep: unknown option '%s' (expected --out, --val-fraction, --tokenizer)",
                       a);
                goto done;
            }
        } else {
            files[nfiles++] = argv[i];
        }
    }
    if (!out || nfiles == 0) {
        errorf("prep: give --out DIR and at least one text file (see modtrain prep --help)");
        goto done;
    }
    if (strcmp(tokenizer, "byte") != 0) {
        errorf("prep: --tokenizer '%s' is not available (this build has: byte)", tokenizer);
        goto done;
    }
    rc = prep_byte_files(files, nfiles, out, val_fraction) == 0 ? 0 : 2;
done:
    free(files);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0) {
        char mpiv[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(mpiv, &len);
        mpiv[strcspn(mpiv, ",\n")] = '\0';
        printf("modtrain %s (BLIS %s, zlib %s, %s)\n", PACKAGE_VERSION, bli_info_get_version_str(),
               zlibVersion(), mpiv);
        return 0;
    }
    if (strcmp(cmd, "prep") == 0) return prep_main(argc - 2, argv + 2);
    int (*run)(int, char **) = strcmp(cmd, "train") == 0    ? train_main
                               : strcmp(cmd, "eval") == 0   ? eval_main
                               : strcmp(cmd, "sample") == 0 ? sample_main
                               : strcmp(cmd, "ckpt") == 0   ? ckpt_main
                                                            : NULL;
    if (!run) {
        errorf("unknown command '%s' (expected prep, train, eval, sample or ckpt)", cmd);
        return 2;
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &util_rank);
    int rc = run(argc - 2, argv + 2);
    MPI_Finalize();
    return rc;
}
