#!/bin/sh
# Tensor and data parallelism: for every (tp, dp) layout that fits in NP
# ranks, trains the same dense model and prints tokens/s and the bytes each
# rank hands to all-reduces per step (counted by modtrain) beside the
# analytic Megatron figure:
#   tp: per micro-batch of N = B*T tokens, 4 all-reduces of N*C floats per
#       block (2 forward, 2 backward) + 2 for the embedding lookup and the
#       head's input gradient + 3N floats for the vocab-parallel loss
#   dp: every local gradient float once per step
# and the share of the step time no phase claims ("other" in the run's
# table of where the time went; goal: under 5%).
# usage: tests/bench/bench_layouts.sh [NP] [STEPS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
np_max=${1:-4}
steps=${2:-6}
MODTRAIN=${MODTRAIN:-$top/modtrain}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --mca btl self,vader}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
MODTRAIN=$MODTRAIN "$top/jobs/prep_fortunes.sh" "$tmp/data" > /dev/null
L=4 C=256 NH=8 T=128 B=16 MB=4
model="--n_layer $L --d_model $C --n_head $NH --seq_len $T --batch_size $B --micro_batch $MB --route_every 0"
printf '%-8s %-6s %10s %16s %16s %16s %16s %7s\n' layout ranks tokens/s "tp bytes/step" "tp analytic" \
    "dp bytes/step" "dp analytic" "other"
for tp in 1 2 4 8; do
    for dp in 1 2 4 8; do
        np=$((tp * dp))
        [ $np -le "$np_max" ] || continue
        [ $((NH % tp)) -eq 0 ] && [ $((B % dp)) -eq 0 ] && [ $(((B / dp) % MB)) -eq 0 ] || continue
        run="$tmp/run-$tp-$dp"
        $MPIRUN -np $np "$MODTRAIN" train $model --tp $tp --steps "$steps" --threads 1 \
            --train_data "$tmp/data/train_000000.bin" --val_data "" --run_dir "$run" --resume never \
            --ckpt_every 0 --log_every 1000 > "$run.log" 2>&1 || { cat "$run.log"; exit 1; }
        tps=$(awk -F'"step_time_ms":' 'NR > 1 && NF > 1 { split($2, a, ","); t += a[1]; n++ }
              END { printf "%.0f", '"$B * $T"' * n / (t / 1000) }' "$run/metrics.jsonl")
        tpb=$(grep "\"tp_bytes\"" "$run/metrics.jsonl" | tail -n 1 | sed -e 's/.*"tp_bytes":\([0-9]*\).*/\1/')
        dpb=$(grep "\"dp_bytes\"" "$run/metrics.jsonl" | tail -n 1 | sed -e 's/.*"dp_bytes":\([0-9]*\).*/\1/')
        other=$(sed -n 's/^  other *[-0-9.]* *\([-0-9.]*%\).*/\1/p' "$run.log")
        awk -v other="$other" -v tp=$tp -v dp=$dp -v np=$np -v tps="$tps" -v tpb="$tpb" -v dpb="$dpb" \
            -v L=$L -v C=$C -v T=$T -v B=$B -v MB=$MB 'BEGIN {
            N = MB * T; micro = B / dp / MB
            tpa = tp > 1 ? 4 * micro * (N * C * (4 * L + 2) + 3 * N) : 0
            # local floats: split tensors / tp, replicated ones whole, padded to 16
            V = 256; Vp = int((V + tp - 1) / tp) * tp
            local = (Vp / tp) * C + T * C + 2 * C + L * (12 * C * C / tp + 7 * C / tp + 6 * C)
            dpa = dp > 1 ? 4 * local : 0
            printf "%-8s %-6d %10.0f %16.0f %16.0f %16.0f %16.0f %7s\n", "(" tp "," dp ")", np, tps, tpb, tpa, dpb, dpa, other }'
    done
done
echo "(the registry pads each tensor to 16 floats; the analytic dp figure does not)"
