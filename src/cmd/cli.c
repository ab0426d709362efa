/*
 * cli: subcommand options, with the same nearest-name hint as config keys.
 * A name is matched with dashes read as underscores; what an error says
 * about an option starts with the option as the user typed it.
 */
#include "src/cmd/cli.h"

#include <ctype.h>
#include <limits.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/cmd/doc.h"
#include "src/config/config.h"
#include "src/base/util.h"

int cli_option_name(const char *a, char *name, size_t n, const char **value) {
    if (strncmp(a, "--", 2) != 0 || !a[2] || a[2] == '=' || n == 0) return 0;
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    if (len >= n) len = n - 1;
    for (size_t k = 0; k < len; k++)
        name[k] = a[2 + k] == '-' ? '_' : (char)tolower((unsigned char)a[2 + k]);
    name[len] = '\0';
    if (value) *value = eq ? eq + 1 : NULL;
    return 1;
}

int cli_is_help(const char *a) {
    char name[8];
    const char *value;
    return strcmp(a, "-h") == 0 ||
           (cli_option_name(a, name, sizeof name, &value) && !value && strcmp(name, "help") == 0);
}

int cli_typed_len(const char *a) {
    const size_t n = strcspn(a, "=");
    return n > 200 ? 200 : (int)n;
}

static const char *meta_of(const CliOpt *o) {
    if (o->meta) return o->meta;
    switch (o->type) {
    case CLI_INT:
    case CLI_I64: return "N";
    case CLI_FLOAT: return "X";
    case CLI_STR: return "S";
    case CLI_FLAG: break;
    }
    return "";
}

/* "an integer in [0, 4096]", "a number >= 0" */
static void range_text(const CliOpt *o, char *buf, size_t n) {
    const char *what = o->type == CLI_FLOAT ? "a number" : "an integer";
    if (o->min == 0 && o->max == 0) snprintf(buf, n, "%s", what);
    else if (o->max >= (o->type == CLI_FLOAT ? 1e18 : 9.2e18))
        snprintf(buf, n, "%s >= %g", what, o->min);
    else if (o->type == CLI_FLOAT) snprintf(buf, n, "%s in [%g, %g]", what, o->min, o->max);
    else snprintf(buf, n, "%s in [%lld, %lld]", what, (long long)o->min, (long long)o->max);
}

void cli_print_help(const char *usage, const char *about, const CliOpt *opts) {
    if (doc_format == DOC_TEXT) {
        printf("usage: %s\n%s\n\noptions (dashes or underscores: --top-k is --top_k; --key=value "
               "too):\n",
               usage, about);
        for (const CliOpt *o = opts; o->name; o++) {
            char flag[96];
            snprintf(flag, sizeof flag, "--%s%s%s", o->name, o->type == CLI_FLAG ? "" : " ",
                     meta_of(o));
            if (strlen(flag) > 22) printf("  %s\n  %-22s %s\n", flag, "", o->help);
            else printf("  %-22s %s\n", flag, o->help);
        }
        return;
    }
    doc_usage(usage);
    if (!doc_nested) doc_section("DESCRIPTION");
    doc_para(about);
    if (!doc_nested) doc_section("OPTIONS");
    for (const CliOpt *o = opts; o->name; o++) {
        char flag[96], range[96];
        snprintf(flag, sizeof flag, "--%s", o->name);
        range_text(o, range, sizeof range);
        const int ranged =
            o->type != CLI_STR && o->type != CLI_FLAG && (o->min != 0 || o->max != 0);
        doc_option(flag, o->type == CLI_FLAG ? NULL : meta_of(o), ranged ? range : NULL, o->help);
    }
    if (doc_format == DOC_MARKDOWN) putchar('\n');
}

void cli_typed_name(char *buf, size_t n, const char *arg, const char *name) {
    const int len = cli_typed_len(arg);
    if ((size_t)len == strlen(name) + 2 && strncmp(arg + 2, name, (size_t)len - 2) == 0)
        snprintf(buf, n, "%.*s", len, arg);
    else snprintf(buf, n, "%.*s (%s)", len, arg, name);
}

