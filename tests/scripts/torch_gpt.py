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


DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    """Returns ({name: float32 tensor}, metadata) without the safetensors package
    (F32, BF16 and F16 tensors, widened to float32)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        buf = bytearray(data[a:b])
        x = torch.frombuffer(buf, dtype=DTYPES[t["dtype"]]) if buf else torch.zeros(0, dtype=DTYPES[t["dtype"]])
        tensors[name] = x.reshape(t["shape"]).to(torch.float32).clone()
    return tensors, meta


def write_safetensors(path, tensors, dtype="F32", meta=None):
    """Writes {name: tensor} as one safetensors file in dtype (F32, BF16, F16)."""
    header, blobs, at = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    for name, t in tensors.items():
        raw = t.detach().to(DTYPES[dtype]).contiguous().view(torch.uint8).numpy().tobytes() \
            if t.numel() else b""
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


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


def expert_capacity(cf, N, k, E):
    """Slots per real expert for N rows: max(1, floor(cf * N * k / E)) in double."""
    return max(1, int(math.floor(float(cf) * N * k / E)))


def moe_choices(p, k):
    """Top-k columns of each row of p, largest first, ties to the lower column:
    a stable sort of -p. Returns a (N, k) int64 tensor."""
    return torch.sort(-p.detach(), dim=1, stable=True).indices[:, :k]


def moe_assign(choice, E, cap):
    """Priority order: every row's first choice before any second choice, rows
    in order. Returns kept (N, k) bool: the slot's expert is real and had room."""
    N, k = choice.shape
    used = [0] * E
    kept = torch.zeros(N, k, dtype=torch.bool)
    ch = choice.tolist()
    for j in range(k):
        for i in range(N):
            e = ch[i][j]
            if e < E and used[e] < cap:
                used[e] += 1
                kept[i, j] = True
    return kept


