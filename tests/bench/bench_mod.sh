#!/bin/sh
# Does a Mixture-of-Depths step cost what its FLOPs say (no pass or fail)?
# At three shapes, a dense model and the same model with every other block
# routed at capacity 12.5% train in turn (dense, MoD, dense, MoD, ...:
# --repeat times each, so the machine's noise falls on both) on the fortunes
# text, one rank; each run's step time is the median of its steps after
# the first (a shared VM's bursts of outside load move a mean by several
# percent, the median barely). Prints per shape the median step times,
# MoD's step-time ratio, its FLOPs ratio (the metrics' flops_ratio_dense),
# their difference and the goal for it (with --repeat above 1, each pair's
# difference too, as the pairs run):
#   gpt2   GPT-2 small (V 50257, d_model 768, 12 layers), T 256, micro-batch 4
#   d128   tests/bench/mod_experiment.sh's model (d_model 128, 8 layers, T 256, B 8)
#   d64    the isoFLOP sweep's smallest (d_model 64, 2 layers, T 256, B 16)
# usage: tests/bench/bench_mod.sh [--shapes "gpt2 d128 d64"] [--steps N]
#            [--repeat N] [--threads N] [-- KEY VALUE ...]
set -eu
set -f
here=$(cd "$(dirname "$0")" && pwd)
. "$here/bench_lib.sh" # med
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}
PYTHON=${PYTHON:-python3}
shapes="gpt2 d128 d64" steps=6 repeat=3 threads=$(nproc)
die() { echo "bench_mod: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    [ "$1" = -- ] && { shift; break; }
    [ $# -ge 2 ] || die "$1 needs a value"
    case $1 in
    --shapes) shapes=$2 ;;
    --steps) steps=$2 ;;
    --repeat) repeat=$2 ;;
    --threads) threads=$2 ;;
    *) die "unknown option '$1' (see the usage at the top of $0)" ;;
    esac
    shift 2
done
wholes "$steps" "$repeat" "$threads"
[ "$steps" -ge 2 ] || die "--steps $steps: at least 2 (the first is left out)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# shape NAME: sets model (the keys), goal, and the tokens a step reads
shape() {
    case $1 in
    gpt2) model="--vocab_size 50257 --d_model 768 --n_head 12 --n_layer 12 --seq_len 256 --batch_size 4 --micro_batch 4"
          goal=0.03 tokens=1024 ;;
    d128) model="--vocab_size 256 --d_model 128 --n_head 4 --n_layer 8 --seq_len 256 --batch_size 8 --micro_batch 8"
          goal=0.03 tokens=2048 ;;
    d64) model="--vocab_size 256 --d_model 64 --n_head 2 --n_layer 2 --seq_len 256 --batch_size 16 --micro_batch 16"
         goal=0.06 tokens=4096 ;;
    *) die "unknown shape '$1' (gpt2, d128 or d64)" ;;
    esac
}
for s in $shapes; do shape "$s"; done
"$PYTHON" "$top/tests/scripts/make_shards.py" text "$tmp/train.bin" \
    $(( (steps + 1) * 4096 + 1 )) --vocab 256 --tokenizer 1

# one ROUTE_EVERY: trains, and prints the median step time over steps 2..
# and the last flops_ratio_dense
one() {
    rm -rf "$tmp/run"
    # shellcheck disable=SC2086 # the model's keys and the extra ones
    "$MODTRAIN" train $model --route_every "$1" --capacity 0.125 \
        --steps "$steps" --threads "$threads" --train_data "$tmp/train.bin" --val_data "" \
        --run_dir "$tmp/run" --resume never --ckpt_every 0 --log_every 1 $extra > "$tmp/log" 2>&1 ||
        { cat "$tmp/log" >&2; die "train failed"; }
    f=$(awk -v out="$tmp/steps" '
            function val(k,   i, r) { i = index($0, "\"" k "\":"); r = substr($0, i + length(k) + 3)
                                      sub(/[,}].*/, "", r); return r }
            /"loss"/ && val("step") + 0 > 1 { print val("step_time_ms") > out; f = val("flops_ratio_dense") }
            END { print f }' "$tmp/run/metrics.jsonl")
    echo "$(med "$tmp/steps" 1) $f"
}
extra="$*"
echo "dense against MoD (every other block routed, capacity 0.125), $threads threads:"
echo "ms a step, the median of $repeat runs, each the median of steps 2..$steps"
printf "%-6s %11s %11s %11s %11s %11s %6s\n" shape dense MoD "time ratio" "FLOPs ratio" difference goal
for s in $shapes; do
    shape "$s"
    : > "$tmp/dense"
    : > "$tmp/mod"
    i=0
    while [ $i -lt "$repeat" ]; do
        one 0 >> "$tmp/dense"
        one 2 >> "$tmp/mod"
        i=$((i + 1))
        # each pair's own difference: this VM's neighbours move it more than
        # the medians show
        [ "$repeat" -gt 1 ] && paste -d ' ' "$tmp/dense" "$tmp/mod" | awk -v s="$s" -v i=$i 'NR == i {
            printf "  %s pair %d: dense %.1f, MoD %.1f ms, difference %+.3f\n", s, i, $1, $3, $3 / $1 - $4 }'
    done
    awk -v s="$s" -v d="$(med "$tmp/dense" 1)" -v m="$(med "$tmp/mod" 1)" -v f="$(med "$tmp/mod" 2)" \
        -v g="$goal" 'BEGIN { r = m / d; printf "%-6s %11.1f %11.1f %11.3f %11.3f %+11.3f %6s\n",
                              s, d, m, r, f, r - f, "<=" g }'
done
