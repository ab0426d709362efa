"""An independent GPT-2 with Mixture-of-Depths blocks in PyTorch, written from
the model's description rather than from modtrain's code: the parity test and
the benchmark both use it.

Weights use Hugging Face GPT-2 names and its Conv1D layout ([in, out]), so a
modtrain safetensors export loads straight into it.
"""
import json
import math
import struct

import torch
import torch.nn.functional as F


def read_safetensors(path):
    """Returns ({name: float32 tensor}, metadata) without the safetensors package."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        buf = bytearray(data[a:b])
        tensors[name] = torch.frombuffer(buf, dtype=torch.float32).reshape(t["shape"]).clone()
    return tensors, meta


def read_shard(path):
    """Tokens of an llm.c shard (256-int32 header, uint16 tokens)."""
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        assert header[0] == 20240520 and header[1] == 1
        n = header[2]
        toks = torch.frombuffer(bytearray(f.read(2 * n)), dtype=torch.int16).to(torch.int64)
    return toks & 0xFFFF


def capacity_k(capacity, T):
    """max(1, round(capacity * T)), halves away from zero (C's lround)."""
    return max(1, min(T, int(math.floor(capacity * T + 0.5))))


class GPT(torch.nn.Module):
    def __init__(self, V, T, L, NH, C, route_every=0, capacity=0.125, gate="raw",
                 predictor=False, H=64):
        super().__init__()
        self.V, self.T, self.L, self.NH, self.C = V, T, L, NH, C
        self.route_every, self.capacity, self.gate = route_every, capacity, gate
        self.predictor, self.H = predictor, H
        p = {}
        p["wte.weight"] = torch.randn(V, C) * 0.02
        p["wpe.weight"] = torch.randn(T, C) * 0.02
        for i in range(L):
            h = f"h.{i}."
            p[h + "ln_1.weight"], p[h + "ln_1.bias"] = torch.ones(C), torch.zeros(C)
            p[h + "attn.c_attn.weight"] = torch.randn(C, 3 * C) * 0.02
            p[h + "attn.c_attn.bias"] = torch.zeros(3 * C)
            p[h + "attn.c_proj.weight"] = torch.randn(C, C) * 0.02 / math.sqrt(2 * L)
            p[h + "attn.c_proj.bias"] = torch.zeros(C)
            p[h + "ln_2.weight"], p[h + "ln_2.bias"] = torch.ones(C), torch.zeros(C)
            p[h + "mlp.c_fc.weight"] = torch.randn(C, 4 * C) * 0.02
            p[h + "mlp.c_fc.bias"] = torch.zeros(4 * C)
            p[h + "mlp.c_proj.weight"] = torch.randn(4 * C, C) * 0.02 / math.sqrt(2 * L)
            p[h + "mlp.c_proj.bias"] = torch.zeros(C)
            if self.routed(i):
                p[h + "router.weight"], p[h + "router.bias"] = torch.randn(C) * 0.02, torch.zeros(1)
                if predictor:
                    p[h + "predictor.c_fc.weight"] = torch.randn(C, H) * 0.02
                    p[h + "predictor.c_fc.bias"] = torch.zeros(H)
                    p[h + "predictor.c_proj.weight"] = torch.randn(H, 1) * 0.02
                    p[h + "predictor.c_proj.bias"] = torch.zeros(1)
        p["ln_f.weight"], p["ln_f.bias"] = torch.ones(C), torch.zeros(C)
        self.p = torch.nn.ParameterDict({k.replace(".", "/"): torch.nn.Parameter(v) for k, v in p.items()})

    def routed(self, i):
        return self.route_every > 0 and i % self.route_every == self.route_every - 1

    def w(self, name):
        return self.p[name.replace(".", "/")]

    def load(self, tensors):
        with torch.no_grad():
            for k, v in tensors.items():
                self.w(k).copy_(v)

    def branches(self, h, x):
        """Attention and MLP branches of block h on x (B, T, C): (a, m)."""
        B, T, C = x.shape
        NH = self.NH
        a = F.layer_norm(x, (C,), self.w(h + "ln_1.weight"), self.w(h + "ln_1.bias"), 1e-5)
        qkv = a @ self.w(h + "attn.c_attn.weight") + self.w(h + "attn.c_attn.bias")
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        a = y @ self.w(h + "attn.c_proj.weight") + self.w(h + "attn.c_proj.bias")
        u = F.layer_norm(x + a, (C,), self.w(h + "ln_2.weight"), self.w(h + "ln_2.bias"), 1e-5)
        u = F.gelu(u @ self.w(h + "mlp.c_fc.weight") + self.w(h + "mlp.c_fc.bias"), approximate="tanh")
        m = u @ self.w(h + "mlp.c_proj.weight") + self.w(h + "mlp.c_proj.bias")
        return a, m

    def routed_block(self, h, x, routing, stats):
        """Mixture-of-Depths: the block on the chosen tokens only, gated."""
        B, T, C = x.shape
        r = x @ self.w(h + "router.weight") + self.w(h + "router.bias")
        k = capacity_k(self.capacity, T)
        # top-k, ties to the lower position: a stable sort of -r
        order = torch.sort(-r.detach(), dim=1, stable=True).indices[:, :k]
        topk = torch.zeros(B, T).scatter(1, order, 1.0)
        stats["aux"].append(F.binary_cross_entropy_with_logits(r, topk))
        if self.predictor:
            u = F.gelu(x.detach() @ self.w(h + "predictor.c_fc.weight")
                       + self.w(h + "predictor.c_fc.bias"), approximate="tanh")
            z = (u @ self.w(h + "predictor.c_proj.weight")).squeeze(-1) + self.w(h + "predictor.c_proj.bias")
            stats["pred"].append(F.binary_cross_entropy_with_logits(z, topk))
            causal = z > 0
        else:
            causal = r > 0
        chosen = topk.bool() if routing == "topk" else causal
        g = torch.sigmoid(r) if self.gate == "sigmoid" else r
        y = x.clone()
        for b in range(B):
            idx = chosen[b].nonzero().squeeze(-1)  # ascending positions
            if idx.numel() == 0:
                continue
            a, m = self.branches(h, x[b, idx].unsqueeze(0))
            gb = g[b, idx].unsqueeze(-1)
            y[b, idx] = x[b, idx] + gb * a[0] + gb * m[0]
        return y

    def forward(self, idx, targets, routing="topk", stats=None):
        """Mean cross-entropy; stats (if given) collects the routing BCEs."""
        B, T = idx.shape
        C = self.C
        stats = stats if stats is not None else {"aux": [], "pred": []}
        x = self.w("wte.weight")[idx] + self.w("wpe.weight")[:T]
        for i in range(self.L):
            h = f"h.{i}."
            if self.routed(i):
                x = self.routed_block(h, x, routing, stats)
            else:
                a, m = self.branches(h, x)
                x = x + a + m
        x = F.layer_norm(x, (C,), self.w("ln_f.weight"), self.w("ln_f.bias"), 1e-5)
        logits = x @ self.w("wte.weight").t()
        return F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))
