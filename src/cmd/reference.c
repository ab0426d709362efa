/*
 * reference: docs/reference.md and the man pages, made from the tables
 * --help prints: the commands (each asked for its --help in the format),
 * the configuration keys, the exit codes and environment variables of
 * commands.c, the metrics fields of src/train/record.c, and the file
 * formats below. A test regenerates docs/reference.md and fails on any
 * difference, and checks these tables against what the code reads and
 * writes.
 */
#include <stdio.h>
#include <string.h>

#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"
#include "src/cmd/doc.h"
#include "src/train/record.h"

/* Every command: the dispatch, modtrain --help, the reference. */
const Command commands[] = {
    {"prep", prep_main, 0, "text, JSON Lines (.gz, .zst) -> token shards (train_000000.bin, ...)"},
    {"data", data_main, 1, "what a dataset spec holds; which sequence each sample reads"},
    {"tokenize", tokenize_main, 0, "text -> BPE token ids (GPT-2, tiktoken, tokenizer.json), and back"},
    {"train", train_main, 2, "train a model (alone or under mpirun/srun)"},
    {"eval", eval_main, 1, "loss of a checkpoint on token shards"},
    {"sample", sample_main, 1, "generate text from a checkpoint"},
    {"ckpt", ckpt_main, 1, "list | verify | inspect | diff | export | import checkpoints"},
    {"plan", plan_main, 1, "memory, traffic and step time of each layout on a cluster"},
    {"reference", reference_main, 1,
     "this reference, as Markdown (docs/reference.md) or as man pages"},
    {NULL, NULL, 0, NULL},
};

/* A shard's header: 256 little-endian int32, then the tokens. */
static const char *const shard_slots[][2] = {
    {"0", "magic: 20240520 (uint16 tokens, llm.c's GPT-2 shards) or 20240801 (uint32 tokens, "
          "llm.c's Llama 3 shards)"},
    {"1", "version: 1 with 20240520, 7 with 20240801"},
    {"2", "the token count n; the file is 1024 + n x 2 (or x 4) bytes"},
    {"3", "the vocabulary size (0 in llm.c's shards: unknown)"},
    {"4", "the tokenizer: 0 unknown, 1 byte, 2 gpt2, 3 r50k_base, 4 cl100k_base, 5 o200k_base, "
          "6 llama3, 7 a Hugging Face tokenizer.json"},
    {"5, 6", "the low and high halves of the vocabulary's 64-bit hash (0 for byte)"},
    {"7", "the CRC-32 (zlib's) of the token bytes"},
    {"8", "1 when slot 7 holds that CRC"},
    {"9-255", "0"},
};

/* A checkpoint's index: text lines, each a record. */
static const char *const index_lines[][2] = {
    {"modtrain-checkpoint 2", "the first line: the format and its version"},
    {"data data.bin BYTES", "the data file beside the index and its size"},
    {"kv config.KEY VALUE", "each model key of the configuration (the keys marked model above)"},
    {"kv state.step N", "the optimizer steps the checkpoint holds"},
    {"kv state.steps N", "the run's configured steps"},
    {"kv state.data_cursor N", "the next sequence of the data order"},
    {"kv state.samples N", "global sequences consumed"},
    {"kv state.batch_offset N", "global batches skipped by rollbacks, so that a requeue skips "
                                "them too"},
    {"kv state.rollbacks N", "rollbacks onto this checkpoint so far"},
    {"kv state.seed N", "the run's seed"},
    {"kv state.run_id HEX", "the run this checkpoint belongs to (random at the first launch)"},
    {"kv state.parent_step N", "the step of the checkpoint this launch resumed from (0: none)"},
    {"kv state.batch_size N", "global sequences a step"},
    {"kv state.lr X", "the peak learning rate"},
    {"kv state.min_lr X", "the final learning rate"},
    {"kv state.warmup_steps N", "warmup steps"},
    {"kv layout.world N", "ranks that wrote it"},
    {"kv layout.tp N", "tensor-parallel ranks"},
    {"kv layout.pp N", "pipeline stages"},
    {"kv layout.ep N", "expert-parallel ranks"},
    {"kv data.parts N", "datasets of the training data"},
    {"kv data.pD weight W shards S tokens N", "dataset D: its blend weight, shards and tokens"},
    {"kv data.pD.sS NAME TOKENS crc32:HEX", "shard S of dataset D: its name, tokens and content "
                                            "hash (a resume refuses changed data)"},
    {"chunk param/TENSOR ...", "a slice of a parameter tensor: its shape, the rows and columns "
                               "it holds, its place and sizes in data.bin, its CRC32 and how "
                               "each byte plane is stored"},
    {"chunk adam_m/TENSOR ...", "the same of AdamW's first moment"},
    {"chunk adam_v/TENSOR ...", "the same of AdamW's second moment"},
    {"end CRC", "the CRC32 of every line before it: an index cut short does not load"},
};

