#!/bin/bash
# Two builds of modtrain, bit for bit: trains the same runs with both (one
# rank dense, MoD with the router's BCE, MoD with the predictor and sigmoid
# gate; tp 2, dp 2, pp 2, (pp 2, tp 2) GPipe, (pp 2, dp 2); MoE, staged
# and integrated MoDE on one rank, ep 2, zero 1, interleaved 1F1B
# (virtual_stages 2), recompute = block and = attention (under tp 2),
# synchronous and asynchronous saves side by side; a run stopped by
# time_limit and resumed), then compares every checkpoint with
# `ckpt diff --tol 0`, every metrics line's loss, gradient norm and routing
# figures, and eval and sample outputs (one rank, tp 2, pp 2, MoDE).
# For refactors that must not change a bit.
# usage: tests/bench/same_bits.sh OLD_MODTRAIN NEW_MODTRAIN [WORKDIR]
set -u
[ $# -ge 2 ] || { echo "usage: $0 OLD_MODTRAIN NEW_MODTRAIN [WORKDIR]" >&2; exit 2; }
old=$(realpath "$1") new=$(realpath "$2")
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
work=${3:-$(mktemp -d "${TMPDIR:-/tmp}/same-bits.XXXXXX")}
mkdir -p "$work" && cd "$work" || exit 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=2
MPIRUN="mpirun --oversubscribe --bind-to none --mca btl self,vader"
work=$(pwd) data=$(pwd)/data
[ -d "$data" ] || "$srcdir/jobs/prep_fortunes.sh" "$data" "$new" > /dev/null || exit 2
common="--config $srcdir/jobs/tiny.conf --train_data $data/train_000000.bin --val_data $data/val_000000.bin \
    --n_layer 4 --micro_batch 2 --steps 12 --ckpt_every 6 --ckpt_keep 5 --eval_every 6 \
    --log_every 1000 --peak_gflops 50 --resume never"
mod="--route_every 2 --capacity 0.25"
moe="--n_expert 4 --expert_top_k 2 --capacity_factor 1"
runs="dense1 mod1 pred1 tp2 dp2 pp2 pp2tp2 pp2dp2 moe1 mode_staged1 mode_integrated1 ep2 zero1 pp2v2
    recompute_block1 recompute_attn_tp2 save_sync_dp2 save_async_dp2 resumed"

run_all() { # BINARY DIR
    local b=$1 d=$2
    rm -rf "$d" && mkdir "$d" && cd "$d" || return 1
    t() { local name=$1 np=$2; shift 2; $MPIRUN -np "$np" "$b" train $common --run_dir "$name" "$@" > "$name.log" 2>&1; }
    t dense1 1 --threads 2
    t mod1 1 --threads 2 $mod
    t pred1 1 --threads 2 $mod --causal_router predictor --router_gate sigmoid
    t tp2 2 --threads 1 $mod --tp 2 --debug_checks 1
    t dp2 2 --threads 1 $mod
    t pp2 2 --threads 1 $mod --pp 2
    t pp2tp2 4 --threads 1 $mod --pp 2 --tp 2 --schedule gpipe
    t pp2dp2 4 --threads 1 --pp 2
    t moe1 1 --threads 2 $moe
    t mode_staged1 1 --threads 2 $moe $mod --moe_every 2
    t mode_integrated1 1 --threads 2 $moe --n_noop_expert 2
    t ep2 2 --threads 1 $moe --ep 2
    t zero1 2 --threads 1 $mod --zero 1
    t pp2v2 2 --threads 1 $mod --pp 2 --virtual_stages 2
    t recompute_block1 1 --threads 2 $mod --recompute block
    t recompute_attn_tp2 2 --threads 1 $mod --tp 2 --recompute attention
    t save_sync_dp2 2 --threads 1 $moe --ckpt_every 4 --ckpt_async 0
    t save_async_dp2 2 --threads 1 $moe --ckpt_every 4 --ckpt_async 1
    t resumed 1 --threads 2 $mod --time_limit 0.001 # stops after step 1, exit 75
    t resumed 1 --threads 2 $mod --resume auto
    "$b" eval --ckpt mod1/ckpt --data "$data/val_000000.bin" --seqs 32 --json --threads 2 > eval1.txt 2>&1
    $MPIRUN -np 2 "$b" eval --ckpt pp2/ckpt --data "$data/val_000000.bin" --seqs 32 --json --threads 1 --pp 2 > evalpp2.txt 2>&1
    "$b" sample --ckpt pred1/ckpt --tokens 200 --threads 2 --seed 3 > sample1.txt 2>&1
    $MPIRUN -np 2 "$b" sample --ckpt tp2/ckpt --tokens 200 --threads 1 --seed 3 > sampletp2.txt 2>&1
    "$b" sample --ckpt mode_staged1/ckpt --tokens 100 --threads 2 --seed 3 > samplemode1.txt 2>&1
    $MPIRUN -np 2 "$b" sample --ckpt mod1/ckpt --tokens 100 --threads 1 --seed 3 --pp 2 --prompt Hello > samplepp2.txt 2>&1
    cd ..
}
run_all "$old" old
run_all "$new" new
figures() { grep -o '"\(loss\|val_loss\|val_loss_causal\|grad_norm\|aux_loss\|predictor_accuracy\|tp_bytes\|dp_bytes\|pp_live\)":[^,}]*' "$1"; }
bad=0
for r in $runs; do
    if d=$("$new" ckpt diff --a "old/$r/ckpt" --b "new/$r/ckpt" --tol 0 2>&1) &&
        [ "$(figures "old/$r/metrics.jsonl")" = "$(figures "new/$r/metrics.jsonl")" ]; then
        echo "same: $r: $(echo "$d" | tail -n 1 | sed 's/ckpt diff: //'), $(wc -l < "new/$r/metrics.jsonl") metrics lines"
    else
        echo "DIFFERENT: $r: $d"
        bad=1
    fi
done
for f in eval1 evalpp2 sample1 sampletp2 samplepp2 samplemode1; do
    if [ -s "new/$f.txt" ] && cmp -s "old/$f.txt" "new/$f.txt"; then echo "same: $f output"; else echo "DIFFERENT: $f"; bad=1; fi
done
exit $bad
