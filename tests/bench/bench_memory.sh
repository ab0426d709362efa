#!/bin/sh
# Peak memory of training at realistic shapes, measured: GPT-2 small's shape
# (V 50257, d_model 768, 12 heads, --layers blocks) at micro-batch 4 and
# each --seq_lens, for every recompute mode the binary has, and for
# --against OLD (another modtrain, e.g. a build of an earlier commit) beside
# it, with OLD's plain run as the base of every ratio. Each run trains
# --steps steps on synthetic tokens; a run train refuses before allocating
# (its memory check) prints its one-line reason. Peak RSS is the kernel's
# (/usr/bin/time's maximum resident set), plan's figure is printed beside it.
# usage: tests/bench/bench_memory.sh [--against OLD] [--layers N] [--steps N]
#            [--seq_lens "1024 4096"] [--micro B] [--threads N]
set -eu
set -f # the fields of a run's line are words, never file patterns
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}
PYTHON=${PYTHON:-python3}
old="" layers=12 steps=1 seq_lens="1024 4096" micro=4 threads=$(nproc)
die() { echo "bench_memory: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || die "$1 needs a value"
    case $1 in
    --against) old=$2 ;;
    --layers) layers=$2 ;;
    --steps) steps=$2 ;;
    --seq_lens) seq_lens=$2 ;;
    --micro) micro=$2 ;;
    --threads) threads=$2 ;;
    *) die "unknown option '$1' (see the usage at the top of $0)" ;;
    esac
    shift 2
done
for v in "$layers" "$steps" "$micro" "$threads" $seq_lens; do
    case $v in '' | *[!0-9]* | 0*) die "'$v' is not a whole number >= 1" ;; esac
done
[ -z "$old" ] || [ -x "$old" ] || die "--against $old: not an executable"
[ -x /usr/bin/time ] || die "/usr/bin/time is missing (apt-get install time)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM # through the EXIT trap
max_t=0
for t in $seq_lens; do [ "$t" -gt "$max_t" ] && max_t=$t; done
"$PYTHON" "$top/tests/scripts/make_shards.py" text "$tmp/train.bin" \
    $(( (steps + 1) * micro * max_t + 1 )) --vocab 50257 --tokenizer 0

model="--vocab_size 50257 --d_model 768 --n_head 12 --n_layer $layers --route_every 0"
# modes BINARY: the recompute modes BINARY's train knows
modes() { "$1" train --help 2>&1 | sed -n 's/.*recompute.*(\(none[^)]*\)).*/\1/p' | tr -d ',' | head -n 1; }
# one BINARY T MODE: "peak_MiB plan_GiB", or "- reason" when train refused
one() {
    rc_arg=""
    [ "$3" = "-" ] || rc_arg="--recompute $3"
    plan=$("$1" plan $model --seq_len "$2" --batch_size "$micro" $rc_arg --layout 1,1,1 2>/dev/null |
        sed -n 's/^ *1 *1 *1 *1 *[0-9]* *\([0-9.]* [GMK]iB\).*/\1/p')
    rc=0
    /usr/bin/time -f %M -o "$tmp/rss" "$1" train $model --seq_len "$2" --batch_size "$micro" \
        $rc_arg --steps "$steps" --threads "$threads" --train_data "$tmp/train.bin" --val_data "" \
        --run_dir "$tmp/run" --resume never --ckpt_every 0 --log_every 1000 > "$tmp/log" 2>&1 || rc=$?
    if [ "$rc" = 0 ]; then
        echo "$(awk '/^[0-9]+$/ { printf "%.0f", $1 / 1024 }' "$tmp/rss") ${plan:-?}"
    elif [ "$rc" = 2 ]; then # train's refusal before it allocates: its one line
        echo "- $(grep -m 1 '^modtrain' "$tmp/log" | cut -c1-160)"
    else
        echo "- failed with exit code $rc (137: killed, e.g. out of memory): $(tail -n 1 "$tmp/log" | cut -c1-120)"
    fi
    rm -rf "$tmp/run"
}
echo "GPT-2 small's shape: V 50257, d_model 768, 12 heads, $layers layers, micro-batch $micro, $steps step(s), $threads threads"
printf "%-6s %-10s %-10s %12s %12s %10s\n" seq_len binary recompute "peak MiB" "plan" "of base"
new_modes=$(modes "$MODTRAIN")
for t in $seq_lens; do
    base=""
    if [ -n "$old" ]; then
        set -- $(one "$old" "$t" -)
        if [ "$1" = "-" ]; then shift; echo "$t     against    -          refused: $*"
        else base=$1; printf "%-6s %-10s %-10s %12s %12s %10s\n" "$t" against none "$1" "$2 $3" 1.000; fi
    fi
    for mode in ${new_modes:--}; do
        set -- $(one "$MODTRAIN" "$t" "$mode")
        if [ "$1" = "-" ]; then shift; echo "$t     this       $mode refused: $*"; continue; fi
        ratio=-
        [ -z "$base" ] || ratio=$(awk -v a="$1" -v b="$base" 'BEGIN { printf "%.3f", a / b }')
        label=$mode
        [ "$mode" != - ] || label=none
        printf "%-6s %-10s %-10s %12s %12s %10s\n" "$t" this "$label" "$1" "$2 $3" "$ratio"
    done
done
