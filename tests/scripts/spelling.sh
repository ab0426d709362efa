#!/bin/sh
# One spelling: every command and script takes an option with underscores
# (--micro_batch, the config keys' spelling), with dashes (--micro-batch) and
# as --key=value, and does the same for each: the same checkpoint bit for
# bit, the same sample, loss, shards, plan and vocabulary files. An error
# about an option echoes it as the user typed it.
. "$(dirname "$0")/lib.sh"
cd "$TMP"

# same_output WHAT A B: files (or folders) A and B are identical
same_output() {
    if diff -r "$2" "$3" > diff.txt 2>&1; then ok "$1"; else fail "$1: $(head -c 400 diff.txt)"; fi
}
# says WHAT PATTERN CMD...: CMD exits 2 and its one stderr line matches PATTERN
says() {
    what=$1 pattern=$2
    shift 2
    set +e
    "$@" > /dev/null 2> err.txt
    rc=$?
    set -e
    if [ "$rc" -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] && grep -q -e "$pattern" err.txt; then
        ok "$what: $(cat err.txt)"
    else
        fail "$what: exit $rc, '$(cat err.txt)', expected /$pattern/"
    fi
}

# prep: --doc-sep, --val-fraction, --shard-tokens in three spellings
printf 'the quick brown fox jumps over the lazy dog %s\n%%\n' $(seq 1 300) > text.txt
"$MODTRAIN" prep --out p1 --doc_sep % --val_fraction 0.1 --shard_tokens 5000 text.txt > /dev/null
"$MODTRAIN" prep --out p2 --doc-sep % --val-fraction 0.1 --shard-tokens 5000 text.txt > /dev/null
"$MODTRAIN" prep --out=p3 --doc-sep=% --val_fraction=0.1 --shard-tokens=5000 text.txt > /dev/null
[ "$(ls p1 | wc -l)" -gt 2 ] && ok "prep wrote $(ls p1 | wc -l) shards" || fail "prep wrote $(ls p1)"
same_output "prep: --doc_sep / --doc-sep give the same shards" p1 p2
same_output "prep: --key=value gives the same shards" p1 p3
says "prep echoes --val-fraction" "prep: --val-fraction (val_fraction) = '2' is not a number" \
    "$MODTRAIN" prep --out p4 --val-fraction 2 text.txt
says "prep echoes --shard_tokens=" "prep: --shard_tokens = '1' is not an integer" \
    "$MODTRAIN" prep --out p4 --shard_tokens=1 text.txt
says "prep echoes an unknown --doc-seq" "prep: unknown option '--doc-seq'" \
    "$MODTRAIN" prep --out p4 --doc-seq % text.txt

# data: --seq-len, --batch-size
"$MODTRAIN" data --data "p1/train_*.bin" --seq_len 16 --batch_size 4 --steps 3 > d1.txt
"$MODTRAIN" data --data="p1/train_*.bin" --seq-len 16 --batch-size=4 --steps 3 > d2.txt
"$MODTRAIN" data --data "p1/train_*.bin" --seq_len 16 --batch_size 8 --steps 3 > d3.txt
same_output "data: --seq-len / --batch-size= read as --seq_len / --batch_size" d1.txt d2.txt
cmp -s d1.txt d3.txt && fail "data: --batch_size changes nothing" || ok "data: --batch_size 8 differs from 4"
says "data echoes --seq-len" "data: --seq-len (seq_len) = 0 is out of range" \
    "$MODTRAIN" data --data "p1/train_*.bin" --seq-len 0

# train: --micro-batch, --eval-every, --route-every: the same checkpoint bit for bit
T="--n_layer 2 --n_head 2 --d_model 32 --seq_len 16 --batch_size 8 --steps 3 --vocab_size 256
   --log_every 1 --capacity 0.5"
# shellcheck disable=SC2086
train_p1() { "$MODTRAIN" train $T --train_data "p1/train_*.bin" --val_data "p1/val_*.bin" "$@"; }
train_p1 --run_dir r1 --micro_batch 4 --eval_every 2 --route_every 2 > r1.log 2>&1 ||
    fail "train: $(tail -n 3 r1.log)"
