/*
 * cli: subcommand options, with the same nearest-name hint as config keys.
 */
#include "src/cmd/cli.h"

#include <ctype.h>
#include <limits.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/config.h"
#include "src/base/util.h"

static void print_help(const char *usage, const char *about, const CliOpt *opts) {
    printf("usage: %s\n%s\n\noptions:\n", usage, about);
    for (const CliOpt *o = opts; o->name; o++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", o->name);
        for (char *p = flag + 2; *p; p++)
            if (*p == '_') *p = '-';
        printf("  %-18s %s\n", flag, o->help);
    }
}

int cli_parse(const char *cmd, const char *usage, const char *about, const CliOpt *opts, int argc,
              char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_help(usage, about, opts);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) {
            errorf("%s: unexpected argument '%s' (see modtrain %s --help)", cmd, a, cmd);
            return -1;
        }
        char name[64];
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (len >= sizeof name) len = sizeof name - 1;
        for (size_t k = 0; k < len; k++) name[k] = a[2 + k] == '-' ? '_' : a[2 + k];
        name[len] = '\0';
        const CliOpt *o = opts;
        for (; o->name; o++)
            if (strcmp(o->name, name) == 0) break;
        if (!o->name) {
            const char *best = NULL;
            int bd = 1 << 30;
            for (const CliOpt *p = opts; p->name; p++) {
                int dd = config_edit_distance(name, p->name);
                if (dd < bd) bd = dd, best = p->name;
            }
            if (best && bd <= (int)strlen(name) / 3 + 1)
                errorf("%s: unknown option '--%s' (did you mean '--%s'?)", cmd, name, best);
            else errorf("%s: unknown option '--%s' (see modtrain %s --help)", cmd, name, cmd);
            return -1;
        }
        if (o->type == CLI_FLAG) {
            *(int *)o->dst = 1;
            continue;
        }
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val) {
            errorf("%s: --%s needs a value", cmd, name);
            return -1;
        }
        switch (o->type) {
        case CLI_STR: *(const char **)o->dst = val; break;
        case CLI_INT:
        case CLI_I64: {
            long long v;
            const long long bound = o->type == CLI_INT ? 1 << 30 : LLONG_MAX;
            if (parse_i64(val, LLONG_MIN, LLONG_MAX, &v) != 0) {
                errorf("%s: --%s = '%s' is not an integer", cmd, name, val);
                return -1;
            }
            if (v > bound || v < -bound) {
                errorf("%s: --%s = %s is out of range (at most %lld in size)", cmd, name, val,
                       bound);
                return -1;
            }
            if (o->type == CLI_INT) *(int *)o->dst = (int)v;
            else *(long long *)o->dst = v;
            break;
        }
        case CLI_FLOAT: {
            double v;
            if (parse_f64(val, &v) != 0) {
                errorf("%s: --%s = '%s' is not a number", cmd, name, val);
                return -1;
            }
            *(double *)o->dst = v;
            break;
        }
        case CLI_FLAG: break;
        }
    }
    return 1;
}
