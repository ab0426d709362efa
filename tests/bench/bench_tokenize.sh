#!/bin/sh
# GPT-2 BPE tokenising speed: `modtrain prep --tokenizer gpt2` on 1 thread
# and on all cores, next to the npm package js-tiktoken (the reference
# test's implementation, run with node) on the same documents, in the same
# run: every fortune of Debian's fortunes package, as prep --doc-sep %
# splits them, REPEAT (1) times over (repeats make the word cache look
# better than on new text). Prints MB/s of each and the ratios.
# Needs node and npm (jobs/deps.sh --node); the vocabulary and js-tiktoken
# are kept in $MODTRAIN_CACHE (default ~/.cache/modtrain).
# usage: tests/bench/bench_tokenize.sh [REPEAT]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}
repeat=${1:-1}
. "$top/tests/scripts/gpt2_ref.sh"
gpt2_ref_setup
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
files=
i=0
for f in $(find /usr/share/games/fortunes -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort); do
    iconv -f UTF-8 -t UTF-8 "$f" > /dev/null 2>&1 || continue # node reads UTF-8 only
    r=0
    while [ $r -lt "$repeat" ]; do
        i=$((i + 1))
        cp "$f" "$tmp/f$i.txt"
        files="$files $tmp/f$i.txt"
        r=$((r + 1))
    done
done
cat > "$tmp/bench.js" <<'JS'
// the same documents as prep --doc-sep %: encode them all, twice (the
// second pass with node's JIT warm), report MB/s of UTF-8 bytes
const { getEncoding } = require("js-tiktoken");
const splitDocs = require("gpt2_docs");
const fs = require("fs");
const enc = getEncoding("gpt2");
const docs = [];
let bytes = 0;
for (const f of process.argv.slice(2)) {
    const text = fs.readFileSync(f, "utf8");
    bytes += Buffer.byteLength(text);
    docs.push(...splitDocs(text, "%"));
}
for (const pass of ["first", "warm"]) {
    const t0 = process.hrtime.bigint();
    let n = 0;
    for (const d of docs) n += enc.encode(d, [], []).length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(`${pass} ${(bytes / 1e6 / s).toFixed(2)} ${n}`);
}
JS
cores=$(nproc)
rate() { # THREADS: prep's MB/s of tokenising (the best of 3)
    best=0
    for k in 1 2 3; do
        # shellcheck disable=SC2086 # the file list
        r=$("$MODTRAIN" prep --out "$tmp/out" --tokenizer gpt2 --vocab "$vocab" --doc-sep % \
            --val-fraction 0 --threads "$1" $files | sed -n 's/.*tokenised in [0-9.]* s (\([0-9.]*\) MB\/s.*/\1/p')
        best=$(awk -v a="$best" -v b="$r" 'BEGIN { print (b > a ? b : a) }')
    done
    echo "$best"
}
one=$(rate 1)
all=$(rate "$cores")
# shellcheck disable=SC2086
js=$(gpt2_node "$tmp/bench.js" $files)
js_first=$(echo "$js" | awk '$1 == "first" { print $2 }')
js_warm=$(echo "$js" | awk '$1 == "warm" { print $2 }')
mb=$(cat $files | wc -c | awk '{ printf "%.1f", $1 / 1e6 }')
echo "GPT-2 BPE on the fortunes ($mb MB: every fortune a document, the files $repeat times over):"
printf "%-34s %10s %s\n" "" "MB/s" "vs js-tiktoken (warm)"
printf "%-34s %10.2f %.1fx\n" "modtrain, 1 thread" "$one" "$(awk -v a="$one" -v b="$js_warm" 'BEGIN { print a / b }')"
printf "%-34s %10.2f %.1fx\n" "modtrain, $cores threads" "$all" "$(awk -v a="$all" -v b="$js_warm" 'BEGIN { print a / b }')"
printf "%-34s %10.2f\n" "js-tiktoken 1.0.21, first pass" "$js_first"
printf "%-34s %10.2f\n" "js-tiktoken 1.0.21, warm" "$js_warm"
