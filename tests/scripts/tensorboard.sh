#!/bin/sh
# TensorBoard event files (tensorboard = 1), read by an independent reader,
# tests/tools/tb_events.py (python3-protobuf on a descriptor of
# event.proto built there, python3-crc32c): every record's two CRCs, every
# Event's fields, a file per launch beginning with file_version and a
# SessionLog START at its first step, and, after TensorBoard's purge, the
# same scalars at the same steps as metrics.jsonl. A Mixture-of-Depths-
# and-Experts model (routing, a predictor, experts and a no-op one), so
# every kind of scalar is there, over three launches: 6 steps, resumed to
# 16 and SIGKILLed in the save of step 12, then requeued as it was.
. "$(dirname "$0")/lib.sh"
"$PYTHON" -c "import crc32c, google.protobuf" 2> /dev/null || {
    echo "SKIP: python3-protobuf and python3-crc32c are not installed (jobs/deps.sh installs them)"
    exit 77
}
prep_fortunes
cd "$TMP"
reader="$PYTHON $srcdir/tests/tools/tb_events.py"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin
    --val_data data/val_000000.bin --seq_len 32 --eval_every 4 --eval_seqs 16 --ckpt_every 4
    --log_every 3 --route_every 2 --causal_router predictor --n_expert 2 --n_noop_expert 1
    --tensorboard"

train_ok run --steps 6
# the resumed launch, killed (SIGKILL) while committing step 12's save
MODTRAIN_FAULT=at:commit.rename:12 train run --steps 16
[ "$rc" = 137 ] || { cat run.log; fail "the fault did not kill the run (exit $rc)"; }
train_ok run --steps 16 # the requeue: resumes from step 8
grep -q "resume: loaded run/ckpt/step-00000008" run.log || fail "the requeue did not resume from step 8"

n=$(ls run/tb | grep -c '^events\.out\.tfevents\.')
[ "$n" = 3 ] && ok "a file per launch ($n)" || fail "$n event files for 3 launches"
$reader run/tb > events.jsonl || fail "the reader refused the files: $(tail -n 1 events.jsonl)"
starts=$(grep '"session_log"' events.jsonl | sed 's/.*"step": \([0-9]*\).*/\1/' | tr '\n' ' ')
[ "$starts" = "1 7 9 " ] && ok "each launch starts at its first step: $starts" ||
    fail "SessionLog STARTs at steps '$starts', expected 1 7 9 (each launch's first step)"
if $reader run/tb --check run/metrics.jsonl > check.txt; then
    ok "$(cat check.txt)"
else
    cat check.txt
    fail "the event files disagree with metrics.jsonl"
fi
# what the issue names, by tag, and the whole of training's steps
for tag in train/loss train/lr train/grad_norm train/tokens_per_s train/mfu \
    train/phase_ms/forward train/phase_ms/dp_comm train/aux_loss train/predictor_accuracy \
    train/expert_load/0/2 train/expert_drop/0 train/moe_aux val/val_loss val/val_loss_causal \
    val/predictor_accuracy ckpt/ckpt_s; do
    grep -q "\"$tag\": " events.jsonl || fail "no scalar $tag"
done
steps=$($PYTHON -c "
import sys; sys.path.insert(0, '$srcdir/tests/tools'); import tb_events
s, _ = tb_events.replay('run/tb', set())
print(' '.join(map(str, sorted(s['train/loss']))))")
[ "$steps" = "$(seq -s ' ' 1 16)" ] && ok "train/loss after the purge: steps 1 to 16" ||
    fail "train/loss steps after the purge: $steps"

# the reader can fail: a flipped byte in a record, a record cut short
f=$(ls run/tb/events.out.tfevents.* | head -n 1)
mkdir bad && cp "$f" bad/
"$PYTHON" -c "
import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[60] ^= 1; open(p, 'wb').write(b)" bad/*
$reader bad > bad.txt && fail "a flipped byte passed the reader" || ok "$(tail -n 1 bad.txt)"
cp "$f" bad/ && truncate -s -3 "bad/$(basename "$f")"
$reader bad > bad.txt && fail "a truncated file passed the reader" || ok "$(tail -n 1 bad.txt)"

# run_dir/tb that cannot be a folder: one line, exit 2, metrics untouched
mkdir -p file_tb && : > file_tb/tb
expect_error "tensorboard: .*file_tb/tb" "$MODTRAIN" train $common --steps 1 --run_dir file_tb
[ -f file_tb/tb ] && [ ! -s file_tb/tb ] || fail "the file in tb's place was changed"
finish
