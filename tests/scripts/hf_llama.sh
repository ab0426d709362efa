#!/bin/sh
# Hugging Face Llama interchange, against torch_llama.py (an independent
# Llama written from LlamaForCausalLM's semantics):
# - `ckpt export --format hf` of a llama model (grouped-query attention, an
#   untied head) writes a LlamaForCausalLM folder whose config.json alone
#   builds PyTorch's model: its loss on eval's sequences is modtrain's
#   (1e-5 relative; and transformers' where it is installed);
# - the folder imported back (`ckpt import`) is the checkpoint bit for bit;
# - a random-weight folder PyTorch writes (BF16, two shards and their
#   index, a tied head, Llama 3's rotary base; and F16 in one file) loads
#   through `ckpt import` and through init_from to PyTorch's loss: an export
#   and an import that shared one transposition bug would fail here;
# - a dense folder starts a Mixture-of-Depths run (routers fresh): its
#   first loss is the one a dense checkpoint gives;
# - what modtrain cannot build (rope_scaling, attention or MLP biases,
#   another activation, another head_dim, another model_type) is one line,
#   exit 2; so are hostile folders: an index naming a file outside the
#   folder, or the wrong shard, or no map; a cut index; neither weights
#   file; a key of the wrong type or out of range; a layer too many; a
#   tensor too many; a tensor in two shards (nothing imported); an --out
#   holding other files is refused untouched.
. "$(dirname "$0")/lib.sh"
need_torch
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --eval_every 0 --log_every 1000 --seq_len 32 --arch llama --n_kv_head 2 --threads 1"
# llama_loss FOLDER EVAL_JSON: the folder's loss on eval's sequences (torch_llama.py
# and transformers' LlamaForCausalLM where it is installed) against modtrain's
llama_loss() {
    PYTHONPATH="$srcdir/tests/scripts" "$PYTHON" - "$1" data/val_000000.bin "$2" <<'PY'
import json, sys
import torch
from torch_gpt import read_shard, report_losses, transformers_loss
from torch_llama import from_hf
folder, shard, eval_file = sys.argv[1:4]
ev = json.load(open(eval_file))
T, n = ev["seq_len"], ev["sequences"]
toks = read_shard(shard)
x = torch.stack([toks[i * T:i * T + T] for i in range(n)])
y = torch.stack([toks[i * T + 1:i * T + T + 1] for i in range(n)])
with torch.no_grad():
    got = {"torch_llama": from_hf(folder)(x, y).item(),
           "transformers": transformers_loss("LlamaForCausalLM", folder, x, y)}
sys.exit(1 if report_losses(got, ev["loss"]) else 0)
PY
}
eval_json() { "$MODTRAIN" eval --ckpt "$1" --data data/val_000000.bin --seqs 8 --json | tail -n 1 | sed 's/}$/,"seq_len":32}/'; }

# --- modtrain's folder, read by PyTorch and imported back
train_ok dense --steps 20
"$MODTRAIN" ckpt export --ckpt dense/ckpt --format hf --out dense.hf > export.out 2>&1 ||
    { cat export.out; fail "export --format hf"; }
grep -q '"architectures": \["LlamaForCausalLM"\]' dense.hf/config.json &&
    grep -q '"num_key_value_heads": 2' dense.hf/config.json && grep -q '"tie_word_embeddings": false' dense.hf/config.json ||
    fail "config.json: $(cat dense.hf/config.json)"
eval_json dense/ckpt > dense.json
llama_loss dense.hf dense.json > loss.txt && ok "exported folder: $(tr '\n' ';' < loss.txt)" ||
    fail "exported folder's loss: $(cat loss.txt)"
"$MODTRAIN" ckpt import --in dense.hf --ckpt dense.back > /dev/null &&
    "$MODTRAIN" ckpt diff --a dense.back --b dense/ckpt > diff.txt 2>&1 &&
    ok "the folder imported back: $(tail -n 1 diff.txt)" || fail "imported back: $(cat diff.txt)"

