#!/bin/sh
# Checkpoint benchmark: trains the quickstart model (jobs/small.conf) for a
# while, then on its saved state prints the compression ratio of deflate
# alone, of deflated byte planes (format 1) and of format 2, save and load
# throughput, and the fraction of training time spent saving at the default
# ckpt_every (500).
# usage: tests/bench/bench_ckpt.sh [STEPS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
steps=${1:-200}
MODTRAIN=${MODTRAIN:-$top/modtrain}
BENCH=${CKPT_BENCH:-$(dirname "$MODTRAIN")/tests/bench/ckpt_bench}
[ -x "$BENCH" ] || make -C "$(dirname "$MODTRAIN")" tests/bench/ckpt_bench > /dev/null
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
MODTRAIN=$MODTRAIN "$top/jobs/prep_fortunes.sh" "$tmp/data" > /dev/null
"$MODTRAIN" train --config "$top/jobs/small.conf" --steps "$steps" --eval_every 0 \
    --train_data "$tmp/data/train.bin" --val_data "" --run_dir "$tmp/run" --resume never > "$tmp/train.log"
head -n 3 "$tmp/train.log"
"$BENCH" "$tmp/run/ckpt/step-$(printf %08d "$steps")" "$tmp" 3 | tee "$tmp/bench.txt"
step_ms=$(awk -F'"step_time_ms":' 'NR > 1 && NF > 1 { split($2, a, ","); t += a[1]; n++ } END { print t / n }' \
    "$tmp/run/metrics.jsonl")
save_s=$(sed -n 's/^format 2, level 6: .* save .* (\([0-9.]*\) s), load.*/\1/p' "$tmp/bench.txt")
awk -v ms="$step_ms" -v s="$save_s" 'BEGIN {
    printf "mean step %.1f ms; a save at level 6 takes %.3f s: %.3f%% of training time at ckpt_every = 500\n",
        ms, s, 100 * s / (500 * ms / 1000 + s) }'
