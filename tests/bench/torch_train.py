"""Trains the same dense GPT as modtrain's benchmark in PyTorch and prints
tokens/s as one JSON line. usage: torch_train.py SHARD L C NH T BATCH STEPS THREADS"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import torch  # noqa: E402
from torch_gpt import GPT, read_shard  # noqa: E402

shard, L, C, NH, T, B, steps, threads = sys.argv[1], *map(int, sys.argv[2:])
torch.set_num_threads(threads)
torch.manual_seed(0)
toks = read_shard(shard)
model = GPT(256, T, L, NH, C)
decay = [p for p in model.parameters() if p.dim() == 2]
other = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                        lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
n_seq = (len(toks) - 1) // T
times = []
for s in range(steps):
    starts = torch.randint(0, n_seq, (B,)) * T
    x = torch.stack([toks[i:i + T] for i in starts])
    y = torch.stack([toks[i + 1:i + T + 1] for i in starts])
    t0 = time.perf_counter()
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
timed = times[1:] if len(times) > 1 else times  # the first step pays for warm-up
print(json.dumps({"tokens_per_s": B * T * len(timed) / sum(timed), "loss": loss.item(),
                  "threads": threads, "torch": torch.__version__}))
