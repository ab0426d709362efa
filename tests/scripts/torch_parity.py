"""Compares modtrain's loss and gradients (from `modtrain eval --grads`) with
those of the PyTorch model in torch_gpt.py on the same batch.
usage: torch_parity.py MODEL.safetensors GRADS.safetensors SHARD EVAL.json ROUTING AUX_WEIGHT"""
import json
import sys

import torch
from torch_gpt import GPT, read_safetensors, read_shard

model_file, grads_file, shard, eval_file, routing, aux_weight = sys.argv[1:7]
aux_weight = float(aux_weight)
weights, meta = read_safetensors(model_file)
grads, _ = read_safetensors(grads_file)
toks = read_shard(shard)
ev = json.load(open(eval_file))
T, n = int(meta["seq_len"]), ev["sequences"]
model = GPT(int(meta["vocab_size"]), T, int(meta["n_layer"]), int(meta["n_head"]), int(meta["d_model"]),
            route_every=int(meta["route_every"]), capacity=float(meta["capacity"]),
            gate=meta["router_gate"], predictor=meta["causal_router"] == "predictor",
            H=int(meta["predictor_hidden"]))
model.load(weights)
x = torch.stack([toks[i * T:i * T + T] for i in range(n)])
y = torch.stack([toks[i * T + 1:i * T + T + 1] for i in range(n)])
stats = {"aux": [], "pred": []}
lm = model(x, y, routing=routing, stats=stats)
total = lm
if stats["pred"]:
    total = total + sum(stats["pred"]) / len(stats["pred"])
elif stats["aux"]:
    total = total + aux_weight * sum(stats["aux"]) / len(stats["aux"])
total.backward()

bad = 0
ref = ev["loss_causal"] if routing == "causal" else ev["loss"]
rel = abs(lm.item() - ref) / abs(lm.item())
print("%s loss: torch %.6f modtrain %.6f (relative difference %.2e)" % (routing, lm.item(), ref, rel))
if rel > 1e-5:
    bad += 1
worst = 0.0
for name, g in grads.items():
    t = model.w(name).grad
    if t is None:
        t = torch.zeros_like(g)
    err = (g - t).abs().max().item() / max(t.abs().max().item(), 1e-12)
    worst = max(worst, err)
    if err > 1e-4:
        print("gradient of %s: relative error %.2e" % (name, err))
        bad += 1
print("%d gradients compared, worst relative error %.2e" % (len(grads), worst))
sys.exit(1 if bad else 0)