# --- PyTorch's folder: BF16, two shards, tied, Llama 3's rotary base
PYTHONPATH="$srcdir/tests/scripts" "$PYTHON" - <<'PY'
import torch
from torch_llama import Llama, write_hf
torch.manual_seed(7)
m = Llama(256, 32, 2, 4, 64, n_kv_head=2, d_ff=96, norm_eps=1e-6, rope_theta=500000.0, tied=True)
with torch.no_grad():
    for v in m.p.values():
        v.copy_(torch.randn_like(v) * 0.1 + (1.0 if v.dim() == 1 else 0.0))
write_hf(m, "torch.hf", dtype="BF16", shards=2)
write_hf(m, "torch16.hf", dtype="F16")
PY
ls torch.hf/model-00002-of-00002.safetensors > /dev/null || fail "PyTorch wrote no shards"
"$MODTRAIN" ckpt import --in torch.hf --ckpt torch.back > import.out 2>&1 || { cat import.out; fail "import of PyTorch's folder"; }
eval_json torch.back > torch.json
llama_loss torch.hf torch.json > loss.txt && ok "PyTorch's BF16 shards, imported: $(tr '\n' ';' < loss.txt)" ||
    fail "PyTorch's folder imported: $(cat loss.txt)"
# the same weights rounded to F16, in one file
"$MODTRAIN" ckpt import --in torch16.hf --ckpt torch16.back > import.out 2>&1 || { cat import.out; fail "import of the F16 folder"; }
eval_json torch16.back > torch16.json
llama_loss torch16.hf torch16.json > loss.txt && ok "PyTorch's F16 file, imported: $(tr '\n' ';' < loss.txt)" ||
    fail "PyTorch's F16 folder imported: $(cat loss.txt)"
# init_from: a run of 0 steps saves the weights it starts from
train_ok init --steps 0 --init_from torch.hf --n_layer 2 --d_ff 96 --tie_embeddings 1 --rope_theta 500000 \
    --norm_eps 1e-6
"$MODTRAIN" ckpt diff --a torch.back --b init/ckpt --tol 0 > diff.txt 2>&1 &&
    ok "init_from the folder starts from its weights: $(tail -n 1 diff.txt)" || fail "init_from the folder: $(cat diff.txt)"

# --- a dense model starts a Mixture-of-Depths run: the routers fresh, the rest loaded
# (from the checkpoint, its folder and its safetensors export alike)
"$MODTRAIN" ckpt export --ckpt dense/ckpt --out dense.st > /dev/null
for src in dense/ckpt dense.hf dense.st; do
    name=mod-$(echo "$src" | tr -c 'a-z\n' _)
    train_ok "$name" --steps 1 --init_from "$src" --route_every 2 --log_every 1 --resume never
    losses "$name" > "$name.loss"
done
cmp -s mod-dense_ckpt.loss mod-dense_hf.loss && cmp -s mod-dense_ckpt.loss mod-dense_st.loss &&
    ok "a dense checkpoint, its folder and its safetensors start the same MoD run: $(cat mod-dense_hf.loss)" ||
    fail "MoD from the dense checkpoint, folder and safetensors differ: $(cat mod-dense_*.loss)"

# --- what modtrain does not build: one line, exit 2
"$PYTHON" - <<'PY'
import json, shutil
base = json.load(open("dense.hf/config.json"))
for name, key, value in [("scaling", "rope_scaling", {"type": "linear", "factor": 2.0}),
                         ("abias", "attention_bias", True), ("mbias", "mlp_bias", True),
                         ("act", "hidden_act", "gelu"), ("hdim", "head_dim", 8),
                         ("mistral", "model_type", "mistral")]:
    shutil.copytree("dense.hf", name + ".hf")
    cfg = dict(base)
    cfg[key] = value
    json.dump(cfg, open(name + ".hf/config.json", "w"))
