#!/bin/sh
# Validation does not depend on the layout: eval_seqs names the first N
# sequences of val_data, summed per sequence in sequence order, so one
# checkpoint gives the same loss at every --micro_batch and through a
# pipeline (the same digits), under tp within fp32 round-off; training
# runs at two micro_batch values and at dp 2 log the same val_loss at
# their first evaluation; a blend's parts are each dataset's share of the
# first N read from its start (eval of that dataset alone); eval_batches
# and --batches are refused with a line naming what replaced them.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --log_every 1000 --ckpt_every 0 --threads 1"
# shellcheck disable=SC2086 # the options
"$MODTRAIN" train $common --steps 6 --eval_every 0 --run_dir src > src.log 2>&1 ||
    { cat src.log; fail "training the source"; finish; }

# 1. one checkpoint, evaluated under several micro-batches and layouts
ev() { "$MODTRAIN" eval --ckpt src/ckpt --data data/val_000000.bin --seqs 40 --json --threads 1 "$@" |
    sed -e 's/.*"loss":\([^,]*\).*/\1/'; }
l16=$(ev --micro_batch 16) l8=$(ev --micro_batch 8) l3=$(ev --micro_batch 3)
pp2=$(timeout -k 10 120 $MPIRUN -np 2 "$MODTRAIN" eval --ckpt src/ckpt --data data/val_000000.bin --seqs 40 \
    --micro_batch 8 --pp 2 --json --threads 1 | sed -e 's/.*"loss":\([^,]*\).*/\1/')
tp2=$(timeout -k 10 120 $MPIRUN -np 2 "$MODTRAIN" eval --ckpt src/ckpt --data data/val_000000.bin --seqs 40 \
    --micro_batch 5 --json --threads 1 | sed -e 's/.*"loss":\([^,]*\).*/\1/')
[ -n "$l16" ] && [ "$l16" = "$l8" ] && [ "$l8" = "$l3" ] && [ "$l8" = "$pp2" ] &&
    ok "eval --seqs 40: $l16 at micro_batch 16, 8 and 3 and through pp 2" ||
    fail "eval --seqs 40 varies: micro 16 $l16, 8 $l8, 3 $l3, pp 2 $pp2"
check_ab "$tp2" "$l8" '(a - b) < 1e-5 && (b - a) < 1e-5' && ok "under tp 2: $tp2 (fp32 round-off)" ||
    fail "under tp 2: $tp2, alone $l8"
# a different count is a different set: the check above could fail
l39=$(ev --seqs 39)
[ "$l39" != "$l8" ] && ok "--seqs 39 reads another set: $l39" || fail "--seqs 39 gave $l39 too"

# 2. the first validation of training runs at two micro_batch values and dp 2
first_val_loss() { # NAME NP [--key value ...]: trains, prints the first val_loss
    train_ok "$@" --steps 2 --eval_every 1 --eval_seqs 40 --resume never
    grep '"val_loss"' "$1/metrics.jsonl" | head -n 1 | sed -e 's/.*"val_loss":\([^,}]*\).*/\1/'
}
v16=$(first_val_loss m16 1 --micro_batch 16) v8=$(first_val_loss m8 1 --micro_batch 8) vdp=$(first_val_loss dp2 2 --micro_batch 4)
[ -n "$v16" ] && [ "$v16" = "$v8" ] && ok "first val_loss $v16 at micro_batch 16 and 8" ||
    fail "first val_loss: micro_batch 16 $v16, 8 $v8"
check_ab "$vdp" "$v8" '(a - b) < 1e-5 && (b - a) < 1e-5' && ok "at dp 2 (micro_batch 4): $vdp" ||
    fail "first val_loss at dp 2: $vdp, alone $v8"

# 3. a blend: each part is that dataset's share of the first N, from its start
cp data/val_000000.bin other.bin
"$MODTRAIN" eval --ckpt src/ckpt --data "3:data/val_000000.bin,1:other.bin" --seqs 40 --json > blend.json ||
    fail "eval on a blend"
parts=$(sed -e 's/.*"loss_parts":\[\([^]]*\)\].*/\1/' blend.json)
a=$(ev --seqs 30) b=$("$MODTRAIN" eval --ckpt src/ckpt --data other.bin --seqs 10 --json |
    sed -e 's/.*"loss":\([^,]*\).*/\1/')
[ "$parts" = "$a,$b" ] && ok "blend 3:1 of 40: parts $parts = the first 30 and the first 10 alone" ||
    fail "blend parts $parts, alone $a and $b"

# 4. the old names are refused with the new ones
rc=0
# shellcheck disable=SC2086
"$MODTRAIN" train $common --eval_batches 8 --run_dir old > old.out 2> old.err || rc=$?
[ "$rc" = 2 ] && [ "$(wc -l < old.err)" = 1 ] && grep -q "eval_batches was replaced by eval_seqs" old.err &&
    ok "eval_batches: $(cat old.err)" || fail "eval_batches: exit $rc, $(cat old.err)"
rc=0
"$MODTRAIN" eval --ckpt src/ckpt --data data/val_000000.bin --batches 2 > old.out 2> old.err || rc=$?
[ "$rc" = 2 ] && [ "$(wc -l < old.err)" = 1 ] && grep -q -- "--batches was replaced by --seqs" old.err &&
    ok "eval --batches: $(cat old.err)" || fail "eval --batches: exit $rc, $(cat old.err)"
finish
