#!/bin/sh
# Small truths: the banner counts the whole model's parameters under pp (as
# under one rank, and as plan --flops counts them); plan refuses to plan a
# model nobody gave and says which cluster it assumes without --cluster; a
# bad number names its option and range; train --help shows the values every
# enumerated key allows (those its own errors list), and plan --help every
# key of a cluster file (those a cluster file's error lists).
. "$(dirname "$0")/lib.sh"
cd "$TMP"
MPIRUN="mpirun --oversubscribe"

printf 'the quick brown fox jumps over the lazy dog %s\n%%\n' $(seq 1 300) > text.txt
"$MODTRAIN" prep --out data --doc_sep % text.txt > /dev/null
M="--n_layer 4 --n_head 2 --d_model 32 --seq_len 16 --vocab_size 256 --route_every 2 --capacity 0.5"
K="--batch_size 4 --steps 1 --eval_every 0 --ckpt_every 0 --train_data data/train_000000.bin --val_data data/val_000000.bin"

# (a) the banner's count: 1 rank, pp 2, pp 4 and plan --flops agree
# shellcheck disable=SC2086
banner() {
    $MPIRUN -np "$1" "$MODTRAIN" train $M $K --pp "$1" --run_dir "r$1" > "r$1.log" 2>&1 ||
        fail "pp $1: $(tail -n 2 "r$1.log")"
    grep -m 1 '^modtrain [0-9]' "r$1.log" # the banner (a thread warning may come first)
}
b1=$(banner 1) b2=$(banner 2) b4=$(banner 4)
count() { echo "$1" | sed -n 's/^modtrain [^|]*| \([0-9.]*\)M parameters.*/\1/p'; }
# shellcheck disable=SC2086
flops=$("$MODTRAIN" plan --flops $M | sed -n 's/.*"params":\([0-9]*\).*/\1/p')
want=$(awk -v p="$flops" 'BEGIN { printf "%.2f", p / 1e6 }')
if [ -n "$(count "$b1")" ] && [ "$(count "$b1")" = "$want" ] && [ "$(count "$b2")" = "$want" ] &&
    [ "$(count "$b4")" = "$want" ]; then
    ok "banner: ${want}M parameters under 1 rank, pp 2 and pp 4 (plan --flops: $flops)"
else
    fail "banner: '$b1' / '$b2' / '$b4', plan --flops $flops"
fi
stage=$(echo "$b2" | sed -n 's/.*M parameters (\([0-9.]*\)M on stage 0).*/\1/p')
check_ab "${stage:-0}" "$want" 'a > 0 && a < b' && ok "pp 2: stage 0 holds ${stage}M of ${want}M" ||
    fail "pp 2: no stage count below the whole in '$b2'"


# (b) plan without a model is refused, without a cluster says what it assumes
expect_exit 2 "plan: no model to plan: give --config FILE" "$MODTRAIN" plan --cluster "$srcdir/jobs/cluster_16x64.conf"
expect_exit 2 "plan: no model to plan" "$MODTRAIN" plan --batch_size 64
expect_exit 0 "plan: no --cluster FILE: assuming 1 node of 2 cores, 24 GiB" "$MODTRAIN" plan --config "$srcdir/jobs/tiny.conf"
grep -q "1 node x 2 cores, 24 GiB" out.txt && ok "and plans on that cluster" || fail "plan: $(head -n 1 out.txt)"
printf 'nodes = 1\ncores_per_node = 4\n' > one.cluster
"$MODTRAIN" plan --config "$srcdir/jobs/tiny.conf" --cluster one.cluster > out.txt 2> err.txt &&
    [ ! -s err.txt ] && grep -q "1 node x 4 cores" out.txt && ok "with --cluster, no note" ||
    fail "with --cluster: $(cat err.txt) $(head -n 1 out.txt)"

