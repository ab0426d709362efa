#!/bin/sh
# Pipeline bubble: for pp = 2 and 4 (as NP allows) and several micro-batch
# counts m, trains the same dense model under 1F1B and prints the measured
# bubble fraction (the share of a step each stage waits on its neighbours,
# averaged over stages) beside the theoretical (p-1)/(m+p-1), and tokens/s.
# usage: tests/bench/bench_pipeline.sh [NP] [STEPS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
np_max=${1:-4}
steps=${2:-5}
MODTRAIN=${MODTRAIN:-$top/modtrain}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --mca btl self,vader}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
MODTRAIN=$MODTRAIN "$top/jobs/prep_fortunes.sh" "$tmp/data" > /dev/null
B=16
model="--n_layer 8 --d_model 128 --n_head 4 --seq_len 128 --batch_size $B --route_every 0"
printf '%-4s %-4s %12s %12s %10s\n' pp m "bubble" "(p-1)/(m+p-1)" tokens/s
for pp in 1 2 4; do
    [ $pp -le "$np_max" ] || continue
    for m in 2 4 8 16; do
        run="$tmp/run-$pp-$m"
        $MPIRUN -np $pp "$MODTRAIN" train $model --pp $pp --micro_batch $((B / m)) --steps "$steps" \
            --threads 1 --train_data "$tmp/data/train_000000.bin" --val_data "" --run_dir "$run" \
            --resume never --ckpt_every 0 --log_every 1000 > "$run.log" 2>&1 || { cat "$run.log"; exit 1; }
        awk -F'"pp_bubble":' -v p=$pp -v m=$m -v B=$B 'NR > 1 && NF > 1 { split($2, a, "}"); s += a[1]; n++
                split($0, t, "\"step_time_ms\":"); split(t[2], u, ","); ms += u[1] }
            END { printf "%-4d %-4d %12.3f %12.3f %10.0f\n", p, m, s / n, (p - 1) / (m + p - 1),
                  B * 128 * n / (ms / 1000) }' "$run/metrics.jsonl"
    done
done
echo "(stages are ranks on this machine's cores; oversubscribed ranks also wait for a core)"
