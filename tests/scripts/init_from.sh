#!/bin/sh
# init_from: a new run from another run's weights (Megatron's --finetune).
# A tiny model trains on the fortunes; runs from its checkpoint, its
# ckpt_dir or its safetensors export, on another dataset and under other
# layouts, start at step 0 with the schedule's first lr; their first loss
# is the source's loss on that data (modtrain eval), not a fresh init's;
# their moments are fresh (a checkpoint source, which has moments, and a
# safetensors one, which has none, give the same bits after a step); the
# source's own ckpt_dir and another model shape are one-line refusals; a
# requeued run resumes its own checkpoints and says init_from is ignored;
# a resume with steps at or below its step, or another lr, says in one
# line what it does.
. "$(dirname "$0")/lib.sh"
prep_fortunes
SHARDS="$PYTHON $srcdir/tests/scripts/make_shards.py"
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --val_data data/val_000000.bin --log_every 1 --ckpt_every 0 \
    --eval_every 0 --threads 1"
# shellcheck disable=SC2086 # the options
"$MODTRAIN" train $common --train_data data/train_000000.bin --steps 12 --run_dir src > src.log 2>&1 ||
    { cat src.log; fail "training the source"; finish; }
"$MODTRAIN" ckpt export --ckpt src/ckpt --out src.safetensors > /dev/null ||
    fail "exporting the source"
# another dataset of exactly one batch (16 sequences of 64): the first
# step's loss is the mean over all of it, whatever the order
$SHARDS text ft.bin 1025 --skip 300000
src_loss=$("$MODTRAIN" eval --ckpt src/ckpt --data ft.bin --seqs 0 --json | sed -e 's/.*"loss":\([^,]*\).*/\1/')
first() { grep '"loss"' "$1/metrics.jsonl" | head -n 1 | sed -e "s/.*\"$2\":\([^,}]*\).*/\1/"; }

ft() { # NAME NP INIT_FROM [--key value ...]
    name=$1 np=$2 from=$3
    shift 3
    # shellcheck disable=SC2086 # the options
    timeout -k 10 300 $MPIRUN -np "$np" "$MODTRAIN" train $common --train_data ft.bin --steps 1 \
        --init_from "$from" --run_dir "$name" "$@" > "$name.log" 2>&1 || { cat "$name.log"; fail "$name: train"; }
}
ft a 1 src/ckpt
ft b 1 src.safetensors
ft c 2 src/ckpt/step-00000012 --tp 2
ft d 2 src.safetensors --pp 2
ft e 2 src/ckpt --micro_batch 4 # dp 2
grep -q "^init_from: the weights of src/ckpt/step-00000012 (step 12 of its run) start a new run at step 0" a.log &&
    ok "the notice: $(grep '^init_from' a.log)" || fail "no init_from notice in a.log"
fresh=$(grep '"loss"' src/metrics.jsonl | head -n 1 | sed -e 's/.*"loss":\([^,]*\).*/\1/')
for r in a b c d e; do
    l=$(first $r loss)
    [ "$(first $r step)" = 1 ] && [ "$(first $r samples)" = 16 ] && [ -d $r/ckpt/step-00000001 ] &&
        [ "$(first $r lr)" = "$(first src lr)" ] && check_ab "$l" "$src_loss" '(a - b) < 1e-4 && (b - a) < 1e-4' &&
        ok "$r: step 1, sample 16, lr $(first $r lr) as the source's first; loss $l = the source's eval $src_loss (a fresh init's: $fresh)" ||
        fail "$r: step $(first $r step), samples $(first $r samples), lr $(first $r lr), loss $l; the source's eval $src_loss"
done
check_ab "$fresh" "$src_loss" 'a - b > 0.3' || fail "the source's eval $src_loss is not below a fresh init's $fresh"
"$MODTRAIN" ckpt diff --a a/ckpt --b b/ckpt --tol 0 > diff.out 2>&1 &&
    ok "fresh moments: from a checkpoint (with moments) = from safetensors (none): $(tail -n 1 diff.out)" ||
    fail "a checkpoint source and a safetensors one differ after a step: $(tail -n 1 diff.out)"
for r in c d e; do
    "$MODTRAIN" ckpt diff --a a/ckpt --b $r/ckpt --tol 1e-4 > diff.$r 2>&1 && ok "$r's layout: $(tail -n 1 diff.$r)" ||
        fail "$r differs from one rank: $(tail -n 1 diff.$r)"
done

# refusals: one line, exit 2, nothing trained
refused_init() { # NAME PATTERN [--key value ...]
    name=$1 pat=$2
    shift 2
    rc=0
    # shellcheck disable=SC2086 # the options
    "$MODTRAIN" train $common --train_data ft.bin --steps 1 "$@" > "$name.out" 2> "$name.err" || rc=$?
    [ "$rc" = 2 ] && [ "$(wc -l < "$name.err")" = 1 ] && grep -q -- "$pat" "$name.err" && ! grep -q '^step' "$name.out" &&
        ok "$name: $(cat "$name.err")" || fail "$name: exit $rc, $(cat "$name.err")"
}
refused_init same "is a checkpoint of this run's own ckpt_dir" --run_dir src --init_from src/ckpt/step-00000012
# spelt with a trailing /. or through a link, it is the same folder
refused_init same_dot "is a checkpoint of this run's own ckpt_dir" --run_dir src --resume never \
    --init_from src/ckpt/step-00000012/.
ln -s src/ckpt/step-00000012 alias
refused_init same_link "is a checkpoint of this run's own ckpt_dir" --run_dir src --resume never \
    --init_from alias
refused_init shape "has d_model = 64 but this run has d_model = 32" --run_dir g --init_from src/ckpt --d_model 32
refused_init st_shape "n_layer = 2 but this run has n_layer = 3" --run_dir g --init_from src.safetensors --n_layer 3
refused_init missing "init_from: ckpt: 'nowhere'" --run_dir g --init_from nowhere

# a requeued fine-tune resumes its own run
ft a 1 src/ckpt --steps 3
grep -q "init_from: ckpt_dir 'a/ckpt' holds this run's own checkpoints: resumed at step 1; init_from 'src/ckpt' is ignored" a.log &&
    [ "$(grep -c '"loss"' a/metrics.jsonl)" = 3 ] && ok "requeued: $(grep '^init_from' a.log)" ||
    { cat a.log; fail "the requeued fine-tune did not resume its own run"; }

# resumes that change the plan say so in one line
# shellcheck disable=SC2086 # the options
"$MODTRAIN" train $common --train_data data/train_000000.bin --steps 5 --run_dir src > below.log 2>&1 &&
    [ "$(grep -c '^resume: steps' below.log)" = 1 ] &&
    grep -q "^resume: steps = 5 is at or below the checkpoint's step 12: nothing to train or save, exiting 0" below.log &&
    ok "$(grep '^resume: steps' below.log)" || { cat below.log; fail "steps below the checkpoint's"; }
# shellcheck disable=SC2086 # the options
"$MODTRAIN" train $common --train_data data/train_000000.bin --steps 13 --lr 1e-3 --run_dir src > lr.log 2>&1 &&
    [ "$(grep -c '^resume: lr' lr.log)" = 1 ] &&
    grep -q "^resume: lr 0.001 differs from the checkpoint's 0.003, steps 13 differs from the checkpoint's 12: the new values apply from step 13" lr.log &&
    ok "$(grep '^resume: lr' lr.log)" || { cat lr.log; fail "a changed lr on resume"; }
finish
