"""An independent Llama in PyTorch (1.13: no scaled_dot_product_attention, no
nn.RMSNorm, both written out here), from the documented semantics of Hugging
Face's LlamaForCausalLM, not from modtrain's code:

  x = embed_tokens[ids]
  per layer: h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1)))
             x = h + down_proj(silu(gate_proj(n2)) * up_proj(n2))
     with n1 = RMSNorm(x) * input_layernorm, n2 = RMSNorm(h) * post_attention_layernorm
  logits = lm_head(RMSNorm(x) * norm)   (lm_head = embed_tokens when tied)

RMSNorm(x) = x / sqrt(mean(x^2) + eps). Rotary positions use rotate_half: in
a head of hs channels, channel i pairs with i + hs/2, turned by the angle
pos * theta^(-2i/hs). Grouped-query attention: query head h uses key and
value head h // (n_head / n_kv_head) (repeat_kv, a repeat_interleave).

Weights live under Hugging Face's names and nn.Linear's [out, in] layout.
Mixture-of-Depths and Mixture-of-Experts come from torch_gpt.GPT: the
routers keep modtrain's names (h.N.router.*, h.N.mlp.router.weight), and a
routed token keeps its own position for the rotation. parts() maps a
modtrain safetensors export (its fused [in, out] c_attn = q|k|v, c_fc =
gate|up) onto these names, for load() and grad().
"""
import json
import math
import os

import torch
import torch.nn.functional as F

from torch_gpt import GPT, read_safetensors, write_safetensors


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, pos, theta):
    """x (..., T, hs) turned to positions pos (T)."""
    hs = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    ang = torch.outer(pos.to(torch.float64), inv)
    ang = torch.cat((ang, ang), dim=-1)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin


def hf(h):
    """modtrain's block prefix h.N. as Hugging Face's model.layers.N."""
    return "model.layers." + h[2:]


