/*
 * ckpt_cmd: `modtrain ckpt list | verify | inspect | export | import`.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint/ckio.h"
#include "src/base/fault.h"
#include "src/base/files.h"
#include "src/base/folder_set.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/safetensors.h"
#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/cmd/doc.h"
#include "src/config/config.h"
#include "src/tokenizer/bpe.h"

/* The codec mix of a checkpoint: "v1 zlib", or for version 2 the share of
 * the raw bytes in Huffman-coded planes, e.g. "v2 h 25% r 75%". */
static void codec_mix(const CkIndex *ix, char *buf, size_t n) {
    if (ix->version == 1) {
        snprintf(buf, n, "v1 zlib");
        return;
    }
    double h = 0, all = 0;
    for (int i = 0; i < ix->nchunks; i++)
        for (int p = 0; p < 4; p++) {
            all += (double)ix->chunks[i].usize / 4;
            if (ix->chunks[i].codec[p] == 'h') h += (double)ix->chunks[i].usize / 4;
        }
    double f = all > 0 ? 100 * h / all : 0;
    snprintf(buf, n, "v2 h %.0f%% r %.0f%%", f, 100 - f);
}

/* One line of `ckpt list` for a step directory; returns 0 when it verifies. */
static int list_one(const char *dir, const char *name) {
    char path[1200], when[32] = "-", size[32] = "-";
    Err err;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    snprintf(path, sizeof path, "%s/%s/data.bin", dir, name);
    double bytes = 0;
    if (stat(path, &st) == 0) {
        bytes += (double)st.st_size;
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&st.st_mtime));
    }
    snprintf(path, sizeof path, "%s/%s/index", dir, name);
    if (stat(path, &st) == 0) bytes += (double)st.st_size;
    format_bytes(size, sizeof size, (size_t)bytes);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CkIndex ix;
    if (ck_index_read(path, &ix, &err) != 0) {
        printf("%-15s %-19s %10s %7s %-16s BAD: %s\n", name, when, size, "-", "-", err.msg);
        return -1;
    }
    double raw = 0, comp = 0;
    for (int i = 0; i < ix.nchunks; i++)
        raw += (double)ix.chunks[i].usize, comp += (double)ix.chunks[i].csize;
    int rc = ck_verify(&ix, &err);
    const char *step = ck_kv(&ix, "state.step");
    char mix[32];
    codec_mix(&ix, mix, sizeof mix);
    printf("%-15s %-19s %10s %6.2fx %-16s %s%s (step %s)\n", name, when, size,
           comp > 0 ? raw / comp : 0, mix, rc == 0 ? "verified" : "BAD: ", rc == 0 ? "" : err.msg,
           step ? step : "?");
    ck_index_free(&ix);
    return rc;
}

static int list_main(int argc, char **argv) {
    const char *ckpt = NULL;
    CliOpt opts[] = {{"ckpt", CLI_STR, &ckpt, "ckpt_dir to list", "DIR"}, {NULL, 0, NULL, NULL}};
    int h = cli_parse("ckpt list", "modtrain ckpt list --ckpt DIR",
                      "Lists a ckpt_dir's checkpoints: step, time, size on disk, compression "
                      "ratio, format and codec mix, and whether every chunk verifies.",
                      opts, argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (!ckpt) {
        errorf("ckpt list: --ckpt is required");
        return EXIT_USAGE;
    }
    char **names;
    int n = ckpt_list_steps(ckpt, &names), bad = 0;
    printf("%-15s %-19s %10s %7s %-16s %s\n", "checkpoint", "written", "size", "ratio", "format",
           "status");
    for (int i = n - 1; i >= 0; i--) {
        bad += list_one(ckpt, names[i]) != 0;
        free(names[i]);
    }
    free(names);
    DIR *d = opendir(ckpt);
    if (!d) {
        errorf("ckpt list: cannot open '%s'", ckpt);
        return EXIT_USAGE;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "step-", 5) == 0 && strstr(e->d_name, ".tmp"))
            printf("%-15s %-19s %10s %7s %-16s incomplete: left by an interrupted save, ignored\n",
                   e->d_name, "-", "-", "-", "-");
    closedir(d);
    char p[1100];
    snprintf(p, sizeof p, "%s/latest", ckpt);
    Err err;
    char *latest = read_file(p, 4096, NULL, &err);
    if (latest) {
        latest[strcspn(latest, "\r\n")] = '\0';
        printf("latest -> %s\n", latest);
        free(latest);
    } else if (access(p, F_OK) == 0) {
        errorf("ckpt list: %s", err.msg);
        bad++;
    }
    if (n == 0) printf("(no checkpoints)\n");
    return bad ? EXIT_FAILURE : EXIT_OK;
}

