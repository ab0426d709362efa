#!/bin/sh
# Tokenising speed of each vocabulary, side by side in one run: `modtrain
# prep --doc-sep % --threads 1` on every fortune of Debian's fortunes
# package, REPEAT (4) times over, with GPT-2's files, cl100k_base,
# o200k_base and llama3 (MB/s of text, the best of ROUNDS (5) rounds, each
# round running every vocabulary once, so that a slow spell of the machine
# falls on all of them), each against GPT-2's (the goal: at least 1.0), and
# tiktoken 1.0.22 (OpenAI's library, its WASM build in node; Llama 3's
# through its constructor of a custom encoding) encoding the same documents
# with each. Needs node and npm (jobs/deps.sh --node); the files are kept
# in $MODTRAIN_CACHE (default ~/.cache/modtrain).
# prep's time includes writing and syncing the shards, which are uint32 for
# the three (twice the bytes of GPT-2's uint16 ones): TMPDIR=/dev/shm
# leaves the disk out.
# A pass over the fortunes once takes 0.1 to 0.2 s, and about 0.1 s of it
# for o200k_base is the first touches of its 200,000-token tables (the
# word cache is empty): REPEAT 1 measures that more than the encoding.
# usage: tests/bench/bench_encodings.sh [REPEAT [ROUNDS]]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}
repeat=${1:-4} rounds=${2:-5}
for n in "$repeat" "$rounds"; do
    case $n in '' | *[!0-9]* | 0) echo "bench_encodings: '$n' is not a whole number >= 1 (usage: bench_encodings.sh [REPEAT [ROUNDS]])" >&2; exit 2 ;; esac
done
. "$top/tests/scripts/gpt2_ref.sh"
tokenizers_setup tiktoken@1.0.22
tk=$cache/tiktoken-1.0.22
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
// ENCODING FILE...: the documents prep --doc-sep % cuts, encoded twice
// (the second pass warm); MB/s of UTF-8 bytes, the warm pass
const { Tiktoken } = require("tiktoken/lite");
const splitDocs = require("gpt2_docs");
const fs = require("fs");
const name = process.argv[2];
const d = require("tiktoken/encoders/" + (name === "llama3" ? "cl100k_base" : name) + ".json");
const enc = name === "llama3" // Llama 3's ranks with cl100k_base's pattern, as Meta's code builds it
    ? new Tiktoken(fs.readFileSync(process.env.LLAMA3, "utf8"), { "<|begin_of_text|>": 128000 }, d.pat_str)
    : new Tiktoken(d.bpe_ranks, d.special_tokens, d.pat_str);
const docs = [];
let bytes = 0;
for (const f of process.argv.slice(3)) {
    const text = fs.readFileSync(f, "utf8");
    bytes += Buffer.byteLength(text);
    docs.push(...splitDocs(text, "%"));
}
let rate = 0;
for (let pass = 0; pass < 2; pass++) {
    const t0 = process.hrtime.bigint();
    for (const doc of docs) enc.encode_ordinary(doc);
    rate = bytes / 1e6 / (Number(process.hrtime.bigint() - t0) / 1e9);
}
console.log(rate.toFixed(2));
enc.free();
JS
rate() { # TOKENIZER VOCAB: prep's MB/s of tokenising on one thread
    # shellcheck disable=SC2086 # the file list
    "$MODTRAIN" prep --out "$tmp/out" --force --tokenizer "$1" --vocab "$2" --doc-sep % \
        --val-fraction 0 --threads 1 $files | sed -n 's/.*tokenised in [0-9.]* s (\([0-9.]*\) MB\/s.*/\1/p'
}
vocabs="gpt2:$vocab cl100k_base:$ranks/cl100k_base.tiktoken o200k_base:$ranks/o200k_base.tiktoken llama3:$ranks/llama3.tiktoken"
k=0
while [ $k -lt "$rounds" ]; do
    for v in $vocabs; do
        e=${v%%:*}
        r=$(rate "$e" "${v#*:}")
        eval "b=\${best_$e:-0}"
        eval "best_$e=$(awk -v a="$b" -v b="$r" 'BEGIN { print (b > a ? b : a) }')"
    done
    k=$((k + 1))
done
mb=$(cat $files | wc -c | awk '{ printf "%.1f", $1 / 1e6 }')
echo "prep --threads 1 on the fortunes ($mb MB: every fortune a document, the files $repeat times over), MB/s, the best of $rounds rounds:"
printf "%-14s %10s %14s %12s %10s\n" "vocabulary" "modtrain" "vs GPT-2's" "tiktoken" "vs tiktoken"
export LLAMA3="$ranks/llama3.tiktoken"
for v in $vocabs; do
    e=${v%%:*} ref=${v%%:*}
    [ "$e" != gpt2 ] || ref=r50k_base
    eval "r=\$best_$e"
    # shellcheck disable=SC2086
    t=$(NODE_PATH="$tk/node_modules:$top/tests/scripts" node "$tmp/bench.js" $ref $files)
    printf "%-14s %10.2f %13.2fx %12.2f %9.1fx\n" "$e" "$r" "$(awk -v a="$r" -v b="$best_gpt2" 'BEGIN { print a / b }')" \
        "$t" "$(awk -v a="$r" -v b="$t" 'BEGIN { print a / b }')"
done
