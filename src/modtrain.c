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

#include "../checkpoint/ckpt.h"
#include "../checkpoint/safetensors.h"
#include "cli.h"
#include "config.h"
#include "data.h"
#include "model.h"
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

static int ckpt_export_main(int argc, char **argv) {
    const char *ckpt = NULL, *format = "safetensors", *out = NULL;
    CliOpt opts[] = {{"ckpt", CLI_STR, &ckpt, "checkpoint (ckpt_dir or step directory)"},
                     {"format", CLI_STR, &format, "output format: safetensors"},
                     {"out", CLI_STR, &out, "output file"},
                     {NULL, 0, NULL, NULL}};
    int h = cli_parse("ckpt export", "modtrain ckpt export --ckpt DIR --format safetensors --out FILE",
                      "Writes the weights under Hugging Face GPT-2 names and shapes.", opts, argc,
                      argv);
    if (h != 1) return h == 0 ? 0 : 2;
    if (!ckpt || !out) {
        errorf("ckpt export: --ckpt and --out are required");
        return 2;
    }
    if (strcmp(format, "safetensors") != 0) {
        errorf("ckpt export: --format '%s' is not available (expected safetensors)", format);
        return 2;
    }
    Config cfg;
    config_defaults(&cfg);
    Model m;
    int step = 0;
    if (ckpt_open_model(ckpt, &m, &cfg, 1, &step) != 0) return 2;
    int rc = ckpt_export_safetensors(out, &m, &cfg, step) == 0 ? 0 : 1;
    if (rc == 0) printf("ckpt export: wrote %s (step %d)\n", out, step);
    model_free(&m);
    return rc;
}

/* Fills a model key missing from the metadata from a tensor's shape. */
static int infer_key(Config *cfg, const StFile *f, const char *key, const char *tensor, int dim) {
    if (st_meta(f, key)) return config_set(cfg, key, st_meta(f, key), f->path);
    const StTensor *t = st_find(f, tensor);
    if (!t || t->ndim <= dim) {
        errorf("ckpt import: '%s' has neither metadata '%s' nor tensor '%s'", f->path, key, tensor);
        return -1;
    }
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)t->shape[dim]);
    return config_set(cfg, key, v, f->path);
}

static int ckpt_import_main(int argc, char **argv) {
    const char *in = NULL, *ckpt = NULL;
    int n_head = 0;
    CliOpt opts[] = {{"in", CLI_STR, &in, "safetensors file to import"},
                     {"ckpt", CLI_STR, &ckpt, "ckpt_dir to write the checkpoint into"},
                     {"n_head", CLI_INT, &n_head, "heads, when the file's metadata lacks n_head"},
                     {NULL, 0, NULL, NULL}};
    int h = cli_parse("ckpt import", "modtrain ckpt import --in FILE --ckpt DIR",
                      "Turns a GPT-2 safetensors file into a checkpoint modtrain can train or "
                      "evaluate.",
                      opts, argc, argv);
    if (h != 1) return h == 0 ? 0 : 2;
    if (!in || !ckpt) {
        errorf("ckpt import: --in and --ckpt are required");
        return 2;
    }
    StFile f;
    if (st_read(&f, in) != 0) return 2;
    Config cfg;
    config_defaults(&cfg);
    cfg.route_every = 0; /* no router tensors unless the metadata says otherwise */
    int rc = 2;
    if (infer_key(&cfg, &f, "vocab_size", "wte.weight", 0) || infer_key(&cfg, &f, "d_model", "wte.weight", 1) ||
        infer_key(&cfg, &f, "seq_len", "wpe.weight", 0))
        goto out;
    int L = 0;
    char name[64];
    for (;; L++) {
        snprintf(name, sizeof name, "h.%d.ln_1.weight", L);
        if (!st_find(&f, name)) break;
    }
    const char *ml = st_meta(&f, "n_layer");
    if (ml) {
        if (config_set(&cfg, "n_layer", ml, in) != 0) goto out;
    } else cfg.n_layer = L;
    const char *mh = st_meta(&f, "n_head");
    if (n_head > 0) cfg.n_head = n_head;
    else if (mh) {
        if (config_set(&cfg, "n_head", mh, in) != 0) goto out;
    } else {
        errorf("ckpt import: '%s' has no n_head metadata; pass --n-head (GPT-2 small: 12)", in);
        goto out;
    }
    for (int i = 0; config_model_keys[i]; i++) {
        const char *v = st_meta(&f, config_model_keys[i]);
        if (v && strcmp(config_model_keys[i], "n_head") != 0 &&
            config_set(&cfg, config_model_keys[i], v, in) != 0)
            goto out;
    }
    if (cfg.n_layer < 1 || cfg.d_model % cfg.n_head != 0) {
        errorf("ckpt import: '%s' gives n_layer = %d, d_model = %d, n_head = %d: not a GPT "
               "shape modtrain can build",
               in, cfg.n_layer, cfg.d_model, cfg.n_head);
        goto out;
    }
    ModelDims d;
    model_dims_config(&d, &cfg, 1, 0);
    Model m;
    model_init(&m, &d, 1, NULL);
    const char *ms = st_meta(&f, "step");
    int step = ms ? atoi(ms) : 0;
    if (ckpt_load_weights(in, &m) == 0 && ckpt_save(ckpt, &m, NULL, &cfg, step, 1 << 20) == 0) {
        printf("ckpt import: %s -> %s/step-%08d (L=%d C=%d NH=%d T=%d V=%d)\n", in, ckpt, step,
               d.L, d.C, d.NH, d.maxT, d.V);
        rc = 0;
    }
    model_free(&m);
out:
    st_free(&f);
    return rc;
}

static int ckpt_main(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
        printf("usage: modtrain ckpt export|import [options]\n"
               "  export --ckpt DIR --format safetensors --out FILE\n"
               "  import --in FILE --ckpt DIR [--n-head N]\n");
        return argc < 1 ? 2 : 0;
    }
    if (strcmp(argv[0], "export") == 0) return ckpt_export_main(argc - 1, argv + 1);
    if (strcmp(argv[0], "import") == 0) return ckpt_import_main(argc - 1, argv + 1);
    errorf("ckpt: unknown subcommand '%s' (expected export or import)", argv[0]);
    return 2;
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
    if (strcmp(cmd, "eval") == 0) return eval_main(argc - 2, argv + 2);
    if (strcmp(cmd, "sample") == 0) return sample_main(argc - 2, argv + 2);
    if (strcmp(cmd, "ckpt") == 0) return ckpt_main(argc - 2, argv + 2);
    if (strcmp(cmd, "train") == 0) {
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &util_rank);
        int rc = train_main(argc - 2, argv + 2);
        MPI_Finalize();
        return rc;
    }
    errorf("unknown command '%s' (expected prep, train, eval, sample or ckpt)", cmd);
    return 2;
}