class Llama(GPT):
    def __init__(self, V, T, L, NH, C, n_kv_head=0, d_ff=0, norm_eps=1e-5, rope_theta=10000.0,
                 tied=False, **kw):
        self.KV = n_kv_head if n_kv_head > 0 else NH
        self.F = d_ff
        self.eps, self.theta, self.tied = norm_eps, rope_theta, tied
        super().__init__(V, T, L, NH, C, **kw)
        if kw.get("expert_d_ff", 0) <= 0:
            self.Fe = self.F

    @classmethod
    def from_meta(cls, meta):
        g = lambda key, default: meta.get(key, default)
        args, kw = cls.meta_args(meta)
        C = args[4]
        d_ff = int(g("d_ff", 0))
        if d_ff == 0:  # Llama's rule: 8/3 C rounded up to a multiple
            k = int(g("ffn_multiple_of", 256))
            d_ff = (8 * C + 2) // 3
            d_ff = (d_ff + k - 1) // k * k
        return cls(*args, n_kv_head=int(g("n_kv_head", 0)), d_ff=d_ff,
                   norm_eps=float(g("norm_eps", 1e-5)), rope_theta=float(g("rope_theta", 10000)),
                   tied=g("tie_embeddings", "auto") == "1", **kw)

    def make_params(self):
        V, L, C, NH, KV = self.V, self.L, self.C, self.NH, self.KV
        hs, Fd = C // NH, self.F
        Fe = self.Fe if self.Fe != 4 * C else Fd
        p = {"model.embed_tokens.weight": torch.randn(V, C) * 0.02}
        for i in range(L):
            h, m = f"h.{i}.", f"model.layers.{i}."
            p[m + "input_layernorm.weight"] = torch.ones(C)
            p[m + "post_attention_layernorm.weight"] = torch.ones(C)
            p[m + "self_attn.q_proj.weight"] = torch.randn(NH * hs, C) * 0.02
            p[m + "self_attn.k_proj.weight"] = torch.randn(KV * hs, C) * 0.02
            p[m + "self_attn.v_proj.weight"] = torch.randn(KV * hs, C) * 0.02
            p[m + "self_attn.o_proj.weight"] = torch.randn(C, NH * hs) * 0.02
            if self.moe(i):
                p[h + "mlp.router.weight"] = torch.randn(C, self.E + self.Nn) * 0.02
                for e in range(self.E):
                    x = f"{m}mlp.experts.{e}."
                    p[x + "gate_proj.weight"] = torch.randn(Fe, C) * 0.02
                    p[x + "up_proj.weight"] = torch.randn(Fe, C) * 0.02
                    p[x + "down_proj.weight"] = torch.randn(C, Fe) * 0.02
            else:
                p[m + "mlp.gate_proj.weight"] = torch.randn(Fd, C) * 0.02
                p[m + "mlp.up_proj.weight"] = torch.randn(Fd, C) * 0.02
                p[m + "mlp.down_proj.weight"] = torch.randn(C, Fd) * 0.02
            if self.routed(i):
                p.update(self.routing_params(h))
        p["model.norm.weight"] = torch.ones(C)
        if not self.tied:
            p["lm_head.weight"] = torch.randn(V, C) * 0.02
        return p

    # ---- modtrain's names and layout ([in, out]; c_attn = q|k|v, c_fc = gate|up)
    def parts(self, name):
        """The Hugging Face tensors that make up modtrain's `name`."""
        NH, KV, hs = self.NH, self.KV, self.C // self.NH
        if name == "wte.weight":
            return [("model.embed_tokens.weight", None, False)]
        if name == "ln_f.weight":
            return [("model.norm.weight", None, False)]
        if name == "lm_head.weight":
            return [("lm_head.weight", None, False)]
        if not name.startswith("h.") or ".router." in name or ".predictor." in name:
            return [(name, None, False)]
        i, rest = name[2:].split(".", 1)
        m = f"model.layers.{i}."
        if rest == "ln_1.weight":
            return [(m + "input_layernorm.weight", None, False)]
        if rest == "ln_2.weight":
            return [(m + "post_attention_layernorm.weight", None, False)]
        if rest == "attn.c_attn.weight":
            q, k = NH * hs, KV * hs
            return [(m + "self_attn.q_proj.weight", (0, q), True),
                    (m + "self_attn.k_proj.weight", (q, q + k), True),
                    (m + "self_attn.v_proj.weight", (q + k, q + 2 * k), True)]
        if rest == "attn.c_proj.weight":
            return [(m + "self_attn.o_proj.weight", None, True)]
        pre = m + rest[:-len("c_fc.weight")] if rest.endswith("c_fc.weight") else None
        if pre is not None:
            f = self.w(pre + "gate_proj.weight").shape[0]
            return [(pre + "gate_proj.weight", (0, f), True), (pre + "up_proj.weight", (f, 2 * f), True)]
        if rest.endswith("c_proj.weight"):
            return [(m + rest[:-len("c_proj.weight")] + "down_proj.weight", None, True)]
        raise KeyError(name)

    # ---- the forward
    def attn(self, h, x, pos):
        B, T, C = x.shape
        NH, KV, hs, m = self.NH, self.KV, C // self.NH, hf(h)
        a = rms_norm(x, self.w(m + "input_layernorm.weight"), self.eps)
        q = (a @ self.w(m + "self_attn.q_proj.weight").t()).view(B, T, NH, hs).transpose(1, 2)
        k = (a @ self.w(m + "self_attn.k_proj.weight").t()).view(B, T, KV, hs).transpose(1, 2)
        v = (a @ self.w(m + "self_attn.v_proj.weight").t()).view(B, T, KV, hs).transpose(1, 2)
        q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        k = k.repeat_interleave(NH // KV, dim=1)
        v = v.repeat_interleave(NH // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * hs)
        return y @ self.w(m + "self_attn.o_proj.weight").t()

    def ffn(self, prefix, u):
        p = hf(prefix)
        g = u @ self.w(p + "gate_proj.weight").t()
        up = u @ self.w(p + "up_proj.weight").t()
        return (F.silu(g) * up) @ self.w(p + "down_proj.weight").t()

    def ln2(self, h, x):
        return rms_norm(x, self.w(hf(h) + "post_attention_layernorm.weight"), self.eps)

    def embed(self, idx):
        return self.w("model.embed_tokens.weight")[idx]

    def head(self, x):
        x = rms_norm(x, self.w("model.norm.weight"), self.eps)
        w = self.w("model.embed_tokens.weight" if self.tied else "lm_head.weight")
        return x @ w.t()


# ---- Hugging Face folders: config.json and model.safetensors (or shards)

def from_hf(folder):
    """A Llama from a LlamaForCausalLM folder: its config.json and weights."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    assert cfg["model_type"] == "llama" and cfg.get("hidden_act", "silu") == "silu"
    model = Llama(cfg["vocab_size"], cfg["max_position_embeddings"], cfg["num_hidden_layers"],
                  cfg["num_attention_heads"], cfg["hidden_size"],
                  n_kv_head=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                  d_ff=cfg["intermediate_size"], norm_eps=cfg.get("rms_norm_eps", 1e-6),
                  rope_theta=cfg.get("rope_theta", 10000.0), tied=cfg.get("tie_word_embeddings", False))
    index = os.path.join(folder, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    with torch.no_grad():
        for name in files:
            for k, v in read_safetensors(os.path.join(folder, name))[0].items():
                model.w(k).copy_(v)
    return model


def write_hf(model, folder, dtype="F32", shards=1):
    """Writes model as a LlamaForCausalLM folder: config.json, and its weights in
    dtype, in one file or in shards with model.safetensors.index.json."""
    os.makedirs(folder, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": model.V,
           "hidden_size": model.C, "intermediate_size": model.F, "num_hidden_layers": model.L,
           "num_attention_heads": model.NH, "num_key_value_heads": model.KV,
           "max_position_embeddings": model.T, "hidden_act": "silu", "rms_norm_eps": model.eps,
           "rope_theta": model.theta, "tie_word_embeddings": model.tied, "torch_dtype": "bfloat16"}
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"), indent=2)
    names = [k.replace("/", ".") for k in model.p]
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), {n: model.w(n) for n in names}, dtype)
        return
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        write_safetensors(os.path.join(folder, file), {n: model.w(n) for n in part}, dtype)
        weight_map.update({n: file for n in part})
    json.dump({"metadata": {}, "weight_map": weight_map},
              open(os.path.join(folder, "model.safetensors.index.json"), "w"), indent=2)
