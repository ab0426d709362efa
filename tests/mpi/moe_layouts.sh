#!/bin/sh
# Expert parallelism on real ranks (Open MPI, oversubscribed, a tiny model
# with 4 experts a block, top-2, capacity_factor 1 so that tokens drop; also
# staged MoDE, route_every 2 + moe_every 2, and integrated MoDE, 2 no-op
# experts): at dp 4 and micro_batch 4, ep 2 and ep 4 train what ep 1 trains;
# so do ep 2 with pp 2, ep 2 with tp 2 (4 ranks, dp 2) and ep 2 x tp 2 x
# pp 2 (8 ranks) (capacity is per rank's micro-batch, so every layout with
# the same micro_batch routes alike); a
# checkpoint saved under ep 2 loads exactly under ep 1 and ep 4 (and one
# saved under ep 2 x tp 2 and ep 2 x pp 2, a stage without experts, under
# ep 4 and on one rank) and training goes on matching the uninterrupted run;
# a run killed under ep 2 (a rank dies mid-step, or all die in a save) and
# resumed ends bitwise equal to the uninterrupted one. recompute = block
# under ep 2 (staged MoDE at dp 4, MoE with tp 2) trains bit for bit what
# recompute = none trains (so the same ep 2 layout twice is bitwise
# identical), its backward repeating the forward's all-to-alls (ep_bytes
# 3/2 of none's).
#   loss per step: |a - b| <= 2e-5 * |b|;  weights and moments: max |a - b| <= 2e-5
#   (the tp tolerance of layouts.sh; measured: at most 4.8e-6)
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --micro_batch 4 --steps 20 --ckpt_every 10 --ckpt_keep 5 --eval_every 10 --log_every 1000 \
    --threads 1 --debug_checks 1 --peak_gflops 50 --resume never"
moe="--n_expert 4 --expert_top_k 2 --capacity_factor 1"
mode="$moe --route_every 2 --capacity 0.25 --moe_every 2"
imode="$moe --n_noop_expert 2"

# MODTRAIN_SKIP_SLOW (the sanitizer pass, after a first pass of all of
# it): no ep 4 at dp 4; ep 2 x tp 2 for MoE and ep 2 x pp 2 for staged
# MoDE alone; no 8 ranks; one recompute case; the ep 2 checkpoint loaded
# under ep 4 only, and two of the four other reshards
eps="2 4"
[ $slow = 1 ] || eps=2

# 1. ep 1, 2, 4 at dp 4 (4 ranks)
for model in moe mode imode; do
    eval "opts=\$$model"
    for ep in 1 $eps; do
        train "$model-ep$ep" 4 --ep $ep $opts
    done
    for ep in $eps; do
        same_run "$model-ep1" "$model-ep$ep" "$model (ep $ep, dp 4)" 2e-5 20
    done
done
# the capacity drops tokens, so the comparison covers dropped rows too
drop=$("$MODTRAIN" eval --ckpt moe-ep1/ckpt --data data/val_000000.bin --seqs 8 --json | tail -n 1)
check_ab "$(echo "$drop" | sed 's/.*"expert_drop":\([^,}]*\).*/\1/')" 0 'a > 0' &&
    ok "capacity_factor 1 drops tokens: $drop" || fail "no token dropped: $drop"

# ep 2 with pp 2 and with tp 2 (4 ranks, dp 2), and with both (8 ranks),
# against ep 1 at dp 4: the same micro-batches, so the same routing
if [ $slow = 1 ]; then
    for model in moe mode; do
        eval "opts=\$$model"
        train_ok "$model-ep2-pp2" 4 --ep 2 --pp 2 $opts
        train_ok "$model-ep2-tp2" 4 --ep 2 --tp 2 $opts
        same_run "$model-ep1" "$model-ep2-pp2" "$model (ep 2, pp 2, dp 2)" 2e-5 20
        same_run "$model-ep1" "$model-ep2-tp2" "$model (ep 2, tp 2, dp 2)" 2e-5 20
    done
else
    train_ok moe-ep2-tp2 4 --ep 2 --tp 2 $moe
    same_run moe-ep1 moe-ep2-tp2 "moe (ep 2, tp 2, dp 2)" 2e-5 20
    train_ok mode-ep2-pp2 4 --ep 2 --pp 2 $mode
    same_run mode-ep1 mode-ep2-pp2 "mode (ep 2, pp 2, dp 2)" 2e-5 20
fi
# all four at once: 8 ranks, ep 2 x tp 2 x pp 2, dp 2
if [ $slow = 1 ]; then
    train_ok moe-ep2-tp2-pp2 8 --ep 2 --tp 2 --pp 2 $moe
    same_run moe-ep1 moe-ep2-tp2-pp2 "moe (ep 2, tp 2, pp 2, dp 2)" 2e-5 20
fi

# recompute = block: every rank of the expert group recomputes the same
# blocks in the same order, so the forward's all-to-alls meet again
epb() { grep '"loss"' "$1/metrics.jsonl" | sed -e 's/.*"ep_bytes":\([0-9]*\).*/\1/'; }
cases="mode-ep2 4 --ep 2 $mode|moe-ep2-tp2 4 --ep 2 --tp 2 $moe"
[ $slow = 1 ] || cases="mode-ep2 4 --ep 2 $mode"
IFS='|'
for case in $cases; do
    unset IFS
    set -- $case
    ref=$1 np=$2
    shift 2
    train_ok "$ref-block" "$np" "$@" --recompute block
    epb "$ref" > a.txt
    epb "$ref-block" > b.txt
    bad=$(paste a.txt b.txt | awk '$1 * 3 != $2 * 2 || $1 == 0 { bad++ } END { print bad + 0 }')
    "$MODTRAIN" ckpt diff --a "$ref/ckpt" --b "$ref-block/ckpt" > diff.txt &&
        [ "$(stable_metrics "$ref")" = "$(stable_metrics "$ref-block")" ] && [ "$bad" -eq 0 ] &&
        ok "$ref, recompute = block: metrics and checkpoints bitwise as none, ep_bytes 3/2 of none's" ||
        { cat diff.txt; paste a.txt b.txt; fail "$ref, recompute = block differs from none"; }
