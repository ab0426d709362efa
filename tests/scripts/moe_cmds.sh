#!/bin/sh
# The commands on Mixture-of-Experts models (MoE, staged MoDE: routed blocks
# beside MoE blocks, integrated MoDE: no-op experts):
#  1 metrics.jsonl: per MoE block expert_load (shares of slots per expert
#    and no-op) and expert_drop that add up to 1, moe_aux, and
#    flops_per_token from the slots kept (below dense-equivalent when slots
#    drop); the progress line's drop rate
#  2 ep_comm among the phases and ep_bytes: 0 on one rank, > 0 under ep 2
#  3 the banner's model kind, and the whole model's parameters under ep 2
#    equal to ep 1's
#  4 eval --routing: an experts column, k marks per MoE row, dropped marks
#    at eval's expert_drop rate, skip for tokens a routed block left out;
#    routing_plot.sh reads MoE, staged MoDE and MoD files
#  5 sample: the same text for a seed; with nothing dropped the decoded
#    logits of the prompt's last token equal a full forward's (1e-4)
#  6 ckpt export --format hf refused (exit 2, one line); safetensors export
#    names the experts and router; import and init_from round trip bitwise
#  7 ckpt inspect shows the MoE keys
# MODTRAIN_SKIP_SLOW (the sanitizer pass): no integ model (moe has no-op
# experts too), ep 2's parameters compared with moe16's (the model ep1 has)
# rather than an ep1 run, and the repeated sample of one model, not three.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --eval_every 0 --log_every 4 --steps 8"
train_ok dense
train_ok mod --route_every 2
train_ok moe --n_expert 4 --expert_top_k 2 --n_noop_expert 1 --capacity_factor 0.5
train_ok moe16 --n_expert 4 --expert_top_k 2 --capacity_factor 16
train_ok staged --n_expert 4 --expert_top_k 2 --route_every 2 --capacity 0.5 --capacity_factor 16
[ $slow = 0 ] || train_ok integ --n_expert 4 --expert_top_k 1 --n_noop_expert 2 --capacity_factor 16

# ---- 1, 2: metrics
"$PYTHON" - moe/metrics.jsonl dense/metrics.jsonl <<'PY' && ok "metrics: expert_load + expert_drop = 1 per block, moe_aux, FLOPs from the slots kept, ep_comm 0" || fail "MoE metrics"
import json, sys
E, Nn, k, C, T, L, V, Fe = 4, 1, 2, 64, 64, 2, 256, 256
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert len(rows) == 8, len(rows)
def fpt(slots):  # model_flops_per_token_moe, every block MoE, no routing
    f = 6.0 * V * C
    for s in slots:
        f += 6.0 * (4.0 * C * C + s * 2.0 * C * Fe + C * (E + Nn)) + 12.0 * T * C
    return f
dropped = 0
for r in rows:
    assert len(r["expert_load"]) == L and len(r["expert_drop"]) == L, r
    for load, drop in zip(r["expert_load"], r["expert_drop"]):
        assert len(load) == E + Nn and all(0 <= x <= 1 for x in load), load
        assert abs(sum(load) + drop - 1) < 1e-5, (load, drop)
        dropped += drop
    assert r["moe_aux"] > 0.5, r["moe_aux"]  # Switch's loss: 1 when balanced
    want = fpt([sum(l[:E]) * k for l in r["expert_load"]])
    assert abs(r["flops_per_token"] - want) <= 1e-6 * want + 1, (r["flops_per_token"], want)
    assert r["ep_bytes"] == 0 and r["phase_ms"]["ep_comm"] == 0 and "ep_comm" in r["wait_ms"], r
assert dropped > 0, "capacity_factor 0.5 dropped nothing"
assert any(r["flops_ratio_dense"] < 1 for r in rows), [r["flops_ratio_dense"] for r in rows]
d = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
assert all("expert_load" not in r and "moe_aux" not in r and r["ep_bytes"] == 0 for r in d)
assert all(abs(r["flops_ratio_dense"] - 1) < 1e-9 for r in d)
PY
grep -q '^step 8/8 | loss [0-9.]* | experts drop [0-9.]*% |' moe.log && ok "progress line: $(grep '^step 8/8' moe.log)" ||
    fail "no drop rate on the progress line"

