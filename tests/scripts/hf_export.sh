#!/bin/sh
# `ckpt export --format hf` writes a Hugging Face folder:
# - config.json parses, says GPT-2 (model_type, architectures, gelu_new,
#   eps 1e-5) and its sizes are the checkpoint's (`ckpt inspect`) and those
#   of the tensors in model.safetensors;
# - model.safetensors imported back (`ckpt import`), and the folder itself
#   (read from its config.json), hold the checkpoint's weights bit for bit
#   (`ckpt diff`);
# - the folder read from config.json alone by an independent PyTorch GPT-2
#   (torch_gpt.py; and by transformers' GPT2LMHeadModel where it is
#   installed) gives modtrain's eval loss;
# - a Mixture-of-Depths model's folder leaves out the routers and predictors
#   and says so in one line: the rest is the checkpoint's dense part bit for
#   bit, and PyTorch's dense GPT-2 of it gives the loss modtrain computes for
#   that dense model;
# - a bad --out or --format is one line, exit 2, and writes nothing.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
have_torch=0
"$PYTHON" -c "import torch" 2> /dev/null && have_torch=1
[ "$have_torch" = 1 ] || echo "note: $PYTHON cannot import torch (apt-get install python3-torch): the PyTorch checks are left out"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --eval_every 0 --log_every 1000 --steps 20 --seq_len 32"
"$MODTRAIN" train $common --run_dir dense > dense.log 2>&1 || { cat dense.log; fail "dense training failed"; finish; }
"$MODTRAIN" train $common --run_dir mod --route_every 2 --causal_router predictor --predictor_hidden 16 \
    > mod.log 2>&1 || { cat mod.log; fail "MoD training failed"; finish; }