#define N_OF(a) ((int)(sizeof a / sizeof a[0]))

static void table2(const char *h0, const char *h1, const char *const (*rows)[2], int n, int code) {
    const char *const head[] = {h0, h1};
    doc_table(2, head);
    for (int i = 0; i < n; i++) {
        char term[160];
        snprintf(term, sizeof term, code && doc_format == DOC_MARKDOWN ? "`%s`" : "%s",
                 rows[i][0]);
        const char *const row[] = {term, rows[i][1]};
        doc_row(row);
    }
    doc_table_end();
}

static void exit_table(void) {
    const char *const head[] = {"code", "meaning"};
    doc_table(2, head);
    for (const ExitCode *e = exit_codes; e->meaning; e++) {
        char c[16];
        snprintf(c, sizeof c, "%d", e->code);
        const char *const row[] = {c, e->meaning};
        doc_row(row);
    }
    doc_table_end();
}

/* The variables read by `who` ("modtrain", "jobs/": a prefix of the
 * reader), or every one (NULL). */
static void env_table(const char *who) {
    const char *const head[] = {"variable", "read by", "meaning"};
    doc_table(3, head);
    for (const EnvVar *v = env_vars; v->name; v++) {
        if (who && strncmp(v->reader, who, strlen(who)) != 0) continue;
        char name[96];
        snprintf(name, sizeof name, doc_format == DOC_MARKDOWN ? "`%s`" : "%s", v->name);
        const char *const row[] = {name, v->reader, v->meaning};
        doc_row(row);
    }
    doc_table_end();
}

static void metrics_table(void) {
    const char *const head[] = {"field", "lines", "present", "meaning"};
    doc_table(4, head);
    for (int f = 0; f < MF_N; f++) {
        const MetricInfo *m = &metric_fields[f];
        char name[64], kinds[96] = "", when[160];
        snprintf(name, sizeof name, doc_format == DOC_MARKDOWN ? "`%s`" : "%s", m->name);
        for (int k = 1; k <= REC_NONFINITE; k <<= 1)
            if (m->kinds & k)
                snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s",
                         kinds[0] ? ", " : "", record_kind_name((RecordKind)k));
        snprintf(when, sizeof when, "%s%s", m->when[0] ? m->when : "always",
                 m->scalar ? "; a TensorBoard scalar" : "");
        const char *const row[] = {name, kinds, when, m->help};
        doc_row(row);
    }
    doc_table_end();
}

static const char metrics_about[] =
    "run_dir/metrics.jsonl, written by rank 0: one JSON object a line, of five kinds: a step "
    "line every step (it has loss), a val line after each validation (val_loss), a ckpt line "
    "when a save is seen committed (ckpt_step), a stall line when a step boundary waited for "
    "checkpoint work (ckpt_stall_ms), and a nonfinite line for a step whose loss was not "
    "finite. Every line has step. A resumed run appends: its lines from its first step on "
    "replace what earlier launches wrote for those steps.";

