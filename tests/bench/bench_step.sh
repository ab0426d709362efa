#!/bin/sh
# Where a training step's time goes at a realistic shape (no pass or fail):
# GPT-2 small's shape (V 50257, d_model 768, 12 heads, --layers blocks),
# dense, micro-batch --micro of --seq_len tokens, --steps steps on one rank;
# per phase the mean ms of the steps after the first (which pays for
# first touches), the step interval, and from the kernel timers the time in
# sgemm calls and the share of the step outside them. With --against OLD
# (a build of an earlier commit) both binaries run in turn, --repeat times
# each (OLD, NEW, OLD, NEW, ...: the machine's noise falls on both), and
# each figure is the median of the runs; OLD builds without kernel timers
# show '-' for sgemm.
# usage: tests/bench/bench_step.sh [--against OLD] [--layers N] [--seq_len T]
#            [--micro B] [--steps N] [--repeat N] [--threads N] [-- KEY VALUE ...]
set -eu
set -f
here=$(cd "$(dirname "$0")" && pwd)
. "$here/bench_lib.sh" # med
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}
PYTHON=${PYTHON:-python3}
old="" layers=12 seq_len=256 micro=4 steps=5 repeat=1 threads=$(nproc)
die() { echo "bench_step: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    [ "$1" = -- ] && { shift; break; }
    [ $# -ge 2 ] || die "$1 needs a value"
    case $1 in
    --against) old=$2 ;;
    --layers) layers=$2 ;;
    --seq_len) seq_len=$2 ;;
    --micro) micro=$2 ;;
    --steps) steps=$2 ;;
    --repeat) repeat=$2 ;;
    --threads) threads=$2 ;;
    *) die "unknown option '$1' (see the usage at the top of $0)" ;;
    esac
    shift 2
done
wholes "$layers" "$seq_len" "$micro" "$steps" "$repeat" "$threads"
[ "$steps" -ge 2 ] || die "--steps $steps: at least 2 (the first is left out)"
[ -z "$old" ] || [ -x "$old" ] || die "--against $old: not an executable"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
"$PYTHON" "$top/tests/scripts/make_shards.py" text "$tmp/train.bin" \
    $(( (steps + 1) * micro * seq_len + 1 )) --vocab 50257 --tokenizer 0
model="--vocab_size 50257 --d_model 768 --n_head 12 --n_layer $layers --route_every 0"
fields="interval_ms forward backward optimizer data other gemm_ms"

# one BINARY [KEY VALUE ...]: trains, and prints the mean of each field
# over steps 2..
one() {
    bin=$1
    shift
    rm -rf "$tmp/run"
    # shellcheck disable=SC2086 # the model's keys and the extra ones
    "$bin" train $model --seq_len "$seq_len" --batch_size "$micro" --micro_batch "$micro" \
        --steps "$steps" --threads "$threads" --train_data "$tmp/train.bin" --val_data "" \
        --run_dir "$tmp/run" --resume never --ckpt_every 0 --log_every 1 "$@" > "$tmp/log" 2>&1 ||
        { cat "$tmp/log" >&2; die "$bin train failed"; }
    awk -v fields="$fields" '
        function val(k,   i, r) { i = index($0, "\"" k "\":"); if (!i) return "-"
            r = substr($0, i + length(k) + 3); sub(/[,}].*/, "", r); return r }
        /"loss"/ && val("step") + 0 > 1 {
            n++; k = split(fields, f, " ")
            for (j = 1; j <= k; j++) { v = val(f[j]); if (v == "-") miss[j] = 1; else s[j] += v }
        }
        END { k = split(fields, f, " ")
              for (j = 1; j <= k; j++) printf "%s ", (miss[j] || !n) ? "-" : sprintf("%.1f", s[j] / n)
              print "" }' "$tmp/run/metrics.jsonl"
}
shift_args="$*"
i=0
while [ $i -lt "$repeat" ]; do
    # shellcheck disable=SC2086
    [ -z "$old" ] || one "$old" $shift_args >> "$tmp/old"
    # shellcheck disable=SC2086
    one "$MODTRAIN" $shift_args >> "$tmp/new"
    i=$((i + 1))
done
echo "GPT-2 small's shape, $layers layers, seq_len $seq_len, micro-batch $micro, $threads threads: ms a step (the median of $repeat runs, each the mean of steps 2..$steps)"
printf "%-10s" ""
for f in $fields; do printf "%11s" "$f"; done
printf "%15s\n" "outside sgemm"
for who in old new; do
    [ -f "$tmp/$who" ] || continue
    printf "%-10s" "$who"
    c=1
    for f in $fields; do printf "%11s" "$(med "$tmp/$who" $c)"; c=$((c + 1)); done
    it=$(med "$tmp/$who" 1) g=$(med "$tmp/$who" 7)
    if [ "$g" = - ]; then printf "%15s\n" -; else awk -v i="$it" -v g="$g" 'BEGIN { printf "%14.1f%%\n", 100 * (i - g) / i }'; fi
done
if [ -f "$tmp/old" ]; then
    awk -v a="$(med "$tmp/old" 1)" -v b="$(med "$tmp/new" 1)" 'BEGIN { printf "new / old step time: %.3f\n", b / a }'
fi
