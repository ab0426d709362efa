/*
 * prep: `modtrain prep`, text to token shards.
 */
#include <stdio.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/prep/prep.h"

/* A progress line on stderr: text read, rate, documents, tokens, shards,
 * and when the input's size is known the share done and an ETA. */
static void progress(void *ctx, const PrepStats *st) {
    (void)ctx;
    const double secs = st->seconds > 0 ? st->seconds : 1e-9;
    char eta[64] = "";
    if (st->in_known && st->in_total > 0 && st->in_done > 0) {
        const double frac = (double)st->in_done / (double)st->in_total;
        char d[32];
        format_duration(d, sizeof d, secs * (1 - frac) / frac);
        snprintf(eta, sizeof eta, " (%.1f%% of the input, ETA %s)", 100 * frac, d);
    }
    fprintf(stderr,
            "prep: %.1f MB read%s, %.1f MB/s, %llu documents, %llu tokens, %zu shards written\n",
            st->bytes / 1e6, eta, st->bytes / 1e6 / secs, (unsigned long long)st->docs,
            (unsigned long long)(st->tokens[0] + st->tokens[1]), st->shards[0] + st->shards[1]);
}

static void note(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "%s\n", line);
}

static void usage(void) {
    char cap[32], mem[400];
    format_bytes(cap, sizeof cap, prep_doc_cap(PREP_MEM_DEFAULT));
    snprintf(mem, sizeof mem,
             "the memory bound, bytes or with K, M, G, T (512M); a document or JSON Lines line "
             "longer than a sixteenth of it (%s at 512M) is refused, as is a JSON line whose "
             "parse would take over about 3/8 of it (gpt2: 1/8)",
             cap);
    /* help only: prep's own loop parses, as FILE... may follow the options */
    const CliOpt opts[] = {
        {"out", CLI_STR, NULL,
         "the shard set's folder; written as DIR.prep-tmp.HOST.PID beside it and renamed to DIR "
         "when complete (a stale one of a killed prep on this host is removed). An existing DIR "
         "must be empty or hold a shard set (train*.bin, val*.bin) alone",
         "DIR"},
        {"force", CLI_FLAG, NULL, "replace the shard set already in DIR, whole"},
        {"val_fraction", CLI_FLOAT, NULL,
         "the fraction of documents for val, in [0, 1) (0.1; 0: no val shards): document d "
         "(from 0, over all inputs) goes to val when floor((d+1)*F) > floor(d*F), every 1/F-th "
         "one, whole",
         "F"},
        {"tokenizer", CLI_STR, NULL,
         "byte (the default: byte-level tokens, vocab_size 256); gpt2 (GPT-2's byte-level BPE "
         "from --vocab DIR: encoder.json, vocab.bpe; <|endoftext|> before each document); a "
         "tiktoken encoding, r50k_base, cl100k_base, o200k_base or llama3, from --vocab FILE, "
         "its rank file (jobs/get_tokenizers.sh; <|endoftext|>, llama3: <|begin_of_text|>, "
         "before each document; uint32 shards past 65,536 tokens); hf (a Hugging Face "
         "tokenizer.json of a byte-level BPE model, GPT-2's or Llama 3's, from --vocab FILE; "
         "before each document its template's token, else <|endoftext|> or <|begin_of_text|>)",
         "NAME"},
        {"vocab", CLI_STR, NULL, "the tokenizer's files: a folder (gpt2) or a file", "PATH"},
        {"doc_sep", CLI_STR, NULL,
         "text: documents are the pieces between lines equal to LINE (--doc_sep % for fortune "
         "files); empty pieces are dropped",
         "LINE"},
        {"jsonl", CLI_STR, NULL,
         "JSON Lines: each line an object whose string under KEY is a document (--jsonl text "
         "for FineWeb, OpenWebText)",
         "KEY"},
        {"threads", CLI_INT, NULL,
         "threads that tokenise (gpt2) and parse JSON Lines (0: all cores; the same shards on "
         "any count)"},
        {"mem", CLI_STR, NULL, mem, "SIZE"},
        {"shard_tokens", CLI_I64, NULL,
         "tokens a shard, in [2, 2^31-2] (100000000); the last of a split holds the rest, a "
         "rest of one token joining the shard before it"},
        {NULL},
    };
    cli_print_help(
        "modtrain prep --out DIR [--val_fraction F] [--tokenizer NAME --vocab PATH]\n"
        "                    [--doc_sep LINE | --jsonl KEY] [--threads N] [--mem SIZE]\n"
        "                    [--shard_tokens N] [--force] FILE...",
        "Tokenises documents into llm.c shards DIR/train_000000.bin, ... and\n"
        "DIR/val_000000.bin, ..., streaming: the memory stays under --mem whatever the\n"
        "input's size. Progress goes to stderr every 2 s; the summary line to stdout.\n\n"
        "Inputs (FILE...): text files; - for standard input (read as it comes: text, or\n"
        "JSON Lines); FILE.gz (gzip) and FILE.zst (zstd) are decompressed as they are\n"
        "read. Each text file is one document, or with --doc_sep its pieces; with\n"
        "--jsonl each line of each file is one. A document never spans two files.",
        opts);
}

