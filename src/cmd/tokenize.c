/*
 * tokenize: `modtrain tokenize`, text to byte-level BPE token ids (GPT-2's
 * files, or a tiktoken rank file) and back, one id a line (what a prompt
 * becomes; the reference tests compare it with tiktoken's).
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "src/tokenizer/bpe.h"
#include "src/base/files.h"
#include "src/cmd/cli.h"
#include "src/cmd/cmd.h"

#define TOKENIZE_MAX ((size_t)1 << 32) /* 4 GiB: more than a prompt or a test */

/* The whole of a file ("-": standard input, which may be a pipe), bounded.
 * NULL with err set. */
static char *slurp(const char *path, size_t *len, Err *err) {
    if (strcmp(path, "-") != 0) return read_file(path, TOKENIZE_MAX, len, err);
    size_t cap = 1 << 16, n = 0;
    char *s = xmalloc(cap + 1);
    for (size_t got; (got = fread(s + n, 1, cap - n, stdin)) > 0;) {
        n += got;
        if (n == cap) {
            if (cap >= TOKENIZE_MAX) { /* never a silent cut */
                free(s);
                err_set(err, "standard input holds more than %llu bytes (tokenize at most that at "
                        "a time, or use 'modtrain prep' for a corpus)", (unsigned long long)TOKENIZE_MAX);
                return NULL;
            }
            s = xrealloc(s, (cap *= 2) + 1);
        }
    }
    if (ferror(stdin)) {
        free(s);
        err_set(err, "cannot read standard input");
        return NULL;
    }
    s[n] = '\0';
    *len = n;
    return s;
}

/* Ids separated by whitespace (one a line, as tokenize writes them) to
 * their bytes on stdout, read in chunks: input of any length streams
 * through, and a bad id or byte anywhere stops it with its offset. The
 * bytes of the ids before it are written by then, so that is exit 1. */
static int decode_ids(const Bpe *b, const char *path) {
    FILE *f = stdin;
    if (strcmp(path, "-") != 0) { /* a regular file only: never a FIFO's hang */
        Err oerr;
        const int fd = open_regular(path, O_RDONLY, NULL, &oerr);
        if (fd < 0 || !(f = fdopen(fd, "rb"))) {
            if (fd >= 0) close(fd);
            errorf("tokenize: %s", fd < 0 ? oerr.msg : "cannot open the input");
            return EXIT_USAGE;
        }
    }
    enum { CHUNK = 1 << 16 };
    char *buf = xmalloc(CHUNK);
    BpeDecoder d;
    bpe_decoder_init(&d);
    BpeBytes out = {0};
    Err err;
    int rc = EXIT_OK;
    for (size_t got = 1; got > 0 && rc == EXIT_OK;) {
        got = fread(buf, 1, CHUNK, f);
        out.n = 0;
        int bad = got > 0     ? bpe_decode_feed(b, &d, buf, got, &out, &err)
                  : ferror(f) ? 0
                              : bpe_decode_end(b, &d, &out, &err);
        if (out.n) fwrite(out.bytes, 1, out.n, stdout); /* bytes may be NULL when none */
        if (bad != 0) {
            errorf("tokenize: %s: %s", path, err.msg);
            rc = EXIT_FAILURE;
        } else if (got == 0 && ferror(f)) {
            errorf("tokenize: cannot read '%s' after byte %llu", path, (unsigned long long)d.at);
            rc = EXIT_FAILURE;
        }
    }
    if (fflush(stdout) != 0 && rc == EXIT_OK) {
        errorf("tokenize: cannot write the decoded bytes");
        rc = EXIT_FAILURE;
    }
    if (f != stdin) fclose(f);
    free(buf);
    free(out.bytes);
    return rc;
}

int tokenize_main(int argc, char **argv) {
    const char *vocab = NULL, *encoding = NULL, *path = "-";
    int decode = 0, hash = 0;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            char enc[512];
            snprintf(enc, sizeof enc,
                     "a rank file's encoding, which gives its pattern and special tokens: %s "
                     "(default: the file's name, NAME.tiktoken); hf: a tokenizer.json",
                     bpe_encoding_names());
            const CliOpt opts[] = {
                /* help only: a FILE may stand among the options */
                {"vocab", CLI_STR, NULL,
                 "GPT-2's files: a folder of encoder.json and vocab.bpe (jobs/get_gpt2_vocab.sh "
                 "DIR); a tiktoken rank file; or a Hugging Face tokenizer.json (a name ending "
                 ".json)",
                 "PATH"},
                {"encoding", CLI_STR, NULL, enc, "NAME"},
                {"decode", CLI_FLAG, NULL, "ids to text"},
                {"hash", CLI_FLAG, NULL,
                 "print the vocabulary's size and hash (config's tokenizer_hash)"},
                {NULL},
            };
            cli_print_help(
                "modtrain tokenize --vocab PATH [--encoding NAME] [--decode | --hash] "
                "[FILE]",
                "Prints the byte-level BPE token ids of FILE (or standard input), one a\n"
                "line; with --decode, reads ids (one a line, or any whitespace between)\n"
                "and writes their bytes. Text that looks like a special token is text.",
                opts);
            return EXIT_OK;
        }
        char name[32];
        const char *v = NULL;
        if (!cli_option_name(argv[i], name, sizeof name, &v)) path = argv[i];
        else if (!v && strcmp(name, "decode") == 0) decode = 1;
        else if (!v && strcmp(name, "hash") == 0) hash = 1;
        else if (strcmp(name, "vocab") == 0 && (v || i + 1 < argc)) vocab = v ? v : argv[++i];
        else if (strcmp(name, "encoding") == 0 && (v || i + 1 < argc)) encoding = v ? v : argv[++i];
        else {
            const int known = strcmp(name, "vocab") == 0 || strcmp(name, "decode") == 0 ||
                              strcmp(name, "hash") == 0 || strcmp(name, "encoding") == 0;
            errorf("tokenize: %.*s %s (expected --vocab PATH, --encoding NAME, --decode, --hash)",
                   cli_typed_len(argv[i]), argv[i],
                   !known ? "is not an option"
                   : v    ? "takes no value"
                          : "needs a value");
            return EXIT_USAGE;
        }
    }
    if (!vocab) {
        errorf("tokenize: --vocab PATH is required (a folder with encoder.json and vocab.bpe, or "
               "a tiktoken rank file)");
        return EXIT_USAGE;
    }
    Err err;
    Bpe *b = bpe_open(vocab, encoding, &err);
    if (!b) {
        err_print(&err);
        return EXIT_USAGE;
    }
    if (hash) {
        char hex[CONFIG_HASH_HEX + 1];
        format_vocab_hash(bpe_hash(b), hex);
        printf("vocab_size %d\ntokenizer_hash %s\n", bpe_vocab_size(b), hex);
        bpe_free(b);
        return EXIT_OK;
    }
    if (decode) {
        const int rc = decode_ids(b, path);
        bpe_free(b);
        return rc;
    }
    size_t n = 0;
    char *text = slurp(path, &n, &err);
    int rc = EXIT_USAGE;
    if (!text) {
        errorf("tokenize: %s", err.msg);
    } else {
        BpeIds ids = {0};
        bpe_encode(b, text, n, &ids);
        for (size_t i = 0; i < ids.n; i++) printf("%d\n", ids.ids[i]);
        free(ids.ids);
        rc = EXIT_OK;
    }
    free(text);
    bpe_free(b);
    return rc;
}
