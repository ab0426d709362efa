#!/bin/sh
# Mixture-of-Depths on the fortunes text (jobs/tiny.conf with every other
# block routed at capacity 12.5%): it learns (validation loss 0.25 nats below
# the unigram entropy), two runs are bitwise identical, top-k processes
# exactly k of T tokens, the causal decision tracks top-k (accuracy > 85%,
# loss_causal within 2% of loss) for the router's BCE and for the predictor,
# the realised FLOPs are below 0.8x dense, and sampling reports what each
# routed block processed.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
run() { # DIR [--key value ...]
    dir=$1
    shift
    "$MODTRAIN" train --config "$srcdir/jobs/tiny.conf" --train_data data/train_000000.bin \
        --val_data data/val_000000.bin --route_every 2 --capacity 0.125 --run_dir "$dir" --resume never \
        "$@" > "$dir.log" 2>&1 || { cat "$dir.log"; fail "training run $dir failed"; finish; }
}
run a
run b
run p --causal_router predictor --router_gate sigmoid
cat a.log

unigram=$(unigram_entropy data/train_000000.bin)
val=$(last_json a/metrics.jsonl val_loss)
check_ab "$val" "$unigram" 'a < b - 0.25' && ok "MoD val_loss $val < unigram entropy $unigram - 0.25" ||
    fail "MoD val_loss $val did not fall below unigram entropy $unigram - 0.25"

strip() { grep -v '"ckpt_' "$1" | sed -e 's/,"lr".*//'; }
[ "$(strip a/metrics.jsonl)" = "$(strip b/metrics.jsonl)" ] && ok "same seed: identical MoD losses" ||
    fail "same seed gave different MoD losses"
cmp -s a/ckpt/step-00000300/data.bin b/ckpt/step-00000300/data.bin &&
    ok "same seed: identical MoD weights" || fail "same seed gave different MoD weights"

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
