#!/bin/sh
# Damaged and malicious safetensors files: each is refused by `ckpt import`
# with exit 2 and one line naming the file and what is wrong, before any
# model is built (small peak RSS) and without creating the checkpoint. A
# header whose length leaves the data unaligned is valid and imports the
# same weights.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
PEAKRSS=${PEAKRSS:-$(dirname "$MODTRAIN")/tests/tools/peakrss}
printf 'the quick brown fox jumps over the lazy dog\n%%\n%.0s' $(seq 1 400) > text.txt
"$MODTRAIN" prep --out data --doc-sep % text.txt > /dev/null
"$MODTRAIN" train --train_data data/train_000000.bin --val_data data/val_000000.bin --run_dir run --seq_len 16 \
    --d_model 32 --n_head 2 --n_layer 4 --route_every 2 --batch_size 2 --steps 2 > /dev/null
"$MODTRAIN" ckpt export --ckpt run/ckpt --out good.safetensors > /dev/null

# make CASE: writes CASE.safetensors, good.safetensors changed as CASE says
make_case() {
    "$PYTHON" - good.safetensors "$1" <<'PY'
import json, struct, sys
src, case = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
data = raw[8 + n:]
meta = head.pop("__metadata__")
names = list(head)
tensors = {k: [v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]] for k, v in head.items()}

def pack(meta, tensors, pad=8, tail=b"", offsets=None, text=None, extra=b""):
    h, off = {"__metadata__": meta}, 0
    for k, (dt, shape, b) in tensors.items():
        h[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    if offsets:
        for k, o in offsets.items(): h[k]["data_offsets"] = o
    js = (text or json.dumps(h)).encode() + tail
    while pad and len(js) % pad: js += b" "
    body = b"".join(b for _, _, b in tensors.values()) + extra
    return struct.pack("<Q", len(js)) + js + body

first, second = names[0], names[1]
if case == "unaligned":   # header length 8k + 3: every float unaligned
    out = pack(meta, tensors, pad=0, tail=b" " * ((3 - len(json.dumps({"__metadata__": meta})) % 8) % 8 + 8))
    n2 = struct.unpack("<Q", out[:8])[0]
    assert n2 % 8 != 0
elif case == "step_neg": meta["step"] = "-5"; out = pack(meta, tensors)
elif case == "step_big": meta["step"] = "123456789"; out = pack(meta, tensors)
elif case == "layers_big": meta["n_layer"] = "4096"; out = pack(meta, tensors)
elif case == "layers_small": meta["n_layer"] = "2"; out = pack(meta, tensors)
elif case == "dmodel_big": meta["d_model"] = "65536"; out = pack(meta, tensors)
elif case == "overlap":
    out = pack(meta, tensors, offsets={second: [0, len(tensors[second][2])]})
elif case == "gap":
    b = tensors[first][2]
    out = pack(meta, tensors, offsets={first: [4, 4 + len(b)]}, extra=b"\0" * 4)
    # every other tensor moves 4 bytes on as well
    h = json.loads(out[8:8 + struct.unpack("<Q", out[:8])[0]])
    for k in names[1:]: h[k]["data_offsets"] = [x + 4 for x in h[k]["data_offsets"]]
    out = pack(meta, tensors, offsets={k: h[k]["data_offsets"] for k in names}, extra=b"\0" * 4)
elif case == "after_json": out = pack(meta, tensors, tail=b"garbage")
elif case == "overflow":
    tensors["h.0.ln_1.weight"][1] = [4294967296, 4294967296]
    tensors["h.0.ln_1.weight"][2] = b""
    out = pack(meta, tensors)
elif case == "shape1d":
    tensors["ln_f.weight"][1] = [3]
    tensors["ln_f.weight"][2] = tensors["ln_f.weight"][2][:12]
    out = pack(meta, tensors)
elif case == "twice":
    full = pack(meta, tensors)
    h = json.loads(full[8:8 + struct.unpack("<Q", full[:8])[0]])
    text = json.dumps(h)
    dup = '"%s": %s' % (first, json.dumps(h[first]))
    text = text[:-1] + ", " + dup + "}"
    out = pack(meta, tensors, text=text)
elif case == "f64": tensors[first][0] = "F64"; out = pack(meta, tensors)
elif case == "nan":
    b = bytearray(tensors["h.1.router.weight"][2]); b[4:8] = struct.pack("<f", float("nan"))
    tensors["h.1.router.weight"][2] = bytes(b); out = pack(meta, tensors)
elif case in ("masks", "mask_beyond"):
    # Hugging Face's GPT-2 files hold each block's causal mask as a buffer
    for l in ([0, 1, 2, 3] if case == "masks" else [7]):
        tensors["h.%d.attn.bias" % l] = ["F32", [1, 1, 16, 16], b"\0" * 1024]
    out = pack(meta, tensors)
elif case == "hlen": out = struct.pack("<Q", 2**63 + 5) + raw[8:]
elif case == "deep": out = pack(meta, tensors, text='{"a":' * 100000)
elif case == "many":  # 70,000 tiny entries: refused at the cap, not after n^2 name checks
    entry = '"t%d":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    out = pack(meta, tensors, text="{" + ",".join(entry % i for i in range(70000)) + "}")
elif case == "many_meta":
    meta.update({"k%d" % i: "v" for i in range(2000)}); out = pack(meta, tensors)
elif case == "meta_twice":  # the header with its "step" metadata key written twice
    full = pack(meta, tensors)
    text = full[8:8 + struct.unpack("<Q", full[:8])[0]].decode().rstrip()
    text = text.replace('"__metadata__": {', '"__metadata__": {"step": "1", ', 1)
    out = pack(meta, tensors, text=text)
open(case + ".safetensors", "wb").write(out)
PY
}

