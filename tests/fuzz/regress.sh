#!/bin/sh
# Replays every fuzz seed and every input that once crashed or hung a
# parser (tests/fuzz/regressions/NAME/) through its harness, without libFuzzer:
# under the sanitizer build a regression is an AddressSanitizer or UBSan
# report, in any build a crash.
. "$(dirname "$0")/../scripts/lib.sh"
bin=$(dirname "$MODTRAIN")/tests/fuzz
for t in config shard index safetensors vocab ranks hf cluster plan merges decode spec prep; do
    dirs="$srcdir/tests/fuzz/seeds/$t"
    [ -d "$srcdir/tests/fuzz/regressions/$t" ] && dirs="$dirs $srcdir/tests/fuzz/regressions/$t"
    # shellcheck disable=SC2086 # two directories
    if out=$("$bin/regress_$t" $dirs 2>&1); then ok "$t: $out"; else fail "$t: $out"; fi
done
finish
