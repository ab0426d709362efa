/* Fuzz harness: a tiktoken rank file (bpe_from_ranks), of the encoding the
 * input's first byte picks (r50k_base, cl100k_base, o200k_base, llama3), and on
 * what it accepted, the encoding of the input itself, which must decode to
 * it byte for byte. */
#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/bpe.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_bpe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    static const char *const encodings[4] = {"r50k_base", "cl100k_base", "o200k_base", "llama3"};
    Err err;
    Bpe *b = bpe_from_ranks((const char *)data + 1, size - 1, encodings[data[0] % 4], &err);
    if (!b) return 0;
    fuzz_bpe_roundtrip(b, data, size);
    bpe_free(b);
    return 0;
}
