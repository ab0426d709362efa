#!/bin/sh
# Trains jobs/tiny.conf on the fortunes text: the validation loss must fall
# well below the unigram entropy of the text (the model learned context),
# two runs with the same seed must be bitwise identical, `modtrain eval`
# must reproduce the run's last validation loss, and sampling must work.
# threads = 0 follows OMP_NUM_THREADS, else the cores the process may use.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
# MODTRAIN_SKIP_SLOW (the sanitizer pass, after the first pass): no repeat,
# and 60 steps (saves and evaluations every 20) that need only beat the
# first loss, not the unigram entropy: the code paths of the 300
short=
[ $slow = 1 ] || short="--steps 60 --eval_every 20 --ckpt_every 20"
train_tiny() {
    # shellcheck disable=SC2086 # the options' words
    "$MODTRAIN" train --config "$srcdir/jobs/tiny.conf" --train_data data/train_000000.bin \
        --val_data data/val_000000.bin --run_dir "$1" --resume never $short > "$1.log" 2>&1 ||
        { cat "$1.log"; fail "training run $1 failed"; finish; }
}
train_tiny a
[ $slow = 0 ] || train_tiny b
cat a.log

# 1. learning: the bound is the entropy of the byte distribution of the
# training text, which a model that ignores context cannot beat.
unigram=$(unigram_entropy data/train_000000.bin)
val=$(last_json a/metrics.jsonl val_loss)
first=$(grep '"loss"' a/metrics.jsonl | head -n 1 | sed -e 's/.*"loss":\([^,]*\).*/\1/')
echo "first loss $first, unigram entropy $unigram nats, final val_loss $val"
if [ $slow = 0 ]; then
    check_ab "$val" "$first" 'a < b - 0.25' && ok "60 steps: val_loss $val < first loss $first - 0.25" ||
        fail "60 steps: val_loss $val did not fall below the first loss $first - 0.25"
elif awk -v v="$val" -v u="$unigram" 'BEGIN { exit !(v < u - 0.25) }'; then
    ok "val_loss $val < unigram entropy $unigram - 0.25"
else
    fail "val_loss $val did not fall below unigram entropy $unigram - 0.25"
fi
awk -v f="$first" 'BEGIN { exit !(f > 5.3 && f < 5.8) }' && ok "first loss $first ~ ln 256" ||
    fail "first loss $first is not near ln 256 = 5.545"

# 2. determinism: losses, validation losses and final weights bit for bit
curve_lines() { grep -v '"ckpt_' "$1" | sed -e 's/,"tokens_per_s".*//'; }
if [ $slow = 0 ]; then
    :
elif [ "$(curve_lines a/metrics.jsonl)" = "$(curve_lines b/metrics.jsonl)" ]; then
    ok "same seed: identical loss curves"
else
    fail "same seed gave different losses"
fi
if [ $slow = 0 ]; then
    :
elif same_ckpt a/ckpt/step-00000300 b/ckpt/step-00000300; then
    ok "same seed: identical final weights and moments"
else
    fail "same seed gave different weights"
fi
[ "$(ls a/ckpt | grep -c '^step-')" -eq 3 ] && ok "ckpt_keep = 3 checkpoints kept" ||
    fail "expected 3 checkpoints, found: $(ls a/ckpt)"

# 3. eval reproduces the run's last validation loss (the same first 64 sequences)
ev=$("$MODTRAIN" eval --ckpt a/ckpt --data data/val_000000.bin --seqs 64 --micro-batch 8 --json)
echo "eval: $ev"
evl=$(echo "$ev" | sed -e 's/.*"loss":\([^,]*\).*/\1/')
awk -v a="$evl" -v b="$val" 'BEGIN { d = a - b; exit !(d < 1e-5 && d > -1e-5) }' &&
    ok "eval loss $evl = the run's val_loss $val" || fail "eval loss $evl != val_loss $val"

# 4. sampling: the requested length, reproducible by seed
"$MODTRAIN" sample --ckpt a/ckpt --prompt "Q: " --tokens 200 --seed 7 > s1.txt
"$MODTRAIN" sample --ckpt a/ckpt --prompt "Q: " --tokens 200 --seed 7 > s2.txt
"$MODTRAIN" sample --ckpt a/ckpt --prompt "Q: " --tokens 200 --seed 8 > s3.txt
cat s1.txt
[ "$(wc -c < s1.txt)" -eq 204 ] && ok "sample: prompt + 200 tokens + newline" ||
    fail "sample printed $(wc -c < s1.txt) bytes, expected 204"
cmp -s s1.txt s2.txt && ok "sample: same seed, same text" || fail "sample: same seed differs"
cmp -s s1.txt s3.txt && fail "sample: different seeds gave the same text" || ok "sample: seed matters"
# 5. threads = 0: OMP_NUM_THREADS when it is a number (its first level when
# nested), else the cores over the ranks, no more than the process is bound to
threads_of() { # ENV...: the threads train reports with that environment
    env "$@" "$MODTRAIN" train --config "$srcdir/jobs/tiny.conf" --train_data data/train_000000.bin \
        --val_data data/val_000000.bin --run_dir t --resume never --steps 1 --eval_every 0 2>&1 |
        sed -n 's/.* | \([0-9]*\) threads* a rank | .*/\1/p'
}
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) # the cores this process may use
for case in "OMP_NUM_THREADS=3:3" "OMP_NUM_THREADS=5,2:5" "OMP_NUM_THREADS=x:$cores" \
    "-u OMP_NUM_THREADS:$cores" "-u OMP_NUM_THREADS taskset -c 0:1"; do
    # shellcheck disable=SC2086 # the environment's words
    got=$(threads_of ${case%:*})
    [ "$got" = "${case##*:}" ] && ok "threads with ${case%:*}: $got" ||
        fail "threads with ${case%:*}: $got, expected ${case##*:}"
done
finish
