#!/bin/sh
# Trains the same dense GPT (byte vocab, d_model 256, 8 layers, 8 heads,
# seq_len 256, batch 8) in modtrain and in PyTorch with the same thread count,
# one after the other in one run, and prints tokens/s of each, their ratio,
# and modtrain's MFU against the BLIS sgemm peak it measured.
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
    --train_data "$tmp/data/train.bin" --val_data "" --run_dir "$tmp/run" --resume never \
    --log_every 1000 > "$tmp/modtrain.log"
head -n 2 "$tmp/modtrain.log"
# mean over steps 2.. (step 1 pays for warm-up), as PyTorch's figure below
mt=$(awk -F'"step_time_ms":' 'NR > 1 && NF > 1 { split($2, a, ","); t += a[1]; n++ }
     END { printf "%.1f", 8 * 256 * n / (t / 1000) }' "$tmp/run/metrics.jsonl")
mfu=$(awk -F'"mfu":' 'NR > 1 { split($2, a, ","); s += a[1]; n++ } END { printf "%.1f", 100 * s / n }' \
    "$tmp/run/metrics.jsonl")
pt=$("$PYTHON" "$here/torch_train.py" "$tmp/data/train.bin" "$layers" 256 8 256 8 "$steps" "$threads")
ptt=$(echo "$pt" | sed -e 's/.*"tokens_per_s": \([0-9.]*\).*/\1/')
echo "model: L=$layers C=256 NH=8 T=256 B=8, $threads threads, $steps steps"
echo "modtrain: $mt tokens/s, MFU $mfu%"
echo "pytorch:  $ptt tokens/s ($pt)"
awk -v a="$mt" -v b="$ptt" 'BEGIN { printf "ratio modtrain/pytorch: %.2fx\n", a / b }'
