#!/bin/sh
# Hash flooding: the time `modtrain tokenize --hash` takes to load a valid
# vocabulary of MERGES (default 200000) merges crafted to collide in the
# merge table of the unkeyed hash the tokenizer once used, next to the same size
# spread out (tests/bench/vocab_flood writes both). With a second modtrain
# (OTHER, e.g. a build of an older commit) it times that one too.
# usage: tests/bench/bench_vocab_flood.sh [MERGES [OTHER]]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}
gen=$(dirname "$MODTRAIN")/tests/bench/vocab_flood
merges=${1:-200000}
other=${2:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-flood.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
load_s() { # BINARY DIR: seconds to load DIR's vocabulary
    t0=$(date +%s.%N)
    "$1" tokenize --vocab "$2" --hash > /dev/null
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}
printf "%-10s %8s %10s %10s\n" "" "MB" "this (s)" "other (s)"
for kind in crafted spread; do
    mkdir -p "$tmp/$kind"
    "$gen" "$tmp/$kind" "$merges" "$kind" > /dev/null
    mb=$(cat "$tmp/$kind/encoder.json" "$tmp/$kind/vocab.bpe" | wc -c | awk '{ printf "%.1f", $1 / 1e6 }')
    this=$(load_s "$MODTRAIN" "$tmp/$kind")
    that=-
    [ -n "$other" ] && that=$(load_s "$other" "$tmp/$kind")
    printf "%-10s %8s %10s %10s\n" "$kind" "$mb" "$this" "$that"
done
