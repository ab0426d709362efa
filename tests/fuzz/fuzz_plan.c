/* Fuzz harness: the planner's inputs. The input is a cluster file, a line
 * "%%", a config file (the model's dims, batch, schedule, ...), and
 * optionally a line "%%" and a layout (TP,PP,RANKS_PER_NODE, as plan
 * --layout takes it): cluster_load_text, config_load_text and
 * config_validate, then plan_layout of that layout or plan_candidates of
 * all, as `modtrain plan` runs them. Every accepted input is planned in
 * about a second at most without the sanitizers (libFuzzer's -timeout, set
 * in run.sh, catches a hang), and the planner builds a few registry rows a
 * layout, not a registry a stage. */
#include <stdlib.h>
#include <string.h>

#include "src/plan/plan.h"
#include "tests/fuzz/fuzz.h"

/* The next section of text (up to a line "%%" or the end): *len bytes
 * from the returned pointer; *rest after the separator, or NULL. */
static char *section(char *text, size_t size, char **rest, size_t *len) {
    for (size_t i = 0; i + 2 <= size; i++)
        if ((i == 0 || text[i - 1] == '\n') && text[i] == '%' && text[i + 1] == '%' &&
            (i + 2 == size || text[i + 2] == '\n')) {
            text[i] = '\0';
            *len = i;
            *rest = i + 3 <= size ? text + i + 3 : text + size;
            return text;
        }
    *len = size;
    *rest = NULL;
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char *conf, *lay;
    size_t ncl, nconf, nlay;
    char *cluster = section(text, size, &conf, &ncl);
    Cluster cl;
    Config c;
    Err err;
    cluster_defaults(&cl);
    config_defaults(&c);
    if (!conf || cluster_load_text(&cl, cluster, ncl, "fuzz.cluster", &err) != 0) goto done;
    conf = section(conf, size - (size_t)(conf - text), &lay, &nconf);
    if (config_load_text(&c, conf, nconf, "fuzz.conf", &err) != 0 || config_validate(&c, &err) != 0)
        goto done;
    if (!c.vocab_size) c.vocab_size = 50257; /* plan's default without data */
    const size_t before = model_registry_rows_built();
    int layouts = 1;
    if (lay) {
        char *l = section(lay, size - (size_t)(lay - text), &lay, &nlay);
        if (nlay && l[nlay - 1] == '\n') l[--nlay] = '\0';
        int tp, pp, rpn;
        PlanRow row;
        if (plan_parse_layout(l, &tp, &pp, &rpn) != 0 || pp > c.n_layer) goto done;
        size_t *stage = malloc((size_t)pp * sizeof *stage);
        if (stage) plan_layout(&c, &cl, tp, pp, rpn, &row, stage, &err);
        free(stage);
    } else {
        PlanRow *rows = NULL;
        layouts = plan_candidates(&c, &cl, &rows, &err);
        for (int i = 1; i < layouts; i++) /* fitting first, then by tokens/s */
            if (rows[i].fits > rows[i - 1].fits ||
                (rows[i].fits == rows[i - 1].fits &&
                 rows[i].tokens_per_s > rows[i - 1].tokens_per_s))
                abort();
        free(rows);
    }
    /* a layout measures one block of each kind (dense, routed, MoE, routed
     * MoE: at most 71 rows with the predictor and one expert's 4) */
    if (model_registry_rows_built() - before > 80 * (size_t)(layouts > 0 ? layouts + 1 : 1))
        abort(); /* a registry a stage (or every expert's rows) again: minutes on a big node */
done:
    free(text);
    return 0;
}
