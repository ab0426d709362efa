/*
 * cli: option parsing for the subcommands other than train (which uses the
 * config table): `--name value`, `--name=value`, dashes or underscores.
 */
#ifndef MODTRAIN_CLI_H
#define MODTRAIN_CLI_H

typedef enum { CLI_STR, CLI_INT, CLI_I64, CLI_FLOAT, CLI_FLAG } CliType;

typedef struct {
    const char *name; /* with underscores */
    CliType type;
    void *dst; /* const char **, int *, long long *, double *, int * */
    const char *help;
} CliOpt;

/* Parses argv into opts (NULL-terminated). Returns 1 to go on, 0 when it
 * printed --help, -1 after printing an error. */
int cli_parse(const char *cmd, const char *usage, const char *about, const CliOpt *opts, int argc,
              char **argv);

#endif
