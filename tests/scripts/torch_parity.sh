#!/bin/sh
# Parity with an independent implementation: PyTorch (Debian's python3-torch)
# loads modtrain's safetensors export, computes the loss and every gradient
# on the same batch, and they must match modtrain's:
#   loss:      |a - b| <= 1e-5 * |b|
#   gradients: max |a - b| <= 1e-4 * max |b| per tensor (fp32, different
#              summation orders; a wrong gradient is off by O(1))
. "$(dirname "$0")/lib.sh"
if ! "$PYTHON" -c "import torch" 2> /dev/null; then
    echo "SKIP: $PYTHON cannot import torch (apt-get install python3-torch)"
    exit 77
fi
prep_fortunes
cd "$TMP"
# train a little first so that the weights are no longer at their init
"$MODTRAIN" train --config "$srcdir/jobs/tiny.conf" --train_data data/train.bin \
    --val_data data/val.bin --steps 30 --seq_len 32 --eval_every 0 --run_dir run > train.log 2>&1 ||
    { cat train.log; fail "training failed"; finish; }
"$MODTRAIN" ckpt export --ckpt run/ckpt --format safetensors --out model.safetensors > /dev/null
"$MODTRAIN" eval --ckpt run/ckpt --data data/val.bin --batches 2 --micro-batch 3 \
    --grads grads.safetensors --json > eval.json
cat eval.json
PYTHONPATH="$srcdir/tests/scripts" "$PYTHON" - model.safetensors grads.safetensors data/val.bin eval.json <<'PY' ||
import json, sys
import torch
from torch_gpt import GPT, read_safetensors, read_shard
weights, meta = read_safetensors(sys.argv[1])
grads, _ = read_safetensors(sys.argv[2])
toks = read_shard(sys.argv[3])
ev = json.load(open(sys.argv[4]))
T, n = int(meta["seq_len"]), ev["sequences"]
assert n == 6, n
model = GPT(int(meta["vocab_size"]), T, int(meta["n_layer"]), int(meta["n_head"]), int(meta["d_model"]))
model.load(weights)
x = torch.stack([toks[i * T:i * T + T] for i in range(n)])
y = torch.stack([toks[i * T + 1:i * T + T + 1] for i in range(n)])
loss = model(x, y)
loss.backward()
bad = 0
rel = abs(loss.item() - ev["loss"]) / abs(loss.item())
print("loss: torch %.6f modtrain %.6f (relative difference %.2e)" % (loss.item(), ev["loss"], rel))
if rel > 1e-5:
    bad += 1
worst = 0.0
for name, g in grads.items():
    ref = model.w(name).grad
    err = (g - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
    worst = max(worst, err)
    if err > 1e-4:
        print("gradient of %s: relative error %.2e" % (name, err))
        bad += 1
print("%d gradients compared, worst relative error %.2e" % (len(grads), worst))
sys.exit(1 if bad else 0)
PY
    fail "modtrain and PyTorch disagree"
[ "$failures" -eq 0 ] && ok "loss and all gradients match PyTorch"
finish
