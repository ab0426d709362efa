/*
 * data_cmd: `modtrain data`, what a dataset spec holds and which
 * sequences a run reads from it, sample by sample.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/config/config.h"
#include "src/data/dataset.h"

/* The summary: the datasets, their shards, tokens and sequences, the
 * tokenizer, and what a run of steps x batch_size would read. */
static void print_summary(const Dataset *ds, long long steps, long long batch) {
    uint64_t shards = 0, seqs = 0;
    for (int d = 0; d < ds->n_parts; d++) {
        shards += (uint64_t)ds->parts[d].n_shards;
        seqs += ds->parts[d].n_seqs;
    }
    char tok[96];
    shard_describe_tokenizer(ds_meta(ds), tok, sizeof tok);
    printf("data: %d dataset%s, %" PRIu64 " shard%s, %" PRIu64 " tokens, %" PRIu64
           " sequences of seq_len %d; written by %s, vocabulary %d%s, uint%d tokens; seed %" PRIu64
           "\n",
           ds->n_parts, ds->n_parts == 1 ? "" : "s", shards, shards == 1 ? "" : "s", ds_tokens(ds),
           seqs, ds->T, tok, ds_meta(ds)->vocab, ds_meta(ds)->vocab ? "" : " (not recorded)",
           8 * ds_meta(ds)->width, ds->seed);
    _Static_assert((uint64_t)CONFIG_MAX_STEP * CONFIG_MAX_BATCH < (uint64_t)1 << 62,
                   "a run's samples fit the 2^62 a checkpoint's state.samples may hold");
    const uint64_t samples = (uint64_t)steps * (uint64_t)batch;
    for (int d = 0; d < ds->n_parts; d++) {
        const DsPart *p = &ds->parts[d];
        printf("  dataset %d: weight %.6g | %d shard%s | %" PRIu64 " tokens | %" PRIu64
               " sequences | %s\n",
               d, p->weight, p->n_shards, p->n_shards == 1 ? "" : "s", p->n_tokens, p->n_seqs,
               p->pattern);
        if (samples) {
            const uint64_t n = ds_part_count(ds, d, samples);
            printf("    a run of %lld steps x %lld sequences reads %" PRIu64
                   " of its samples: %.3f epochs\n",
                   steps, batch, n, (double)n / (double)p->n_seqs);
        }
    }
}

/* s as the inside of a JSON string: quotes, backslashes and control bytes
 * escaped. */
static void put_json_chars(FILE *f, const char *s) {
    for (; *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
}

/* One JSON line per sample from..from+count-1: where it lies and, with
 * tokens, its first 8 tokens. Returns 0 or -1 (printed). */
static int print_samples(Dataset *ds, long long from, long long count, int tokens) {
    Err err;
    int rc = 0;
    for (long long i = 0; i < count && rc == 0; i++) {
        DsSample s;
        const uint64_t g = (uint64_t)from + (uint64_t)i;
        ds_locate(ds, g, &s);
        printf("{\"sample\":%" PRIu64 ",\"dataset\":%d,\"shard\":\"", g, s.part);
        put_json_chars(stdout, ds->parts[s.part].shards[s.shard].path);
        printf("\",\"offset\":%" PRIu64 ",\"epoch\":%" PRIu64, s.offset, s.epoch);
        if (tokens) {
            /* the inputs and, past them, the last target: the whole window */
            int *win = xmalloc(((size_t)ds->T + 1) * sizeof(int));
            const int vocab = ds_meta(ds)->vocab ? ds_meta(ds)->vocab : MODTRAIN_MAX_VOCAB;
            rc = ds_read(ds, &s, vocab, win, win + 1, &err);
            if (rc == 0) {
                printf(",\"tokens\":[");
                for (int t = 0; t < 8 && t < ds->T; t++) printf("%s%d", t ? "," : "", win[t]);
                printf("]");
            }
            free(win);
        }
        printf("}\n");
    }
    if (rc != 0) err_print(&err);
    return rc;
}

int data_main(int argc, char **argv) {
    Config def;
    config_defaults(&def);
    const char *spec = NULL;
    long long seq_len = def.seq_len, seed = def.seed, steps = 0, batch = def.batch_size;
    long long from = -1, count = 1;
    int tokens = 0;
    CliOpt opts[] = {
        {"data", CLI_STR, &spec, "a shard, a glob pattern, or a blend W:GLOB,W:GLOB", "SPEC"},
        {"seq_len", CLI_I64, &seq_len, "tokens a sequence (the config's default)", NULL, 1,
         1 << 20},
        {"seed", CLI_I64, &seed, "seed of the order (the config's default)", NULL, 0, 9.2e18},
        /* a run's own bounds: a longer or wider run cannot be trained, and its samples,
         * steps x batch_size, would wrap past 2^64 (9.2e18 x 2^30 printed a wrapped count) */
        {"steps", CLI_I64, &steps, "with --batch_size: what a run of this length reads", NULL, 0,
         CONFIG_MAX_STEP},
        {"batch_size", CLI_I64, &batch, "sequences a step (the config's default)", NULL, 1,
         CONFIG_MAX_BATCH},
        {"from", CLI_I64, &from, "print samples from this one (the g-th sequence a run reads)", "G",
         0, 0x1p62},
        {"count", CLI_I64, &count, "samples --from prints (1)", NULL, 0, 0x1p40},
        {"tokens", CLI_FLAG, &tokens, "with --from: each sample's first 8 tokens too"},
        {NULL, 0, NULL, NULL}};
    int rc = cli_parse("data", "modtrain data --data SPEC [options]",
                       "Prints what a dataset spec holds and, with --from, which sequence each "
                       "sample of a run reads:\n"
                       "{\"sample\":G,\"dataset\":D,\"shard\":PATH,\"offset\":O,\"epoch\":E} "
                       "(O: the token index in the shard of the sequence's first token).",
                       opts, argc, argv);
    if (rc <= 0) return rc == 0 ? EXIT_OK : EXIT_USAGE;
    if (!spec) {
        errorf("data: give --data SPEC (a shard, a glob pattern, or W:GLOB,W:GLOB)");
        return EXIT_USAGE;
    }
    Dataset ds;
    Err err;
    if (ds_open(&ds, spec, (int)seq_len, (uint64_t)seed, &err) != 0) {
        err_print(&err);
        return EXIT_USAGE;
    }
    if (from >= 0) rc = print_samples(&ds, from, count, tokens) == 0 ? EXIT_OK : EXIT_USAGE;
    else {
        print_summary(&ds, steps, batch);
        rc = EXIT_OK;
    }
    ds_free(&ds);
    return rc;
}