class GPT(torch.nn.Module):
    def __init__(self, V, T, L, NH, C, route_every=0, capacity=0.125, gate="raw",
                 predictor=False, H=64, n_expert=0, n_noop_expert=0, expert_top_k=1,
                 expert_d_ff=0, capacity_factor=1.25, moe_every=1):
        super().__init__()
        self.V, self.T, self.L, self.NH, self.C = V, T, L, NH, C
        self.route_every, self.capacity, self.gate = route_every, capacity, gate
        self.predictor, self.H = predictor, H
        self.E, self.Nn, self.k = n_expert, n_noop_expert, expert_top_k
        self.Fe = expert_d_ff if expert_d_ff > 0 else 4 * C
        self.cf, self.moe_every = capacity_factor, moe_every
        assert self.E == 0 or self.k in (1, 2)
        p = self.make_params()
        self.p = torch.nn.ParameterDict({k.replace(".", "/"): torch.nn.Parameter(v) for k, v in p.items()})

    def make_params(self):
        """The initial weights under their names: GPT-2's."""
        V, T, L, C, H = self.V, self.T, self.L, self.C, self.H
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
            if self.moe(i):
                p[h + "mlp.router.weight"] = torch.randn(C, self.E + self.Nn) * 0.02
                for e in range(self.E):
                    x = f"{h}mlp.experts.{e}."
                    p[x + "c_fc.weight"] = torch.randn(C, self.Fe) * 0.02
                    p[x + "c_fc.bias"] = torch.zeros(self.Fe)
                    p[x + "c_proj.weight"] = torch.randn(self.Fe, C) * 0.02 / math.sqrt(2 * L)
                    p[x + "c_proj.bias"] = torch.zeros(C)
            else:
                p[h + "mlp.c_fc.weight"] = torch.randn(C, 4 * C) * 0.02
                p[h + "mlp.c_fc.bias"] = torch.zeros(4 * C)
                p[h + "mlp.c_proj.weight"] = torch.randn(4 * C, C) * 0.02 / math.sqrt(2 * L)
                p[h + "mlp.c_proj.bias"] = torch.zeros(C)
            if self.routed(i):
                p.update(self.routing_params(h))
        p["ln_f.weight"], p["ln_f.bias"] = torch.ones(C), torch.zeros(C)
        return p

    def routing_params(self, h):
        """A routed block's router (and predictor): modtrain's names in any block."""
        C, H = self.C, self.H
        p = {h + "router.weight": torch.randn(C) * 0.02, h + "router.bias": torch.zeros(1)}
        if self.predictor:
            p[h + "predictor.c_fc.weight"] = torch.randn(C, H) * 0.02
            p[h + "predictor.c_fc.bias"] = torch.zeros(H)
            p[h + "predictor.c_proj.weight"] = torch.randn(H, 1) * 0.02
            p[h + "predictor.c_proj.bias"] = torch.zeros(1)
        return p

    @staticmethod
    def meta_args(meta):
        """The shape and routing a modtrain safetensors export's metadata says:
        (positional arguments, keyword arguments)."""
        g = lambda key, default: meta.get(key, default)
        return ((int(meta["vocab_size"]), int(meta["seq_len"]), int(meta["n_layer"]),
                 int(meta["n_head"]), int(meta["d_model"])),
                dict(route_every=int(g("route_every", 0)), capacity=float(g("capacity", 0.125)),
                     gate=g("router_gate", "raw"), predictor=g("causal_router", "") == "predictor",
                     H=int(g("predictor_hidden", 64)), n_expert=int(g("n_expert", 0)),
                     n_noop_expert=int(g("n_noop_expert", 0)), expert_top_k=int(g("expert_top_k", 1)),
                     expert_d_ff=int(g("expert_d_ff", 0)), capacity_factor=float(g("capacity_factor", 1.25)),
                     moe_every=int(g("moe_every", 1))))

    @classmethod
    def from_meta(cls, meta):
        """A model shaped as a modtrain safetensors export's metadata says."""
        args, kw = cls.meta_args(meta)
        return cls(*args, **kw)

    def routed(self, i):
        return self.route_every > 0 and i % self.route_every == self.route_every - 1

    def moe(self, i):
        return self.E > 0 and i % self.moe_every == self.moe_every - 1

    def w(self, name):
        return self.p[name.replace(".", "/")]

    def load(self, tensors):
        """Loads a modtrain safetensors export's tensors."""
        with torch.no_grad():
            for name, v in tensors.items():
                for own, cols, tr in self.parts(name):
                    part = v[:, cols[0]:cols[1]] if cols else v
                    self.w(own).copy_(part.t() if tr else part)

    def parts(self, name):
        """[(own name, columns of modtrain's tensor or None, transposed)] that make
        up the tensor modtrain names `name`: here itself."""
        return [(name, None, False)]

    def grad(self, name):
        """The gradient of the tensor modtrain names `name`, or None."""
        out = []
        for own, cols, tr in self.parts(name):
            g = self.w(own).grad
            if g is None:
                return None
            out.append(g.t() if tr else g)
        return torch.cat(out, dim=1) if len(out) > 1 else out[0]

    def attn(self, h, x, pos):
        """Attention branch of block h on x (B, T, C), causal within each row of x,
        whose tokens sit at positions pos (T) of their sequence."""
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
        return y @ self.w(h + "attn.c_proj.weight") + self.w(h + "attn.c_proj.bias")

    def ffn(self, prefix, u):
        u = F.gelu(u @ self.w(prefix + "c_fc.weight") + self.w(prefix + "c_fc.bias"), approximate="tanh")
        return u @ self.w(prefix + "c_proj.weight") + self.w(prefix + "c_proj.bias")

    def moe_rows(self, h, u, stats):
        """Mixture-of-Experts on the rows u (N, C) of block h: (m (N, C), aux)."""
        N = u.shape[0]
        E, Et, k = self.E, self.E + self.Nn, self.k
        if N == 0:
            return u * 0, u.sum() * 0
        p = (u @ self.w(h + "mlp.router.weight")).softmax(dim=-1)
        choice = moe_choices(p, k)
        cap = expert_capacity(self.cf, N, k, E)
        kept = moe_assign(choice, E, cap)
        m = torch.zeros_like(u)
        for e in range(E):
            rows, slots = ((choice == e) & kept).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            out = self.ffn(f"{h}mlp.experts.{e}.", u[rows])
            m = m.index_add(0, rows, p[rows, e].unsqueeze(-1) * out)
        f = torch.bincount(choice.reshape(-1), minlength=Et).to(p.dtype) / (N * k)
        aux = Et * (f * p.mean(dim=0)).sum()
        real = choice < E
        if Et > k:  # the closest call among the choices: a float32 near-tie would show here
            srt = p.detach().sort(dim=1, descending=True).values
            gap = (srt[:, :k] - srt[:, 1:k + 1]).min().item()
            stats["moe_gap"] = min(stats.get("moe_gap", math.inf), gap)
        stats["moe_slots"] += N * k
        stats["moe_noop"] += int((~real).sum())
        stats["moe_dropped"] += int((real & ~kept).sum())
        return m, aux

    def mlp(self, i, h, u, stats):
        """The MLP branch of block i on rows u (N, C): dense, or MoE (its aux goes to stats)."""
        if not self.moe(i):
            return self.ffn(h + "mlp.", u)
        m, aux = self.moe_rows(h, u, stats)
        stats["moe"].append(aux)
        return m

    def ln2(self, h, x):
        return F.layer_norm(x, (self.C,), self.w(h + "ln_2.weight"), self.w(h + "ln_2.bias"), 1e-5)

    def dense_block(self, i, h, x, stats):
        B, T, C = x.shape
        a = self.attn(h, x, torch.arange(T))
        m = self.mlp(i, h, self.ln2(h, x + a).reshape(B * T, C), stats).view(B, T, C)
        return x + a + m

    def routed_block(self, i, h, x, routing, stats):
        """Mixture-of-Depths: the block on the chosen tokens only, gated. An MoE
        MLP sees all the chosen rows of the micro-batch at once, b*T+t ascending."""
        B, T, C = x.shape
        r = x @ self.w(h + "router.weight") + self.w(h + "router.bias")
        k = capacity_k(self.capacity, T)
        # top-k, ties to the lower position: a stable sort of -r
        order = torch.sort(-r.detach(), dim=1, stable=True).indices[:, :k]
        topk = torch.zeros(B, T, dtype=x.dtype).scatter(1, order, 1.0)
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
        picks, attns = [], []
        for b in range(B):
            idx = chosen[b].nonzero().squeeze(-1)  # ascending positions
            if idx.numel() == 0:
                continue
            picks.append((b, idx))
            attns.append(self.attn(h, x[b, idx].unsqueeze(0), idx)[0])
        rows = [x[b, idx] + a for (b, idx), a in zip(picks, attns)]
        u = self.ln2(h, torch.cat(rows) if rows else x.new_zeros(0, C))
        m = self.mlp(i, h, u, stats)
        y = x.clone()
        at = 0
        for (b, idx), a in zip(picks, attns):
            n = idx.numel()
            gb = g[b, idx].unsqueeze(-1)
            y[b, idx] = x[b, idx] + gb * a + gb * m[at:at + n]
            at += n
        return y

    def forward_sum(self, idx, targets, routing, stats):
        """Summed cross-entropy of one micro-batch; stats gets one entry a block."""
        x = self.embed(idx)
        for i in range(self.L):
            h = f"h.{i}."
            if self.routed(i):
                x = self.routed_block(i, h, x, routing, stats)
            else:
                x = self.dense_block(i, h, x, stats)
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1), reduction="sum")

    def embed(self, idx):
        return self.w("wte.weight")[idx] + self.w("wpe.weight")[:idx.shape[1]]

    def head(self, x):
        x = F.layer_norm(x, (self.C,), self.w("ln_f.weight"), self.w("ln_f.bias"), 1e-5)
        return x @ self.w("wte.weight").t()

    def forward(self, idx, targets, routing="topk", stats=None, micro_batch=0):
        """Mean cross-entropy over all tokens. The batch is split into micro-batches
        of micro_batch consecutive sequences (0: one), as modtrain does: MoE
        capacity is per micro-batch. stats (if given) collects, a block each,
        the routing BCEs ("aux", "pred") and the MoE load-balancing losses
        ("moe"), each averaged over the micro-batches weighted by their tokens,
        the MoE slot counts ("moe_slots", "moe_noop", "moe_dropped") and the
        smallest gap between a row's sorted router probabilities up to its
        k-th choice ("moe_gap")."""
        B, T = idx.shape
        mb = micro_batch if micro_batch and micro_batch > 0 else B
        stats = stats if stats is not None else {}
        keys = ("aux", "pred", "moe")
        acc = {key: [] for key in keys}
        for key in ("moe_slots", "moe_noop", "moe_dropped"):
            stats[key] = 0
        total = 0
        for s in range(0, B, mb):
            st = {key: [] for key in keys}
            for key in ("moe_slots", "moe_noop", "moe_dropped"):
                st[key] = 0
            total = total + self.forward_sum(idx[s:s + mb], targets[s:s + mb], routing, st)
            share = idx[s:s + mb].shape[0] / B
            for key in keys:
                for j, v in enumerate(st[key]):
                    if j == len(acc[key]):
                        acc[key].append(share * v)
                    else:
                        acc[key][j] = acc[key][j] + share * v
            for key in ("moe_slots", "moe_noop", "moe_dropped"):
                stats[key] += st[key]
            if "moe_gap" in st:
                stats["moe_gap"] = min(stats.get("moe_gap", math.inf), st["moe_gap"])
        for key in keys:
            stats[key] = acc[key]
        return total / (B * T)


