/*
 * The libFuzzer entry point every harness in tests/fuzz defines: one input,
 * any bytes, handed to one of modtrain's parsers of untrusted files. A
 * harness passes when the parser returns (accepting or refusing the input)
 * without a sanitizer report, a crash or a hang.
 */
#ifndef MODTRAIN_FUZZ_H
#define MODTRAIN_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
