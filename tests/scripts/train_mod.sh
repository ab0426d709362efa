#!/bin/sh
# Mixture-of-Depths on the fortunes text (jobs/tiny.conf with every other
# block routed at capacity 12.5%): it learns (validation loss 0.25 nats below
# the unigram entropy), two runs are bitwise identical, top-k processes
# exactly k of T tokens, the causal decision tracks top-k (accuracy > 85%,
# loss_causal within 2% of loss) for the router's BCE and for the predictor,
# the realised FLOPs are below 0.8x dense, and sampling reports what each
# routed block processed. recompute = block (20 steps, the predictor) logs
# what recompute = none logs (losses, routing, FLOPs, val_loss) and saves
# the same weights, bit for bit, in less memory.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
train_mod_run() { # DIR [--key value ...]
    dir=$1
    shift
    "$MODTRAIN" train --config "$srcdir/jobs/tiny.conf" --train_data data/train_000000.bin \
        --val_data data/val_000000.bin --route_every 2 --capacity 0.125 --run_dir "$dir" --resume never \
        "$@" > "$dir.log" 2>&1 || { cat "$dir.log"; fail "training run $dir failed"; finish; }
}
# MODTRAIN_SKIP_SLOW (the sanitizer pass, after the first pass): no repeat,
# and the predictor's run 60 steps long, whose causal decision is not yet
# held to top-k's (the router's run still is)
train_mod_run a
[ $slow = 0 ] || train_mod_run b
short=
[ $slow = 1 ] || short="--steps 60 --eval_every 20 --ckpt_every 20"
# shellcheck disable=SC2086 # the options' words
train_mod_run p --causal_router predictor --router_gate sigmoid $short
cat a.log

unigram=$(unigram_entropy data/train_000000.bin)
val=$(last_json a/metrics.jsonl val_loss)
check_ab "$val" "$unigram" 'a < b - 0.25' && ok "MoD val_loss $val < unigram entropy $unigram - 0.25" ||
    fail "MoD val_loss $val did not fall below unigram entropy $unigram - 0.25"

loss_lines() { grep -v '"ckpt_' "$1" | sed -e 's/,"lr".*//'; }
if [ $slow = 1 ]; then
    [ "$(loss_lines a/metrics.jsonl)" = "$(loss_lines b/metrics.jsonl)" ] && ok "same seed: identical MoD losses" ||
        fail "same seed gave different MoD losses"
    cmp -s a/ckpt/step-00000300/data.bin b/ckpt/step-00000300/data.bin &&
        ok "same seed: identical MoD weights" || fail "same seed gave different MoD weights"
fi

# recompute: each block's forward again in its backward, counted once
for rc in none block; do
    train_mod_run "r-$rc" --causal_router predictor --router_gate sigmoid --steps 20 --eval_every 10 --recompute $rc
done
comparable() { grep -v '"ckpt_' "$1" | sed -e 's/,"tokens_per_s".*"flops_per_token":\([0-9]*\).*/,\1/'; }
memory_bytes() { sed -n 's/^memory (rank 0): .*(recompute '"$2"').*(\([0-9]*\) bytes)$/\1/p' "$1"; }
mb=$(memory_bytes r-block.log block) mn=$(memory_bytes r-none.log none)
[ "$(comparable r-none/metrics.jsonl)" = "$(comparable r-block/metrics.jsonl)" ] &&
    [ "$(grep -c val_loss r-block/metrics.jsonl)" -eq 2 ] &&
    cmp -s r-none/ckpt/step-00000020/data.bin r-block/ckpt/step-00000020/data.bin &&
    [ -n "$mb" ] && [ -n "$mn" ] && [ "$mb" -lt "$mn" ] &&
    ok "recompute = block: the metrics and weights of none bit for bit, in $mb bytes, not $mn" ||
    fail "recompute = block differs from none (memory $mb against $mn bytes)"

ratio=$(last_json a/metrics.jsonl flops_ratio_dense)
check_ab "$ratio" 0.8 'a < b' && ok "realised FLOPs $ratio x dense" || fail "FLOPs ratio $ratio >= 0.8"

for r in a p; do
    "$MODTRAIN" eval --ckpt $r/ckpt --data data/val_000000.bin --seqs 128 --json > $r.json
    cat $r.json
    loss=$(last_json $r.json loss)
    causal=$(last_json $r.json loss_causal)
    acc=$(last_json $r.json predictor_accuracy)
    topk=$(sed -e 's/.*"processed_topk":\[\([^]]*\)\].*/\1/' $r.json)
    [ "$topk" = "0.125000" ] && ok "$r: top-k processed exactly 8 of 64 tokens" ||
        fail "$r: top-k processed $topk, expected 0.125000"
    [ $slow = 1 ] || [ $r = a ] || continue
    check_ab "$causal" "$loss" 'a < b * 1.02' && ok "$r: loss_causal $causal within 2% of loss $loss" ||
        fail "$r: loss_causal $causal is not within 2% of loss $loss"
    check_ab "$acc" 0.85 'a > b' && ok "$r: predictor accuracy $acc > 0.85" ||
        fail "$r: predictor accuracy $acc <= 0.85"
done

"$MODTRAIN" sample --ckpt a/ckpt --prompt "Q: " --tokens 100 --stats > s.txt 2> s.log
cat s.log
[ "$(wc -c < s.txt)" -eq 104 ] && grep -q "block 1 processed" s.log &&
    ok "MoD sampling with --stats" || fail "MoD sampling"
finish
