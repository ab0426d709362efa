/* Fuzz harness: a BPE vocabulary (bpe_from_memory: encoder.json, then
 * vocab.bpe after the input's first NUL byte), and on what it accepted,
 * the encoding of the input itself, which must decode to it byte for byte
 * and give only ids of the vocabulary. */
#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/bpe.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_bpe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t elen = nul ? (size_t)(nul - data) : size;
    const char *merges = nul ? (const char *)nul + 1 : "";
    const size_t mlen = nul ? size - elen - 1 : 0;
    Err err;
    Bpe *b = bpe_from_memory((const char *)data, elen, merges, mlen, &err);
    if (!b) return 0;
    fuzz_bpe_roundtrip(b, data, size);
    bpe_free(b);
    return 0;
}