/* The options that take a value, beside the PrepOptions they fill. */
typedef struct {
    const char *tokenizer, *vocab;
    long long threads, shard_tokens;
} PrepArgs;

/* Option name (underscores), typed as a, with value v. Returns 0, or -1
 * (printed, echoing the option as typed). */
static int prep_option(const char *name, const char *a, const char *v, PrepOptions *o,
                       PrepArgs *pa) {
    const int n = cli_typed_len(a);
    char who[160];
    cli_typed_name(who, sizeof who, a, name);
    if (strcmp(name, "out") == 0) o->out = v;
    else if (strcmp(name, "tokenizer") == 0) pa->tokenizer = v;
    else if (strcmp(name, "vocab") == 0) pa->vocab = v;
    else if (strcmp(name, "doc_sep") == 0) o->doc_sep = *v ? v : NULL;
    else if (strcmp(name, "jsonl") == 0) {
        if (!*v) {
            errorf("prep: %s needs a key (the documents' key: --jsonl text)", who);
            return -1;
        }
        o->jsonl_key = v;
    } else if (strcmp(name, "threads") == 0) {
        if (parse_i64(v, 0, 1024, &pa->threads) != 0) {
            errorf("prep: %s = '%s' is not an integer in [0, 1024]", who, v);
            return -1;
        }
    } else if (strcmp(name, "shard_tokens") == 0) {
        if (parse_i64(v, 2, INT32_MAX - 1, &pa->shard_tokens) != 0) {
            errorf("prep: %s = '%s' is not an integer in [2, %d]", who, v, INT32_MAX - 1);
            return -1;
        }
    } else if (strcmp(name, "mem") == 0) {
        if (prep_parse_size(v, &o->mem) != 0 || o->mem < PREP_MEM_MIN) {
            errorf("prep: %s = '%s' is not a size of at least 16M (bytes, or a number "
                   "with K, M, G or T: 512M, 2G)",
                   who, v);
            return -1;
        }
    } else if (strcmp(name, "val_fraction") == 0) {
        if (parse_f64(v, &o->val_fraction) != 0 || o->val_fraction < 0 || o->val_fraction >= 1) {
            errorf("prep: %s = '%s' is not a number in [0, 1)", who, v);
            return -1;
        }
    } else if (strcmp(name, "force") == 0) {
        errorf("prep: %s takes no value (give it alone)", who);
        return -1;
    } else {
        errorf("prep: unknown option '%.*s' (expected --out, --val_fraction, --tokenizer, "
               "--vocab, --doc_sep, --jsonl, --threads, --mem, --shard_tokens, --force)",
               n, a);
        return -1;
    }
    return 0;
}

/* The lines that say what a prep wrote. */
static void print_stats(const PrepOptions *o, const PrepStats *st) {
    for (int s = 0; s < 2; s++)
        if (st->shards[s] > 0)
        {
            char last[64] = "";
            if (st->shards[s] > 1)
                snprintf(last, sizeof last, " .. %s_%06zu.bin", s ? "val" : "train",
                         st->shards[s] - 1);
            printf("prep: wrote %s/%s_000000.bin%s (%llu tokens in %zu shard%s)\n", o->out,
                   s ? "val" : "train", last, (unsigned long long)st->tokens[s], st->shards[s],
                   st->shards[s] > 1 ? "s" : "");
        }
    if (st->shards[1] == 0) printf("prep: no val shards (--val_fraction 0)\n");
    const double secs = st->seconds > 0 ? st->seconds : 1e-9;
    printf("prep: %llu documents, %.1f MB tokenised in %.2f s (%.1f MB/s on %d thread%s): "
           "%llu train tokens in %zu shard%s, %llu val tokens in %zu shard%s\n",
           (unsigned long long)st->docs, st->bytes / 1e6, st->seconds, st->bytes / 1e6 / secs,
           st->threads, st->threads > 1 ? "s" : "", (unsigned long long)st->tokens[0],
           st->shards[0], st->shards[0] == 1 ? "" : "s", (unsigned long long)st->tokens[1],
           st->shards[1], st->shards[1] == 1 ? "" : "s");
}

