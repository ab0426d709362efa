#!/bin/sh
# Hostile data: bad specs, shards of another tokenizer than their
# neighbours, truncated shards, llm.c shards without vocab_size, uint32
# shards (their ids, their neighbours, their training), a shard
# truncated while a run reads it, a token outside the vocabulary. Each is
# one line on stderr and exit 2; those found at the start are refused
# before the first step (no metrics line).
. "$(dirname "$0")/lib.sh"
set -f # the specs hold glob patterns: modtrain expands them, not the shell
[ -d "${FORTUNES_DIR:-/usr/share/games/fortunes}" ] || { echo "SKIP: no fortunes text"; exit 77; }
SHARDS="$PYTHON $srcdir/tests/scripts/make_shards.py"
cd "$TMP"
mkdir d
for i in 0 1 2; do $SHARDS text d/train_$i.bin 20000 --skip $((i * 20000)); done
$SHARDS text d/val.bin 20000 --skip 100000
common="--config $srcdir/jobs/tiny.conf --batch_size 8 --micro_batch 8 --steps 2 --eval_every 0 \
    --eval_seqs 8 --log_every 1000 --ckpt_every 0 --threads 1"

# refused PATTERN CMD...: exit 2, one line on stderr matching PATTERN, and
# no training step
refused_data() {
    pattern=$1
    shift
    rm -rf run
    set +e
    "$@" > out.txt 2> err.txt
    rc=$?
    set -e
    if [ "$rc" -ne 2 ] || [ "$(wc -l < err.txt)" -ne 1 ] || ! grep -q -- "$pattern" err.txt; then
        cat out.txt err.txt
        fail "'$*': exit $rc, expected 2 and one line /$pattern/"
    elif [ -e run/metrics.jsonl ] && grep -q '"loss"' run/metrics.jsonl; then
        fail "'$*' trained before refusing"
    else
        ok "$(cat err.txt)"
    fi
}
# bad_spec PATTERN SPEC: refused by modtrain data, as train_data and as val_data
bad_spec() {
    refused_data "$1" "$MODTRAIN" data --data "$2" --seq_len 64
    refused_data "$1" "$MODTRAIN" train $common --train_data "$2" --val_data d/val.bin --run_dir run
    refused_data "$1" "$MODTRAIN" train $common --train_data "d/train_*.bin" --val_data "$2" --run_dir run
}
bad_spec "'d/none_\*.bin' matches no file" "d/none_*.bin"
bad_spec "cannot open\|no such\|No such" "d/absent.bin"
bad_spec "the weight '0' of '0:d/train_\*.bin' is not a positive number" "0:d/train_*.bin"
bad_spec "the weight '-1' of '-1:d/train_\*.bin' is not a positive number" "-1:d/train_*.bin"
bad_spec "'abc:d/train_0.bin' in the blend .* has no weight" "abc:d/train_0.bin,0.5:d/train_1.bin"
bad_spec "'d/train_1.bin' in the blend .* has no weight" "0.5:d/train_0.bin,d/train_1.bin"
bad_spec "a part of '0.5:' names no shard" "0.5:"
bad_spec "a part of '0.5:d/train_0.bin,0.5:' names no shard" "0.5:d/train_0.bin,0.5:"
bad_spec "'' in the blend .* has no weight" "0.5:d/train_0.bin,"
refused_data "the spec is empty" "$MODTRAIN" data --data "" --seq_len 64
refused_data "the spec is empty" "$MODTRAIN" train $common --train_data "" --val_data d/val.bin --run_dir run # val_data = "": none

# weights whose sum overflows a double: refused, or normalised to 0.5 each
# (not "weight 0" each, which blends the validation losses to 0)
set +e
"$MODTRAIN" data --data "1e308:d/train_0.bin,1e308:d/train_1.bin" --seq_len 64 > out.txt 2> err.txt
rc=$?
set -e
if [ "$rc" -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ]; then
    ok "$(cat err.txt)"
elif [ "$rc" -eq 0 ] && grep -q "dataset 0: weight 0.5 |" out.txt && grep -q "dataset 1: weight 0.5 |" out.txt; then
    ok "weights 1e308 and 1e308: 0.5 each"
else
    cat out.txt err.txt
    fail "weights 1e308 and 1e308 (their sum overflows): exit $rc, neither refused nor 0.5 each"
fi

