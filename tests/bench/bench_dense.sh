#!/bin/sh
# Trains the same dense GPT (byte vocab, d_model 256, 8 layers, 8 heads,
# seq_len 256, batch 8) in modtrain and in PyTorch with the same thread count,
# one after the other in one run, and prints tokens/s of each, their ratio,
# and modtrain's MFU against the BLIS sgemm peak it measured. Debian's
# PyTorch calls the system BLAS, which is BLIS here: the fair baseline gives
# it the kernels modtrain uses (BLIS_ARCH_TYPE from `modtrain --version`);
# PyTorch with BLIS's own choice of kernels is printed beside it. BLIS runs
# PyTorch's products on THREADS threads too (torch_train.py sets
# BLIS_NUM_THREADS: BLIS does not follow torch.set_num_threads).
# With REPEAT > 1, modtrain and PyTorch (the same kernels) run in turn
# REPEAT times (the machine's drift falls on both; PyTorch's speed moved
# by 10% over a day here), and the ratio is of the two medians. The last
# lines put 3x PyTorch's speed in GFLOP/s beside the cores' FMA peak
# (tests/bench/fma_peak, built by make check) and split both steps into
# matrix products and the rest.
# usage: tests/bench/bench_dense.sh [THREADS] [STEPS] [N_LAYER] [REPEAT]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/bench_lib.sh" # med
top=$(cd "$here/../.." && pwd)
threads=${1:-$(nproc)}
steps=${2:-10}
layers=${3:-8}
repeat=${4:-1}
for v in "$threads" "$steps" "$layers" "$repeat"; do
    case $v in '' | *[!0-9]* | 0*) echo "bench_dense: '$v' is not a whole number >= 1" >&2; exit 2 ;; esac
done
MODTRAIN=${MODTRAIN:-$top/modtrain}
PYTHON=${PYTHON:-/usr/bin/python3}
FMA_PEAK=${FMA_PEAK:-$here/fma_peak}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
MODTRAIN=$MODTRAIN "$top/jobs/prep_fortunes.sh" "$tmp/data" > /dev/null
model="--n_layer $layers --d_model 256 --n_head 8 --seq_len 256 --batch_size 8"
# one modtrain run: its tokens/s, MFU, ms a step and ms of it in matrix
# products (the kernel timers' "gemm_ms"), the means over steps 2.. (step 1
# pays for warm-up), as PyTorch's figures below
modtrain_run() {
    rm -rf "$tmp/run"
    "$MODTRAIN" train $model --route_every 0 --steps "$steps" --threads "$threads" \
        --train_data "$tmp/data/train_000000.bin" --val_data "" --run_dir "$tmp/run" --resume never \
        --log_every 1000 > "$tmp/modtrain.log"
    awk 'function val(k,   i, r) { i = index($0, "\"" k "\":"); r = substr($0, i + length(k) + 3)
             sub(/[,}].*/, "", r); return r + 0 }
         /"step_time_ms"/ && val("step") > 1 { t += val("step_time_ms"); g += val("gemm_ms"); m += val("mfu"); n++ }
         END { printf "%.1f %.1f %.1f %.1f\n", 8 * 256 * n / (t / 1000), 100 * m / n, t / n, g / n }' \
        "$tmp/run/metrics.jsonl"
}
version=$("$MODTRAIN" --version)
arch=$(echo "$version" | sed -n 's/.*with \([a-z0-9_]*\) kernels: BLIS_ARCH_TYPE=\([0-9]*\).*/\1 \2/p')
torch_run() { # PROFILE-STEPS ENV-ARGS...: PyTorch's JSON line, run under env ENV-ARGS
    p=$1
    shift
    env "$@" "$PYTHON" "$here/torch_train.py" "$tmp/data/train_000000.bin" "$layers" 256 8 256 8 "$steps" "$threads" "$p"
}
tps() { echo "$1" | sed -e 's/.*"tokens_per_s": \([0-9]*\).*/\1/'; }
field() { echo "$1" | sed -e 's/.*"'"$2"'": \([0-9.]*\).*/\1/'; } # JSON-LINE KEY
: > "$tmp/pairs"
i=0
while [ $i -lt "$repeat" ]; do
    m=$(modtrain_run)
    pt=$(torch_run 4 BLIS_ARCH_TYPE="${arch#* }")
    # the columns: modtrain's tokens/s, MFU, step and products ms; PyTorch's
    # tokens/s, step and products ms
    set -- $m
    echo "$1 $2 $(tps "$pt") $3 $4 $(field "$pt" step_ms) $(field "$pt" products_ms)" >> "$tmp/pairs"
    [ "$repeat" -gt 1 ] && awk -v i=$((i + 1)) '{ l = $0 } END { split(l, f, " ");
        printf "pair %d: modtrain %s tokens/s, pytorch %s: %.2fx\n", i, f[1], f[3], f[1] / f[3] }' "$tmp/pairs"
    i=$((i + 1))
