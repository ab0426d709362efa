#!/bin/sh
# ZeRO-1 (zero 1) on real ranks: AdamW's moments and update sharded over dp,
# the gradients reduce-scattered and the parameters all-gathered.
#  - at dp 2 (where a sum of two is exact in any order) the losses and the
#    final weights and moments equal zero 0's exactly, with the overlapped
#    reduce-scatter and without;
#  - at dp 4, at tp 2 x dp 2, at pp 2 x dp 2 (the tied embedding's two
#    copies) and for an MoE model at ep 2 x dp 4 (the experts shard over
#    their own replicas), losses and final state equal zero 0's within fp32
#    rounding, and a run repeats bit for bit;
#  - checkpoints hold each moment whole: saved under zero 1 at dp 4 and
#    loaded under zero 0 at dp 2, or saved under zero 0 at dp 2 and loaded
#    under zero 1 at dp 4, the state is exact, and training on matches the
#    uninterrupted run;
#  - each rank holds 1/dp of the moments (the optimizer's bytes train
#    logs); a bad value is a one-line error.
#   losses: |a - b| <= 2e-5 * |b|;  weights and moments: max |a - b| <= 2e-5
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --n_layer 4 --train_data data/train_000000.bin \
    --val_data data/val_000000.bin --eval_seqs 8 --steps 8 --ckpt_every 4 --ckpt_keep 5 \
    --log_every 1000 --micro_batch 2 --threads 1 --resume never --dp_bucket_mb 0"
close() { # A B WHAT: losses within 2e-5 relative, final state within 2e-5
    if close_runs "$1" "$2" 2e-5 8; then
        ok "$3: losses, $(tail -n 1 diff.txt | sed 's/ckpt diff: //')"
    else
        paste a.txt b.txt
        cat diff.txt
        fail "$3: zero 1 differs from zero 0"
    fi
}
exact() { # A B WHAT: the same losses, and every weight and moment equal (the
    # moments' chunks follow the shards, so the files' bytes differ)
    if [ "$(losses "$1")" = "$(losses "$2")" ] &&
        "$MODTRAIN" ckpt diff --a "$1/ckpt" --b "$2/ckpt" > diff.txt; then
        ok "$3: the same losses, $(tail -n 1 diff.txt | sed 's/ckpt diff: //')"
    else
        cat diff.txt
        fail "$3: the final states differ"
    fi
}

# MODTRAIN_SKIP_SLOW (the sanitizer pass, after a first pass of all of
# it): dp 2 (both reductions) and the MoE case, no dp 4 (the shards'
# arithmetic as at dp 2), no repeat, no tp 2 (the norm's tp sums are zero
# 0's); one reshard, of dp 2's zero 0 checkpoint into zero 1 at pp 2 x dp
# 2, whose run on to step 8 stands for the pp case (the tied embedding's
# two copies) against the uninterrupted zero 0 run (the other direction,
# a zero 1 save, is each zero 1 run's checkpoint above)
train_ok dp2_z0 2 --zero 0
train_ok dp2_z1 2 --zero 1
exact dp2_z0 dp2_z1 "dp 2, zero 1 against zero 0"
train_ok dp2_z1_after 2 --zero 1 --dp_overlap 0
exact dp2_z1 dp2_z1_after "dp 2, zero 1 with the overlapped reduce-scatter against after the backward"
grep -q '"dp_gather_bytes":[1-9]' dp2_z1/metrics.jsonl && ok "zero 1 counts the parameters gathered" ||
    fail "zero 1: no dp_gather_bytes in the metrics"

if [ $slow = 1 ]; then
    train_ok dp4_z0 4 --zero 0
    train_ok dp4_z1 4 --zero 1
    close dp4_z0 dp4_z1 "dp 4, zero 1 against zero 0"
    train_ok dp4_z1_again 4 --zero 1
    expect_same_step dp4_z1 dp4_z1_again 8 "dp 4 with zero 1, run twice"
    train_ok tp2_z0 4 --tp 2 --zero 0
    train_ok tp2_z1 4 --tp 2 --zero 1
    close tp2_z0 tp2_z1 "tp 2 x dp 2, zero 1 against zero 0"
    train_ok pp2_z0 4 --pp 2 --zero 0
    train_ok pp2_z1 4 --pp 2 --zero 1
    close pp2_z0 pp2_z1 "pp 2 x dp 2 (the tied embedding on two stages), zero 1 against zero 0"
fi
moe="--n_expert 4 --expert_top_k 2 --ep 2"
train_ok moe_z0 4 $moe --zero 0
train_ok moe_z1 4 $moe --zero 1
close moe_z0 moe_z1 "MoE top-2 at ep 2 x dp 4 (experts over their replicas), zero 1 against zero 0"

# the moments each rank holds (as allocated, on train's memory line) halve at dp 2
opt_kib() {
    grep -o "AdamW moments [0-9.]* [KMG]iB" "$1" | head -n 1 |
        awk '{ print $3 * ($4 == "KiB" ? 1 : $4 == "MiB" ? 1024 : 1048576) }'
}
a=$(opt_kib dp2_z0.log) b=$(opt_kib dp2_z1.log)
check_ab "$a" "$b" 'b > 0 && b <= a / 2 * 1.02' && ok "dp 2: a rank's moments $a KiB under zero 0, $b under zero 1" ||
    fail "dp 2: the moments take $a KiB under zero 0 and '$b' under zero 1 (expected half)"

# resharding both ways: step 4 saved under one, loaded under the other
# (--steps 4 loads and saves it again, training nothing), then on to step 8
reshard_zero() { # FROM NAME RANKS ARGS...: loads FROM's step 4 under the layout ARGS
    from=$1 name=$2 n=$3
    shift 3
    train_ok "$name" "$n" "$@" --resume "$from/ckpt/step-00000004" --steps 4
    "$MODTRAIN" ckpt diff --a "$from/ckpt/step-00000004" --b "$name/ckpt/step-00000004" > diff.txt &&
        ok "$name: $from's step 4 loaded exactly (weights and moments)" ||
        { cat diff.txt; fail "$name: loading $from's step 4 changed the state"; }
    train_ok "$name" "$n" "$@" --resume auto
    "$MODTRAIN" ckpt diff --a "$from/ckpt/step-00000008" --b "$name/ckpt/step-00000008" --tol 2e-5 > diff.txt &&
        ok "$name: step 8 matches $from's uninterrupted run: $(tail -n 1 diff.txt | sed 's/ckpt diff: //')" ||
        { cat diff.txt; fail "$name: resumed run drifted from $from's"; }
}
if [ $slow = 1 ]; then
    reshard_zero dp4_z1 z1dp4_to_z0dp2 2 --zero 0
    reshard_zero dp2_z0 z0dp2_to_z1dp4 4 --zero 1
else
    reshard_zero dp2_z0 z0dp2_to_z1pp2 4 --zero 1 --pp 2
fi

rc=0
$MODTRAIN train $common --zero 2 --run_dir bad > bad.log 2>&1 || rc=$?
if [ "$rc" -eq 2 ] && [ "$(wc -l < bad.log)" -eq 1 ] && grep -q -- "zero" bad.log; then
    ok "--zero 2 refused: $(cat bad.log)"
else
    cat bad.log
    fail "--zero 2: exit $rc, expected one line naming the key and exit 2"
fi
finish
