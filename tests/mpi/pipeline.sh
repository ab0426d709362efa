#!/bin/sh
# Pipeline parallelism on real ranks (Open MPI, oversubscribed, a 4-block
# model, 8 micro-batches a step): (pp 2), (pp 4), (pp 2, tp 2), (pp 2, dp 2)
# under both schedules train the same MoD model as one rank, and (pp 2) and
# (pp 4) the same dense model, within fp32 round-off (losses 5e-5 relative,
# weights and moments 5e-5 absolute; measured at most 5.9e-6);
# GPipe and 1F1B are bitwise identical; 1F1B never holds more than pp
# micro-batches of activations (GPipe holds all 8); a checkpoint saved under
# (pp 2, tp 2) loads exactly under pp 1 and pp 4; uneven splits and a block
# count pp does not divide work; impossible splits are one-line errors.
# recompute = attention and block under (pp 2, tp 2), 1F1B and GPipe (sets
# in flight sharing one working copy; block repeats its forward's tp
# all-reduces) train the MoD model bit for bit as recompute = none does.
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --n_layer 4 --micro_batch 2 --steps 12 --ckpt_every 6 --ckpt_keep 5 --eval_every 6 \
    --log_every 1000 --threads 1 --debug_checks 1 --peak_gflops 50 --resume never"

# MODTRAIN_SKIP_SLOW (the sanitizer pass, which the first pass precedes
# with every layout): MoD at (pp 2, tp 2) alone, under both schedules,
# GPipe's run recomputing blocks (so one run checks GPipe and recompute =
# block against 1F1B without; test_recompute checks the rest); evaluation
# and sampling under (2 ranks, pp 2) alone; resharding to pp 4 alone; the
# uneven split of the MoD model (no dense runs: the MoD model has dense
# blocks, and the blocks' code is the same under pp); no 3-block model (the
# default split's remainder is the same arithmetic); one split error
# (test_config and cli_errors.sh check stage_layers' refusals)
models="dense mod"
[ $slow = 1 ] || models=mod
for model in $models; do
    # the dense model at pp 2 and pp 4: tp and dp run its blocks' code in
    # the MoD model's dense blocks
    extra="" lays="2 1 1|4 1 1"
    [ "$model" = mod ] && extra="--route_every 2 --capacity 0.25" lays="2 1 1|4 1 1|2 2 1|2 1 2"
    [ $slow = 1 ] || lays="2 2 1"
    train_ok "$model-base" 1 $extra
    IFS='|'
    set -- $lays
    unset IFS
    for lay in "$@"; do
        set -- $lay
        pp=$1 tp=$2 dp=$3
        for sched in 1f1b gpipe; do
            name="$model-pp$pp-tp$tp-dp$dp-$sched" rec=""
            [ $slow = 1 ] || [ $sched = 1f1b ] || rec="--recompute block"
            train_ok "$name" $((pp * tp * dp)) --pp $pp --tp $tp --schedule $sched $extra $rec
            if close_runs "$model-base" "$name" 5e-5 12; then
                ok "$name = one rank: $(tail -n 1 diff.txt | sed 's/ckpt diff: //')"
            else
                cat diff.txt
                fail "$name differs from one rank"
            fi
        done
        a="$model-pp$pp-tp$tp-dp$dp-1f1b" b="$model-pp$pp-tp$tp-dp$dp-gpipe"
        "$MODTRAIN" ckpt diff --a "$a/ckpt" --b "$b/ckpt" > diff.txt && [ "$(losses "$a")" = "$(losses "$b")" ] &&
            ok "$model (pp $pp, tp $tp, dp $dp): 1F1B and GPipe bitwise identical" ||
            { cat diff.txt; fail "$model (pp $pp, tp $tp, dp $dp): schedules differ"; }
        m=$((8 / dp))
        l1=$(pp_live_max "$a") l2=$(pp_live_max "$b")
        [ "$l1" -le "$pp" ] && [ "$l2" -eq "$m" ] &&
            ok "$model (pp $pp, dp $dp): 1F1B held at most $l1 <= pp micro-batches, GPipe $l2 of $m" ||
            fail "$model (pp $pp, dp $dp): live activations 1F1B $l1 (bound $pp), GPipe $l2 (expected $m)"
    done
done