done
head -n 2 "$tmp/modtrain.log"
own=$(torch_run 0 -u BLIS_ARCH_TYPE)
mt=$(med "$tmp/pairs" 1) mfu=$(med "$tmp/pairs" 2) ptm=$(med "$tmp/pairs" 3)
of=""
[ "$repeat" -gt 1 ] && of=" (the medians of $repeat runs each, in turn)"
echo "model: L=$layers C=256 NH=8 T=256 B=8, $threads threads, $steps steps; $version"
echo "modtrain: $mt tokens/s, MFU $mfu% (BLIS ${arch% *} kernels)$of"
echo "pytorch, the same BLIS kernels (BLIS_ARCH_TYPE=${arch#* }): $ptm tokens/s ($pt)"
echo "pytorch, BLIS's own choice of kernels: $(tps "$own") tokens/s"
# both programs' products on all the threads: modtrain's measured sgemm peak
# beside PyTorch's rate on a 1024^3 product (torch_train.py sets BLIS's threads)
peak=$(sed -n 's/.*sgemm peak \([0-9.]*\) GFLOP.*/\1/p' "$tmp/modtrain.log" | head -n 1)
ptg=$(echo "$pt" | sed -e 's/.*"sgemm_gflops": \([0-9.]*\).*/\1/')
echo "sgemm, $threads threads: modtrain's measured peak $peak GFLOP/s, pytorch $ptg GFLOP/s"
awk -v a="$peak" -v b="$ptg" 'BEGIN { if (b < a / 2) print "warning: PyTorch'"'"'s sgemm runs at under half modtrain'"'"'s peak: are its products on all the threads? (BLIS_NUM_THREADS)" }'
# what 3x PyTorch would ask of the cores: modtrain's FLOPs per token (its
# count, as MFU's) at three times PyTorch's tokens/s, against the most the
# cores can do, measured (fma_peak: FMAs and nothing else)
fpt=$(sed -n 's/.*"flops_per_token":\([0-9.e+]*\).*/\1/p' "$tmp/run/metrics.jsonl" | head -n 1)
if [ -x "$FMA_PEAK" ]; then
    # (no figure where the CPU has no FMA that fma_peak knows: it says so)
    fma=$("$FMA_PEAK" "$threads" | sed -n 's/^fma peak: \([0-9.]*\) GFLOP.*/\1/p') || true
    awk -v p="$ptm" -v f="$fpt" -v m="${fma:-0}" 'BEGIN { g = 3 * p * f / 1e9
        printf "3x pytorch: %.0f tokens/s, %.1f GFLOP/s at %.1f MFLOP a token", 3 * p, g, f / 1e6
        if (m > 0) printf "; the cores'"'"' FMA peak %.1f GFLOP/s (%.0f%% of it)", m, 100 * g / m
        print "" }'
else
    echo "3x pytorch: build $FMA_PEAK (make tests/bench/fma_peak) for the cores' FMA peak"
fi
# where the two steps' time goes: the matrix products (modtrain's kernel
# timers; PyTorch's profiler over 4 more steps) and the rest, the medians
awk -v ms="$(med "$tmp/pairs" 4)" -v mg="$(med "$tmp/pairs" 5)" -v ps="$(med "$tmp/pairs" 6)" \
    -v pg="$(med "$tmp/pairs" 7)" 'BEGIN {
    printf "a step: modtrain %.0f ms = products %.0f + the rest %.0f; pytorch %.0f ms = products %.0f + the rest %.0f\n",
        ms, mg, ms - mg, ps, pg, ps - pg
    printf "pytorch/modtrain: the step %.2fx, the products %.2fx, the rest %.2fx\n", ps / ms, pg / mg, (ps - pg) / (ms - mg) }'
awk -v a="$mt" -v b="$ptm" -v c="$(tps "$own")" \
    'BEGIN { printf "ratio modtrain/pytorch: %.2fx with the same kernels (%.2fx against BLIS'"'"'s own choice)\n", a / b, a / c }'
