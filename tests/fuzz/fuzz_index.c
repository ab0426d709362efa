/* Fuzz harness: a checkpoint index (ck_index_parse: every line, the CRC,
 * chunks tiling each tensor), then lookups on what it accepted. A mutation
 * almost never keeps the end line's CRC32 right, so the harness rewrites it
 * (for inputs that have one): the checks behind the CRC get fuzzed too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "checkpoint/ckio.h"
#include "tests/fuzz/fuzz.h"

/* Sets the 8 hex digits after the last "\nend " to the CRC32 of the text
 * before that line, when they are there. */
static void fix_crc(char *text, size_t size) {
    char *end = NULL;
    for (char *p = text; (p = memmem(p, size - (size_t)(p - text), "\nend ", 5)); p++) end = p;
    if (!end || (size_t)(end - text) + 5 + 8 > size) return;
    size_t before = (size_t)(end - text) + 1;
    char hex[9];
    snprintf(hex, sizeof hex, "%08lx", crc32(0L, (const Bytef *)text, (uInt)before));
    memcpy(end + 5, hex, 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    fix_crc(text, size);
    CkIndex ix;
    Err err;
    if (ck_index_parse(&ix, "fuzz", text, size, &err) == 0) {
        (void)ck_kv(&ix, "state.step");
        ck_index_free(&ix);
    }
    free(text);
    return 0;
}
