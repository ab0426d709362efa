/*
 * cli: option parsing for the subcommands other than train (which uses the
 * config table): `--name value`, `--name=value`, dashes or underscores
 * (`--top-k` is `--top_k`); --help shows the underscores, the config keys'
 * spelling, and errors echo the option as it was typed.
 */
#ifndef MODTRAIN_CLI_H
#define MODTRAIN_CLI_H

#include <stddef.h>

typedef enum { CLI_STR, CLI_INT, CLI_I64, CLI_FLOAT, CLI_FLAG } CliType;

/* A table row lists the fields it needs: {name, type, dst, help} for most,
 * a metavar and a range after them where they help. The fields left out
 * are zero, which is what they mean. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

typedef struct {
    const char *name; /* with underscores */
    CliType type;
    void *dst; /* const char **, int *, long long *, double *, int * */
    const char *help;
    const char *meta; /* the value in --help (DIR, FILE); NULL: N, X or S by type */
    double min, max;  /* numbers: the inclusive range a value must be in (both 0: any) */
} CliOpt;

/* Parses argv into opts (NULL-terminated). Returns 1 to go on, 0 when it
 * printed --help, -1 after printing an error. */
int cli_parse(const char *cmd, const char *usage, const char *about, const CliOpt *opts, int argc,
              char **argv);

/* Prints a command's help from its table (cli_parse's --help), in
 * doc_format: text, or Markdown and man for `modtrain reference`. */
void cli_print_help(const char *usage, const char *about, const CliOpt *opts);

/* Splits an argument "--name" or "--name=value" (dashes or underscores)
 * into name, lower case with underscores and at most n - 1 characters, and *value
 * (what follows '=', or NULL). Returns 1 for such an option, 0 for
 * anything else (a file, "-", "--"). */
int cli_option_name(const char *arg, char *name, size_t n, const char **value);

/* The option as typed (arg up to '='), and its own name beside it when
 * they differ: "--top-k (top_k)", "--top_k". */
void cli_typed_name(char *buf, size_t n, const char *arg, const char *name);

/* Whether arg asks for help: -h, or --help in any spelling (--HELP). */
int cli_is_help(const char *arg);

/* How many characters of arg the user typed as the option's name (up to
 * '='), for errors that echo it: printf("%.*s", cli_typed_len(a), a). */
int cli_typed_len(const char *arg);

#endif