static int verify_main(int argc, char **argv) {
    const char *ckpt = NULL;
    CliOpt opts[] = {{"ckpt", CLI_STR, &ckpt, "checkpoint (ckpt_dir or step directory)", "DIR"},
                     {NULL, 0, NULL, NULL}};
    int h = cli_parse("ckpt verify", "modtrain ckpt verify --ckpt DIR",
                      "Reads every chunk of a checkpoint and checks its CRC32.", opts, argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (!ckpt) {
        errorf("ckpt verify: --ckpt is required");
        return EXIT_USAGE;
    }
    /* a checkpoint that cannot be found or read is bad input (2); one
     * whose chunks do not verify is the check failing (1) */
    char dir[1100];
    Err err;
    CkIndex ix;
    if (ckpt_resolve(ckpt, dir, sizeof dir, &err) != 0 || ck_index_read(dir, &ix, &err) != 0) {
        err_print(&err);
        return EXIT_USAGE;
    }
    if (ck_verify(&ix, &err) != 0) {
        err_print(&err);
        ck_index_free(&ix);
        return EXIT_FAILURE;
    }
    printf("ckpt verify: %s: %d chunks, every CRC32 matches\n", dir, ix.nchunks);
    ck_index_free(&ix);
    return EXIT_OK;
}

static int inspect_main(int argc, char **argv) {
    const char *ckpt = NULL;
    CliOpt opts[] = {{"ckpt", CLI_STR, &ckpt, "checkpoint (ckpt_dir or step directory)", "DIR"},
                     {NULL, 0, NULL, NULL}};
    int h = cli_parse("ckpt inspect", "modtrain ckpt inspect --ckpt DIR",
                      "Prints a checkpoint's config, training state, the layout it was written "
                      "with, and every tensor with its shape and chunks.",
                      opts, argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (!ckpt) {
        errorf("ckpt inspect: --ckpt is required");
        return EXIT_USAGE;
    }
    char dir[1100];
    Err err;
    CkIndex ix;
    if (ckpt_resolve(ckpt, dir, sizeof dir, &err) != 0 || ck_index_read(dir, &ix, &err) != 0) {
        err_print(&err);
        return EXIT_USAGE;
    }
    printf("checkpoint %s (format %d, data.bin: %" PRIu64 " bytes)\n", dir, ix.version,
           ix.data_bytes);
    for (int i = 0; i < ix.nkv; i++) printf("  %-24s %s\n", ix.kv[i].key, ix.kv[i].value);
    printf("%-40s %-12s %s\n", "tensor", "shape",
           "chunks: [rows, cols] slice, bytes raw -> stored (each byte plane: h Huffman-coded, "
           "r raw)");
    for (int i = 0; i < ix.nchunks; i++) {
        const CkChunk *c = &ix.chunks[i];
        int first = i == 0 || strcmp(ix.chunks[i - 1].name, c->name) != 0;
        char shape[40];
        if (c->ndim == 1) snprintf(shape, sizeof shape, "[%" PRId64 "]", c->rows);
        else snprintf(shape, sizeof shape, "[%" PRId64 ", %" PRId64 "]", c->rows, c->cols);
        char planes[16] = "";
        if (ix.version >= 2)
            snprintf(planes, sizeof planes, " (%c %c %c %c)", c->codec[0], c->codec[1],
                     c->codec[2], c->codec[3]);
        printf("%-40s %-12s [%" PRId64 ":%" PRId64 ", %" PRId64 ":%" PRId64 "] %" PRIu64
               " -> %" PRIu64 "%s\n",
               first ? c->name : "", first ? shape : "", c->r0, c->r0 + c->nr, c->c0, c->c0 + c->nc,
               c->usize, c->csize, planes);
    }
    ck_index_free(&ix);
    return EXIT_OK;
}

/* A whole tensor of a checkpoint, read from whatever chunks hold it. */
static float *read_tensor(const CkIndex *ix, const CkChunk *like, Err *err) {
    CkSlice s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "%s", like->name);
    s.ndim = like->ndim, s.rows = like->rows, s.cols = like->cols;
    s.nr = like->rows, s.nc = like->cols, s.ld = like->cols;
    s.data = xmalloc((size_t)(s.nr * s.nc) * sizeof(float) + 4);
    if (ck_read_slices(ix, &s, 1, err) != 0) {
        free(s.data);
        return NULL;
    }
    return s.data;
}

static int diff_main(int argc, char **argv) {
    const char *a = NULL, *b = NULL;
    double tol = 0;
    CliOpt opts[] = {{"a", CLI_STR, &a, "first checkpoint", "DIR"},
                     {"b", CLI_STR, &b, "second checkpoint", "DIR"},
                     {"tol", CLI_FLOAT, &tol, "largest absolute difference accepted (0: bitwise)",
                      NULL, 0, 1e18},
                     {NULL, 0, NULL, NULL}};
    int h = cli_parse("ckpt diff", "modtrain ckpt diff --a DIR --b DIR [--tol X]",
                      "Compares every tensor (weights and moments) of two checkpoints, whatever "
                      "layouts wrote them; exit 0 when no element differs by more than --tol.",
                      opts, argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (!a || !b) {
        errorf("ckpt diff: --a and --b are required");
        return EXIT_USAGE;
    }
    char da[1100], db[1100];
    Err err;
    CkIndex ia, ib;
    if (ckpt_resolve(a, da, sizeof da, &err) != 0 || ckpt_resolve(b, db, sizeof db, &err) != 0 ||
        ck_index_read(da, &ia, &err) != 0) {
        err_print(&err);
        return EXIT_USAGE;
    }
    if (ck_index_read(db, &ib, &err) != 0) {
        err_print(&err);
        ck_index_free(&ia);
        return EXIT_USAGE;
    }
    int rc = EXIT_OK, tensors = 0;
    double worst = 0;
    char worst_name[112] = "";
    for (int i = 0; i < ia.nchunks && rc != EXIT_USAGE; i++) {
        const CkChunk *c = &ia.chunks[i];
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = strcmp(ia.chunks[j].name, c->name) == 0;
        if (seen) continue;
        float *x = read_tensor(&ia, c, &err), *y = x ? read_tensor(&ib, c, &err) : NULL;
        if (!x || !y) {
            errorf("ckpt diff: %s", err.msg);
            free(x);
            rc = EXIT_USAGE;
            break;
        }
        double d = 0;
        for (int64_t k = 0; k < c->rows * c->cols; k++) {
            double e = fabs((double)x[k] - y[k]);
            if (e > d || e != e) d = e != e ? INFINITY : e;
        }
        if (d > tol) printf("%-40s max |a - b| = %.3g\n", c->name, d);
        if (d > worst) {
            worst = d;
            snprintf(worst_name, sizeof worst_name, "%s", c->name);
        }
        tensors++;
        free(x);
        free(y);
    }
    if (rc != EXIT_USAGE) {
        printf("ckpt diff: %d tensors, largest difference %.3g%s%s (tolerance %.3g)\n", tensors,
               worst, worst > 0 ? " in " : "", worst_name, tol);
        rc = worst > tol ? EXIT_FAILURE : EXIT_OK; /* as diff(1): 1 when they differ */
    }
    ck_index_free(&ia);
    ck_index_free(&ib);
    return rc;
}

/* A vocabulary a model can use: at least 2 tokens, and every token of its
 * tokenizer (the byte tokenizer's 256, GPT-2's 50257); a file claiming 0
 * would export or import a model nothing can feed. 0 or -1 with err set. */
static int check_vocab(const Config *cfg, const char *cmd, const char *path, Err *err) {
    const int known = config_tokenizer_vocab(cfg->tokenizer), need = known ? known : 2;
    if (cfg->vocab_size >= need) return 0;
    return err_set(err,
                   "%s: '%s' has vocab_size = %d, below the %d its model needs (tokenizer %s): "
                   "damaged or not a modtrain model",
                   cmd, path, cfg->vocab_size, need,
                   shard_tokenizer_name(shard_code_of_tokenizer(cfg->tokenizer)));
}

/* --format hf on a Mixture-of-Depths model: one line on what the folder
 * leaves out, and that it exports anyway. */
static void warn_hf_left_out(const char *ckpt, const Model *m, int left_out) {
    char blocks[256] = "";
    size_t k = 0;
    int n = 0;
    for (int l = 0; l < m->d.L && k < sizeof blocks; l++)
        if (model_is_routed(&m->d, l)) {
            k += (size_t)snprintf(blocks + k, sizeof blocks - k, "%s%d", k ? ", " : "", l);
            n++;
        }
    const char *arch = m->d.arch == ARCH_LLAMA ? "Llama" : "GPT-2";
    errorf("warning: ckpt export: '%s' is a Mixture-of-Depths model: the folder leaves out the "
           "%s of block%s %s (%d tensors), which Hugging Face's %s cannot run, and holds the "
           "rest as a dense %s (every block takes every token, so its outputs differ; "
           "--format safetensors keeps every tensor)",
           ckpt, m->d.predictor ? "routers and predictors" : "routers", n > 1 ? "s" : "", blocks,
           left_out, arch, arch);
}

/* The files an exported folder holds (and their temporary names while
 * written): what its commit replaces and a stale one's removal removes. */
static int is_export_name(const char *name) {
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        const size_t n = strlen(files[i]);
        if (strncmp(name, files[i], n) == 0 &&
            (name[n] == '\0' || strncmp(name + n, ".tmp.", 5) == 0))
            return 1;
    }
    return 0;
}

static void export_note(void *ctx, const char *line) {
    (void)ctx;
    errorf("%s", line);
}

/* --out of --format hf as a folder set (folder_set.h): written beside it,
 * then renamed or exchanged into place whole. 0, or -1 after printing why. */
static int hf_out_set(FolderSet *fs, const char *out) {
    memset(fs, 0, sizeof *fs);
    fs->tag = "hf";
    fs->who = "ckpt export";
    fs->member = is_export_name;
    fs->what = "an exported folder";
    fs->other = "which no export writes; ckpt export replaces only a folder it wrote "
                "(config.json, model.safetensors, tokenizer.json): give another --out or move it";
    fs->not_folder = "--format hf writes a folder";
    fs->note = export_note;
    Err err;
    if (fset_paths(fs, out, &err) != 0 || fset_check_out(fs, 1, &err) != 0) {
        err_print(&err);
        return -1;
    }
    struct stat st;
    if (stat(fs->parent, &st) != 0 || !S_ISDIR(st.st_mode)) {
        errorf("ckpt export: --out '%s': its parent '%s' is not a folder (make it first)", out,
               fs->parent);
        return -1;
    }
    return 0;
}

/* --vocab of ckpt export: the tokenizer the checkpoint records, by its
 * hash, for --format hf. 0, or -1 with the line printed. */
static int export_tokenizer_open(const Config *cfg, const char *ckpt, int hf, const char *vocab,
                                 Bpe **bpe) {
    Err err;
    if (!hf) {
        errorf("ckpt export: --vocab is for --format hf (a safetensors file holds no tokenizer)");
        return -1;
    }
    if (!config_tokenizer_is_bpe(cfg->tokenizer)) {
        errorf("ckpt export: '%s' records tokenizer %s, not a BPE vocabulary; leave --vocab out",
               ckpt, shard_tokenizer_name(shard_code_of_tokenizer(cfg->tokenizer)));
        return -1;
    }
    if (!(*bpe = bpe_open(vocab, config_tokenizer_encoding(cfg->tokenizer), &err))) {
        err_print(&err);
        return -1;
    }
    char hex[CONFIG_HASH_HEX + 1];
    format_vocab_hash(bpe_hash(*bpe), hex);
    if (cfg->tokenizer_hash[0] && strcmp(hex, cfg->tokenizer_hash) != 0) {
        errorf("ckpt export: --vocab '%s' has the hash %s, but '%s' was trained with %s; give "
               "the vocabulary it was trained with",
               vocab, hex, ckpt, cfg->tokenizer_hash);
        bpe_free(*bpe);
        *bpe = NULL;
        return -1;
    }
    return 0;
}

static int export_main(int argc, char **argv) {
    const char *ckpt = NULL, *format = "safetensors", *out = NULL, *vocab = NULL;
    CliOpt opts[] = {{"ckpt", CLI_STR, &ckpt, "checkpoint (ckpt_dir or step directory)", "DIR"},
                     {"format", CLI_STR, &format,
                      "safetensors (one file) or hf (a Hugging Face folder: model.safetensors "
                      "and GPT-2's or Llama's config.json)",
                      "safetensors|hf"},
                     {"out", CLI_STR, &out, "output file (safetensors) or folder (hf)", "PATH"},
                     {"vocab", CLI_STR, &vocab,
                      "hf: the model's tokenizer (GPT-2's folder, a rank file or a "
                      "tokenizer.json), written as FOLDER/tokenizer.json",
                      "PATH"},
                     {NULL, 0, NULL, NULL}};
    int h = cli_parse("ckpt export",
                      "modtrain ckpt export --ckpt DIR --format safetensors --out FILE\n"
                      "       modtrain ckpt export --ckpt DIR --format hf --out FOLDER",
                      "Writes the weights as safetensors under modtrain's names and shapes "
                      "(GPT-2's for arch gpt2); hf writes the folder transformers' "
                      "GPT2LMHeadModel or LlamaForCausalLM reads, whole or not at all (a "
                      "Mixture-of-Depths model's routers left out).",
                      opts, argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (!ckpt || !out) {
        errorf("ckpt export: --ckpt and --out are required");
        return EXIT_USAGE;
    }
    const int hf = strcmp(format, "hf") == 0;
    if (!hf && strcmp(format, "safetensors") != 0) {
        errorf("ckpt export: --format '%s' is not available (expected safetensors or hf)", format);
        return EXIT_USAGE;
    }
    FolderSet fs;
    if (hf && hf_out_set(&fs, out) != 0) return EXIT_USAGE;
    if (hf) out = fs.out; /* without trailing slashes */
    Config cfg;
    config_defaults(&cfg);
    Model m;
    int step = 0;
    Err err;
    if (ckpt_open_model(ckpt, &m, &cfg, 1, &step, NULL, 1, 0, 1, &err) != 0) {
        err_print(&err);
        return EXIT_USAGE;
    }
    if (check_vocab(&cfg, "ckpt export", ckpt, &err) != 0) {
        err_print(&err);
        model_free(&m);
        return EXIT_USAGE;
    }
    if (hf && m.d.E > 0) { /* one line, before anything is written */
        errorf("ckpt export: '%s' is a Mixture-of-Experts model (%d experts in %d of %d blocks): "
               "Hugging Face's %s architecture has no experts; use --format safetensors, which "
               "keeps every tensor",
               ckpt, m.d.E, model_moe_blocks(&m.d), m.d.L,
               m.d.arch == ARCH_LLAMA ? "Llama" : "GPT-2");
        model_free(&m);
        return EXIT_USAGE;
    }
    Bpe *bpe = NULL;
    if (vocab && export_tokenizer_open(&cfg, ckpt, hf, vocab, &bpe) != 0) {
        model_free(&m);
        return EXIT_USAGE;
    }
    int rc = EXIT_OK, left_out = 0;
    char tj[FSET_PATH + 400];
    if (hf) { /* the folder's files in fs.tmp, then the folder into place whole */
        fset_clean_stale(&fs);
        snprintf(tj, sizeof tj, "%s/tokenizer.json", fs.tmp);
        if (fp_mkdir("hf.mkdir", fs.tmp, 0755) != 0)
            rc = err_set(&err, "ckpt export: cannot create '%s': %s", fs.tmp, strerror(errno));
        else if (ckpt_export_hf(fs.tmp, &m, &cfg, step, &left_out, &err) != 0 ||
                 (bpe && bpe_write_hf(bpe, tj, &err) != 0) || fset_commit(&fs, 1, &err) != 0)
            rc = -1;
        if (rc != 0) fset_remove(&fs, fs.tmp);
        snprintf(tj, sizeof tj, "%s/tokenizer.json", out);
    } else {
        rc = ckpt_export_safetensors(out, &m, &cfg, step, &err);
    }
    if (rc != 0) {
        err_print(&err);
        rc = EXIT_FAILURE;
    }
    if (rc == 0 && left_out) warn_hf_left_out(ckpt, &m, left_out);
    if (rc == 0 && hf)
        printf("ckpt export: wrote %s/model.safetensors%s %s/config.json%s%s (step %d)\n", out,
               bpe ? "," : " and", out, bpe ? " and " : "", bpe ? tj : "", step);
    else if (rc == 0)
        printf("ckpt export: wrote %s (step %d)\n", out, step);
    bpe_free(bpe);
    model_free(&m);
    return rc;
}

/* Fills a model key missing from the metadata from a tensor's shape.
 * Returns 0 or -1 with err set. */
static int infer_key(Config *cfg, const StFile *f, const char *key, const char *tensor, int dim,
                     Err *err) {
    if (st_meta(f, key)) return config_set(cfg, key, st_meta(f, key), f->path, err);
    const StTensor *t = st_find(f, tensor);
    if (!t || t->ndim <= dim)
        return err_set(err, "ckpt import: '%s' has neither metadata '%s' nor tensor '%s'", f->path,
                       key, tensor);
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)t->shape[dim]);
    return config_set(cfg, key, v, f->path, err);
}

