#!/bin/sh
# Checkpoint format 2 on real ranks: tensors cut into many chunks
# (ckpt_chunk 256) and every rank writing a share of what it holds alike with
# others. Under (dp 2), (tp 2, dp 2) and (pp 2, dp 2) the state saved is bit
# for bit the one saved in whole-tensor chunks, every rank writes between
# 0.5x and 1.5x of the mean share (none idle), a run resumed from a chunked
# checkpoint ends bitwise equal to the uninterrupted one, and a chunked
# (tp 2, dp 2) checkpoint loads under one rank and under pp 2 exactly. A
# version-1 checkpoint (tests/fixtures/ckpt-v1) still verifies, evaluates,
# and saved again as version 2 holds the same state.
# MODTRAIN_SKIP_SLOW=1 keeps (tp 2, dp 2) (every share group a layout
# without pp has: dp replicas, tp-replicated tensors, tp slices) and its
# load under pp 2, and drops dp 2, (pp 2, dp 2) and the one-rank load (the
# same writing and reading at other layouts).
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --steps 20 --ckpt_every 10 --ckpt_keep 5 --eval_every 0 --log_every 1000 --threads 1 \
    --peak_gflops 50 --route_every 2 --capacity 0.25"
# shares N LOG: the last save was written by N ranks, each 0.5x-1.5x the mean
shares() {
    line=$(grep "^checkpoint: .*step-00000020" "$2" | tail -n 1)
    echo "$line" | grep -q "written by $1 ranks" || { fail "$2: $line"; return; }
    echo "$line" | sed -e 's/.*, \([0-9.]*\) \([KM]\)iB to \([0-9.]*\) \([KM]\)iB each .*/\1 \2 \3 \4/' |
        awk -v n="$1" '{ lo = $1 * ($2 == "M" ? 1024 : 1); hi = $3 * ($4 == "M" ? 1024 : 1)
            exit !(lo > 0 && hi < 1.5 * (lo + hi) / 2 * 1.0 && lo > 0.5 * (lo + hi) / 2) }' &&
        ok "$2: $(echo "$line" | sed -e 's/.*| written/written/' -e 's/ | peak.*//')" || fail "$2: unbalanced: $line"
}

for lay in "dp2:2:" "tp2dp2:4:--tp 2" "pp2dp2:4:--pp 2"; do
    name=${lay%%:*} rest=${lay#*:} np=${rest%%:*} opts=${rest#*:}
    [ $slow = 1 ] || [ "$name" = tp2dp2 ] || continue
    train_ok "$name-whole" "$np" $opts
    train_ok "$name-chunks" "$np" $opts --ckpt_chunk 256
    n=$(grep -c "^chunk param/wte.weight" "$name-chunks/ckpt/step-00000020/index")
    [ "$n" -ge 32 ] && ok "$name: wte in $n chunks" || fail "$name: wte in $n chunks"
    expect_same_ckpt "$name-whole/ckpt/step-00000020" "$name-chunks/ckpt/step-00000020" "$name: chunked = whole"
    shares "$np" "$name-chunks.log"
    # resumed from the chunked step 10: bitwise the uninterrupted run
    mkdir -p "$name-resumed/ckpt"
    cp -r "$name-chunks/ckpt/step-00000010" "$name-resumed/ckpt/"
    train_ok "$name-resumed" "$np" $opts --ckpt_chunk 256
    grep -q "resume: loaded $name-resumed/ckpt/step-00000010" "$name-resumed.log" ||
        fail "$name: did not resume from step 10"
    expect_same_ckpt "$name-chunks/ckpt/step-00000020" "$name-resumed/ckpt/step-00000020" "$name: 10 + resume + 10"
    cmp -s "$name-chunks/ckpt/step-00000020/data.bin" "$name-resumed/ckpt/step-00000020/data.bin" &&
        ok "$name: the same data.bin byte for byte" || fail "$name: data.bin differs"
done

# a chunked (tp 2, dp 2) checkpoint under other layouts: the same weights
for lay in "one:1:" "pp2:2:--pp 2"; do
    name=${lay%%:*} rest=${lay#*:} np=${rest%%:*} opts=${rest#*:}
    [ $slow = 1 ] || [ "$name" = pp2 ] || continue
    mkdir -p "re-$name/ckpt"
    cp -r tp2dp2-chunks/ckpt/step-00000020 "re-$name/ckpt/"
    train_ok "re-$name" "$np" $opts
    expect_same_ckpt tp2dp2-chunks/ckpt/step-00000020 "re-$name/ckpt/step-00000020" "(tp 2, dp 2) chunks loaded under $name"
done

# version 1
v1=$srcdir/tests/fixtures/ckpt-v1/step-00000004
chunked=dp2-chunks
[ $slow = 1 ] || chunked=tp2dp2-chunks # (the one chunked run)
"$MODTRAIN" ckpt verify --ckpt "$v1" > v.txt 2>&1 && ok "v1: $(cat v.txt)" || fail "v1 verify: $(cat v.txt)"
"$MODTRAIN" ckpt inspect --ckpt "$v1" | grep -q "(format 1, " &&
    "$MODTRAIN" ckpt inspect --ckpt "$chunked/ckpt" | grep -q "(format 2, " &&
    "$MODTRAIN" ckpt inspect --ckpt "$chunked/ckpt" | grep -q "^param/wte.weight .* -> [0-9]* ([hr] [hr] [hr] h)$" &&
    ok "ckpt inspect names the format and each chunk's plane codecs" || fail "ckpt inspect of formats"
mkdir lsv1 && cp -r "$v1" lsv1/
"$MODTRAIN" ckpt list --ckpt lsv1 | grep -q "step-00000004 .* v1 zlib *verified" &&
    ok "ckpt list names version 1" || fail "ckpt list of v1: $("$MODTRAIN" ckpt list --ckpt lsv1)"
printf 'the quick brown fox jumps over the lazy dog\n%%\n%.0s' $(seq 1 400) > text.txt
"$MODTRAIN" prep --out fx --doc-sep % text.txt > /dev/null
e1=$("$MODTRAIN" eval --ckpt "$v1" --data fx/val_000000.bin --json)
fx="--train_data fx/train_000000.bin --val_data fx/val_000000.bin --seq_len 8 --d_model 8 --n_head 2 --n_layer 2 \
    --route_every 2 --causal_router predictor --predictor_hidden 4 --batch_size 4 --seed 7"
mkdir -p v2/ckpt
cp -r "$v1" v2/ckpt/
rm -rf v2/ckpt/step-00000004
"$MODTRAIN" train $fx --run_dir v2 --resume "$v1" --steps 4 > v2.log 2>&1 || { cat v2.log; fail "v1 resume"; }
head -n 1 v2/ckpt/step-00000004/index | grep -q "modtrain-checkpoint 2" &&
    expect_same_ckpt "$v1" v2/ckpt/step-00000004 "v1 saved again as v2" || fail "v1 resaved: not version 2"
e2=$("$MODTRAIN" eval --ckpt v2/ckpt/step-00000004 --data fx/val_000000.bin --json)
[ "$e1" = "$e2" ] && ok "v1 and its v2 copy evaluate the same: $e1" || fail "eval: $e1 vs $e2"
"$MODTRAIN" train $fx --run_dir v2 --steps 6 > v2b.log 2>&1 &&
    grep -q "resume: loaded v2/ckpt/step-00000004" v2b.log && ok "training goes on from it" ||
    { cat v2b.log; fail "training on from the v1 state"; }
finish
