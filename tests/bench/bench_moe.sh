#!/bin/bash
# Mixture-of-Experts against dense, side by side in one run (never asserts
# a time): trains each model below for a few steps on the fortunes text,
# one after the other, and prints the means over steps 2.. (step 1 pays for
# warm-up) from each run's metrics.jsonl:
# - dense, MoE (8 experts, top-1), staged MoDE (MoD routing, every other
#   block at capacity 12.5%, and every block MoE) and integrated MoDE (8
#   experts and 8 no-op experts), one rank, d_model 256, 8 layers: FLOPs per
#   token as train counts them, step time, tokens/s, and step time per FLOP
#   against dense's. An expert is 4 x d_model wide, so a top-1 slot costs
#   what the dense MLP costs; train counts an MoE block at the slots its
#   experts kept (a dropped or no-op slot costs nothing and counts nothing),
#   so time per FLOP compares the work done;
# - expert parallelism: the MoE model at dp 2 (mpirun -np 2), ep 1 against
#   ep 2, with the all-to-all's share of the step (the ep_comm phase of
#   phase_ms, where train reports one; n/a otherwise);
# - an MoE model with 8 experts, top-1, capacity_factor 8 (nothing drops),
#   and 0, 8 and 24 no-op experts: the step time as the share of slots that
#   reach an expert falls (1, 1/2 and 1/4 when the router balances; the
#   share each run's routers realised, from expert_load, is printed too).
# usage: tests/bench/bench_moe.sh [--quick] [STEPS]
#   --quick   a sanity run of seconds (d_model 64, 2 layers, 3 steps)
#   STEPS     steps of each run (6; the default run takes about 3 minutes on
#             2 cores)
# MODTRAIN names the binary; MODTRAIN_MPIRUN_ARGS adds options to mpirun
# (default --oversubscribe --bind-to none --mca btl self,vader).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
model="--n_layer 8 --d_model 256 --n_head 8 --seq_len 256 --batch_size 8"
steps=6 tokens=$((256 * 8)) quick=0
for a in "$@"; do
    case $a in
    --quick) quick=1 model="--n_layer 2 --d_model 64 --n_head 2 --seq_len 64 --batch_size 4" steps=3 tokens=$((64 * 4)) ;;
    --help | -h) sed -n '2,/^set -eu/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) [[ $a =~ ^[1-9][0-9]{0,3}$ ]] || { echo "bench_moe: '$a' is not --quick or a number of steps" >&2; exit 2; }
       steps=$a ;;
    esac
done
(( steps >= 2 )) || { echo "bench_moe: at least 2 steps (the means are over steps 2..)" >&2; exit 2; }
MODTRAIN=${MODTRAIN:-$top/modtrain}
[ -x "$MODTRAIN" ] || MODTRAIN=$top/_b/modtrain
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
MODTRAIN=$MODTRAIN "$top/jobs/prep_fortunes.sh" "$tmp/data" > /dev/null
moe="--n_expert 8 --expert_top_k 1 --capacity_factor 1.25 --moe_every 1"
# train NAME [LAUNCHER ...] -- KEYS...: a run of $steps steps into $tmp/NAME
train() {
    local name=$1 launch=()
    shift
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    # shellcheck disable=SC2086 # the model keys are words
    "${launch[@]}" "$MODTRAIN" train $model "$@" --steps "$steps" --train_data "$tmp/data/train_*.bin" \
        --val_data "" --eval_every 0 --ckpt_every 0 --run_dir "$tmp/$name" --resume never \
        --log_every 1000 > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
}
# mean over steps 2.. of a metrics.jsonl key (in phase_ms when the key is
# phase.NAME; empty when no step has it)
mean() {
    awk -v key="$2" '
    /"loss"/ {
        line = $0
        if (key ~ /^phase\./) { i = index(line, "\"phase_ms\":{"); if (!i) next
                                line = substr(line, i + 12); sub(/}.*/, "", line); k = substr(key, 7) }
        else k = key
        i = index(line, "\"" k "\":"); if (!i) next
        v = substr(line, i + length(k) + 3); sub(/[,}].*/, "", v)
        if (++seen > 1) { s += v; n++ }
    }
    END { if (n) printf "%.6g", s / n }' "$1/metrics.jsonl"
}