train_p1 --run_dir r2 --micro-batch 4 --eval-every=2 --route-every 2 > r2.log 2>&1 ||
    fail "train: $(tail -n 3 r2.log)"
grep -q "micro-batch 4" r2.log && ok "train: --micro-batch 4 taken" || fail "train: $(head -n 1 r2.log)"
"$MODTRAIN" ckpt diff --a r1/ckpt --b r2/ckpt > diff.log &&
    ok "train: --micro-batch, --eval-every=, --route-every: the same checkpoint bit for bit" ||
    fail "train: the spellings differ: $(tail -n 2 diff.log)"
v1=$(grep -c '"val_loss"' r1/metrics.jsonl) || true
[ "${v1:-0}" -ge 2 ] && [ "$(grep -c '"val_loss"' r2/metrics.jsonl)" = "$v1" ] &&
    ok "train: --eval-every=2 evaluates as often as --eval_every 2" || fail "train: evaluations differ"
says "train echoes --micro-batch" "^modtrain: --micro-batch: micro_batch = 'x' is not an integer" \
    train_p1 --run_dir r4 --micro-batch x
says "train echoes --eval-evry" "^modtrain: --eval-evry: unknown key 'eval_evry' (did you mean 'eval_every'?)" \
    train_p1 --run_dir r4 --eval-evry 5
says "train's --dp says what dp is" "--dp: dp is not a key: it is what the world leaves after tp x pp" \
    train_p1 --run_dir r4 --dp 2
[ ! -e r4 ] && ok "no run directory from the failed runs" || fail "r4 was created"

# eval: --micro-batch, --routing-seqs
"$MODTRAIN" eval --ckpt r1/ckpt --data "p1/val_*.bin" --micro_batch 2 --json > e1.txt
"$MODTRAIN" eval --ckpt=r1/ckpt --data "p1/val_*.bin" --micro-batch=2 --json > e2.txt
same_output "eval: --micro-batch= / --micro_batch" e1.txt e2.txt
"$MODTRAIN" eval --ckpt r1/ckpt --data "p1/val_*.bin" --routing ro1.tsv --routing_seqs 2 > /dev/null
"$MODTRAIN" eval --ckpt r1/ckpt --data "p1/val_*.bin" --routing ro2.tsv --routing-seqs 2 > /dev/null
"$MODTRAIN" eval --ckpt r1/ckpt --data "p1/val_*.bin" --routing ro3.tsv --routing-seqs 1 > /dev/null
same_output "eval: --routing-seqs / --routing_seqs" ro1.tsv ro2.tsv
cmp -s ro1.tsv ro3.tsv && fail "eval: --routing-seqs changes nothing" || ok "eval: --routing-seqs 1 differs from 2"
says "eval echoes --micro-batch" "eval: --micro-batch (micro_batch) = 0 is out of range" \
    "$MODTRAIN" eval --ckpt r1/ckpt --data "p1/val_*.bin" --micro-batch 0
says "eval echoes an unknown --micro-bach" "eval: unknown option '--micro-bach' (did you mean '--micro_batch'?)" \
    "$MODTRAIN" eval --ckpt r1/ckpt --data "p1/val_*.bin" --micro-bach 2

# sample: --top-k, --top_k, --top_k=
"$MODTRAIN" sample --ckpt r1/ckpt --tokens 40 --top_k 3 --seed 7 > s1.txt
"$MODTRAIN" sample --ckpt r1/ckpt --tokens 40 --top-k 3 --seed 7 > s2.txt
"$MODTRAIN" sample --ckpt r1/ckpt --tokens=40 --top_k=3 --seed=7 > s3.txt
"$MODTRAIN" sample --ckpt r1/ckpt --tokens 40 --top_k 3 --seed 8 > s4.txt
same_output "sample: --top-k / --top_k" s1.txt s2.txt
same_output "sample: --key=value" s1.txt s3.txt
cmp -s s1.txt s4.txt && fail "sample: --seed changes nothing" || ok "sample: another seed, another text"
says "sample echoes --top-k" "sample: --top-k (top_k) = -1 is out of range (expected an integer in \[0, " \
    "$MODTRAIN" sample --ckpt r1/ckpt --top-k -1

