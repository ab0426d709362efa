/* Fuzz harness: a Hugging Face tokenizer.json (bpe_from_hf), and on what
 * it accepted, the encoding of the input itself, which must decode to it
 * byte for byte. */
#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/bpe.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_bpe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Err err;
    Bpe *b = bpe_from_hf((const char *)data, size, &err);
    if (!b) return 0;
    fuzz_bpe_roundtrip(b, data, size);
    bpe_free(b);
    return 0;
}