# (d) a bad number names its option and range
expect_exit 2 "sample: --temperature = -1 is out of range (expected a number in \[0, " "$MODTRAIN" sample --ckpt x --temperature -1
expect_exit 2 "sample: --tokens = -5 is out of range (expected an integer in \[0, " "$MODTRAIN" sample --ckpt x --tokens -5
expect_exit 2 "sample: --threads = 5000 is out of range (expected an integer in \[0, 4096\])" "$MODTRAIN" sample --ckpt x --threads 5000
expect_exit 2 "sample: --pp = 0 is out of range" "$MODTRAIN" sample --ckpt x --pp 0
expect_exit 2 "eval: --threads = -1 is out of range" "$MODTRAIN" eval --ckpt x --data y --threads -1
expect_exit 2 "eval: --aux_weight = -1 is out of range (expected a number >= 0)" "$MODTRAIN" eval --ckpt x --data y --aux_weight -1
expect_exit 2 "eval: --seqs = -1 is out of range" "$MODTRAIN" eval --ckpt x --data y --seqs -1
expect_exit 2 "data: --count = -1 is out of range" "$MODTRAIN" data --data y --count -1
expect_exit 2 "data: --batch_size = 0 is out of range" "$MODTRAIN" data --data y --batch_size 0
expect_exit 2 "plan: --top = '0' is not a count in \[1, " "$MODTRAIN" plan --config "$srcdir/jobs/tiny.conf" --top 0
expect_exit 2 "ckpt diff: --tol = -1 is out of range (expected a number >= 0)" "$MODTRAIN" ckpt diff --a x --b y --tol -1

# (e) train --help: every key an error calls an enumeration shows its values
"$MODTRAIN" train --help > help.txt
keys=$(sed -n 's/^  --\([a-z_0-9]*\) .*/\1/p' help.txt)
[ "$(echo $keys | wc -w)" -ge 40 ] && ok "train --help lists $(echo $keys | wc -w) keys" || fail "train --help: '$keys'"
n=0
# MODTRAIN_SKIP_SLOW (the sanitizer pass, after the first pass): the first
# ten keys (each try starts a process; the config fuzzer parses every key)
[ $slow = 1 ] || keys=$(echo $keys | cut -d' ' -f1-10)
for k in $keys; do
    set +e
    "$MODTRAIN" train --run_dir nowhere "--$k" not_a_value 2> err.txt > /dev/null
    set -e
    choices=$(sed -n "s/.* $k = 'not_a_value' is not one of \([a-z0-9_/]*\)$/\1/p" err.txt)
    [ -n "$choices" ] || continue
    n=$((n + 1))
    grep -q -e "^  --$k $(echo "$choices" | tr / '|')\( \|\$\)" help.txt &&
        ok "train --help: --$k $(echo "$choices" | tr / '|')" ||
        fail "train --help does not show --$k's values $choices: $(grep -e "--$k " help.txt)"
done
[ "$n" -ge 6 ] || [ $slow = 0 ] && ok "$n enumerated keys" || fail "only $n enumerated keys found"
for k in steps:N train_data:SPEC lr:X resume:auto ckpt_dir:DIR; do
    grep -q "^  --${k%%:*} ${k#*:}" help.txt && ok "train --help: --${k%%:*} ${k#*:}" ||
        fail "train --help has no '--${k%%:*} ${k#*:}'"
done
grep -q "dp is not a key: it is what the world leaves after tp x pp" help.txt &&
    ok "train --help says what dp is" || fail "train --help does not explain dp"

# plan --help: every key a cluster file may hold (as its error lists them)
printf 'no_such_key = 1\n' > bad.cluster
"$MODTRAIN" plan --config "$srcdir/jobs/tiny.conf" --cluster bad.cluster 2> err.txt > /dev/null || true
ckeys=$(sed -n 's/.*unknown key .no_such_key. (expected one of \(.*\))$/\1/p' err.txt | tr -d ,)
"$MODTRAIN" plan --help > phelp.txt
[ "$(echo $ckeys | wc -w)" -ge 10 ] || fail "the cluster error lists '$ckeys': $(cat err.txt)"
missing=""
for k in $ckeys; do grep -q "^  $k  *= " phelp.txt || missing="$missing $k"; done
[ -z "$missing" ] && ok "plan --help names the $(echo $ckeys | wc -w) cluster keys" ||
    fail "plan --help lacks the cluster keys$missing"
finish
