#!/bin/sh
# Replays every fuzz seed and every input that once crashed or hung a
# parser (tests/fuzz/regressions/NAME/) through its harness, without libFuzzer:
# under the sanitizer build a regression is an AddressSanitizer or UBSan
# report, in any build a crash.
set -eu
srcdir=${srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=$(dirname "${MODTRAIN:-./modtrain}")/tests/fuzz
failures=0
for t in config shard index safetensors vocab cluster plan merges decode spec prep; do
    dirs="$srcdir/tests/fuzz/seeds/$t"
    [ -d "$srcdir/tests/fuzz/regressions/$t" ] && dirs="$dirs $srcdir/tests/fuzz/regressions/$t"
    # shellcheck disable=SC2086 # two directories
    if out=$("$bin/regress_$t" $dirs 2>&1); then
        echo "ok: $t: $out"
    else
        echo "FAIL: $t: $out" >&2
        failures=$((failures + 1))
    fi
done
[ "$failures" -eq 0 ]
