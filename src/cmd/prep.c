/*
 * prep: `modtrain prep`, text files to token shards.
 */
#include <stdio.h>
#include <string.h>

#include "src/cmd/cmd.h"
#include "src/data.h"

int prep_main(int argc, char **argv) {
    const char *out = NULL, *tokenizer = "byte";
    double val_fraction = 0.1;
    char **files = xcalloc((size_t)argc + 1, sizeof(char *));
    int nfiles = 0, rc = EXIT_USAGE;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: modtrain prep --out DIR [--val-fraction F] [--tokenizer byte] FILE...\n"
                   "Tokenises text files into llm.c shards DIR/train.bin and DIR/val.bin.\n\n"
                   "options:\n"
                   "  --out DIR            output directory (created)\n"
                   "  --val-fraction F     fraction of 4096-token chunks for val.bin (0.1)\n"
                   "  --tokenizer byte     byte-level tokens, vocab_size 256\n");
            rc = EXIT_OK;
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
    size_t counts[2];
    Err err;
    if (prep_byte_files(files, nfiles, out, val_fraction, counts, &err) != 0) {
        err_print(&err);
        goto done;
    }
    printf("prep: wrote %s/train.bin (%zu tokens)\n", out, counts[0]);
    if (counts[1] > 0) printf("prep: wrote %s/val.bin (%zu tokens)\n", out, counts[1]);
    rc = EXIT_OK;
done:
    free(files);
    return rc;
}