/* The model config of a GPT-2 safetensors file (its metadata where it has
 * some, its tensors' shapes otherwise) and its step (metadata, or 0).
 * Returns 0 or -1 with err set. */
static int import_config(Config *cfg, const StFile *f, int n_head, int *step, Err *err) {
    config_defaults(cfg);
    cfg->route_every = 0; /* no router tensors unless the metadata says otherwise */
    if (infer_key(cfg, f, "vocab_size", "wte.weight", 0, err) ||
        infer_key(cfg, f, "d_model", "wte.weight", 1, err) ||
        infer_key(cfg, f, "seq_len", "wpe.weight", 0, err))
        return -1;
    int L = 0;
    char name[64];
    for (;; L++) {
        snprintf(name, sizeof name, "h.%d.ln_1.weight", L);
        if (!st_find(f, name)) break;
    }
    cfg->n_layer = L;
    const char *key;
    for (int i = 0; (key = config_model_key(i)); i++) {
        const char *v = st_meta(f, key);
        if (v && config_set(cfg, key, v, f->path, err) != 0) return -1;
    }
    if (cfg->tokenizer == TOK_AUTO) /* GPT-2's own weights, or modtrain's from before */
        cfg->tokenizer = config_tokenizer_for_vocab(cfg->vocab_size);
    if (n_head > 0) cfg->n_head = n_head;
    else if (!st_meta(f, "n_head"))
        return err_set(err,
                       "ckpt import: '%s' has no n_head metadata; pass --n-head (GPT-2 small: 12)",
                       f->path);
    const char *ms = st_meta(f, "step");
    long long v = 0;
    if (ms && parse_i64(ms, 0, CONFIG_MAX_STEP, &v) != 0)
        return err_set(err, "ckpt import: '%s' has step = '%.32s' (expected an integer in [0, %d])",
                       f->path, ms, CONFIG_MAX_STEP);
    *step = (int)v;
    if (check_vocab(cfg, "ckpt import", f->path, err) != 0) return -1;
    if (cfg->n_layer < 1 || cfg->d_model % cfg->n_head != 0 || config_validate(cfg, NULL) != 0)
        return err_set(err,
                       "ckpt import: '%s' gives n_layer = %d, d_model = %d, n_head = %d: not a GPT "
                       "shape modtrain can build",
                       f->path, cfg->n_layer, cfg->d_model, cfg->n_head);
    return EXIT_OK;
}

