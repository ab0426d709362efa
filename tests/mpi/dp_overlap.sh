#!/bin/sh
# The overlapped gradient reduction (dp_overlap 1, the default) on real
# ranks, a bucket a block (dp_bucket_mb 0) so that buckets start while the
# backward goes on: at dp 2 (where a sum of two is exact in any order) the
# final checkpoint is byte for byte dp_overlap 0's, dense, at pp 2 x dp 2
# (each stage its own blocks) and for an MoE model at ep 2 (the experts
# reduce over their own replicas after the backward, the rest overlapped);
# at dp 4 two runs give the same bytes and the losses equal dp_overlap 0's
# within fp32 rounding. Both keys refuse bad values in one line.
# MODTRAIN_SKIP_SLOW=1 keeps pp 2 x dp 2 (the dense overlap on a stage with
# the head and on one without) and the MoE pair, and drops dp 2 dense and
# dp 4 (the same overlap at other dp sizes).
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --n_layer 4 --train_data data/train_000000.bin \
    --val_data data/val_000000.bin --eval_seqs 8 --steps 5 --ckpt_every 0 --log_every 1000 \
    --micro_batch 2 --threads 1 --resume never --dp_bucket_mb 0"
if [ $slow = 1 ]; then
    train_ok dp2_after 2 --dp_overlap 0
    train_ok dp2_overlap 2 --dp_overlap 1
    expect_same_step dp2_after dp2_overlap 5 "dp 2, dp_overlap 1 against 0"
    grep -q "dp_overlap: a block's or ln_f's tensors are not one range" dp2_overlap.log &&
        fail "dp 2: the overlap fell back to the reduction after the backward"
fi
train_ok pp2_after 4 --pp 2 --dp_overlap 0
train_ok pp2_overlap 4 --pp 2
expect_same_step pp2_after pp2_overlap 5 "pp 2 x dp 2, dp_overlap 1 against 0"
# (without dp 2 dense: pp 2's overlap must not have fallen back either)
[ $slow = 1 ] || ! grep -q "dp_overlap: a block's or ln_f's tensors are not one range" pp2_overlap.log ||
    fail "pp 2 x dp 2: the overlap fell back to the reduction after the backward"
moe="--n_expert 4 --expert_top_k 2 --ep 2"
train_ok moe_after 2 $moe --dp_overlap 0
train_ok moe_overlap 2 $moe
expect_same_step moe_after moe_overlap 5 "MoE top-2 at ep 2 (dp 2), dp_overlap 1 against 0"
if [ $slow = 1 ]; then
    train_ok dp4_overlap 4
    train_ok dp4_again 4
    expect_same_step dp4_overlap dp4_again 5 "dp 4 with dp_overlap 1, run twice"
    train_ok dp4_after 4 --dp_overlap 0
    "$PYTHON" - dp4_after dp4_overlap <<'PY' && ok "dp 4: losses of dp_overlap 1 within 1e-5 of 0's" || fail "dp 4: losses differ"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"loss"' in l] for d in sys.argv[1:])
assert len(a) == len(b) == 5, (a, b)
for x, y in zip(a, b):
    assert abs(x - y) <= 1e-5 * abs(x), (x, y)
PY
fi
for bad in "--dp_overlap 2" "--dp_bucket_mb -1" "--dp_bucket_mb 1e300"; do
    # shellcheck disable=SC2086 # the key and its value
    rc=0
    $MODTRAIN train $common $bad --run_dir bad > bad.log 2>&1 || rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l < bad.log)" -eq 1 ] && grep -q -- "${bad%% *}" bad.log; then
        ok "$bad refused: $(cat bad.log)"
    else
        cat bad.log
        fail "$bad: exit $rc, expected one line naming the key and exit 2"
    fi
done
finish