# refused CASE PATTERN: exit 2, one line naming the file and matching
# PATTERN, small peak RSS, no checkpoint written
refused_import() {
    make_case "$1"
    set +e
    "$PEAKRSS" rss.txt "$MODTRAIN" ckpt import --in "$1.safetensors" --ckpt "ck_$1" > out.txt 2> err.txt
    rc=$?
    set -e
    if [ "$rc" -ne 2 ] || [ "$(wc -l < err.txt)" -ne 1 ] || ! grep -q -- "'$1.safetensors'.*$2" err.txt; then
        fail "$1: exit $rc, expected 2 and one line /$2/: $(cat err.txt)"
    elif [ "$(cat rss.txt)" -ge 262144 ]; then
        fail "$1: touched $(cat rss.txt) KiB before refusing"
    elif [ -e "ck_$1" ]; then
        fail "$1: created ck_$1"
    else
        ok "$1 ($(cat rss.txt) KiB): $(cat err.txt)"
    fi
}

refused_import step_neg "step = '-5' (expected an integer in \[0, 99999999\])"
refused_import step_big "step = '123456789'"
refused_import layers_big "lacks tensor 'h.4.ln_1.weight'"
refused_import layers_small "tensor 'h.2.ln_1.weight' is not part of the model its metadata describes (n_layer = 2"
refused_import dmodel_big "tensor 'wte.weight' has shape \[256, 32\], the model needs \[256, 65536\]"
refused_import overlap "overlap in the data section"
refused_import gap "bytes \[0, 4) of the data section belong to no tensor"
refused_import after_json "malformed JSON header at byte .*: bytes after the JSON object"
refused_import overflow "tensor 'h.0.ln_1.weight' has a shape whose size overflows"
refused_import shape1d "tensor 'ln_f.weight' has shape \[3\], the model needs \[32\]"
refused_import twice "a tensor name appears twice"
refused_import f64 "has dtype 'F64' (modtrain reads F32, BF16 and F16)"
refused_import nan "tensor 'h.1.router.weight' holds nan at element 1"
refused_import hlen "is truncated"
refused_import mask_beyond "tensor 'h.7.attn.bias' is not part of the model"
refused_import deep "malformed JSON header"
refused_import many "malformed JSON header at byte .*: more than 65536 tensors"
refused_import many_meta "more than 1024 metadata keys"
refused_import meta_twice "a metadata key appears twice ('step')"

# a valid file whose data section starts at an odd address imports the same
make_case unaligned
"$MODTRAIN" ckpt import --in unaligned.safetensors --ckpt ck_unaligned > /dev/null
"$MODTRAIN" ckpt import --in good.safetensors --ckpt ck_good > /dev/null
a=$("$MODTRAIN" eval --ckpt ck_good --data data/val_000000.bin --seqs 16 --json)
b=$("$MODTRAIN" eval --ckpt ck_unaligned --data data/val_000000.bin --seqs 16 --json)
[ "$a" = "$b" ] && ok "unaligned data imports the same weights: $a" || fail "unaligned: $a vs $b"
# GPT-2's causal-mask buffers are not parameters: imported past, same weights
make_case masks
"$MODTRAIN" ckpt import --in masks.safetensors --ckpt ck_masks > /dev/null
b=$("$MODTRAIN" eval --ckpt ck_masks --data data/val_000000.bin --seqs 16 --json)
[ "$a" = "$b" ] && ok "h.N.attn.bias buffers are passed over" || fail "masks: $a vs $b"
finish