/* A model of cfg's shape, made for one micro-batch of one sequence on this
 * machine (its memory checked first). 0, or -1 with err set. */
static int import_model(Model *m, const Config *cfg, const char *in, Err *err) {
    ModelDims d;
    model_dims_config(&d, cfg, 1, 0);
    ModelMemory mm;
    model_memory(&d, 1, 1, 0, &mm);
    Err why;
    if (model_memory_check(&mm, machine_memory(), 1, &why) != 0)
        return err_set(err, "ckpt import: '%s': %s", in, why.msg);
    model_init(m, &d, 1, NULL);
    return 0;
}

static int import_main(int argc, char **argv) {
    const char *in = NULL, *ckpt = NULL;
    int n_head = 0;
    CliOpt opts[] = {
        {"in", CLI_STR, &in,
         "a safetensors file, or a Hugging Face folder (config.json with "
         "model.safetensors or its shards)",
         "PATH"},
        {"ckpt", CLI_STR, &ckpt, "ckpt_dir to write the checkpoint into", "DIR"},
        {"n_head", CLI_INT, &n_head, "heads, when a file's metadata lacks n_head", NULL, 1, 4096},
        {NULL, 0, NULL, NULL}};
    int h = cli_parse("ckpt import", "modtrain ckpt import --in FILE|FOLDER --ckpt DIR",
                      "Turns a GPT-2 safetensors file, or a Hugging Face GPT2LMHeadModel or "
                      "LlamaForCausalLM folder (F32, BF16 or F16, one file or shards), into a "
                      "checkpoint modtrain can train or evaluate.",
                      opts, argc, argv);
    if (h != 1) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (!in || !ckpt) {
        errorf("ckpt import: --in and --ckpt are required");
        return EXIT_USAGE;
    }
    struct stat st;
    const int folder = stat(in, &st) == 0 && S_ISDIR(st.st_mode);
    StFile f;
    HfFolder hf;
    Config cfg;
    Err err;
    Model m;
    int step = 0, bad;
    char cj[4200];
    snprintf(cj, sizeof cj, "%s/config.json", in);
    if (folder && access(cj, F_OK) != 0) {
        errorf("ckpt import: '%s' is a directory without config.json (give a safetensors file, "
               "or a Hugging Face folder: config.json with model.safetensors or its shards)",
               in);
        return EXIT_USAGE;
    }
    if (folder) {
        bad = hf_open(&hf, in, &err);
        if (!bad) {
            cfg = hf.cfg;
            /* modtrain's own export says its step; a folder from elsewhere is step 0 */
            const char *ms = st_meta(&hf.f[0], "step");
            long long v = 0;
            if (ms && parse_i64(ms, 0, CONFIG_MAX_STEP, &v) == 0) step = (int)v;
            bad = import_model(&m, &cfg, in, &err);
            if (bad) hf_close(&hf);
        }
    } else {
        if (st_read(&f, in, &err) != 0) {
            err_print(&err);
            return EXIT_USAGE;
        }
        bad = import_config(&cfg, &f, n_head, &step, &err);
        if (!bad) {
            ModelDims d;
            model_dims_config(&d, &cfg, 1, 0);
            bad = ckpt_check_safetensors(&f, &d, 0, &err) || import_model(&m, &cfg, in, &err);
        }
        if (bad) st_free(&f);
    }
    if (bad) {
        err_print(&err);
        return EXIT_USAGE;
    }
    int rc = EXIT_USAGE, saved = 0;
    cfg.ckpt_keep = 1 << 20;
    if ((folder ? hf_load(&hf, &m, &err) : ckpt_load_safetensors(&f, &m, 0, &err)) != 0) {
        err_print(&err);
    } else if ((saved = ckpt_save(ckpt, &m, NULL, &cfg, step, NULL, MPI_COMM_WORLD, 1, 0, NULL,
                                  &err)) < 0) {
        err_print(&err);
        rc = EXIT_FAILURE;
    } else {
        if (saved > 0) err_print(&err); /* committed, with a warning */
        printf("ckpt import: %s -> %s/step-%08d (%s, L=%d C=%d NH=%d T=%d V=%d)\n", in, ckpt, step,
               m.d.arch == ARCH_LLAMA ? "llama" : "gpt2", m.d.L, m.d.C, m.d.NH, m.d.maxT, m.d.V);
        rc = EXIT_OK;
    }
    model_free(&m);
    if (folder) hf_close(&hf);
    else st_free(&f);
    return rc;
}

