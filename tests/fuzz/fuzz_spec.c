/* Fuzz harness: dataset specs, as train_data, val_data and eval --data
 * take them ("0.7:web/train_*.bin,0.3:code/train_*.bin"). The input, up
 * to its first NUL, is split into parts and weights (ds_parse_spec: no
 * file is read, so the harness never globs the machine), and a blend's
 * schedule is sized from the weights (ds_memory). An accepted spec has
 * 1 to DS_MAX_PARTS parts, each a non-empty pattern with a finite weight
 * above 0, and a schedule of at most 2^DS_PERIOD_BITS samples. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/data/dataset.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *spec = malloc(size + 1);
    if (!spec) return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    char *pats[DS_MAX_PARTS];
    double w[DS_MAX_PARTS];
    Err err;
    const int n = ds_parse_spec(spec, pats, w, &err);
    if (n == 0 || n > DS_MAX_PARTS) abort();
    for (int d = 0; d < n; d++) {
        if (!pats[d][0] || !(w[d] > 0) || !isfinite(w[d])) abort();
        free(pats[d]);
    }
    if (n < 0 && (!err.msg[0] || strchr(err.msg, '\n'))) abort(); /* one line saying why */
    if (n > 0) {
        const size_t bytes = ds_memory(spec, 1, 8, 1);
        /* the schedule is a byte a sample plus every 256th sample's counts */
        if (bytes > ((size_t)1 << DS_PERIOD_BITS) * 2 + 4096 + DS_MAX_PARTS * 65536u) abort();
    }
    free(spec);
    return 0;
}
