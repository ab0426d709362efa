"""An independent GPT-2 in PyTorch, built from DESIGN.md section 2 rather than
from modtrain's code: the parity test and the benchmark both use it.

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


class GPT(torch.nn.Module):
    def __init__(self, V, T, L, NH, C):
        super().__init__()
        self.V, self.T, self.L, self.NH, self.C = V, T, L, NH, C
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
        p["ln_f.weight"], p["ln_f.bias"] = torch.ones(C), torch.zeros(C)
        self.p = torch.nn.ParameterDict({k.replace(".", "/"): torch.nn.Parameter(v) for k, v in p.items()})

    def w(self, name):
        return self.p[name.replace(".", "/")]

    def load(self, tensors):
        with torch.no_grad():
            for k, v in tensors.items():
                self.w(k).copy_(v)

    def forward(self, idx, targets):
        B, T = idx.shape
        C, NH = self.C, self.NH
        x = self.w("wte.weight")[idx] + self.w("wpe.weight")[:T]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for i in range(self.L):
            h = f"h.{i}."
            a = F.layer_norm(x, (C,), self.w(h + "ln_1.weight"), self.w(h + "ln_1.bias"), 1e-5)
            qkv = a @ self.w(h + "attn.c_attn.weight") + self.w(h + "attn.c_attn.bias")
            q, k, v = qkv.split(C, dim=2)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ self.w(h + "attn.c_proj.weight") + self.w(h + "attn.c_proj.bias")
            a = F.layer_norm(x, (C,), self.w(h + "ln_2.weight"), self.w(h + "ln_2.bias"), 1e-5)
            a = F.gelu(a @ self.w(h + "mlp.c_fc.weight") + self.w(h + "mlp.c_fc.bias"), approximate="tanh")
            x = x + a @ self.w(h + "mlp.c_proj.weight") + self.w(h + "mlp.c_proj.bias")
        x = F.layer_norm(x, (C,), self.w("ln_f.weight"), self.w("ln_f.bias"), 1e-5)
        logits = x @ self.w("wte.weight").t()
        return F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))