static const char tb_about[] =
    "With tensorboard = 1, rank 0 also writes run_dir/tb/events.out.tfevents.SECONDS.HOST.PID, "
    "a new file each launch: TFRecords (a little-endian uint64 length, its masked CRC32C, an "
    "Event protocol buffer, the Event's masked CRC32C). The first Event carries file_version "
    "brain.Event:2, the second a SessionLog START at the launch's first step (TensorBoard then "
    "drops what earlier launches logged from that step on), then one Event a metrics line with "
    "the fields marked as scalars, tagged KIND/FIELD (train/loss, val/val_loss, "
    "ckpt/ckpt_s, train/phase_ms/forward, train/expert_load/BLOCK/EXPERT); the file is "
    "flushed at each log line. Point TensorBoard at run_dir/tb (tensorboard --logdir).";

/* A part of the Files section: "### title" in Markdown, .SS in man. */
static void files_part(const char *title) {
    if (doc_format == DOC_MARKDOWN) {
        printf("### %s\n\n", title);
        return;
    }
    doc_nested = 1;
    doc_section(title);
    doc_nested = 0;
}

static void files_section(void) {
    files_part("Token shards");
    doc_para("Token shards (prep's output, llm.c's format): a header of 256 little-endian "
             "int32, then the tokens (uint16 or uint32, by the magic).");
    table2("slot", "meaning", shard_slots, N_OF(shard_slots), 1);
    files_part("Checkpoints");
    doc_para("A checkpoint is a folder ckpt_dir/step-NNNNNNNN holding index (text, one record "
             "a line) and data.bin (the tensors' chunks, each compressed on its own, written "
             "collectively); ckpt_dir/latest names the newest committed one.");
    table2("index line", "meaning", index_lines, N_OF(index_lines), 1);
    files_part("metrics.jsonl");
    doc_para(metrics_about);
    metrics_table();
    files_part("TensorBoard event files");
    doc_para(tb_about);
}

/* The markdown reference (docs/reference.md). */
static void markdown(void) {
    doc_format = DOC_MARKDOWN;
    printf("# Reference\n\n"
           "<!-- Made by `modtrain reference > docs/reference.md`; a test regenerates it. Edit "
           "the tables in the code (src/cmd/commands.c, the commands' option tables, "
           "src/config/config.c, src/train/record.c, src/cmd/reference.c), not this file. -->\n\n"
           "Every command with its options, the configuration keys, exit codes, environment "
           "variables and file formats, made from the same tables as `--help` and the man "
           "pages (`man modtrain`).\n\n"
           "- [Commands](#commands)\n- [Configuration keys](#configuration-keys)\n"
           "- [Exit codes](#exit-codes)\n- [Environment](#environment)\n- [Files](#files): "
           "[token shards](#token-shards), [checkpoints](#checkpoints), "
           "[metrics.jsonl](#metricsjsonl), [TensorBoard event files](#tensorboard-event-files)\n\n"
           "## Commands\n\n");
    const char *const head[] = {"command", "what it does"};
    doc_table(2, head);
    for (const Command *c = commands; c->name; c++) {
        char link[96];
        snprintf(link, sizeof link, "[`%s`](#modtrain-%s)", c->name, c->name);
        const char *const row[] = {link, c->summary};
        doc_row(row);
    }
    doc_table_end();
    for (const Command *c = commands; c->name; c++) {
        printf("### modtrain %s\n\n", c->name);
        char help[] = "--help", *argv[] = {help, NULL};
        fflush(stdout);
        c->main(1, argv);
        fflush(stdout);
    }
    printf("## Configuration keys\n\n");
    doc_para("`train`'s options, also `key = value` lines of a `--config` file. A model key "
             "(model: yes) is recorded in checkpoints: a resume, `eval`, `sample` and "
             "`init_from` compare them.");
    train_print_keys();
    printf("## Exit codes\n\n");
    exit_table();
    printf("## Environment\n\n");
    env_table(NULL);
    printf("## Files\n\n");
    files_section();
}