/* Stores val, typed as `arg`, into o. Returns 0, or -1 (printed). */
static int cli_value(const char *cmd, const CliOpt *o, const char *arg, const char *val) {
    char who[160], range[96];
    cli_typed_name(who, sizeof who, arg, o->name);
    range_text(o, range, sizeof range);
    const int ranged = o->min != 0 || o->max != 0;
    if (o->type == CLI_STR) {
        *(const char **)o->dst = val;
        return 0;
    }
    if (o->type == CLI_FLOAT) {
        double v;
        if (parse_f64(val, &v) != 0) {
            errorf("%s: %s = '%.64s' is not a number (expected %s)", cmd, who, val, range);
            return -1;
        }
        if (ranged && (v < o->min || v > o->max)) {
            errorf("%s: %s = %s is out of range (expected %s)", cmd, who, val, range);
            return -1;
        }
        *(double *)o->dst = v;
        return 0;
    }
    long long v;
    const long long bound = o->type == CLI_INT ? 1 << 30 : LLONG_MAX;
    if (parse_i64(val, LLONG_MIN, LLONG_MAX, &v) != 0) {
        errorf("%s: %s = '%.64s' is not an integer (expected %s)", cmd, who, val, range);
        return -1;
    }
    /* in whole numbers: a double near 2^62 would round a value past the bound onto it */
    const long long lo = (long long)o->min, hi = o->max >= 9.2e18 ? LLONG_MAX : (long long)o->max;
    if (ranged ? v < lo || v > hi : v > bound || v < -bound) {
        if (ranged) errorf("%s: %s = %s is out of range (expected %s)", cmd, who, val, range);
        else errorf("%s: %s = %s is out of range (at most %lld in size)", cmd, who, val, bound);
        return -1;
    }
    if (o->type == CLI_INT) *(int *)o->dst = (int)v;
    else *(long long *)o->dst = v;
    return 0;
}

/* The option named name, or NULL after an error naming the nearest one. */
static const CliOpt *cli_find(const char *cmd, const CliOpt *opts, const char *arg,
                              const char *name) {
    for (const CliOpt *o = opts; o->name; o++)
        if (strcmp(o->name, name) == 0) return o;
    const char *best = NULL;
    int bd = 1 << 30;
    for (const CliOpt *p = opts; p->name; p++) {
        int dd = config_edit_distance(name, p->name);
        if (dd < bd) bd = dd, best = p->name;
    }
    const int len = cli_typed_len(arg);
    if (best && bd <= (int)strlen(name) / 3 + 1)
        errorf("%s: unknown option '%.*s' (did you mean '--%s'?)", cmd, len, arg, best);
    else errorf("%s: unknown option '%.*s' (see modtrain %s --help)", cmd, len, arg, cmd);
    return NULL;
}

int cli_parse(const char *cmd, const char *usage, const char *about, const CliOpt *opts, int argc,
              char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        char name[64];
        if (cli_is_help(a)) { /* not a value: those are skipped */
            cli_print_help(usage, about, opts);
            return 0;
        }
        if (!cli_option_name(a, name, sizeof name, &val)) {
            errorf("%s: unexpected argument '%s' (see modtrain %s --help)", cmd, a, cmd);
            return -1;
        }
        const CliOpt *o = cli_find(cmd, opts, a, name);
        if (!o) return -1;
        if (o->type == CLI_FLAG) {
            if (val) {
                errorf("%s: %.*s takes no value (give it alone)", cmd, cli_typed_len(a), a);
                return -1;
            }
            *(int *)o->dst = 1;
            continue;
        }
        if (!val && i + 1 < argc) val = argv[++i];
        if (!val) {
            errorf("%s: %s needs a value", cmd, a);
            return -1;
        }
        if (cli_value(cmd, o, a, val) != 0) return -1;
    }
    return 1;
}