# recompute: the metrics (losses, routing, FLOPs, bytes, val_loss) and the
# checkpoint of recompute = none, bit for bit
cases="attention-1f1b block-1f1b block-gpipe"
[ $slow = 1 ] || cases=block-gpipe
for case in $cases; do
    set -- ${case%-*} ${case#*-}
    ref="mod-pp2-tp2-dp1-$2" name="mod-pp2-tp2-dp1-$2-$1"
    if [ $slow = 1 ]; then
        train_ok "$name" 4 --pp 2 --tp 2 --schedule $2 --recompute $1 --route_every 2 --capacity 0.25
    else # the GPipe run above recomputed blocks: 1F1B's run is its reference
        ref=mod-pp2-tp2-dp1-1f1b name=mod-pp2-tp2-dp1-gpipe
    fi
    "$MODTRAIN" ckpt diff --a "$ref/ckpt" --b "$name/ckpt" > diff.txt && [ "$(stable_metrics "$ref")" = "$(stable_metrics "$name")" ] &&
        grep -q "(recompute $1)" "$name.log" &&
        ok "mod (pp 2, tp 2, $2), recompute = $1: metrics and checkpoint bitwise as recompute = none" ||
        { cat diff.txt; fail "mod (pp 2, tp 2, $2), recompute = $1 differs from none"; }
done

# evaluation and sampling through a pipeline give what one rank gives
"$MODTRAIN" eval --ckpt mod-base/ckpt --data data/val_000000.bin --seqs 32 --json > e1.json
"$MODTRAIN" sample --ckpt mod-base/ckpt --prompt "Q: " --tokens 60 --seed 5 --temperature 0.7 > s1.txt
lays="2-2 4-4 4-2"
[ $slow = 1 ] || lays=2-2
for lay in $lays; do
    np=${lay%-*} pp=${lay#*-}
    timeout -k 10 120 $MPIRUN -np $np "$MODTRAIN" eval --ckpt mod-base/ckpt --data data/val_000000.bin --seqs 32 \
        --json --pp $pp > ep.json
    timeout -k 10 120 $MPIRUN -np $np "$MODTRAIN" sample --ckpt mod-base/ckpt --prompt "Q: " --tokens 60 \
        --seed 5 --temperature 0.7 --pp $pp > sp.txt
    a=$(last_json e1.json loss) b=$(last_json ep.json loss)
    c=$(last_json e1.json loss_causal) d=$(last_json ep.json loss_causal)
    check_ab "$a" "$b" 'a - b < 1e-5 && b - a < 1e-5' && check_ab "$c" "$d" 'a - b < 1e-5 && b - a < 1e-5' &&
        ok "eval over $np ranks, pp $pp: loss $b, loss_causal $d as on one rank" ||
        fail "eval over $np ranks, pp $pp: $(cat ep.json)"
    cmp -s s1.txt sp.txt && ok "sampling over $np ranks, pp $pp: the same text" ||
        fail "sampling over $np ranks, pp $pp differs"
done

# checkpoint resharding across pp: step 6 of (pp 2, tp 2) under pp 1 and pp 4
pps="1 4"
[ $slow = 1 ] || pps=4
for pp in $pps; do
    name="reshard-pp$pp"
    train_ok "$name" $pp --pp $pp --route_every 2 --capacity 0.25 \
        --resume mod-pp2-tp2-dp1-1f1b/ckpt/step-00000006 --steps 6
    "$MODTRAIN" ckpt diff --a mod-pp2-tp2-dp1-1f1b/ckpt/step-00000006 --b "$name/ckpt/step-00000006" > diff.txt &&
        ok "saved under (pp 2, tp 2), loaded under pp $pp: weights and moments exact" ||
        { cat diff.txt; fail "resharding to pp $pp"; }
done

# uneven splits, and a block count pp does not divide
model=dense extra=""
[ $slow = 1 ] || model=mod extra="--route_every 2 --capacity 0.25"
train_ok uneven 2 --pp 2 --stage_layers 3,1 $extra
close_runs $model-base uneven 5e-5 12 && ok "stage_layers 3,1 = one rank" || { cat diff.txt; fail "uneven split"; }
if [ $slow = 1 ]; then
    train_ok three 2 --pp 2 --n_layer 3
    train_ok three-base 1 --n_layer 3
    close_runs three-base three 5e-5 12 && ok "3 blocks over pp 2 (2 + 1) = one rank" || { cat diff.txt; fail "3 blocks over pp 2"; }
fi

expect_train_error 4 "pp = 4 stages cannot split n_layer = 3 blocks" --pp 4 --n_layer 3
if [ $slow = 1 ]; then
    expect_train_error 2 "stage_layers = '4,0' does not split n_layer = 4 over pp = 2 stages" --pp 2 --stage_layers 4,0
    expect_train_error 2 "stage_layers = '1,1' does not split n_layer = 4" --pp 2 --stage_layers 1,1
fi
finish