# plan: config keys and its own options, both spellings
"$MODTRAIN" plan --config "$srcdir/jobs/tiny.conf" --micro_batch 4 --layout 1,1,1 --top 3 > pl1.txt 2>&1
"$MODTRAIN" plan --config="$srcdir/jobs/tiny.conf" --micro-batch=4 --layout=1,1,1 --top=3 > pl2.txt 2>&1
"$MODTRAIN" plan --config "$srcdir/jobs/tiny.conf" --micro_batch 2 --layout 1,1,1 --top 3 > pl3.txt 2>&1
same_output "plan: --micro-batch=, --layout=, --top=" pl1.txt pl2.txt
cmp -s pl1.txt pl3.txt && fail "plan: --micro_batch changes nothing" || ok "plan: micro_batch 2 differs from 4"
says "plan echoes --Layout" "plan: --Layout (layout) '1,2' is not TP,PP,RANKS_PER_NODE" \
    "$MODTRAIN" plan --config "$srcdir/jobs/tiny.conf" --Layout 1,2

# tokenize and ckpt
byte_vocab voc
printf 'hello there' > hi.txt
"$MODTRAIN" tokenize --vocab voc hi.txt > t1.txt
"$MODTRAIN" tokenize --vocab=voc hi.txt > t2.txt
same_output "tokenize: --vocab=" t1.txt t2.txt
"$MODTRAIN" ckpt import --in nowhere.st --ckpt c1 --n-head 2 2> i1.txt || true
"$MODTRAIN" ckpt import --in nowhere.st --ckpt c1 --n_head=2 2> i2.txt || true
same_output "ckpt import: --n-head / --n_head=" i1.txt i2.txt
says "ckpt import echoes --n-head" "ckpt import: --n-head (n_head) = 0 is out of range" \
    "$MODTRAIN" ckpt import --in nowhere.st --ckpt c1 --n-head 0

# scripts: isoflop's and routing_plot's options, get_gpt2_vocab's --from=
says "isoflop takes --head-dim" "size '64x2': d_model 64 is not a multiple of --head-dim 48" \
    bash "$srcdir/jobs/isoflop.sh" --sizes 64x2 --head-dim 48
says "isoflop takes --head_dim=" "size '64x2': d_model 64 is not a multiple of --head_dim 48" \
    bash "$srcdir/jobs/isoflop.sh" --sizes 64x2 --head_dim=48
says "isoflop echoes --min-steps" "isoflop: --min-steps = 'x' is not a whole number" \
    bash "$srcdir/jobs/isoflop.sh" --min-steps x
says "isoflop echoes --eval-seqs=" "isoflop: --eval-seqs = '0' is not a whole number" \
    bash "$srcdir/jobs/isoflop.sh" --eval-seqs=0
if command -v gnuplot > /dev/null; then
    bash "$srcdir/jobs/routing_plot.sh" ro1.tsv g1 --min_count 2 --positions 8 > /dev/null 2>&1 ||
        fail "routing_plot: $(bash "$srcdir/jobs/routing_plot.sh" ro1.tsv g1 --min_count 2 2>&1 | tail -n 2)"
    bash "$srcdir/jobs/routing_plot.sh" ro1.tsv g2 --min-count 2 --positions=8 > /dev/null 2>&1 || true
    bash "$srcdir/jobs/routing_plot.sh" ro1.tsv g3 --min_count 1 --positions 8 > /dev/null 2>&1 || true
    same_output "routing_plot: --min-count / --min_count, --positions=" g1.txt g2.txt
    cmp -s g1.txt g3.txt && fail "routing_plot: --min_count changes nothing" || ok "routing_plot: --min_count 1 differs from 2"
fi
says "routing_plot echoes --min-count" "routing_plot: --min-count = 'x' is not a whole number" \
    bash "$srcdir/jobs/routing_plot.sh" ro1.tsv g4 --min-count x
sh "$srcdir/jobs/get_gpt2_vocab.sh" v1 --from voc > /dev/null
sh "$srcdir/jobs/get_gpt2_vocab.sh" v2 --from=voc > /dev/null
same_output "get_gpt2_vocab: --from=" v1 v2
finish