$MPIRUN -np 2 "$MODTRAIN" train $common --threads 1 --n_expert 4 --expert_top_k 2 --ep 2 --run_dir ep2 > ep2.log 2>&1 ||
    { cat ep2.log; fail "ep 2: train"; }
one=ep1 # the parameters of ep 1
[ $slow = 1 ] || one=moe16
[ $slow = 0 ] || train_ok ep1 --n_expert 4 --expert_top_k 2
"$PYTHON" - ep2/metrics.jsonl <<'PY' && ok "ep 2: ep_bytes and ep_comm > 0" || fail "ep 2 metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert rows and all(r["ep_bytes"] > 0 for r in rows), [r["ep_bytes"] for r in rows]
assert sum(r["phase_ms"]["ep_comm"] for r in rows) > 0
PY
grep -q '^  ep_comm ' ep2.log && ok "the run's phase table lists ep_comm" || fail "no ep_comm in the phase table"

# ---- 3: the banner
kind() { grep -m 1 '^model: ' "$1.log"; }
kind dense | grep -q '^model: dense$' && kind mod | grep -q '^model: Mixture-of-Depths$' &&
    kind moe | grep -q '^model: integrated MoDE (no-op experts) | 2 of 2 blocks MoE: 4 experts + 1 no-op, top-2, width 256, capacity factor 0.5 ' &&
    kind moe16 | grep -q '^model: Mixture-of-Experts | 2 of 2 blocks MoE: 4 experts, top-2,' &&
    kind staged | grep -q '^model: staged MoDE (routed blocks beside MoE blocks) |' &&
    { [ $slow = 0 ] || kind integ | grep -q '^model: integrated MoDE (no-op experts) | .* 4 experts + 2 no-op, top-1'; } &&
    ok "banner kinds: $(kind staged)" || fail "banner kinds: $(kind dense; kind mod; kind moe; kind staged; kind integ)"
p1=$(grep -m 1 '^modtrain [0-9]' $one.log | sed 's/.*| \([0-9.]*M\) parameters.*/\1/')
p2=$(grep -m 1 '^modtrain [0-9]' ep2.log | sed 's/.*| \([0-9.]*M\) parameters.*/\1/')
pd=$(grep -m 1 '^modtrain [0-9]' dense.log | sed 's/.*| \([0-9.]*M\) parameters.*/\1/')
[ "$p1" = "$p2" ] && [ "$p1" = 0.32M ] && [ "$pd" != "$p1" ] && grep -q 'ep 2 | experts 0.26M of the 0.32M parameters' ep2.log &&
    ok "parameters under ep 2 = ep 1 = $p1 (every expert)" || fail "parameters: ep1 $p1 ep2 $p2 dense $pd"

# ---- 4: eval --routing (a FIFO named for the table: one line, no hang)
mkfifo fifo.tsv
rc=0
timeout -k 10 10 "$MODTRAIN" eval --ckpt mod/ckpt --data data/val_000000.bin --seqs 8 --routing fifo.tsv \
    > fifo.out 2> fifo.err || rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l < fifo.err)" -eq 1 ] && grep -q "'fifo.tsv' is a FIFO, not a file" fifo.err &&
    ok "eval --routing into a FIFO: $(cat fifo.err)" || fail "eval --routing into a FIFO: exit $rc, $(cat fifo.err)"
models="moe staged integ mod"
[ $slow = 1 ] || models="moe staged mod"
for n in $models; do
    "$MODTRAIN" eval --ckpt $n/ckpt --data data/val_000000.bin --seqs 8 --json --routing $n.tsv --routing_seqs 8 > $n.json ||
        fail "$n: eval --routing"
done
"$PYTHON" - $slow <<'PY' && ok "eval --routing: experts marks, drops at eval's rate, skip in routed blocks" || fail "eval --routing on MoE"
import json, re, sys
def rows(n):
    lines = open(n + ".tsv").read().split("\n")
    return lines[0], lines[1].split("\t"), [l.split("\t") for l in lines[2:] if l]
