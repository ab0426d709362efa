/*
 * tokenize: `modtrain tokenize`, text to GPT-2 token ids and back, one id a
 * line (what a prompt becomes; the reference tests compare it with
 * tiktoken's).
 */
#include <stdio.h>
#include <string.h>

#include "src/bpe.h"
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
            if (cap >= TOKENIZE_MAX) break;
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

/* Ids, one a line, to their bytes on stdout. */
static int decode_ids(const Bpe *b, char *text, const char *path) {
    int line = 0;
    for (char *save = NULL, *tok = strtok_r(text, "\n", &save); tok;
         tok = strtok_r(NULL, "\n", &save)) {
        line++;
        long long id;
        size_t len;
        const uint8_t *bytes;
        if (parse_i64(tok, 0, (long long)bpe_vocab_size(b) - 1, &id) != 0 ||
            !(bytes = bpe_token(b, (int)id, &len))) {
            errorf("tokenize: %s: line %d: '%.40s' is not a token id in [0, %d)", path, line, tok,
                   bpe_vocab_size(b));
            return EXIT_USAGE;
        }
        fwrite(bytes, 1, len, stdout);
    }
    return EXIT_OK;
}

int tokenize_main(int argc, char **argv) {
    const char *vocab = NULL, *path = "-";
    int decode = 0, hash = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: modtrain tokenize --vocab DIR [--decode | --hash] [FILE]\n"
                   "Prints the GPT-2 BPE token ids of FILE (or standard input), one a line;\n"
                   "with --decode, reads ids one a line and writes their bytes.\n\n"
                   "options:\n"
                   "  --vocab DIR   folder of encoder.json and vocab.bpe "
                   "(jobs/get_gpt2_vocab.sh DIR)\n"
                   "  --decode      ids to text\n"
                   "  --hash        print the vocabulary's size and hash (config's "
                   "tokenizer_hash)\n");
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--decode") == 0) decode = 1;
        else if (strcmp(argv[i], "--hash") == 0) hash = 1;
        else if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc) vocab = argv[++i];
        else if (strncmp(argv[i], "--", 2) == 0) {
            errorf("tokenize: unknown option '%s' (expected --vocab DIR, --decode, --hash)",
                   argv[i]);
            return EXIT_USAGE;
        } else path = argv[i];
    }
    if (!vocab) {
        errorf("tokenize: --vocab DIR is required (a folder with encoder.json and vocab.bpe)");
        return EXIT_USAGE;
    }
    Err err;
    Bpe *b = bpe_load(vocab, &err);
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
    size_t n = 0;
    char *text = slurp(path, &n, &err);
    int rc = EXIT_USAGE;
    if (!text) {
        errorf("tokenize: %s", err.msg);
    } else if (decode) {
        rc = decode_ids(b, text, path);
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