static const Command *find_command(const char *page) {
    for (const Command *c = commands; c->name; c++)
        if (strncmp(page, "modtrain-", 9) == 0 && strcmp(page + 9, c->name) == 0) return c;
    return NULL;
}

/* man page `page`: modtrain, or modtrain-COMMAND. Returns 0, or -1 for
 * no such page. */
static int man_page(const char *page) {
    const Command *cmd = find_command(page);
    if (!cmd && strcmp(page, "modtrain") != 0) return -1;
    doc_format = DOC_MAN;
    char upper[64];
    snprintf(upper, sizeof upper, "%s", page);
    for (char *p = upper; *p; p++)
        if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
    printf(".TH %s 1 \"\" \"modtrain %s\" \"User Commands\"\n.SH NAME\n", upper, PACKAGE_VERSION);
    doc_put(page, 0);
    printf(" \\- %s\n", cmd ? cmd->summary : "train Mixture-of-Depths transformers on CPU clusters");
    if (cmd) {
        char help[] = "--help", *argv[] = {help, NULL};
        fflush(stdout);
        cmd->main(1, argv);
        fflush(stdout);
    } else {
        doc_usage("modtrain COMMAND [options]\nmodtrain COMMAND --help\nmodtrain --version");
        doc_section("DESCRIPTION");
        doc_para("modtrain trains Mixture-of-Depths (MoD) and Mixture-of-Depths-and-Experts "
                 "transformers on CPU clusters: alone, or under mpirun or srun with tensor, "
                 "pipeline, data and expert parallelism. Checkpoints are compressed and written "
                 "collectively; a preempted SLURM job resumes where it stopped.");
        doc_section("COMMANDS");
        for (const Command *c = commands; c->name; c++) {
            char name[64];
            snprintf(name, sizeof name, "modtrain-%s(1)", c->name);
            doc_option(name, NULL, NULL, c->summary);
        }
    }
    doc_section("EXIT STATUS");
    exit_table();
    if (!cmd || strcmp(cmd->name, "train") == 0) {
        doc_section("ENVIRONMENT");
        env_table(cmd ? "modtrain" : NULL);
    }
    if (!cmd) {
        doc_section("FILES");
        files_section();
    } else if (strcmp(cmd->name, "train") == 0) {
        doc_section("FILES");
        doc_para(metrics_about);
        metrics_table();
        doc_para(tb_about);
    }
    doc_section("SEE ALSO");
    if (cmd) printf("\\fBmodtrain\\fR(1)");
    for (const Command *c = commands; c->name; c++)
        if (c != cmd) printf("%s\\fBmodtrain\\-%s\\fR(1)", c == commands && !cmd ? "" : ", ", c->name);
    printf("\n.PP\nThe guide: README.md and docs/ in the source tree.\n");
    return 0;
}

int reference_main(int argc, char **argv) {
    const char *man = NULL;
    int pages = 0;
    const CliOpt opts[] = {
        {"man", CLI_STR, &man, "print man page PAGE (roff): modtrain, or modtrain-COMMAND",
         "PAGE"},
        {"pages", CLI_FLAG, &pages, "list the man pages' names, one a line"},
        {NULL},
    };
    const int h = cli_parse("reference", "modtrain reference [--man PAGE | --pages]",
                            "Prints the reference as Markdown (docs/reference.md), a man page, or "
                            "the man pages' names.",
                            opts, argc, argv);
    if (h <= 0) return h == 0 ? EXIT_OK : EXIT_USAGE;
    if (pages) {
        puts("modtrain");
        for (const Command *c = commands; c->name; c++) printf("modtrain-%s\n", c->name);
        return EXIT_OK;
    }
    if (man) {
        if (man_page(man) == 0) return EXIT_OK;
        errorf("reference: no man page '%s' (expected modtrain or modtrain-COMMAND; see "
               "modtrain reference --pages)",
               man);
        return EXIT_USAGE;
    }
    markdown();
    return EXIT_OK;
}
