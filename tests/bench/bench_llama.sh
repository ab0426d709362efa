#!/bin/sh
# Does a Llama-style block cost what its FLOPs say (no pass or fail)? A
# GPT-2-small-sized model (V 50257, d_model 768, 12 layers, 12 heads, T 1024,
# one sequence a step by default) trains with GPT-2's blocks and with Llama's (4 kv
# heads, d_ff 2048, an untied head), in turn (gpt2, llama, gpt2, ...:
# --repeat times each, so the machine's noise falls on both), one rank, on
# the fortunes text. Prints per block its median step time (steps 2..),
# FLOPs per token (metrics' flops_per_token), time per GFLOP, and the share
# of the step outside the matrix products (1 - gemm_ms / step_time_ms);
# then llama's time per FLOP over GPT-2's (the goal: at most 1.10) and
# llama's share outside the products (the goal: at most 0.20). With
# --mod, each block's Mixture-of-Depths model (every other block routed at
# capacity 0.125) runs beside its dense one, and the step-time ratio is
# printed against the FLOPs ratio (the goal: within 0.03).
# --batch B trains B sequences a step (in micro-batches of one: a step's
# fixed costs, the optimizer over every weight and the gradients' norm,
# shrink against its compute as B grows, and MoD shrinks only the compute);
# --archs restricts the blocks (the per-FLOP line needs both).
# usage: tests/bench/bench_llama.sh [--steps N] [--repeat N] [--threads N]
#            [--seq_len T] [--batch B] [--archs "gpt2 llama"] [--mod] [-- KEY VALUE ...]
set -eu
set -f
here=$(cd "$(dirname "$0")" && pwd)
. "$here/bench_lib.sh" # med
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}
PYTHON=${PYTHON:-python3}
steps=4 repeat=2 threads=$(nproc) T=1024 mod=0 B=1 archs="gpt2 llama"
die() { echo "bench_llama: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    [ "$1" = -- ] && { shift; break; }
    case $1 in --mod) mod=1; shift; continue ;; esac
    [ $# -ge 2 ] || die "$1 needs a value"
    case $1 in
    --steps) steps=$2 ;;
    --repeat) repeat=$2 ;;
    --threads) threads=$2 ;;
    --seq_len) T=$2 ;;
    --batch) B=$2 ;;
    --archs) archs=$2 ;;
    *) die "unknown option '$1' (see the usage at the top of $0)" ;;
    esac
    shift 2
done
for a in $archs; do case $a in gpt2 | llama) ;; *) die "--archs: '$a' is not gpt2 or llama" ;; esac; done
wholes "$steps" "$repeat" "$threads" "$T" "$B"
[ "$steps" -ge 2 ] || die "--steps $steps: at least 2 (the first is left out)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
"$PYTHON" "$top/tests/scripts/make_shards.py" text "$tmp/train.bin" $(( (steps + 1) * B * T + 1 )) \
    --vocab 256 --tokenizer 1 > /dev/null
common="--vocab_size 50257 --d_model 768 --n_head 12 --n_layer 12 --seq_len $T --batch_size $B --micro_batch 1"
arch_keys() {
    case $1 in
    gpt2) echo "--arch gpt2" ;;
    llama) echo "--arch llama --n_kv_head 4 --d_ff 2048" ;;
    esac
}
# one ARCH ROUTE_EVERY: prints the median step ms (steps 2..), the median
# gemm ms, flops_per_token and flops_ratio_dense of the last step
one() {
    rm -rf "$tmp/run"
    # shellcheck disable=SC2046,SC2086 # the keys
    "$MODTRAIN" train $common $(arch_keys "$1") --route_every "$2" --capacity 0.125 --steps "$steps" \
        --threads "$threads" --train_data "$tmp/train.bin" --val_data "" --run_dir "$tmp/run" \
        --resume never --ckpt_every 0 --log_every 1 $extra > "$tmp/log" 2>&1 ||
        { cat "$tmp/log" >&2; die "train ($1) failed"; }
    f=$(awk -v out="$tmp/steps" '
            function val(k,   i, r) { i = index($0, "\"" k "\":"); r = substr($0, i + length(k) + 3)
                                      sub(/[,}].*/, "", r); return r }
            /"loss"/ && val("step") + 0 > 1 { print val("step_time_ms"), val("gemm_ms") > out
                                              f = val("flops_per_token") " " val("flops_ratio_dense") }
            END { print f }' "$tmp/run/metrics.jsonl")
    echo "$(med "$tmp/steps" 1) $(med "$tmp/steps" 2) $f"
}
extra="$*"
routes=0
[ "$mod" = 0 ] || routes="0 2"
echo "GPT-2's block against Llama's at d_model 768, 12 layers, T $T, $B sequence(s) a step, $threads threads ($("$MODTRAIN" --version | head -n 1)):"
: > "$tmp/all"
r=1
while [ "$r" -le "$repeat" ]; do
    for a in $archs; do
        for re in $routes; do
            echo "$a $re $(one "$a" "$re")" >> "$tmp/all"
        done
    done
    r=$((r + 1))
done
# medians per arch and routing: step ms, gemm ms, flops per token, flops ratio
summary() { awk -v a="$1" -v re="$2" '$1 == a && $2 == re' "$tmp/all" > "$tmp/sel"; echo "$(med "$tmp/sel" 3) $(med "$tmp/sel" 4) $(med "$tmp/sel" 5) $(med "$tmp/sel" 6)"; }
printf '%-8s %10s %10s %14s %12s %10s\n' block "ms/step" "gemm ms" "GFLOP/token" "ms/TFLOP" "non-GEMM"
for a in $archs; do
    set -- $(summary "$a" 0)
    printf '%-8s %10.0f %10.0f %14.3f %12.1f %10.3f\n' "$a" "$1" "$2" "$(echo "$3" | awk '{ print $1 / 1e9 }')" \
        "$(awk -v ms="$1" -v f="$3" -v t="$T" -v b="$B" 'BEGIN { print ms / (f * t * b / 1e12) }')" \
        "$(awk -v ms="$1" -v g="$2" 'BEGIN { print 1 - g / ms }')"
done
[ "$archs" != "gpt2 llama" ] || {
set -- $(summary gpt2 0)
g_ms=$1 g_f=$3
set -- $(summary llama 0)
awk -v gm="$g_ms" -v gf="$g_f" -v lm="$1" -v lf="$3" -v lg="$2" 'BEGIN {
    r = (lm / lf) / (gm / gf)
    printf "llama / gpt2 time per FLOP: %.3f (goal <= 1.10); llama outside the products: %.3f of the step (goal <= 0.20)\n", r, 1 - lg / lm }'
}
[ "$mod" = 0 ] && exit 0
for a in $archs; do
    set -- $(summary "$a" 0)
    d=$1
    set -- $(summary "$a" 2)
    awk -v a="$a" -v d="$d" -v m="$1" -v f="$4" 'BEGIN {
        printf "%s MoD: step-time ratio %.3f, FLOPs ratio %.3f, difference %+.3f (goal within 0.03)\n", a, m / d, f, m / d - f }'
done