PY
for c in "scaling:rope_scaling is set, but modtrain's rotary positions are unscaled" \
    "abias:attention_bias is true, but modtrain's attention has no biases" \
    "mbias:mlp_bias is true, but modtrain's MLP has no biases" \
    "act:hidden_act is 'gelu', but modtrain's SwiGLU uses silu" \
    "hdim:head_dim is not hidden_size / num_attention_heads = 64 / 4" \
    "mistral:model_type is 'mistral', not one modtrain builds (gpt2, llama)"; do
    expect_error "${c#*:}" "$MODTRAIN" ckpt import --in "${c%%:*}.hf" --ckpt "x-${c%%:*}"
done
# hostile folders (PyTorch's sharded one, edited): one line each, nothing imported
PYTHONPATH="$srcdir/tests/scripts" "$PYTHON" - <<'PY'
import json, os, shutil
from torch_gpt import read_safetensors, write_safetensors
def folder(name, index=None, config=None, shard1=None, drop=()):
    shutil.copytree("torch.hf", name)
    ix = json.load(open(name + "/model.safetensors.index.json"))
    if index:
        ix = index(ix)
    if isinstance(ix, str):
        open(name + "/model.safetensors.index.json", "w").write(ix)
    else:
        json.dump(ix, open(name + "/model.safetensors.index.json", "w"))
    if config:
        cfg = json.load(open(name + "/config.json"))
        config(cfg)
        json.dump(cfg, open(name + "/config.json", "w"))
    if shard1:
        f = name + "/model-00001-of-00002.safetensors"
        t, _ = read_safetensors(f)
        shard1(t)
        write_safetensors(f, t, "BF16")
    for d in drop:
        os.remove(name + "/" + d)
other, _ = read_safetensors("torch.hf/model-00002-of-00002.safetensors")
first = sorted(other)[0]
def retarget(ix, target):
    ix["weight_map"][first] = target
    return ix
folder("h-escape.hf", index=lambda ix: retarget(ix, "../torch.hf/model-00002-of-00002.safetensors"))
folder("h-wrong.hf", index=lambda ix: retarget(ix, "model-00001-of-00002.safetensors"))
folder("h-map.hf", index=lambda ix: {"weight_map": ["x"]})
folder("h-notjson.hf", index=lambda ix: '{"weight_map": {')
folder("h-none.hf", drop=("model.safetensors.index.json",))
folder("h-type.hf", config=lambda c: c.update(num_hidden_layers="2"))
folder("h-layers.hf", config=lambda c: c.update(num_hidden_layers=3))
folder("h-huge.hf", config=lambda c: c.update(hidden_size=10**9))
folder("h-extra.hf", shard1=lambda t: t.update({"model.layers.0.mlp.bias": t["model.norm.weight"] if "model.norm.weight" in t else next(iter(t.values()))}))
folder("h-twice.hf", shard1=lambda t: t.update({first: other[first]}))
PY
for c in "escape:maps to ../torch.hf/model-00002-of-00002.safetensors, not a file of the folder" \
    "wrong:puts tensor '.*' in model-00001-of-00002.safetensors, which lacks it" \
    "map:has no weight_map object" "notjson:is not JSON" \
    "none:holds neither model.safetensors nor a readable index" \
    "type:num_hidden_layers is not an integer" "layers:lacks tensor 'model.layers.2." \
    "huge:hidden_size = 1000000000 cannot be modtrain's d_model" \
    "extra:holds 21 tensors, and the model its config.json describes takes 20" \
    "twice:appears in two shards"; do
    expect_error "${c#*:}" "$MODTRAIN" ckpt import --in "h-${c%%:*}.hf" --ckpt "x-${c%%:*}"
done
[ -z "$(ls -d x-* 2> /dev/null)" ] && ok "no hostile folder left a checkpoint" || fail "imported: $(ls -d x-*)"
mkdir other && echo notes > other/README.md
expect_error "'other' holds 'README.md', which no export writes" "$MODTRAIN" ckpt export --ckpt dense/ckpt --format hf --out other
[ "$(ls other)" = README.md ] && ok "the refused --out is untouched" || fail "the refused --out changed: $(ls other)"
finish
