/*
 * What the vocabulary harnesses check of a vocabulary that loaded: the
 * input itself encoded, every id the vocabulary's, decoding back to the
 * input byte for byte (abort otherwise).
 */
#ifndef MODTRAIN_FUZZ_BPE_H
#define MODTRAIN_FUZZ_BPE_H

#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/bpe.h"

static inline void fuzz_bpe_roundtrip(Bpe *b, const uint8_t *data, size_t size) {
    BpeIds ids = {0};
    bpe_encode(b, (const char *)data, size, &ids);
    size_t at = 0;
    for (size_t i = 0; i < ids.n; i++) {
        size_t len = 0;
        const uint8_t *t = bpe_token(b, ids.ids[i], &len);
        if (!t || at + len > size || memcmp(data + at, t, len) != 0) abort();
        at += len;
    }
    if (at != size) abort();
    free(ids.ids);
}

#endif
