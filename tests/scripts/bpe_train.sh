#!/bin/sh
# GPT-2 BPE end to end: the fortunes, tokenised by `prep --tokenizer gpt2`,
# train a model whose loss falls; its checkpoint records the tokenizer and
# the vocabulary's hash (the shard's, which equals `tokenize --hash`); eval
# runs, and warns on a shard of another vocabulary; `sample --vocab` prints
# text whose ids (--ids) decode through the reference decoder (js-tiktoken's
# token bytes) to exactly the bytes it printed. Refused, each in one line:
# sampling without the vocabulary, with a missing one or with another one
# (a hash that differs), --vocab for a byte model, training on a shard
# another tokenizer wrote than the config or the validation shard names.
# A checkpoint from before the tokenizer was recorded (tests/fixtures)
# samples as a byte model. Skips like bpe_reference.sh without node/npm.
# MODTRAIN_SKIP_SLOW (the sanitizer pass): 20 steps at a higher learning
# rate rather than 60 (the loss still falls 2 nats) and eval on 16 rather
# than 64 sequences; every command and refusal stays.
. "$(dirname "$0")/lib.sh"
top=$srcdir
. "$srcdir/tests/scripts/gpt2_ref.sh"
if ! why=$(gpt2_ref_setup 2>&1) || [ ! -d "${FORTUNES_DIR:-/usr/share/games/fortunes}" ]; then
    why=${why:-the fortunes package is not installed (apt-get install fortunes)}
    [ "${MODTRAIN_REQUIRE_REFERENCE:-0}" = 1 ] && { echo "FAIL: $why" >&2; exit 1; }
    echo "SKIP: $why"
    exit 77
fi
cd "$TMP"
files=$(find "${FORTUNES_DIR:-/usr/share/games/fortunes}" -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort)
# shellcheck disable=SC2086 # the file list
"$MODTRAIN" prep --out data --tokenizer gpt2 --vocab "$vocab" --doc-sep % $files > prep.log ||
    { cat prep.log; fail "prep"; finish; }
hash=$("$MODTRAIN" tokenize --vocab "$vocab" --hash | sed -n 's/^tokenizer_hash //p')
head=$("$PYTHON" -c '
import struct, sys
h = struct.unpack("<7i", open(sys.argv[1], "rb").read(28))
print(h[3], h[4], "%016x" % ((h[6] & 0xffffffff) << 32 | (h[5] & 0xffffffff)))' data/train_000000.bin)
[ "$head" = "50257 2 $hash" ] && ok "the shard's header: vocabulary 50257, tokenizer gpt2, hash $hash" ||
    fail "the shard's header says '$head', expected '50257 2 $hash'"

steps=60 lr=3e-3 seqs=64
[ $slow = 1 ] || steps=20 lr=1e-2 seqs=16
model="--n_layer 2 --n_head 2 --d_model 32 --seq_len 32 --batch_size 8 --lr $lr --warmup_steps 5"
# shellcheck disable=SC2086 # the options
"$MODTRAIN" train --config "$srcdir/jobs/text.conf" --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --run_dir run $model --steps $steps --eval_every $steps --eval_seqs 32 --log_every 1 \
    --ckpt_every 0 > train.log 2>&1 ||
    { cat train.log; fail "training on gpt2 tokens"; finish; }
first=$(grep '"loss"' run/metrics.jsonl | head -n 1 | sed 's/.*"loss":\([^,]*\).*/\1/')
val=$(last_json run/metrics.jsonl val_loss)
check_ab "$first" 10.3 'a > b' && check_ab "$val" "$first" 'a < b - 2' &&
    ok "loss falls on gpt2 tokens: first $first (ln 50257 = 10.82), val_loss $val" ||
    fail "loss did not fall: first $first, val_loss $val"
ck=$(step_dir run $steps)
grep -q "^kv config.tokenizer gpt2$" "$ck/index" && grep -q "^kv config.tokenizer_hash $hash$" "$ck/index" &&
    ok "the checkpoint records tokenizer gpt2 and hash $hash" || fail "index: $(grep -a tokenizer "$ck/index")"

"$MODTRAIN" eval --ckpt "$ck" --data data/val_000000.bin --seqs $seqs > eval.out 2> eval.err &&
    grep -q "^eval: loss" eval.out && [ ! -s eval.err ] && ok "eval: $(head -n 1 eval.out)" ||
    fail "eval on the gpt2 shard: $(cat eval.out eval.err)"
printf 'plain bytes, a shard of the byte tokenizer\n%%\n%.0s' $(seq 1 300) > bytes.txt
"$MODTRAIN" prep --out bytes --doc-sep % bytes.txt > /dev/null
"$MODTRAIN" eval --ckpt "$ck" --data bytes/val_000000.bin --seqs 16 > /dev/null 2> warn.err &&
    [ "$(wc -l < warn.err)" -eq 2 ] && grep -q "256-token vocabulary, but the model has vocab_size = 50257" warn.err &&
    grep -q "tokenized by the byte tokenizer, but the model was trained on gpt2 tokens" warn.err && ok "eval warns: $(head -n 1 warn.err)" ||
    fail "eval on a byte shard: $(cat warn.err)"

prompt="Q: What is the meaning of life?"
"$MODTRAIN" sample --ckpt "$ck" --vocab "$vocab" --prompt "$prompt" --tokens 40 --temperature 0.8 \
    --ids ids.txt > sample.out || fail "sample --vocab"
cat > decode.js <<'JS'
// argv: IDS OUT: the bytes of the ids (one a line), by js-tiktoken's table
const { getEncoding } = require("js-tiktoken");
const fs = require("fs");
const enc = getEncoding("gpt2");
const ids = fs.readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l !== "");
fs.writeFileSync(process.argv[3], Buffer.concat(ids.map((i) => Buffer.from(enc.textMap.get(Number(i))))));
JS
gpt2_node decode.js ids.txt ref.bin
{ printf '%s' "$prompt"; cat ref.bin; printf '\n'; } > expect.out
[ "$(wc -l < ids.txt)" -eq 40 ] && cmp -s sample.out expect.out &&
    ok "40 sampled ids decode through js-tiktoken to the bytes sample printed: $(tr '\n' ' ' < sample.out | cut -c 1-100)" ||
    fail "sample's text and the reference decoding of its ids differ: $(cmp sample.out expect.out)"

