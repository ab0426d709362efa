#!/bin/sh
# Export to safetensors and import back give the same model (same eval loss
# bit for bit); the export carries Hugging Face GPT-2 names, shapes and the
# config metadata; an imported model trains; an interrupted run resumed from
# its checkpoint ends bitwise equal to an uninterrupted one; broken files are
# clear errors.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --eval_every 0 --log_every 1000"
"$MODTRAIN" train $common --steps 20 --ckpt_every 10 --run_dir full > full.log 2>&1 ||
    { cat full.log; fail "training failed"; finish; }

"$MODTRAIN" ckpt export --ckpt full/ckpt --format safetensors --out model.safetensors
"$PYTHON" - model.safetensors <<'PY' && ok "export: HF GPT-2 names, shapes, metadata" || fail "export header"
import json, struct, sys
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
m = h.pop("__metadata__")
assert m["n_layer"] == "2" and m["d_model"] == "64" and m["n_head"] == "4", m
assert m["vocab_size"] == "256" and m["seq_len"] == "64" and m["route_every"] == "0", m
C = 64
want = {"wte.weight": [256, C], "wpe.weight": [64, C], "ln_f.weight": [C], "ln_f.bias": [C]}
for i in range(2):
    p = "h.%d." % i
    want.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C], p + "ln_2.weight": [C],
                 p + "ln_2.bias": [C], p + "attn.c_attn.weight": [C, 3 * C],
                 p + "attn.c_attn.bias": [3 * C], p + "attn.c_proj.weight": [C, C],
                 p + "attn.c_proj.bias": [C], p + "mlp.c_fc.weight": [C, 4 * C],
                 p + "mlp.c_fc.bias": [4 * C], p + "mlp.c_proj.weight": [4 * C, C],
                 p + "mlp.c_proj.bias": [C]})
got = {k: v["shape"] for k, v in h.items()}
assert got == want, set(got.items()) ^ set(want.items())
assert all(v["dtype"] == "F32" for v in h.values())
PY

"$MODTRAIN" ckpt import --in model.safetensors --ckpt imported > import.log
a=$("$MODTRAIN" eval --ckpt full/ckpt --data data/val_000000.bin --seqs 32 --json)
b=$("$MODTRAIN" eval --ckpt imported --data data/val_000000.bin --seqs 32 --json)
[ "$a" = "$b" ] && ok "import(export(x)) evaluates identically: $a" || fail "eval differs: $a vs $b"

# an imported model can be trained further
"$MODTRAIN" train $common --resume imported --steps 25 --run_dir cont > cont.log 2>&1 &&
    grep -q "resume: loaded imported/step-00000020 (step 20)" cont.log &&
    [ "$(grep -c '"loss"' cont/metrics.jsonl)" -eq 5 ] &&
    ok "training resumes from an imported checkpoint at step 20" ||
    { cat cont.log; fail "training from an imported checkpoint"; }

# resume = auto: 10 steps, stop, then the rest, equals 20 straight
"$MODTRAIN" train $common --steps 20 --ckpt_every 10 --run_dir part > /dev/null 2>&1
rm -rf part/ckpt/step-00000020
printf 'step-00000010\n' > part/ckpt/latest
"$MODTRAIN" train $common --steps 20 --ckpt_every 10 --run_dir part > part.log 2>&1
grep -q "resume: loaded part/ckpt/step-00000010 (step 10)" part.log || fail "auto resume did not load step 10"
same_ckpt full/ckpt/step-00000020 part/ckpt/step-00000020 &&
    ok "10 + resume + 10 steps = 20 steps, bit for bit" || fail "resumed run differs from uninterrupted run"

# a model config that differs from the checkpoint's is refused, naming the key
set +e
"$MODTRAIN" train $common --steps 30 --run_dir full --n_layer 3 > mismatch.log 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "has n_layer = 2 but this run has n_layer = 3" mismatch.log &&
    ok "config mismatch names n_layer" || { cat mismatch.log; fail "config mismatch"; }

# a Mixture-of-Depths model carries its router and predictor tensors
"$MODTRAIN" train $common --steps 5 --route_every 2 --causal_router predictor --predictor_hidden 16 \
    --run_dir mod > mod.log 2>&1 || { cat mod.log; fail "MoD training failed"; }
"$MODTRAIN" ckpt export --ckpt mod/ckpt --format safetensors --out mod.safetensors > /dev/null
"$PYTHON" - mod.safetensors <<'PY' && ok "MoD export: router and predictor tensors, metadata" || fail "MoD export header"
import json, struct, sys
f = open(sys.argv[1], "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
m = h.pop("__metadata__")
assert m["route_every"] == "2" and m["causal_router"] == "predictor" and m["capacity"] == "0.125", m
assert m["router_gate"] == "raw" and m["predictor_hidden"] == "16", m
got = {k: v["shape"] for k, v in h.items() if "router" in k or "predictor" in k}
want = {"h.1.router.weight": [64], "h.1.router.bias": [1],
        "h.1.predictor.c_fc.weight": [64, 16], "h.1.predictor.c_fc.bias": [16],
        "h.1.predictor.c_proj.weight": [16, 1], "h.1.predictor.c_proj.bias": [1]}
assert got == want, got
PY
"$MODTRAIN" ckpt import --in mod.safetensors --ckpt modimp > /dev/null
a=$("$MODTRAIN" eval --ckpt mod/ckpt --data data/val_000000.bin --seqs 16 --json)
b=$("$MODTRAIN" eval --ckpt modimp --data data/val_000000.bin --seqs 16 --json)
[ "$a" = "$b" ] && ok "MoD import(export(x)) evaluates identically: $a" || fail "MoD eval differs: $a vs $b"

# broken safetensors files
head -c 100 model.safetensors > short.safetensors
set +e
"$MODTRAIN" ckpt import --in short.safetensors --ckpt x > err.log 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "short.safetensors' is truncated" err.log && ok "truncated safetensors: $(cat err.log)" ||
    { cat err.log; fail "truncated safetensors"; }
finish
