#!/bin/sh
# Checkpoint benchmark: trains the quickstart model (jobs/small.conf) for a
# while, then on its saved state prints the compression ratio of deflate
# alone, of deflated byte planes (format 1) and of format 2, save and load
# throughput, and the fraction of training time spent saving at the default
# ckpt_every (500).
#
# With --gpt2, the GPT-2-small shape instead (vocabulary 50257, d_model 768,
# 12 layers, 12 heads, seq_len 256, batch 4; random tokens), at 1 rank x 2
# threads and 2 ranks (dp 2) x 1 thread. First 3 steps with a synchronous
# save after each: per layout the step time, each save's time, MB/s of
# state and ratio, the raw write bandwidth of the same folder (dd ...
# conv=fsync of the same size, measured in the same run), load + verify
# MB/s, and the peak RSS before and after a save. Then the whole cost of a
# save to training, synchronous and asynchronous, each measured within its
# run (the machine drifts between runs): GPT2_STEPS (20) steps with a save
# after half of them; the stalls plus the extra time of the steps the save
# was in flight for over the run's median step, the asynchronous stall
# alone, its time in the background, and peak RSS.
# usage: tests/bench/bench_ckpt.sh [STEPS] | tests/bench/bench_ckpt.sh --gpt2
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}

# train RUN NP THREADS [--key value ...]: the GPT-2-small shape, logged to RUN.log
train() {
    run=$1 np=$2 thr=$3
    shift 3
    if [ "$np" -eq 1 ]; then
        "$MODTRAIN" train $model --val_data "" --threads "$thr" --run_dir "$run" "$@" > "$run.log" 2>&1
    else
        mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" "$MODTRAIN" train \
            $model --val_data "" --threads "$thr" --run_dir "$run" "$@" > "$run.log" 2>&1
    fi || { cat "$run.log"; exit 1; }
}

# cost RUN LAST: the whole cost of the run's one periodic save (step S),
# measured within the run: the stalls it caused (the final save's left
# out) plus the extra time of the steps it was in flight for (S + 1 to the
# step that saw its commit) over the median of the other steps from 2 on;
# prints "COST MEDIAN STEP"
cost() {
    awk -v last="$2" -F'[:,}]' '
        function val(key,   i) { for (i = 1; i < NF; i++) if ($i ~ key) return $(i + 1); return "" }
        { step = $2 + 0 }
        /"step_time_ms"/ { t[step] = val("\"step_time_ms\"") / 1e3 }
        /"ckpt_stall_ms"/ { x = val("\"ckpt_stall_ms\"") / 1e3; stall += x; if (step == last) final = x }
        /"ckpt_step"/ { c = val("\"ckpt_step\"") + 0; if (c < last) { from = c; to = step } }
        END {
            n = 0
            for (k = 2; k <= last; k++) if (k <= from || k > to) {
                for (j = ++n; j > 1 && v[j - 1] > t[k]; j--) v[j] = v[j - 1]
                v[j] = t[k]
            }
            med = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
            extra = 0
            for (k = from + 1; k <= to; k++) extra += t[k] - med
            printf "%.2f %.2f", stall - final + extra, med
        }' "$1/metrics.jsonl"
}

