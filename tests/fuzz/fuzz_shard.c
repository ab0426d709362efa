/* Fuzz harness: a token shard's header (shard_parse_header), the input
 * standing for the whole file. */
#include <stdlib.h>

#include "src/data.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t n = 0;
    int vocab = 0;
    Err err;
    if (shard_parse_header(data, size, size, "fuzz.bin", &n, &vocab, &err) == 0 &&
        (n * 2 + 1024 != size || vocab == 1 || vocab < 0 || vocab > 65536))
        abort(); /* accepted a header its file contradicts */
    return 0;
}
