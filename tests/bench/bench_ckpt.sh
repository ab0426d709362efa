#!/bin/sh
# Checkpoint benchmark: trains the quickstart model (jobs/small.conf) for a
# while, then on its saved state prints the compression ratio of deflate
# alone, of deflated byte planes (format 1) and of format 2, save and load
# throughput, and the fraction of training time spent saving at the default
# ckpt_every (500).
#
# With --gpt2, the GPT-2-small shape instead (vocabulary 50257, d_model 768,
# 12 layers, 12 heads, seq_len 256, batch 4; random tokens): 3 steps with a
# save after each, at 1 rank x 2 threads and 2 ranks (dp 2) x 1 thread;
# per layout the step time, each save's time, MB/s of state and ratio, the
# raw write bandwidth of the same folder (dd ... conv=fsync of the same
# size, measured in the same run), load + verify MB/s, and the peak RSS
# before and after a save.
# usage: tests/bench/bench_ckpt.sh [STEPS] | tests/bench/bench_ckpt.sh --gpt2
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}

gpt2() {
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    python3 - "$tmp/train.bin" <<'PY'
import random, struct, sys
random.seed(1)
n = 600000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, 50257, *[0] * 252))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PY
    model="--train_data $tmp/train.bin --val_data '' --d_model 768 --n_layer 12 --n_head 12 \
        --seq_len 256 --batch_size 4 --route_every 0 --steps 3 --ckpt_every 1 --ckpt_keep 1"
    printf "%-18s %8s %8s %9s %7s %9s %10s %s\n" layout "step s" "save s" "save MB/s" ratio \
        "dd MB/s" "load MB/s" "peak RSS before -> after a save (rank 0)"
    for lay in "1 2" "2 1"; do
        set -- $lay
        run="$tmp/run-$1x$2"
        if [ "$1" -eq 1 ]; then
            eval "\"$MODTRAIN\" train $model --threads $2 --run_dir $run" > "$run.log" 2>&1
        else
            eval "mpirun --allow-run-as-root --oversubscribe --bind-to none -np $1 \"$MODTRAIN\" train \
                $model --threads $2 --run_dir $run" > "$run.log" 2>&1
        fi || { cat "$run.log"; exit 1; }
        m="$run/metrics.jsonl"
        step_s=$(awk -F'"step_time_ms":' 'NF > 1 && !/"step":1,/ { split($2, a, ","); t += a[1]; n++ }
            END { printf "%.2f", t / n / 1000 }' "$m")
        save=$(awk -F'"ckpt_s":' 'NF > 1 { split($2, a, ","); t += a[1]; n++ } END { printf "%.2f", t / n }' "$m")
        mbs=$(awk -F'"ckpt_mb_s":' 'NF > 1 { split($2, a, ","); t += a[1]; n++ } END { printf "%.0f", t / n }' "$m")
        ratio=$(grep '"ckpt_ratio"' "$m" | tail -n 1 | sed 's/.*"ckpt_ratio":\([^,]*\).*/\1/')
        rss=$(grep '"ckpt_rss_before_mb"' "$m" | head -n 1 |
            sed 's/.*"ckpt_rss_before_mb":\([^,]*\),"ckpt_rss_after_mb":\([^}]*\).*/\1 MB -> \2 MB/')
        bytes=$(stat -c %s "$run/ckpt/step-00000003/data.bin")
        t0=$(date +%s.%N)
        dd if=/dev/zero of="$tmp/dd" bs=1M count=$((bytes >> 20)) conv=fsync 2> /dev/null
        t1=$(date +%s.%N)
        rm -f "$tmp/dd"
        "$MODTRAIN" ckpt verify --ckpt "$run/ckpt/step-00000003" > /dev/null
        t2=$(date +%s.%N)
        raw=$(awk -v b="$bytes" -v r="$ratio" 'BEGIN { print b * r }')
        awk -v l="$1 rank x $2 thr" -v st="$step_s" -v sv="$save" -v mbs="$mbs" -v r="$ratio" \
            -v b="$bytes" -v raw="$raw" -v a="$t0" -v b1="$t1" -v c="$t2" -v rss="$rss" 'BEGIN {
            printf "%-18s %8s %8s %9s %7.3f %9.0f %10.0f %s\n", l, st, sv, mbs, r,
                b / (b1 - a) / 1e6, raw / (c - b1) / 1e6, rss }'
    done
}
if [ "${1:-}" = "--gpt2" ]; then
    gpt2
    exit 0
fi
steps=${1:-200}
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