# mean KEY RUN: the mean of KEY over the records that have it
mean() {
    awk -F"\"$1\":" -v fmt="${3:-%.2f}" 'NF > 1 { split($2, a, /[,}]/); t += a[1]; n++ }
        END { printf fmt, n ? t / n : 0 }' "$2/metrics.jsonl"
}

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
    model="--train_data $tmp/train.bin --d_model 768 --n_layer 12 --n_head 12 \
        --seq_len 256 --batch_size 4 --route_every 0 --ckpt_keep 1 --eval_every 0"
    steps=${GPT2_STEPS:-20} every=$(( ${GPT2_STEPS:-20} / 2 ))
    echo "Synchronous saves (ckpt_async 0), 3 steps with a save after each:"
    printf "%-18s %8s %8s %9s %7s %9s %10s %s\n" layout "step s" "save s" "save MB/s" ratio \
        "dd MB/s" "load MB/s" "peak RSS before -> after a save (rank 0)"
    for lay in "1 2" "2 1"; do
        set -- $lay
        run="$tmp/sync-$1x$2"
        train "$run" "$1" "$2" --steps 3 --ckpt_every 1 --ckpt_async 0
        m="$run/metrics.jsonl"
        step_s=$(awk -F'"step_time_ms":' 'NF > 1 && !/"step":1,/ { split($2, a, ","); t += a[1]; n++ }
            END { printf "%.2f", t / n / 1000 }' "$m")
        save=$(mean ckpt_s "$run")
        mbs=$(mean ckpt_mb_s "$run" %.0f)
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
        rm -rf "$run"
    done
    echo
    echo "The whole cost of one save, within each run: $steps steps, a save after $every (and at the end, left out):"
    printf "%-18s %8s %10s %10s %12s %12s %9s %s\n" layout "step s" "sync cost" "async cost" \
        "async stall" "async total" "RSS MB" "(training alone, sync, async: peak RSS of rank 0)"
    for lay in "1 2" "2 1"; do
        set -- $lay
        for how in sync async; do
            train "$tmp/$how-$1x$2" "$1" "$2" --steps "$steps" --ckpt_every "$every" \
                --ckpt_async "$([ $how = async ] && echo 1 || echo 0)"
        done
        set -- "$1" "$2" $(cost "$tmp/sync-$1x$2" "$steps") $(cost "$tmp/async-$1x$2" "$steps")
        awk -v l="$1 rank x $2 thr" -v sync="$3" -v step="$4" -v async="$5" \
            -v stall="$(awk -F'"ckpt_stall_ms":' -v at="$every" 'NF > 1 && $0 ~ "\"step\":" at "," {
                split($2, a, /[,}]/); printf "%.2f", a[1] / 1e3 }' "$tmp/async-$1x$2/metrics.jsonl")" \
            -v total="$(awk -F'"ckpt_s":' '/"ckpt_async":1/ { split($2, a, ","); printf "%.2f", a[1] }' \
                "$tmp/async-$1x$2/metrics.jsonl")" \
            -v rss="$({ grep -m 1 '"ckpt_rss_before_mb"' "$tmp/sync-$1x$2/metrics.jsonl" |
                sed 's/.*"ckpt_rss_before_mb":\([^,]*\),.*/\1/'; for h in sync async; do
                grep '"ckpt_rss_after_mb"' "$tmp/$h-$1x$2/metrics.jsonl" | tail -n 1 |
                sed 's/.*"ckpt_rss_after_mb":\([^}]*\).*/\1/'; done; } | tr '\n' ' ')" 'BEGIN {
            printf "%-18s %8.2f %9.2fs %9.2fs %11.2fs %11.2fs %s\n", l, step, sync, async, stall,
                total, rss }'
        rm -rf "$tmp"/*-"$1x$2"
    done
    echo "(cost: the stalls plus the steps' extra time while the save was in flight, over the"
    echo " run's median step; async stall: the staging copy; async total: the save's time in the"
    echo " background from the copy to the commit)"
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
    --train_data "$tmp/data/train_000000.bin" --val_data "" --run_dir "$tmp/run" --resume never > "$tmp/train.log"
head -n 3 "$tmp/train.log"
"$BENCH" "$tmp/run/ckpt/step-$(printf %08d "$steps")" "$tmp" 3 | tee "$tmp/bench.txt"
step_ms=$(awk -F'"step_time_ms":' 'NR > 1 && NF > 1 { split($2, a, ","); t += a[1]; n++ } END { print t / n }' \
    "$tmp/run/metrics.jsonl")
save_s=$(sed -n 's/^format 2, level 6: .* save .* (\([0-9.]*\) s), load.*/\1/p' "$tmp/bench.txt")
awk -v ms="$step_ms" -v s="$save_s" 'BEGIN {
    printf "mean step %.1f ms; a save at level 6 takes %.3f s: %.3f%% of training time at ckpt_every = 500\n",
        ms, s, 100 * s / (500 * ms / 1000 + s) }'
