#!/bin/sh
# Trains the same dense GPT (byte vocab, d_model 256, 8 layers, 8 heads,
# seq_len 256, batch 8) in modtrain and in PyTorch with the same thread count,
# one after the other in one run, and prints tokens/s of each, their ratio,
# and modtrain's MFU against the BLIS sgemm peak it measured. Debian's
# PyTorch calls the system BLAS, which is BLIS here: the fair baseline gives
# it the kernels modtrain uses (BLIS_ARCH_TYPE from `modtrain --version`);
# PyTorch with BLIS's own choice of kernels is printed beside it.
# usage: tests/bench/bench_dense.sh [THREADS] [STEPS] [N_LAYER]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
threads=${1:-$(nproc)}
steps=${2:-10}
layers=${3:-8}
MODTRAIN=${MODTRAIN:-$top/modtrain}
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
MODTRAIN=$MODTRAIN "$top/jobs/prep_fortunes.sh" "$tmp/data" > /dev/null
model="--n_layer $layers --d_model 256 --n_head 8 --seq_len 256 --batch_size 8"
"$MODTRAIN" train $model --route_every 0 --steps "$steps" --threads "$threads" \
    --train_data "$tmp/data/train_000000.bin" --val_data "" --run_dir "$tmp/run" --resume never \
    --log_every 1000 > "$tmp/modtrain.log"
head -n 2 "$tmp/modtrain.log"
# mean over steps 2.. (step 1 pays for warm-up), as PyTorch's figure below
mt=$(awk -F'"step_time_ms":' 'NR > 1 && NF > 1 { split($2, a, ","); t += a[1]; n++ }
     END { printf "%.1f", 8 * 256 * n / (t / 1000) }' "$tmp/run/metrics.jsonl")
mfu=$(awk -F'"mfu":' 'NR > 1 { split($2, a, ","); s += a[1]; n++ } END { printf "%.1f", 100 * s / n }' \
    "$tmp/run/metrics.jsonl")
version=$("$MODTRAIN" --version)
arch=$(echo "$version" | sed -n 's/.*with \([a-z0-9_]*\) kernels: BLIS_ARCH_TYPE=\([0-9]*\).*/\1 \2/p')
torch_run() { # ENV-ARGS...: PyTorch's JSON line, run under env ENV-ARGS
    env "$@" "$PYTHON" "$here/torch_train.py" "$tmp/data/train_000000.bin" "$layers" 256 8 256 8 "$steps" "$threads"
}
tps() { echo "$1" | sed -e 's/.*"tokens_per_s": \([0-9]*\).*/\1/'; }
pt=$(torch_run BLIS_ARCH_TYPE="${arch#* }")
own=$(torch_run -u BLIS_ARCH_TYPE)
echo "model: L=$layers C=256 NH=8 T=256 B=8, $threads threads, $steps steps; $version"
echo "modtrain: $mt tokens/s, MFU $mfu% (BLIS ${arch% *} kernels)"
echo "pytorch, the same BLIS kernels (BLIS_ARCH_TYPE=${arch#* }): $(tps "$pt") tokens/s ($pt)"
echo "pytorch, BLIS's own choice of kernels: $(tps "$own") tokens/s"
awk -v a="$mt" -v b="$(tps "$pt")" -v c="$(tps "$own")" \
    'BEGIN { printf "ratio modtrain/pytorch: %.2fx with the same kernels (%.2fx against BLIS'"'"'s own choice)\n", a / b, a / c }'