h, cols, r = rows("moe")
assert "n_expert 4, n_noop_expert 1, expert_top_k 2, capacity_factor 0.5" in h, h
assert cols[-1] == "experts" and len(cols) == 10, cols
mark = re.compile(r"^(d?[0-4]|n0)$")
slots = drops = 0
for x in r:
    assert x[5:9] == ["-"] * 4, x
    m = x[9].split(",")
    assert len(m) == 2 and all(mark.match(v) for v in m), x
    slots += 2; drops += sum(v.startswith("d") for v in m)
assert len(r) == 8 * 64 * 2, len(r)
j = json.load(open("moe.json"))
assert drops > 0 and abs(drops / slots - j["expert_drop"]) < 1e-6, (drops / slots, j)
h, cols, r = rows("staged")
b1 = [x for x in r if x[2] == "1"]  # routed and MoE
assert b1 and all(x[5] in "01" for x in b1)
assert all((x[9] == "skip") == (x[5] == "0") for x in b1), "skip is not the tokens top-k left out"
assert sum(x[9] == "skip" for x in b1) > 0 and sum(x[9] != "skip" for x in b1) > 0, "no skip/kept in block 1"
if sys.argv[1] == "1":  # integ (not under MODTRAIN_SKIP_SLOW)
    h, cols, r = rows("integ")
    assert all(re.match(r"^(n[01]|[0-3])$", x[9]) for x in r), set(x[9] for x in r)
h, cols, r = rows("mod")
assert len(cols) == 9 and "n_expert" not in h, cols  # a MoD file as before
PY
for n in $models; do
    bash "$srcdir/jobs/routing_plot.sh" $n.tsv plot_$n --min_count 2 > plot_$n.log 2>&1 || { cat plot_$n.log; fail "routing_plot.sh on $n"; }
done
grep -q '^block 0 experts: 1024 slots, [0-9.]*% dropped; kept by expert 0 [0-9.]*% expert 1 [0-9.]*% expert 2 [0-9.]*% expert 3 [0-9.]*% no-op 0 [0-9.]*%$' plot_moe.txt &&
    grep -q '^block 1 experts: .* tokens not routed to it' plot_staged.txt && grep -q '^block 1: chose' plot_staged.txt &&
    grep -q '^block 1: chose' plot_mod.txt && ! grep -q experts plot_mod.txt &&
    ok "routing_plot.sh: experts tables for MoE, MoD tables as before" || fail "routing_plot.sh tables"

# ---- 5: sampling
seeded="moe staged integ"
[ $slow = 1 ] || seeded=moe # the same sampler whatever the model
for n in $seeded; do
    a=$("$MODTRAIN" sample --ckpt $n/ckpt --tokens 40 --seed 7 --prompt "The " | od -c)
    b=$("$MODTRAIN" sample --ckpt $n/ckpt --tokens 40 --seed 7 --prompt "The " | od -c)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok "$n: sampling repeats for a seed" || fail "$n: sampling differs for seed 7"
done
decoded="moe16 staged integ"
[ $slow = 1 ] || decoded="moe16 staged"
for n in $decoded; do
    "$MODTRAIN" eval --ckpt $n/ckpt --data data/val_000000.bin --seqs 1 --logits full_$n.txt --routing seq_$n.tsv --routing_seqs 1 > /dev/null ||
        fail "$n: eval --logits"
    "$PYTHON" - "$MODTRAIN" $n <<'PY' && ok "$n: decoded logits = full forward's (1e-4)" || fail "$n: decoded logits differ from the full forward"
import subprocess, sys
M, n = sys.argv[1], sys.argv[2]
r = [l.split("\t") for l in open("seq_%s.tsv" % n).read().split("\n")[2:] if l]
toks = [int(x[3]) for x in r if x[0] == "0" and x[2] == r[0][2]]
assert len(toks) == 64
subprocess.run([M, "sample", "--ckpt", n + "/ckpt", "--prompt", bytes(toks), "--tokens", "1",
                "--temperature", "0", "--logits", "dec_%s.txt" % n], check=True, stdout=subprocess.DEVNULL)