int prep_main(int argc, char **argv) {
    PrepArgs pa = {"byte", NULL, 0, PREP_SHARD_TOKENS_DEFAULT};
    PrepOptions o = {.val_fraction = 0.1, .mem = PREP_MEM_DEFAULT};
    o.inputs = xcalloc((size_t)argc + 1, sizeof(char *));
    int rc = EXIT_USAGE, only_files = 0;
    Bpe *bpe = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!only_files && cli_is_help(a)) {
            usage();
            rc = EXIT_OK;
            goto done;
        }
        char name[64];
        const char *v = NULL;
        if (!only_files && strcmp(a, "--") == 0) {
            only_files = 1;
        } else if (!only_files && cli_option_name(a, name, sizeof name, &v) &&
                   strcmp(name, "force") == 0 && !v) {
            o.force = 1;
        } else if (!only_files && cli_option_name(a, name, sizeof name, &v)) {
            if (!v && i + 1 >= argc) {
                errorf("prep: %s needs a value", a);
                goto done;
            }
            if (prep_option(name, a, v ? v : argv[++i], &o, &pa) != 0) goto done;
        } else {
            o.inputs[o.ninputs++] = argv[i];
        }
    }
    if (!o.out || o.ninputs == 0) {
        errorf("prep: give --out DIR and at least one input (a file, or - for standard input; "
               "see modtrain prep --help)");
        goto done;
    }
    if (o.doc_sep && o.jsonl_key) {
        errorf("prep: --doc_sep cuts text files and --jsonl reads JSON Lines; give one of them");
        goto done;
    }
    const int code = shard_tokenizer_code(pa.tokenizer);
    if (code == SHARD_TOK_GPT2) {
        if (!pa.vocab) {
            errorf("prep: --tokenizer gpt2 needs --vocab DIR (encoder.json and vocab.bpe; "
                   "jobs/get_gpt2_vocab.sh DIR places GPT-2's)");
            goto done;
        }
        Err err;
        if (!(bpe = bpe_load(pa.vocab, &err))) {
            err_print(&err);
            goto done;
        }
    } else if (code > SHARD_TOK_GPT2) {
        if (!pa.vocab) {
            if (code == SHARD_TOK_HF)
                errorf("prep: --tokenizer hf needs --vocab FILE, a tokenizer.json "
                       "(jobs/get_tokenizers.sh DIR places GPT-2's and Llama 3's)");
            else
                errorf("prep: --tokenizer %s needs --vocab FILE, its rank file (%s.tiktoken; "
                       "jobs/get_tokenizers.sh DIR places it)",
                       pa.tokenizer, pa.tokenizer);
            goto done;
        }
        Err err;
        if (!(bpe = bpe_open(pa.vocab, pa.tokenizer, &err))) {
            err_print(&err);
            goto done;
        }
    } else if (code != SHARD_TOK_BYTE) {
        errorf("prep: --tokenizer '%s' is not available (expected byte, gpt2, r50k_base, "
               "cl100k_base, o200k_base, llama3 or hf)",
               pa.tokenizer);
        goto done;
    }
#ifdef _OPENMP
    if (pa.threads == 0) pa.threads = omp_get_max_threads();
#endif
    o.bpe = bpe;
    o.threads = pa.threads > 0 ? (int)pa.threads : 1;
    o.shard_tokens = (size_t)pa.shard_tokens;
    PrepReport rep = {progress, note, NULL};
    PrepStats st;
    Err err;
    if (prep_run(&o, &rep, &st, &err) != 0) {
        err_print(&err);
        goto done;
    }
    print_stats(&o, &st);
    rc = EXIT_OK;
done:
    bpe_free(bpe);
    free(o.inputs);
    return rc;
}
