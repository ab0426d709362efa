"""Compares modtrain's loss and gradients (from `modtrain eval --grads`) with
those of the PyTorch model in torch_gpt.py on the same batch.
usage: torch_parity.py MODEL.safetensors GRADS.safetensors SHARD EVAL.json ROUTING AUX_WEIGHT [MOE_AUX_WEIGHT]

The batch is split into micro-batches of MICRO_BATCH sequences, as the
`modtrain eval --micro-batch 3` of torch_parity.sh does: a Mixture-of-Experts
block's capacity is per micro-batch."""
import json
import sys

import torch
from torch_gpt import GPT, read_safetensors, read_shard
from torch_llama import Llama

MICRO_BATCH = 3

model_file, grads_file, shard, eval_file, routing, aux_weight = sys.argv[1:7]
aux_weight = float(aux_weight)
moe_weight = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
weights, meta = read_safetensors(model_file)
grads, _ = read_safetensors(grads_file)
toks = read_shard(shard)
ev = json.load(open(eval_file))
T, n = int(meta["seq_len"]), ev["sequences"]
model = (Llama if meta.get("arch") == "llama" else GPT).from_meta(meta)
model.load(weights)
x = torch.stack([toks[i * T:i * T + T] for i in range(n)])
y = torch.stack([toks[i * T + 1:i * T + T + 1] for i in range(n)])
stats = {}
lm = model(x, y, routing=routing, stats=stats, micro_batch=MICRO_BATCH)
total = lm
if stats["pred"]:
    total = total + sum(stats["pred"]) / len(stats["pred"])
elif stats["aux"]:
    total = total + aux_weight * sum(stats["aux"]) / len(stats["aux"])
moe_aux = None
if stats["moe"]:
    moe_aux = sum(stats["moe"]) / len(stats["moe"])
    total = total + moe_weight * moe_aux
total.backward()

bad = 0
ref = ev["loss_causal"] if routing == "causal" else ev["loss"]
rel = abs(lm.item() - ref) / abs(lm.item())
print("%s loss: torch %.6f modtrain %.6f (relative difference %.2e)" % (routing, lm.item(), ref, rel))
if rel > 1e-5:
    bad += 1
if moe_aux is not None:
    slots, noop, dropped = stats["moe_slots"], stats["moe_noop"], stats["moe_dropped"]
    print("moe: %d blocks, %d expert slots over the micro-batches: %d to no-op experts, %d dropped "
          "(%.4f of the real-expert slots); load-balancing loss %.6f, weight %g"
          % (len(stats["moe"]), slots, noop, dropped, dropped / max(slots - noop, 1), moe_aux.item(),
             moe_weight))
    print("moe: the closest call between a row's router probabilities up to its k-th choice: %.3e"
          % stats.get("moe_gap", float("nan")))
    # modtrain's own figures, where eval prints them under these names
    key = "moe_aux_causal" if routing == "causal" and "moe_aux_causal" in ev else "moe_aux"
    if key in ev and (routing == "topk" or key == "moe_aux_causal"):
        rel = abs(moe_aux.item() - ev[key]) / max(abs(moe_aux.item()), 1e-12)
        print("%s: torch %.6f modtrain %.6f (relative difference %.2e)" % (key, moe_aux.item(), ev[key], rel))
        if rel > 1e-5:
            bad += 1
    # eval's expert_drop: the dropped share of all N*k slots (no-op ones too), top-k pass
    if "expert_drop" in ev and routing == "topk":
        share = dropped / max(slots, 1)
        print("expert_drop: torch %.6f modtrain %.6f" % (share, ev["expert_drop"]))
        if abs(share - ev["expert_drop"]) > 1e-6:
            bad += 1
worst = 0.0
for name, g in grads.items():
    t = model.grad(name)
    if t is None:
        t = torch.zeros_like(g)
    err = (g - t).abs().max().item() / max(t.abs().max().item(), 1e-12)
    worst = max(worst, err)
    if err > 1e-4:
        print("gradient of %s: relative error %.2e (max |torch| %.3e, max |modtrain| %.3e)"
              % (name, err, t.abs().max().item(), g.abs().max().item()))
        bad += 1
covered = {own for name in grads for own, _, _ in model.parts(name)}
missing = [k.replace("/", ".") for k in model.p if k.replace("/", ".") not in covered]
if missing:
    print("no gradient from modtrain for: %s" % ", ".join(missing))
    bad += any(".mlp.router." in k or ".mlp.experts." in k for k in missing)
print("%d gradients compared, worst relative error %.2e" % (len(grads), worst))
sys.exit(1 if bad else 0)
