#!/bin/sh
# prep's rate and memory (no pass or fail): MB/s of input and peak RSS of
# `modtrain prep` on the fortunes REPEAT times over (every fortune a
# document), as text (--doc-sep %) and as gzipped JSON Lines (--jsonl
# text), with the byte tokenizer and with GPT-2's BPE, on 1 and 2 threads,
# under --mem MEM. Each figure is the best of 3 runs (MB/s) and the largest
# of their peaks (RSS); the last column is the peak over --mem. GPT-2's
# vocabulary comes from jobs/get_gpt2_vocab.sh (node and npm; kept in
# $MODTRAIN_CACHE); without it the gpt2 rows are left out, and said so.
# usage: tests/bench/bench_prep.sh [REPEAT (10)] [MEM (512M)]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}
PEAKRSS=${PEAKRSS:-$(dirname "$MODTRAIN")/tests/tools/peakrss}
PYTHON=${PYTHON:-python3}
repeat=${1:-10} mem=${2:-512M}
[ -x "$PEAKRSS" ] || { echo "bench_prep: no $PEAKRSS (make tests/tools/peakrss)" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
files=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort)
# shellcheck disable=SC2086 # the file list
"$PYTHON" - "$repeat" corpus.txt corpus.jsonl $files <<'PY'
import json, sys
n = int(sys.argv[1])
text = b"".join(open(f, "rb").read() for f in sys.argv[4:]).decode("utf-8", "replace")
if not text.endswith("\n"):
    text += "\n"
docs, cur = [], []
for line in text.split("\n")[:-1]:
    if line == "%":
        if cur:
            docs.append("".join(cur))
        cur = []
    else:
        cur.append(line + "\n")
if cur:
    docs.append("".join(cur))
with open(sys.argv[2], "w", encoding="utf-8") as t, open(sys.argv[3], "w", encoding="utf-8") as j:
    for _ in range(n):
        t.write(text)
        for d in docs:
            j.write(json.dumps({"text": d}) + "\n")
PY
gzip -c corpus.jsonl > corpus.jsonl.gz
vocab=
if . "$top/tests/scripts/gpt2_ref.sh" && "$top/jobs/get_gpt2_vocab.sh" "$cache/gpt2" > /dev/null 2>&1; then
    vocab=$cache/gpt2
else
    echo "note: GPT-2's vocabulary could not be fetched: the gpt2 rows are left out"
fi

# one INPUT_KIND TOKENIZER THREADS: "MB/s peak_KiB" of the best of 3
one() {
    case $1 in
    text) input="--doc-sep % corpus.txt" mb=$(wc -c < corpus.txt) ;;
    jsonl.gz) input="--jsonl text corpus.jsonl.gz" mb=$(wc -c < corpus.jsonl) ;;
    esac
    tok="--tokenizer $2"
    [ "$2" = gpt2 ] && tok="$tok --vocab $vocab"
    best=999999 peak=0
    for k in 1 2 3; do
        rm -rf out
        t0=$(date +%s.%N)
        # shellcheck disable=SC2086 # the options
        "$PEAKRSS" rss "$MODTRAIN" prep --out out $tok --threads "$3" --mem "$mem" $input > /dev/null 2> err ||
            { cat err >&2; exit 1; }
        t1=$(date +%s.%N)
        best=$(awk -v a="$best" -v b="$(awk -v x="$t0" -v y="$t1" 'BEGIN { print y - x }')" 'BEGIN { print (b < a ? b : a) }')
        peak=$(awk -v a="$peak" -v b="$(cat rss)" 'BEGIN { print (b > a ? b : a) }')
    done
    awk -v m="$mb" -v s="$best" -v p="$peak" 'BEGIN { printf "%.1f %d\n", m / 1e6 / s, p }'
}
memk=$(echo "$mem" | awk '{ v = $1 + 0; u = substr($1, length($1)); f = u == "K" ? 1 : u == "M" ? 1024 : u == "G" ? 1048576 : 1 / 1024; print v * f }')
echo "prep on the fortunes x$repeat: text $(wc -c < corpus.txt | awk '{ printf "%.1f", $1 / 1e6 }') MB, JSON Lines $(wc -c < corpus.jsonl | awk '{ printf "%.1f", $1 / 1e6 }') MB ($(wc -c < corpus.jsonl.gz | awk '{ printf "%.1f", $1 / 1e6 }') MB gzipped); --mem $mem"
printf "%-10s %-6s %7s %9s %12s %9s\n" input tokenizer threads "MB/s" "peak RSS" "of --mem"
for tk in byte gpt2; do
    [ "$tk" = gpt2 ] && [ -z "$vocab" ] && continue
    for kind in text jsonl.gz; do
        for th in 1 2; do
            # the byte tokenizer on text is one thread's work whatever --threads says
            [ "$tk:$kind:$th" = byte:text:2 ] && continue
            read -r rate peak <<EOF
$(one "$kind" "$tk" "$th")
EOF
            printf "%-10s %-6s %7d %9.1f %8.0f MiB %8.1f%%\n" "$kind" "$tk" "$th" "$rate" "$(awk -v p="$peak" 'BEGIN { print p / 1024 }')" \
                "$(awk -v p="$peak" -v m="$memk" 'BEGIN { print 100 * p / m }')"
        done
    done
done