# --- the kinds on one rank
train dense -- --route_every 0
train moe -- --route_every 0 $moe
train mode_staged -- --route_every 2 --capacity 0.125 $moe
train mode_integrated -- --route_every 0 $moe --n_noop_expert 8
for nn in 0 8 24; do train "noop$nn" -- --route_every 0 $moe --capacity_factor 8 --n_noop_expert "$nn"; done
echo "model: $model, $steps steps a run (means over steps 2..); $("$MODTRAIN" --version | head -n 1)"
echo "MoE: 8 experts, top-1, expert_d_ff 4 x d_model, capacity_factor 1.25, every block; staged MoDE routes every other block at capacity 0.125"
printf '%-18s %14s %10s %10s %14s %10s\n' kind "FLOPs/token" "step ms" tokens/s "ms per TFLOP" "vs dense"
dms=$(mean "$tmp/dense" step_time_ms) dfpt=$(mean "$tmp/dense" flops_per_token)
for k in dense moe mode_staged mode_integrated; do
    awk -v k="$k" -v f="$(mean "$tmp/$k" flops_per_token)" -v ms="$(mean "$tmp/$k" step_time_ms)" \
        -v tps="$(mean "$tmp/$k" tokens_per_s)" -v dms="$dms" -v dfpt="$dfpt" -v bt="$tokens" 'BEGIN {
        per = ms / (f * bt / 1e12); dper = dms / (dfpt * bt / 1e12)
        printf "%-18s %14.0f %10.1f %10.0f %14.2f %9.3fx\n", k, f, ms, tps, per, per / dper }'
done

# --- expert parallelism at dp 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2206 # options are words
mpi=(mpirun -np 2 ${MODTRAIN_MPIRUN_ARGS:---oversubscribe --bind-to none --mca btl self,vader})
for ep in 1 2; do train "ep$ep" "${mpi[@]}" -- --route_every 0 $moe --ep "$ep" --threads 1; done
echo
echo "expert parallelism: the MoE model at dp 2 (mpirun -np 2, 1 thread a rank)"
printf '%-6s %10s %10s %12s %14s\n' "" "step ms" tokens/s "ep_comm ms" "ep_comm share"
e1=$(mean "$tmp/ep1" step_time_ms)
for ep in 1 2; do
    awk -v ep="$ep" -v ms="$(mean "$tmp/ep$ep" step_time_ms)" -v tps="$(mean "$tmp/ep$ep" tokens_per_s)" \
        -v c="$(mean "$tmp/ep$ep" phase.ep_comm)" 'BEGIN {
        printf "%-6s %10.1f %10.0f %12s %14s\n", "ep " ep, ms, tps, c == "" ? "n/a" : sprintf("%.2f", c),
            c == "" ? "n/a" : sprintf("%.1f%%", 100 * c / ms) }'
done
awk -v a="$e1" -v b="$(mean "$tmp/ep2" step_time_ms)" 'BEGIN { printf "ratio ep 2 / ep 1 step time: %.3fx\n", b / a }'
[ -n "$(mean "$tmp/ep2" phase.ep_comm)" ] ||
    echo "(no ep_comm phase in this build's phase_ms: the all-to-all's time is inside forward and backward)"

# the share of slots the real experts kept, over steps 2.. and the blocks
realised() {
    python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][1:]
print("%.3f" % (sum(sum(sum(b[:8]) for b in r["expert_load"]) / len(r["expert_load"]) for r in rows) / len(rows)))
PY
}

# --- the no-op share
echo
echo "no-op experts: 8 experts, top-1, capacity_factor 8 (nothing drops), one rank"
printf '%-10s %14s %14s %10s %10s %12s\n' no-ops "balanced share" "realised share" "step ms" tokens/s "vs 0 no-ops"
z=$(mean "$tmp/noop0" step_time_ms) prev="" falls=yes
for nn in 0 8 24; do
    d=noop$nn
    ms=$(mean "$tmp/$d" step_time_ms)
    awk -v nn="$nn" -v ms="$ms" -v tps="$(mean "$tmp/$d" tokens_per_s)" -v z="$z" -v r="$(realised "$tmp/$d")" 'BEGIN {
        printf "%-10s %14.3f %14.3f %10.1f %10.0f %11.3fx\n", nn, 8 / (8 + nn), r, ms, tps, ms / z }'
    [ -z "$prev" ] || awk -v a="$prev" -v b="$ms" 'BEGIN { exit !(b < a) }' || falls=no
    prev=$ms
done
echo "the step time falls at every step of the no-op share: $falls"
(( quick == 0 )) || echo "(--quick: a sanity run of a tiny model; its times say little)"