a = [float(x) for x in open("full_%s.txt" % n)]
b = [float(x) for x in open("dec_%s.txt" % n)]
assert len(a) == len(b) == 256
d = max(abs(x - y) for x, y in zip(a, b))
assert d <= 1e-4, d
print("max difference", d)
PY
done

# ---- 6: export
set +e
"$MODTRAIN" ckpt export --ckpt moe/ckpt --format hf --out hfdir > hf.out 2> hf.err
rc=$?
set -e
[ $rc = 2 ] && [ "$(wc -l < hf.err)" = 1 ] && grep -q "Mixture-of-Experts model (4 experts in 2 of 2 blocks): Hugging Face's GPT-2 architecture has no experts; use --format safetensors" hf.err &&
    [ ! -e hfdir/model.safetensors ] && ok "hf export refused: $(cat hf.err)" || fail "hf export of MoE: rc $rc, $(cat hf.err)"
"$MODTRAIN" ckpt export --ckpt moe/ckpt --format safetensors --out moe.st > /dev/null
"$PYTHON" - moe.st <<'PY' && ok "safetensors export: experts and router by name and shape" || fail "safetensors export names"
import json, struct, sys
f = open(sys.argv[1], "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
m = h.pop("__metadata__")
assert m["n_expert"] == "4" and m["n_noop_expert"] == "1" and m["expert_top_k"] == "2", m
for l in range(2):
    p = "h.%d.mlp." % l
    assert h[p + "router.weight"]["shape"] == [64, 5]
    assert p + "c_fc.weight" not in h
    for e in range(4):
        q = p + "experts.%d." % e
        assert h[q + "c_fc.weight"]["shape"] == [64, 256] and h[q + "c_fc.bias"]["shape"] == [256]
        assert h[q + "c_proj.weight"]["shape"] == [256, 64] and h[q + "c_proj.bias"]["shape"] == [64]
PY
"$MODTRAIN" ckpt import --in moe.st --ckpt imported > /dev/null
a=$("$MODTRAIN" eval --ckpt moe/ckpt --data data/val_000000.bin --seqs 8 --json)
b=$("$MODTRAIN" eval --ckpt imported --data data/val_000000.bin --seqs 8 --json)
[ "$a" = "$b" ] && ok "import(export(MoE)) evaluates identically: $a" || fail "eval differs: $a vs $b"
# init_from the file, one step at lr 0: the weights come back bit for bit
"$MODTRAIN" train $common --n_expert 4 --expert_top_k 2 --n_noop_expert 1 --capacity_factor 0.5 --init_from moe.st \
    --steps 1 --lr 0 --min_lr 0 --warmup_steps 0 --run_dir initb > initb.log 2>&1 || { cat initb.log; fail "init_from safetensors"; }
"$MODTRAIN" ckpt export --ckpt initb/ckpt --format safetensors --out initb.st > /dev/null
"$PYTHON" - moe.st initb.st <<'PY' && ok "init_from an MoE safetensors file round trips bitwise" || fail "init_from round trip"
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__")
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys() and any("experts" in k for k in a)
assert all(a[k] == b[k] for k in a), [k for k in a if a[k] != b[k]]
PY

# ---- 7: the checkpoint's config
kvs="n_expert:4 n_noop_expert:2 expert_top_k:1 capacity_factor:16 moe_every:1 expert_d_ff:0" shown=integ
[ $slow = 1 ] || kvs="n_expert:4 n_noop_expert:1 expert_top_k:2 capacity_factor:0.5 moe_every:1 expert_d_ff:0" shown=moe
"$MODTRAIN" ckpt inspect --ckpt $shown/ckpt > inspect.txt
for kv in $kvs; do
    kv="${kv%:*} +${kv#*:}"
    grep -Eq "^  config\.${kv% *} ${kv#* }$" inspect.txt || fail "ckpt inspect lacks $kv"
done
ok "ckpt inspect shows the MoE keys"
finish
