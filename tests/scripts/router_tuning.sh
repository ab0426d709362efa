#!/bin/sh
# Router-Tuning: a dense llama model's checkpoint starts a Mixture-of-Depths
# run (route_every 2: its routers start fresh, the rest loads) that trains
# the routers alone (train_only = routers):
# - every other tensor ends bit for bit the dense model's, and the routers
#   move;
# - AdamW holds moments for the routers alone (the checkpoint's adam_m);
# - dp reduces only their gradients: (C + 1) floats a routed block a step,
#   dp_bytes 260 at d_model 64, where all of them would be 1.4 MB;
# - at dp 2 it trains what one rank trains; resumed at step 5 it ends bit
#   for bit where the uninterrupted run did;
# - the checkpoint records train_only: a resume with train_only = all is
#   one line; so are zero = 1 and a model without routers.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --eval_every 0 --log_every 1 --seq_len 32 --arch llama --n_kv_head 2 --threads 1 --resume never"
train_ok dense --steps 20 --ckpt_every 0
tune="--init_from dense/ckpt --route_every 2 --train_only routers --steps 10 --ckpt_every 5"
train_ok rt-1 1 $tune
train_ok rt-2 2 $tune
"$MODTRAIN" ckpt export --ckpt dense/ckpt --out dense.st > /dev/null
"$MODTRAIN" ckpt export --ckpt rt-1/ckpt --out rt.st > /dev/null
PYTHONPATH="$srcdir/tests/scripts" "$PYTHON" - > frozen.txt <<'PY' && ok "$(cat frozen.txt)" || fail "$(cat frozen.txt)"
import sys
import torch
from torch_gpt import read_safetensors
a, _ = read_safetensors("dense.st")
b, _ = read_safetensors("rt.st")
routers = [k for k in b if ".router." in k]
same = [k for k in a if torch.equal(a[k], b[k])]
moved = [k for k in routers if b[k].abs().sum() > 0 and k.endswith("weight")]
print("%d of %d dense tensors bit for bit the source's; the routers (%s) trained" % (len(same), len(a), ", ".join(routers)))
sys.exit(0 if len(same) == len(a) and len(routers) == 2 and moved else 1)
PY
"$MODTRAIN" ckpt inspect --ckpt rt-1/ckpt > inspect.txt
moments=$(grep -o '^ *adam_m/[^ ]*' inspect.txt | tr -d ' ' | tr '\n' ' ')
[ "$moments" = "adam_m/h.1.router.weight adam_m/h.1.router.bias " ] && grep -q "config.train_only *routers" inspect.txt &&
    ok "moments for the routers alone ($moments), train_only recorded" || fail "moments: '$moments'; $(grep train_only inspect.txt)"
bytes=$(grep -o '"dp_bytes":[0-9]*' rt-2/metrics.jsonl | cut -d: -f2 | sort -u | tr '\n' ' ')
[ "$bytes" = "260 " ] && ok "dp reduces the router's 65 floats a step alone: dp_bytes $bytes" || fail "dp_bytes: $bytes"
same_run rt-1 rt-2 "Router-Tuning at dp 2" 2e-5 10
train_ok rt-2r 2 --route_every 2 --train_only routers --steps 10 --ckpt_every 5 \
    --resume rt-2/ckpt/step-00000005
cmp -s rt-2/ckpt/step-00000010/data.bin rt-2r/ckpt/step-00000010/data.bin &&
    ok "resumed at step 5 (dp 2): step 10 bit for bit" || fail "the resumed Router-Tuning run drifted"
common="$common --route_every 2"
# (a resume names the mismatch, then that it cannot resume: moe_errors.sh's form)
set +e
"$MODTRAIN" train $common --run_dir again --resume rt-1/ckpt/step-00000005 --steps 10 > again.log 2>&1
rc=$?
set -e
[ $rc = 2 ] && head -n 1 again.log | grep -q "has train_only = routers but this run has train_only = all" &&
    ok "$(head -n 1 again.log)" || fail "resumed with train_only = all: exit $rc: $(cat again.log)"
expect_train_error 2 "zero = 1 shards AdamW's moments over dp, and train_only = routers" --train_only routers --zero 1
expect_train_error 1 "train_only = routers trains the routers, and this model has none" --train_only routers --route_every 0
finish