def transformers_loss(arch, folder, x, y):
    """transformers' loss of a Hugging Face folder (arch: its class name), or
    None where transformers is not installed."""
    try:
        import transformers
    except ImportError:
        return None
    logits = getattr(transformers, arch).from_pretrained(folder).eval()(x).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


def report_losses(got, ref, tol=1e-5):
    """Prints each loss of got ({who: loss}) against modtrain's ref; returns how
    many are further than tol (relative)."""
    bad = 0
    for who, loss in got.items():
        if loss is None:
            print("(%s is not installed)" % who)
            continue
        rel = abs(loss - ref) / abs(ref)
        print("%s loss %.6f, modtrain %.6f (relative difference %.2e)" % (who, loss, ref, rel))
        bad += rel > tol
    return bad


# ---- self-test: python3 torch_gpt.py (float64, no modtrain needed) ----

def _slow_moe(u, wr, experts, E, Nn, k, cf):
    """The MoE of one block written as a plain loop over tokens and slots."""
    N = len(u)
    Et = E + Nn
    ps, choices = [], []
    for i in range(N):
        z = [sum(u[i][c] * wr[c][e] for c in range(len(u[i]))) for e in range(Et)]
        mx = max(z)
        ex = [math.exp(v - mx) for v in z]
        p = [v / sum(ex) for v in ex]
        ps.append(p)
        choices.append(sorted(range(Et), key=lambda e: (-p[e], e))[:k])
    cap = max(1, int(math.floor(cf * N * k / E)))
    used = [0] * E
    kept = [[False] * k for _ in range(N)]
    for j in range(k):
        for i in range(N):
            e = choices[i][j]
            if e < E and used[e] < cap:
                used[e] += 1
                kept[i][j] = True
    m = []
    for i in range(N):
        out = [0.0] * len(u[i])
        for j in range(k):
            if not kept[i][j]:
                continue
            e = choices[i][j]
            w1, b1, w2, b2 = experts[e]
            hid = []
            for f in range(len(b1)):
                a = b1[f] + sum(u[i][c] * w1[c][f] for c in range(len(u[i])))
                hid.append(0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))))
            for c in range(len(out)):
                out[c] += ps[i][e] * (b2[c] + sum(hid[f] * w2[f][c] for f in range(len(hid))))
        m.append(out)
    aux = 0.0
    for e in range(Et):
        f = sum(1 for i in range(N) for j in range(k) if choices[i][j] == e) / (N * k)
        P = sum(ps[i][e] for i in range(N)) / N
        aux += Et * f * P
    dropped = sum(1 for i in range(N) for j in range(k) if choices[i][j] < E and not kept[i][j])
    return m, aux, dropped


