/*
 * prep: `modtrain prep`, text files to token shards.
 */
#include <stdio.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "src/cmd/cmd.h"
#include "src/prep.h"

static void progress(void *ctx, size_t done, size_t total, double secs) {
    (void)ctx;
    fprintf(stderr, "prep: %.1f of %.1f MB tokenised, %.1f MB/s\n", done / 1e6, total / 1e6,
            done / 1e6 / (secs > 0 ? secs : 1e-9));
}

/* --tokenizer gpt2: the vocabulary loaded, the shards written. */
static int prep_gpt2(char **files, int nfiles, const char *out, double val_fraction,
                     const char *vocab, const char *doc_sep, int threads, size_t counts[2]) {
    if (!vocab) {
        errorf("prep: --tokenizer gpt2 needs --vocab DIR (encoder.json and vocab.bpe; "
               "jobs/get_gpt2_vocab.sh DIR places GPT-2's)");
        return EXIT_USAGE;
    }
    Err err;
    Bpe *bpe = bpe_load(vocab, &err);
    if (!bpe) {
        err_print(&err);
        return EXIT_USAGE;
    }
    PrepProgress pg = {progress, NULL};
    PrepStats st;
    const int rc =
        prep_gpt2_files(files, nfiles, out, val_fraction, bpe, doc_sep, threads, &pg, &st, &err);
    bpe_free(bpe);
    if (rc != 0) {
        err_print(&err);
        return EXIT_USAGE;
    }
    printf("prep: %zu documents, %.1f MB tokenised in %.2f s (%.1f MB/s on %d threads)\n", st.docs,
           st.bytes / 1e6, st.seconds, st.bytes / 1e6 / (st.seconds > 0 ? st.seconds : 1e-9),
           threads);
    counts[0] = st.counts[0], counts[1] = st.counts[1];
    return EXIT_OK;
}

int prep_main(int argc, char **argv) {
    const char *out = NULL, *tokenizer = "byte", *vocab = NULL, *doc_sep = NULL;
    long long threads = 0;
    double val_fraction = 0.1;
    char **files = xcalloc((size_t)argc + 1, sizeof(char *));
    int nfiles = 0, rc = EXIT_USAGE;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf(
                "usage: modtrain prep --out DIR [--val-fraction F] [--tokenizer byte|gpt2]\n"
                "                    [--vocab DIR] [--doc-sep LINE] [--threads N] FILE...\n"
                "Tokenises text files into llm.c shards DIR/train.bin and DIR/val.bin.\n\n"
                "options:\n"
                "  --out DIR            output directory (created)\n"
                "  --val-fraction F     fraction of 4096-token chunks for val.bin (0.1)\n"
                "  --tokenizer byte     byte-level tokens, vocab_size 256 (the default)\n"
                "  --tokenizer gpt2     GPT-2's byte-level BPE from --vocab DIR (encoder.json,\n"
                "                       vocab.bpe), <|endoftext|> before each document\n"
                "  --doc-sep LINE       documents are the pieces of each file between lines\n"
                "                       equal to LINE (--doc-sep %% for fortune files); without\n"
                "                       it each file is one document (gpt2)\n"
                "  --threads N          threads that tokenise (0: all cores; gpt2)\n");
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
            else if (strcmp(a, "--vocab") == 0) vocab = v;
            else if (strcmp(a, "--doc-sep") == 0 && *v) doc_sep = v;
            else if (strcmp(a, "--threads") == 0) {
                if (parse_i64(v, 0, 1024, &threads) != 0) {
                    errorf("prep: --threads = '%s' is not an integer in [0, 1024]", v);
                    goto done;
                }
            } else if (strcmp(a, "--val-fraction") == 0 || strcmp(a, "--val_fraction") == 0) {
                if (parse_f64(v, &val_fraction) != 0 || val_fraction < 0 || val_fraction >= 1) {
                    errorf("prep: --val-fraction = '%s' is not a number in [0, 1)", v);
                    goto done;
                }
            } else {
                errorf("prep: unknown option '%s' (expected --out, --val-fraction, --tokenizer, "
                       "--vocab, --doc-sep, --threads)",
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
    size_t counts[2];
    if (strcmp(tokenizer, "gpt2") == 0) {
#ifdef _OPENMP
        if (threads == 0) threads = omp_get_max_threads();
#endif
        if ((rc = prep_gpt2(files, nfiles, out, val_fraction, vocab, doc_sep,
                            threads > 0 ? (int)threads : 1, counts)) != EXIT_OK)
            goto done;
        rc = EXIT_USAGE;
    } else if (strcmp(tokenizer, "byte") != 0) {
        errorf("prep: --tokenizer '%s' is not available (expected byte or gpt2)", tokenizer);
        goto done;
    } else {
        Err err;
        if (prep_byte_files(files, nfiles, out, val_fraction, counts, &err) != 0) {
            err_print(&err);
            goto done;
        }
    }
    printf("prep: wrote %s/train.bin (%zu tokens)\n", out, counts[0]);
    if (counts[1] > 0) printf("prep: wrote %s/val.bin (%zu tokens)\n", out, counts[1]);
    else printf("prep: no %s/val.bin (--val-fraction 0; an old one is removed)\n", out);
    rc = EXIT_OK;
done:
    free(files);
    return rc;
}