# a run's samples, steps x batch_size: bounded as a run's, so the count
# cannot wrap past 2^64 (9.2e18 x 2^30 printed a wrapped one); the largest
# run is counted exactly
refused_data "data: --steps = 9200000000000000000 is out of range (expected an integer in \[0, 99999999\])" \
    "$MODTRAIN" data --data d/train_0.bin --seq_len 64 --steps 9200000000000000000 --batch_size 16
refused_data "data: --batch_size = 1073741824 is out of range (expected an integer in \[1, 16777216\])" \
    "$MODTRAIN" data --data d/train_0.bin --seq_len 64 --steps 10 --batch_size 1073741824
"$MODTRAIN" data --data d/train_0.bin --seq_len 64 --steps 99999999 --batch_size 16777216 > out.txt
grep -q "a run of 99999999 steps x 16777216 sequences reads 1677721583222784 of its samples" out.txt &&
    ok "99999999 steps x 16777216 sequences: 1677721583222784 samples" ||
    { cat out.txt; fail "the largest run's samples are not 99999999 x 16777216"; }

# a shard of another tokenizer among its neighbours
cp -r d mixed
$SHARDS slot mixed/train_1.bin 4 0
bad_spec "'mixed/train_1.bin' was written by an unknown tokenizer with vocabulary size 256, but 'mixed/train_0.bin' by the byte tokenizer" "mixed/train_*.bin"
cp -r d mixedv
$SHARDS slot mixedv/train_2.bin 3 512
bad_spec "'mixedv/train_2.bin' was written by the byte tokenizer with vocabulary size 512, but 'mixedv/train_0.bin' by the byte tokenizer with 256" "mixedv/train_*.bin"

# a shard shorter than its header says
cp -r d short
truncate -s 30000 short/train_1.bin
bad_spec "'short/train_1.bin' is 30000 bytes but its header promises 20000 tokens (41024 bytes): truncated or corrupt" "short/train_*.bin"
truncate -s 100 short/train_1.bin
bad_spec "'short/train_1.bin' is 100 bytes, shorter than the 1024-byte shard header" "short/train_*.bin"

# an llm.c shard (vocabulary 0 in its header) without vocab_size
mkdir llmc
$SHARDS text llmc/train_0.bin 20000 --vocab 0 --tokenizer 0
refused_data "'llmc/train_0.bin' does not record its vocabulary (an llm.c shard); set vocab_size" \
    "$MODTRAIN" train $common --train_data llmc/train_0.bin --val_data "" --run_dir run
"$MODTRAIN" train $common --train_data llmc/train_0.bin --val_data "" --vocab_size 256 --run_dir llmc-run \
    > llmc.log 2>&1 && ok "the llm.c shard trains with vocab_size 256" || { cat llmc.log; fail "llm.c shard with vocab_size"; }

# a token outside vocab_size = 256 where the first step reads it
cp llmc/train_0.bin llmc/bad.bin
where=$("$MODTRAIN" data --data llmc/bad.bin --seq_len 64 --seed 1337 --from 0 --count 1)
off=$(echo "$where" | sed -e 's/.*"offset":\([0-9]*\).*/\1/')
$SHARDS poke llmc/bad.bin $((off + 5)) 300
"$MODTRAIN" data --data llmc/bad.bin --seq_len 64 --seed 1337 --from 0 --count 1 --tokens | grep -q '"tokens":\[[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,300,' &&
    ok "token 300 planted at token $((off + 5)), in sample 0" || fail "planting token 300"
set +e
"$MODTRAIN" train $common --train_data llmc/bad.bin --val_data "" --vocab_size 256 --run_dir run \
    > out.txt 2> err.txt
rc=$?
set -e
[ "$rc" -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] &&
    grep -q "'llmc/bad.bin' holds token 300 at offset $((off + 5)), outside vocab_size = 256" err.txt &&
    ! grep -q '"loss"' run/metrics.jsonl 2> /dev/null && ok "$(cat err.txt)" ||
    { cat out.txt err.txt; fail "token 300: exit $rc"; }

# the same in validation data (read after the last step) and in eval --data
$SHARDS text llmc/val.bin 20000 --vocab 0 --tokenizer 0
$SHARDS poke llmc/val.bin 10 300
refused_data "'llmc/val.bin' holds token 300 at offset 10, outside vocab_size = 256" \
    "$MODTRAIN" train $common --train_data llmc/train_0.bin --val_data llmc/val.bin --vocab_size 256 --run_dir run-val