one_line() { # WHAT EXPECTED-PART COMMAND...: fails with exit 2 and one line naming it
    what=$1 part=$2
    shift 2
    if out=$("$@" 2>&1 > /dev/null); then
        fail "$what: accepted"
    elif [ $? -eq 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && printf '%s' "$out" | grep -q "$part"; then
        ok "$what: $out"
    else
        fail "$what: '$out'"
    fi
}
one_line "sample without --vocab" "pass --vocab DIR" "$MODTRAIN" sample --ckpt "$ck" --tokens 4
one_line "sample with a missing vocabulary" "cannot open 'nowhere': No such file or directory" \
    "$MODTRAIN" sample --ckpt "$ck" --vocab nowhere --tokens 4
mkdir other
cp "$vocab/encoder.json" other/
sed '$d' "$vocab/vocab.bpe" > other/vocab.bpe # one merge fewer: another vocabulary
one_line "sample with another vocabulary" "hash differs" "$MODTRAIN" sample --ckpt "$ck" --vocab other --tokens 4
# shellcheck disable=SC2086
one_line "train: tokenizer = byte on a gpt2 shard" "tokenizer = byte, but 'data/train_000000.bin' was written by 'modtrain prep --tokenizer gpt2'" \
    "$MODTRAIN" train --train_data data/train_000000.bin --val_data data/val_000000.bin --run_dir r2 $model --steps 1 --tokenizer byte
# shellcheck disable=SC2086
one_line "train: validation shard of another tokenizer" "prep both with the same one" \
    "$MODTRAIN" train --train_data data/train_000000.bin --val_data bytes/val_000000.bin --run_dir r3 $model --steps 1
# shellcheck disable=SC2086
one_line "train: tokenizer_hash of another vocabulary" "tokenizer_hash = 0123456789abcdef, but" \
    "$MODTRAIN" train --train_data data/train_000000.bin --val_data data/val_000000.bin --run_dir r4 $model --steps 1 \
    --tokenizer_hash 0123456789abcdef

v1=$srcdir/tests/fixtures/ckpt-v1/step-00000004
"$MODTRAIN" sample --ckpt "$v1" --prompt "the quick" --tokens 8 > v1.out && grep -q "^the quick" v1.out &&
    ok "a checkpoint without a tokenizer key samples as a byte model: $(cat -v v1.out)" || fail "sample from the v1 fixture"
one_line "--vocab for a byte model" "trained on byte tokens" "$MODTRAIN" sample --ckpt "$v1" --vocab "$vocab"
finish