/* The subcommands: ckpt --help, the dispatch and the reference. */
static const struct {
    const char *name, *args, *summary;
    int (*main)(int argc, char **argv);
} subs[] = {
    {"list", "--ckpt DIR", "checkpoints of a ckpt_dir, verified", list_main},
    {"verify", "--ckpt DIR", "every chunk's CRC32", verify_main},
    {"inspect", "--ckpt DIR", "config, state, layout, tensors and chunks", inspect_main},
    {"diff", "--a DIR --b DIR [--tol X]", "compare two checkpoints tensor by tensor", diff_main},
    {"export", "--ckpt DIR --format safetensors|hf --out FILE|FOLDER",
     "a safetensors file, or a Hugging Face folder", export_main},
    {"import", "--in FILE|FOLDER --ckpt DIR [--n_head N]",
     "a safetensors file or a Hugging Face folder as a checkpoint", import_main},
};
#define NSUBS ((int)(sizeof subs / sizeof subs[0]))

static void ckpt_help(void) {
    static const char usage[] = "modtrain ckpt list|verify|inspect|diff|export|import [options]";
    if (doc_format == DOC_TEXT) {
        printf("usage: %s\n", usage);
        for (int i = 0; i < NSUBS; i++)
            printf("  %-8s %s\n  %-8s   %s\n", subs[i].name, subs[i].args, "", subs[i].summary);
        printf("'modtrain ckpt SUBCOMMAND --help' describes each.\n");
        return;
    }
    doc_usage(usage);
    doc_section("DESCRIPTION");
    doc_para("Lists, checks, compares, exports and imports checkpoints: a ckpt_dir's "
             "step-NNNNNNNN folders, each an index and a data file.");
    if (doc_format == DOC_MAN) doc_section("SUBCOMMANDS");
    doc_nested = 1;
    for (int i = 0; i < NSUBS; i++) {
        char title[64];
        snprintf(title, sizeof title, "modtrain ckpt %s", subs[i].name);
        doc_section(title);
        char help[] = "--help", *argv[] = {help, NULL};
        subs[i].main(1, argv);
    }
    doc_nested = 0;
}

int ckpt_main(int argc, char **argv) {
    if (argc < 1 || cli_is_help(argv[0])) {
        if (argc < 1) {
            errorf("ckpt: which subcommand? (expected list, verify, inspect, diff, export or "
                   "import; see modtrain ckpt --help)");
            return EXIT_USAGE;
        }
        ckpt_help();
        return EXIT_OK;
    }
    const char *sub = argv[0];
    for (int i = 0; i < NSUBS; i++)
        if (strcmp(sub, subs[i].name) == 0) return subs[i].main(argc - 1, argv + 1);
    errorf("ckpt: unknown subcommand '%s' (expected list, verify, inspect, diff, export or import)",
           sub);
    return EXIT_USAGE;
}
