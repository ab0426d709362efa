/* Fuzz harness: a safetensors file (st_parse: header length, JSON header,
 * shapes, offsets tiling the data), then every element of what it accepted
 * read back, which must lie inside the input. */
#include <stdlib.h>

#include "checkpoint/safetensors.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    StFile f;
    Err err;
    if (st_parse(&f, data, size, "fuzz.safetensors", &err) != 0) return 0;
    volatile float sink = 0;
    for (int i = 0; i < f.nt; i++) {
        size_t n = st_numel(&f.t[i]);
        for (size_t k = 0; k < n; k++) sink += st_float(&f.t[i], &f, k);
        (void)st_find(&f, f.t[i].name);
    }
    (void)st_meta(&f, "n_layer");
    (void)sink;
    st_free(&f);
    return 0;
}