# check_folder NAME CKPT: config.json against `ckpt inspect` and the tensors
check_folder() {
    "$MODTRAIN" ckpt inspect --ckpt "$2" > "$1.inspect"
    "$PYTHON" - "$1" "$1.inspect" <<'PY'
import json, struct, sys
folder, inspect = sys.argv[1:3]
cfg = json.load(open(folder + "/config.json"))
ck = {}
for line in open(inspect):
    w = line.split()
    if len(w) == 2 and w[0].startswith("config."):
        ck[w[0][7:]] = w[1]
want = {"n_embd": ck["d_model"], "n_layer": ck["n_layer"], "n_head": ck["n_head"],
        "n_positions": ck["seq_len"], "n_ctx": ck["seq_len"], "vocab_size": ck["vocab_size"]}
bad = {k: (cfg.get(k), v) for k, v in want.items() if str(cfg.get(k)) != v}
assert not bad, "config.json against the checkpoint: %s" % bad
assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"], cfg
assert cfg["activation_function"] == "gelu_new" and cfg["layer_norm_epsilon"] == 1e-5, cfg
assert cfg["tie_word_embeddings"] is True, cfg
f = open(folder + "/model.safetensors", "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
h.pop("__metadata__")
C, V, T, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
assert h["wte.weight"]["shape"] == [V, C] and h["wpe.weight"]["shape"] == [T, C], h["wte.weight"]
blocks = {int(k.split(".")[1]) for k in h if k.startswith("h.")}
assert blocks == set(range(L)), blocks
assert h["h.0.mlp.c_fc.weight"]["shape"] == [C, cfg["n_inner"]], h["h.0.mlp.c_fc.weight"]
mod = [k for k in h if ".router." in k or ".predictor." in k]
assert not mod, "tensors Hugging Face's GPT-2 cannot run: %s" % mod
print("%d tensors, n_embd %d, n_layer %d, n_head %d, n_positions %d, vocab_size %d" %
      (len(h), C, L, cfg["n_head"], T, V))
PY
}

# torch_loss NAME EVAL_JSON: the folder's loss on eval's sequences, by a
# GPT-2 built from config.json alone (torch_gpt.py, and transformers when
# it is installed), against modtrain's
torch_loss() {
    PYTHONPATH="$srcdir/tests/scripts" "$PYTHON" - "$1" data/val_000000.bin "$2" <<'PY'
import json, sys
import torch
from torch_gpt import GPT, read_safetensors, read_shard, report_losses, transformers_loss
folder, shard, eval_file = sys.argv[1:4]
cfg = json.load(open(folder + "/config.json"))
weights, _ = read_safetensors(folder + "/model.safetensors")
ev = json.load(open(eval_file))
T, n = cfg["n_positions"], ev["sequences"]
toks = read_shard(shard)
x = torch.stack([toks[i * T:i * T + T] for i in range(n)])
y = torch.stack([toks[i * T + 1:i * T + T + 1] for i in range(n)])
model = GPT(cfg["vocab_size"], T, cfg["n_layer"], cfg["n_head"], cfg["n_embd"])
model.load(weights)
with torch.no_grad():
    got = {"torch_gpt": model(x, y).item(),
           "transformers": transformers_loss("GPT2LMHeadModel", folder, x, y)}
sys.exit(1 if report_losses(got, ev["loss"]) else 0)
PY
}

# --- a dense model
"$MODTRAIN" ckpt export --ckpt dense/ckpt --format hf --out dense.hf > export.out 2> export.err
[ ! -s export.err ] && grep -q "wrote dense.hf/model.safetensors and dense.hf/config.json (step 20)" export.out &&
    ok "dense export: $(cat export.out)" || fail "dense export: '$(cat export.out export.err)'"
check_folder dense.hf dense/ckpt > check.log 2>&1 && ok "dense config.json: $(cat check.log)" ||
    fail "dense config.json: $(cat check.log)"
"$MODTRAIN" ckpt import --in dense.hf --ckpt dense.folder > /dev/null &&
    "$MODTRAIN" ckpt diff --a dense.folder --b dense/ckpt > diff.log 2>&1 &&
    ok "dense folder imported back as a folder (config.json and model.safetensors): $(tail -n 1 diff.log)" ||
    fail "dense folder imported as a folder: $(cat diff.log)"
"$MODTRAIN" ckpt import --in dense.hf/model.safetensors --ckpt dense.back > /dev/null
"$MODTRAIN" ckpt diff --a dense.back --b dense/ckpt > diff.log 2>&1 &&
    ok "dense folder imported back: $(tail -n 1 diff.log)" || fail "dense folder imported back: $(cat diff.log)"
if [ "$have_torch" = 1 ]; then
    "$MODTRAIN" eval --ckpt dense/ckpt --data data/val_000000.bin --seqs 8 --micro_batch 4 --json > dense.json
    torch_loss dense.hf dense.json > torch.log 2>&1 && ok "dense folder in PyTorch: $(tr '\n' ' ' < torch.log)" ||
        fail "dense folder in PyTorch: $(cat torch.log)"
fi

# --- a Mixture-of-Depths model: the routers and predictors left out, in one line
"$MODTRAIN" ckpt export --ckpt mod/ckpt --format hf --out mod.hf > export.out 2> export.err
[ "$(wc -l < export.err)" = 1 ] &&
    grep -q "warning: ckpt export: 'mod/ckpt' is a Mixture-of-Depths model: the folder leaves out the routers and predictors of block 1 (6 tensors)" export.err &&
    ok "MoD export: $(cat export.err)" || fail "MoD export: '$(cat export.err)'"
check_folder mod.hf mod/ckpt > check.log 2>&1 && ok "MoD config.json: $(cat check.log)" ||
    fail "MoD config.json: $(cat check.log)"
"$MODTRAIN" ckpt import --in mod.hf/model.safetensors --ckpt mod.back > /dev/null
"$MODTRAIN" ckpt diff --a mod.back --b mod/ckpt > diff.log 2>&1 &&
    ok "MoD folder: the checkpoint's dense part, $(tail -n 1 diff.log)" || fail "MoD folder imported back: $(cat diff.log)"
if [ "$have_torch" = 1 ]; then
    "$MODTRAIN" eval --ckpt mod.back --data data/val_000000.bin --seqs 8 --micro_batch 4 --json > modback.json
    torch_loss mod.hf modback.json > torch.log 2>&1 && ok "MoD folder in PyTorch, as a dense GPT-2: $(tr '\n' ' ' < torch.log)" ||
        fail "MoD folder in PyTorch: $(cat torch.log)"
fi

# --- bad --out and --format
touch file.st
mkdir -p keep
for bad in "hf --out file.st:--out 'file.st' exists and is not a folder" \
    "hf --out nowhere/x:--out 'nowhere/x': its parent 'nowhere' is not a folder" \
    "onnx --out keep/x:--format 'onnx' is not available (expected safetensors or hf)"; do
    rc=0
    # shellcheck disable=SC2086 # the options are words
    "$MODTRAIN" ckpt export --ckpt dense/ckpt --format ${bad%%:*} > bad.out 2> bad.err || rc=$?
    [ "$rc" = 2 ] && [ "$(wc -l < bad.err)" = 1 ] && grep -q -- "${bad#*:}" bad.err && [ ! -s bad.out ] &&
        [ -z "$(ls keep)" ] && [ ! -s file.st ] && ok "refused: $(cat bad.err)" || fail "--format ${bad%%:*}: exit $rc, '$(cat bad.err)'"
done
finish
