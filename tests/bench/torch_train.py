"""Trains the same dense GPT as modtrain's benchmark in PyTorch and prints
tokens/s as one JSON line. With PROFILE_STEPS, that many more steps run under
torch.autograd.profiler, and the line has the mean step's time ("step_ms", the
timed steps, without the profiler) and its matrix products' ("products_ms",
the profiler's own time of mm, bmm and their fused-add forms): the split of
modtrain's kernel timers.
usage: torch_train.py SHARD L C NH T BATCH STEPS THREADS [PROFILE_STEPS]"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
# The matrix products are the system BLAS's (BLIS). BLIS does not follow
# torch.set_num_threads: it reads its thread count from BLIS_NUM_THREADS or
# OMP_NUM_THREADS when it starts, and without them runs every sgemm on one
# thread. A baseline with single-threaded sgemm would flatter modtrain
# (808 against 1307-1361 tokens/s at bench_dense.sh's model on 2 threads).
if len(sys.argv) not in (9, 10):
    sys.exit("usage: torch_train.py SHARD L C NH T BATCH STEPS THREADS [PROFILE_STEPS]")
shard, (L, C, NH, T, B, steps, threads) = sys.argv[1], map(int, sys.argv[2:9])
profile_steps = int(sys.argv[9]) if len(sys.argv) == 10 else 0
os.environ["BLIS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(threads)
import torch  # noqa: E402
from torch_gpt import GPT, read_shard  # noqa: E402

torch.set_num_threads(threads)  # PyTorch's own OpenMP work: elementwise, softmax, ...
torch.manual_seed(0)
toks = read_shard(shard)
model = GPT(256, T, L, NH, C)
decay = [p for p in model.parameters() if p.dim() == 2]
other = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                        lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
n_seq = (len(toks) - 1) // T


def step():
    """One training step on a random batch; returns its loss and seconds."""
    starts = torch.randint(0, n_seq, (B,)) * T
    x = torch.stack([toks[i:i + T] for i in starts])
    y = torch.stack([toks[i + 1:i + T + 1] for i in starts])
    t0 = time.perf_counter()
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss, time.perf_counter() - t0


times = []
for s in range(steps):
    loss, t = step()
    times.append(t)
timed = times[1:] if len(times) > 1 else times  # the first step pays for warm-up
out = {"tokens_per_s": B * T * len(timed) / sum(timed), "loss": loss.item()}
if profile_steps > 0:
    # after the timed steps, so that the profiler's own cost stays out of
    # tokens/s; the products' self time excludes what they call
    with torch.autograd.profiler.profile() as prof:
        for s in range(profile_steps):
            step()
    products = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm")
    us = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in products)
    out["step_ms"] = 1e3 * sum(timed) / len(timed)
    out["products_ms"] = us / 1e3 / profile_steps


def sgemm_gflops(n=1024, reps=10):
    """PyTorch's sgemm rate on an n x n x n product, the best of reps (as
    modtrain measures its peak): beside modtrain's peak it shows the
    baseline's products run on all its threads."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


out.update({"threads": threads, "sgemm_gflops": round(sgemm_gflops(), 1), "torch": torch.__version__})
print(json.dumps(out))
