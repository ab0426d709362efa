#!/bin/sh
# `modtrain plan`'s step time against measured ones. Calibration: `plan
# --calibrate` (2 ranks) measures this machine, and a short run of another
# model (d_model 384, 6 layers, GPT-2's vocabulary, 1 rank x all cores)
# gives the efficiency (its MFU). Checked: a model whose state
# dominates the baseline (d_model 512, 8 layers, vocabulary 50257) under
# every layout of 1, 2 and 4 ranks; for each, the plan's step time beside
# the measured mean (steps 2..N). Goal: within 25% where ranks x threads fit
# the cores; the oversubscribed layouts (4 ranks on 2 cores) are reported
# apart. usage: tests/bench/bench_plan.sh [STEPS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
steps=${1:-6}
MODTRAIN=${MODTRAIN:-$top/modtrain}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader}
cores=$(nproc)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
MODTRAIN=$MODTRAIN "$top/jobs/prep_fortunes.sh" "$tmp/data" > /dev/null
cd "$tmp"
$MPIRUN -np 2 "$MODTRAIN" plan --calibrate --out cluster.conf
mean_ms() { # RUN_DIR: mean step_time_ms over steps 2..
    grep '"loss"' "$1/metrics.jsonl" | awk -F'"step_time_ms":' 'NR > 1 { split($2, a, ","); t += a[1]; n++ }
        END { printf "%.1f", t / n }'
}
"$MODTRAIN" train --n_layer 6 --d_model 384 --n_head 6 --seq_len 64 --vocab_size 50257 --batch_size 8 \
    --micro_batch 2 --route_every 0 \
    --steps "$steps" --train_data data/train_000000.bin --val_data "" --ckpt_every 0 --run_dir cal \
    --resume never --log_every 1000 > cal.log
eff=$(grep '"loss"' cal/metrics.jsonl | awk -F'"mfu":' 'NR > 1 { split($2, a, ","); s += a[1]; n++ } END { printf "%.3f", s / n }')
sed -i "s/^efficiency *=.*/efficiency = $eff/" cluster.conf
echo "calibration: $(sed -n 's/^\(gflops_per_core\|mem_bw_gbs\|shm_bw_gbs\|shm_latency_us\|efficiency\) *= *\([0-9.]*\).*/\1 \2/p' cluster.conf | tr '\n' ' ')"
cat > model.conf <<CONF
n_layer = 8
n_head = 8
d_model = 512
seq_len = 64
vocab_size = 50257
route_every = 0
batch_size = 8
micro_batch = 2
train_data = data/train_000000.bin
val_data = ""
ckpt_every = 0
log_every = 1000
resume = never
CONF
printf '%-6s %-4s %-4s %-4s %-5s %10s %10s %8s %s\n' ranks tp pp dp thr "plan ms" "measured" "error" ""
worst=0
worst_over=0
for n in 1 2 4; do
    for tp in 1 2 4; do
        for pp in 1 2 4; do
            [ $((n % (tp * pp))) -eq 0 ] || continue
            dp=$((n / (tp * pp)))
            thr=$((cores / n))
            [ "$thr" -ge 1 ] || thr=1
            over=$([ $((n * thr)) -gt "$cores" ] && echo oversubscribed || echo "")
            # all ranks on this node; oversubscribed, the plan is told of a
            # core a rank (what oversubscription pretends)
            sed "s/^cores_per_node *=.*/cores_per_node = $((n * thr))/" cluster.conf > c-$n.conf
            plan=$("$MODTRAIN" plan --config model.conf --cluster c-$n.conf --layout "$tp,$pp,$n" 2>&1) ||
                { echo "($n ranks, tp $tp, pp $pp: $plan)"; continue; }
            est=$(echo "$plan" | sed -n 's/^step \([0-9.]*\) s:.*/\1/p' | awk '{ printf "%.1f", $1 * 1000 }')
            run="r-$tp-$pp-$dp"
            $MPIRUN -np "$n" "$MODTRAIN" train --config model.conf --tp "$tp" --pp "$pp" --steps "$steps" \
                --threads "$thr" --run_dir "$run" > "$run.log" 2>&1 || { cat "$run.log"; exit 1; }
            got=$(mean_ms "$run")
            e=$(awk -v a="$est" -v b="$got" 'BEGIN { printf "%+.1f", 100 * (a - b) / b }')
            printf '%-6s %-4s %-4s %-4s %-5s %10s %10s %7s%% %s\n' "$n" "$tp" "$pp" "$dp" "$thr" "$est" "$got" "$e" "$over"
            a=$(awk -v e="$e" 'BEGIN { print (e < 0 ? -e : e) }')
            if [ -n "$over" ]; then
                worst_over=$(awk -v a="$a" -v b="$worst_over" 'BEGIN { print (a > b ? a : b) }')
            else
                worst=$(awk -v a="$a" -v b="$worst" 'BEGIN { print (a > b ? a : b) }')
            fi
        done
    done
done
echo "worst |error|: $worst% where ranks x threads fit the $cores cores (goal 25%); $worst_over% oversubscribed"