refused_data "'llmc/val.bin' holds token 300 at offset 10, outside vocab_size = 256" \
    "$MODTRAIN" eval --ckpt llmc-run/ckpt --data llmc/val.bin --seqs 8

# uint32 shards (llm.c's Llama 3 format, written here without modtrain):
# the same tokens train as the uint16 shards do, batch for batch and bit for
# bit; an id is checked up to 2^32 - 1; a dataset or a run does not mix
# the two widths
mkdir w32
for i in 0 1 2; do $SHARDS text w32/train_$i.bin 20000 --skip $((i * 20000)) --width 4; done
$SHARDS text w32/val.bin 20000 --skip 100000 --width 4
for w in d w32; do
    "$MODTRAIN" train $common --train_data "$w/train_*.bin" --val_data $w/val.bin --run_dir $w-run \
        > $w.log 2>&1 || { cat $w.log; fail "training on $w"; }
done
stable_metrics d-run > d.metrics
stable_metrics w32-run > w32.metrics
[ -s d.metrics ] && cmp -s d.metrics w32.metrics &&
    ok "uint32 shards: every step's batch (data_hash), loss and val loss those of uint16 shards" ||
    { diff d.metrics w32.metrics | head -n 5; fail "uint32 shards train otherwise than uint16 ones"; }
cp w32/train_1.bin d/train_w32.bin
bad_spec "'d/train_w32.bin' holds uint32 tokens, but 'd/train_0.bin' uint16" "d/train_*.bin"
rm d/train_w32.bin
refused_data "'w32/val.bin' holds uint32 tokens but 'd/train_0.bin' uint16" \
    "$MODTRAIN" train $common --train_data "d/train_*.bin" --val_data w32/val.bin --run_dir run
cp w32/val.bin w32/bad.bin
$SHARDS poke w32/bad.bin 10 4294967295
refused_data "'w32/bad.bin' holds token 4294967295 at offset 10, outside vocab_size = 256" \
    "$MODTRAIN" train $common --train_data w32/train_0.bin --val_data w32/bad.bin --run_dir run-val32 # (read after the last step)
truncate -s 60000 w32/bad.bin
bad_spec "'w32/bad.bin' is 60000 bytes but its header promises 20000 tokens (81024 bytes)" "w32/bad.bin"

# a folder among the shards a pattern matches
cp -r d withdir
mkdir withdir/train_9.bin
bad_spec "'withdir/train_9.bin' is a directory, not a file" "withdir/train_*.bin"

# a shard truncated while a run reads it, on one rank and under dp 2
mkdir live
cut_live() { # NAME LAUNCH...: starts a long run, cuts its shard after its first step; sets rc
    name=$1
    shift
    $SHARDS text live/train_0.bin 100000
    "$@" "$MODTRAIN" train $common --micro_batch 4 --train_data live/train_0.bin --val_data "" \
        --steps 100000 --run_dir "$name" > "$name.out" 2> "$name.err" &
    pid=$!
    i=0
    while [ $i -lt 600 ] && ! grep -q '"loss"' "$name/metrics.jsonl" 2> /dev/null; do
        sleep 0.1
        i=$((i + 1))
    done
    truncate -s 1024 live/train_0.bin
    set +e
    wait $pid
    rc=$?
    set -e
}
cut_live live-run env
if [ "$rc" -eq 2 ] && [ "$(wc -l < live-run.err)" -eq 1 ] &&
    grep -q "'live/train_0.bin' ends at byte [0-9]*, inside the sequence at token [0-9]* (bytes [0-9]*-[0-9]*; its header promised 100000 tokens" live-run.err; then
    ok "truncated while in use, exit 2: $(cat live-run.err)"
else
    cat live-run.out live-run.err
    fail "a shard truncated while training: exit $rc"
fi
cut_live live-dp2 timeout -k 10 300 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2
# mpirun adds its own lines about the exit; modtrain's are one
if [ "$rc" -eq 2 ] && [ "$(grep -c '^modtrain:' live-dp2.err)" -eq 1 ] &&
    grep -q "^modtrain: data: 'live/train_0.bin' ends at byte [0-9]*, inside the sequence at token" live-dp2.err; then
    ok "truncated while in use under dp 2, exit 2, one line: $(grep '^modtrain:' live-dp2.err)"
else
    cat live-dp2.out live-dp2.err
    fail "a shard truncated while training under dp 2: exit $rc"
fi
finish