done

# 2. resharding: step 10 of the ep 2 run loaded under ep 1 and ep 4
reshards="1 4"
[ $slow = 1 ] || reshards=4
for ep in $reshards; do
    name="reshard-ep$ep"
    # --steps 10: load from the other run, train nothing, save step 10 into
    # this run's ckpt_dir under the new layout
    train_ok "$name" 4 --ep $ep $moe --resume moe-ep2/ckpt/step-00000010 --steps 10
    "$MODTRAIN" ckpt diff --a moe-ep2/ckpt/step-00000010 --b "$name/ckpt/step-00000010" --tol 0 > diff.txt &&
        ok "saved under ep 2, loaded under ep $ep: weights and moments exact" ||
        { cat diff.txt; fail "resharding from ep 2 to ep $ep changed the state"; }
    train_ok "$name" 4 --ep $ep $moe --resume auto
    grep -q "resume: loaded $name/ckpt/step-00000010" "$name.log" || fail "$name: did not resume at step 10"
    "$MODTRAIN" ckpt diff --a moe-ep2/ckpt/step-00000020 --b "$name/ckpt/step-00000020" --tol 2e-5 > diff.txt &&
        ok "resumed under ep $ep, step 20 matches the uninterrupted ep 2 run: $(tail -n 1 diff.txt | sed 's/ckpt diff: //')" ||
        { cat diff.txt; fail "resumed under ep $ep drifted"; }
done
# experts split over tp, and a stage without experts, saved and loaded elsewhere
cases="moe-ep2-tp2:4:4 moe-ep2-tp2:1:1 mode-ep2-pp2:4:4 mode-ep2-pp2:1:1"
[ $slow = 1 ] || cases="moe-ep2-tp2:1:1 mode-ep2-pp2:4:4"
for case in $cases; do
    IFS=:
    set -- $case
    unset IFS
    set -- "$1" "$2" --ep "$3"
    src=$1 np=$2
    shift 2
    name="reshard-$src-np$np"
    eval "opts=\$${src%%-*}"
    train_ok "$name" "$np" "$@" $opts --resume "$src/ckpt/step-00000010" --steps 10
    "$MODTRAIN" ckpt diff --a "$src/ckpt/step-00000010" --b "$name/ckpt/step-00000010" --tol 0 > diff.txt &&
        ok "saved as $src, loaded on $np ranks $*: weights and moments exact" ||
        { cat diff.txt; fail "resharding $src to $np ranks $* changed the state"; }
done

# 3. killed under ep 2 (rank 3 dies after step 14's backward), resumed: bitwise.
# The step-10 save is synchronous (--ckpt_async 0): in the background it takes
# about as long as the four steps before the kill, and a loaded host can leave
# it uncommitted when rank 3 dies (ckpt_async.sh kills saves in flight)
set +e
MODTRAIN_FAULT=rank-exit:3:14 timeout -k 10 300 $MPIRUN -np 4 "$MODTRAIN" train $common --ep 2 $moe \
    --ckpt_async 0 --run_dir killed > killed.1.log 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "rank 3 exits at step 14" killed.1.log &&
    ok "ep 2: rank 3 dies at step 14 (exit $rc), no hang" || { cat killed.1.log; fail "killing under ep 2 (exit $rc)"; }
mv killed.1.log killed-first.log
train_ok killed 4 --ep 2 $moe --resume auto
: > diff.txt
grep -q "resume: loaded killed/ckpt/step-00000010" killed.log &&
    "$MODTRAIN" ckpt diff --a moe-ep2/ckpt/step-00000020 --b killed/ckpt/step-00000020 --tol 0 > diff.txt &&
    cmp -s moe-ep2/ckpt/step-00000020/data.bin killed/ckpt/step-00000020/data.bin &&
    [ "$(losses moe-ep2 | tail -n 10)" = "$(losses killed | tail -n 10)" ] &&
    ok "ep 2: killed at step 14, resumed at 10: steps 11-20 and step 20's checkpoint bitwise equal" ||
    { tail -n 5 killed-first.log killed.log; cat diff.txt; fail "ep 2: the resumed run differs from the uninterrupted one"; }
# killed while writing the step-10 checkpoint (staged MoDE): resumed from step 5
set +e
MODTRAIN_FAULT=save-kill:write:10 timeout -k 10 300 $MPIRUN -np 4 "$MODTRAIN" train $common --ep 2 $mode \
    --ckpt_every 5 --run_dir savekill > savekill-first.log 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "MODTRAIN_FAULT=save-kill:write" savekill-first.log || {
    cat savekill-first.log
    fail "save-kill under ep 2 did not kill (exit $rc)"
}
train_ok savekill 4 --ep 2 $mode --ckpt_every 5 --resume auto
grep -q "resume: loaded savekill/ckpt/step-00000005" savekill.log &&
    "$MODTRAIN" ckpt diff --a mode-ep2/ckpt/step-00000020 --b savekill/ckpt/step-00000020 --tol 0 > diff.txt &&
    ok "ep 2: killed in the step-10 save, resumed at 5: step 20 bitwise equal" ||
    { cat savekill.log diff.txt; fail "ep 2: resumed after a killed save differs"; }
finish