def _selftest():
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    bad = 0
    # 1. one MoE block's forward against the per-token loop
    for E, Nn, k, cf, N in [(4, 0, 1, 1.0, 24), (4, 0, 2, 1.25, 24), (4, 4, 2, 1.0, 24),
                            (3, 2, 1, 0.5, 17), (4, 0, 2, 4.0, 9), (2, 1, 2, 0.1, 5), (4, 0, 1, 1.0, 1)]:
        model = GPT(16, 8, 1, 2, 8, n_expert=E, n_noop_expert=Nn, expert_top_k=k,
                    capacity_factor=cf, expert_d_ff=12)
        with torch.no_grad():
            for v in model.p.values():
                v.copy_(torch.randn_like(v) * 0.5)
        u = torch.randn(N, 8)
        st = {"moe_slots": 0, "moe_noop": 0, "moe_dropped": 0}
        with torch.no_grad():
            m, aux = model.moe_rows("h.0.", u, st)
        ex = [[model.w(f"h.0.mlp.experts.{e}.{n}").tolist() for n in
               ("c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias")] for e in range(E)]
        sm, saux, sdrop = _slow_moe(u.tolist(), model.w("h.0.mlp.router.weight").tolist(), ex, E, Nn, k, cf)
        err = max((m - torch.tensor(sm)).abs().max().item(), abs(aux.item() - saux))
        ok = err < 1e-12 and sdrop == st["moe_dropped"]
        bad += not ok
        print("moe forward E=%d Nn=%d k=%d cf=%g N=%d: %d dropped, %d no-op; error %.1e %s"
              % (E, Nn, k, cf, N, sdrop, st["moe_noop"], err, "ok" if ok else "FAIL"))
    # 2. whole-model gradients by central differences, one direction a tensor
    cases = [
        ("moe top-1 drops", dict(n_expert=4, expert_top_k=1, capacity_factor=1.0), "topk"),
        ("moe top-2 every 2", dict(n_expert=4, expert_top_k=2, capacity_factor=1.25, moe_every=2), "topk"),
        ("integrated MoDE", dict(n_expert=4, n_noop_expert=4, expert_top_k=2, capacity_factor=1.0), "topk"),
        ("staged MoDE topk", dict(route_every=2, capacity=0.5, n_expert=4, expert_top_k=1, moe_every=2), "topk"),
        ("staged MoDE causal", dict(route_every=2, capacity=0.5, n_expert=4, expert_top_k=1, moe_every=2), "causal"),
        ("staged MoDE predictor", dict(route_every=2, capacity=0.5, n_expert=4, expert_top_k=2, moe_every=2,
                                       predictor=True, gate="sigmoid", H=8), "causal"),
    ]
    for name, kw, routing in cases:
        torch.manual_seed(1)
        model = GPT(16, 8, 4, 2, 8, expert_d_ff=12, **kw)
        with torch.no_grad():
            for v in model.p.values():
                v.copy_(v + torch.randn_like(v) * 0.3)
        x = torch.randint(0, 16, (5, 8))
        y = torch.randint(0, 16, (5, 8))

        def objective():
            st = {}
            lm = model(x, y, routing=routing, stats=st, micro_batch=2)
            tot = lm + 0.3 * sum(st["moe"]) / len(st["moe"])
            # (the predictor's BCE is left out: it sees x through a detach, so
            # finite differences would differ from its gradient by design)
            if st["aux"] and not st["pred"]:
                tot = tot + 0.5 * sum(st["aux"]) / len(st["aux"])
            return tot, st

        model.zero_grad()
        tot, st = objective()
        tot.backward()
        worst = 0.0
        for pname, v in model.p.items():
            d = torch.randn_like(v)
            with torch.no_grad():
                v.add_(1e-6 * d)
                fp = objective()[0].item()
                v.sub_(2e-6 * d)
                fm = objective()[0].item()
                v.add_(1e-6 * d)
            fd = (fp - fm) / 2e-6
            an = (v.grad * d).sum().item() if v.grad is not None else 0.0
            err = abs(fd - an) / max(abs(fd), 1e-3)
            if err > 1e-5:
                print("  %s: d/d%s analytic %.8e, finite differences %.8e" % (name, pname, an, fd))
            worst = max(worst, err)
        ok = worst < 1e-5 and st["moe_slots"] > 0
        bad += not ok
        print("gradients, %s (%s): %d slots, %d no-op, %d dropped; worst relative error %.1e %s"
              % (name, routing, st["moe_slots"], st["moe_noop"], st["moe_dropped"], worst,
                 "ok" if ok else "FAIL"))
    return bad


if __name__ == "__main__":
    import sys
    sys.exit(1 if _selftest() else 0)
