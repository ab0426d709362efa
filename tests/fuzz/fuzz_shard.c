/* Fuzz harness: a token shard's header (shard_parse_header), the input
 * standing for the whole file. */
#include <stdlib.h>

#include "src/data/data.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t n = 0;
    ShardMeta m;
    Err err;
    if (shard_parse_header(data, size, size, "fuzz.bin", &n, &m, &err) == 0 &&
        (n * (size_t)m.width + 1024 != size || m.vocab == 1 || m.vocab < 0 ||
         m.vocab > (m.width == 2 ? 65536 : MODTRAIN_MAX_VOCAB) || m.tokenizer < SHARD_TOK_UNKNOWN ||
         m.tokenizer > SHARD_TOK_LAST))
        abort(); /* accepted a header its file contradicts */
    return 0;
}
