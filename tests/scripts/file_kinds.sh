#!/bin/sh
# Files that are not files: a directory, a FIFO with no writer and a
# character device (/dev/zero) given for every file modtrain reads (a
# config, a token shard, a vocabulary's encoder.json and vocab.bpe, a prep
# or tokenize input, a checkpoint's index, data.bin and latest, a
# safetensors file to import, a cluster file) are each refused at once: the
# documented exit code, one stderr line naming the path and what it is, no
# hang (each command under `timeout 10`) and no 2^63-byte allocation. So
# is each file it writes beside a checkpoint: metrics.jsonl, sample --ids
# and eval --logits (eval --routing: moe_cmds.sh).
# Outputs appear together or not at all (prep's set of shards: see
# prep_corpus.sh), and jobs/get_gpt2_vocab.sh --from a bad folder
# leaves a good vocabulary alone; --help does nothing else.
# MODTRAIN_SKIP_SLOW (the sanitizer pass): every file is tried once, as one
# of the three kinds in turn (each kind still comes for inputs and outputs),
# rather than as each kind: the check is the same for all three.
. "$(dirname "$0")/lib.sh"
cd "$TMP"

# expect_kind CODE PATH KIND CMD...: exit CODE within 10 s, one stderr line
# saying "'PATH' is KIND, not a file".
expect_kind() {
    code=$1 path=$2 kind=$3
    shift 3
    set +e
    timeout -k 10 10 "$@" > out.txt 2> err.txt < /dev/null
    rc=$?
    set -e
    lines=$(wc -l < err.txt)
    if [ "$rc" -eq 124 ]; then
        fail "'$*' hung on $kind '$path'"
    elif [ "$rc" -ne "$code" ]; then
        fail "'$*' exited $rc, expected $code ($(cat err.txt))"
    elif [ "$lines" -ne 1 ]; then
        fail "'$*' printed $lines lines on stderr, expected 1: $(cat err.txt)"
    elif ! grep -qF -- "'$path' is $kind, not a file" err.txt; then
        fail "'$*' said '$(cat err.txt)', expected \"'$path' is $kind, not a file\""
    else
        ok "$(cat err.txt)"
    fi
}

# bad KIND PATH: replaces PATH (a file, or nothing) by a thing of KIND
# (dir, fifo, dev) and prints the words the error line uses for it
bad() {
    rm -rf "$2"
    case $1 in
    dir) mkdir "$2" && echo "a directory" ;;
    fifo) mkfifo "$2" && echo "a FIFO" ;;
    dev) ln -s /dev/zero "$2" && echo "a character device" ;;
    esac
}

# the real inputs: a shard, a small checkpoint, its safetensors export, a
# byte-level vocabulary in GPT-2's format (no merges)
printf 'the quick brown fox jumps over the lazy dog\n%%\n%.0s' $(seq 1 400) > text.txt
"$MODTRAIN" prep --out data --doc-sep % text.txt > /dev/null
T="--route_every 0 --train_data data/train_000000.bin --val_data data/val_000000.bin --seq_len 16"
M="--d_model 32 --n_head 2 --n_layer 2 --batch_size 2"
# shellcheck disable=SC2086 # the options
"$MODTRAIN" train $T $M --run_dir run --steps 2 > /dev/null
"$MODTRAIN" ckpt export --ckpt run/ckpt --out good.st > /dev/null
step=$(cat run/ckpt/latest)
byte_vocab vocab
"$MODTRAIN" tokenize --vocab vocab text.txt > /dev/null || fail "the test's vocabulary does not load"

# skip: whether this file is left out for this kind (under
# MODTRAIN_SKIP_SLOW, the n-th file is tried as kind n mod 3 only)
skip() {
    n=$((n + 1))
    [ $slow = 0 ] && [ $((n % 3)) -ne $ki ]
}
ki=0
for k in dir fifo dev; do
    n=0
    # files named on the command line
    w=$(bad $k x)
    skip || expect_kind 2 x "$w" "$MODTRAIN" train --config x
    # shellcheck disable=SC2086 # the options
    skip || expect_kind 2 x "$w" "$MODTRAIN" train $T $M --run_dir r --train_data x
    # shellcheck disable=SC2086 # the options
    skip || expect_kind 2 x "$w" "$MODTRAIN" train $T $M --run_dir r --val_data x
    skip || expect_kind 2 x "$w" "$MODTRAIN" eval --ckpt run/ckpt --data x
    skip || expect_kind 2 x "$w" "$MODTRAIN" prep --out p x
    skip || expect_kind 2 x "$w" "$MODTRAIN" prep --out p --tokenizer gpt2 --vocab vocab x
    skip || expect_kind 2 x "$w" "$MODTRAIN" tokenize --vocab vocab x
    if [ $k = dir ]; then # (a folder may be Hugging Face's: one with config.json)
        skip || expect_error "'x' is a directory without config.json" "$MODTRAIN" ckpt import --in x --ckpt imp
    else
        skip || expect_kind 2 x "$w" "$MODTRAIN" ckpt import --in x --ckpt imp
    fi
    skip || expect_kind 2 x "$w" "$MODTRAIN" plan --config "$srcdir/jobs/tiny.conf" --cluster x
    # outputs: a FIFO (with no reader) would hang, a device takes the bytes
    skip || expect_kind 2 x "$w" "$MODTRAIN" sample --ckpt run/ckpt --prompt the --tokens 2 --ids x
    skip || expect_kind 1 x "$w" "$MODTRAIN" eval --ckpt run/ckpt --data data/val_000000.bin --logits x
    mkdir -p o && w=$(bad $k o/metrics.jsonl)
    # shellcheck disable=SC2086 # the options
    skip || expect_kind 2 o/metrics.jsonl "$w" "$MODTRAIN" train $T $M --run_dir o --steps 1
    # a vocabulary's files
    for f in encoder.json vocab.bpe; do
        rm -rf v && cp -r vocab v
        w=$(bad $k v/$f)
        skip || expect_kind 2 v/$f "$w" "$MODTRAIN" tokenize --vocab v text.txt
        skip || expect_kind 2 v/$f "$w" "$MODTRAIN" prep --out p --tokenizer gpt2 --vocab v text.txt
    done
    # a checkpoint's files
    for f in index data.bin; do
        rm -rf c && cp -r run/ckpt c
        w=$(bad $k "c/$step/$f")
        skip || expect_kind 2 "c/$step/$f" "$w" "$MODTRAIN" ckpt export --ckpt "c/$step" --out o.st
        skip || expect_kind 2 "c/$step/$f" "$w" "$MODTRAIN" ckpt verify --ckpt "c/$step"
        skip || expect_kind 2 "c/$step/$f" "$w" "$MODTRAIN" eval --ckpt "c/$step" --data data/val_000000.bin
    done
    rm -rf c && cp -r run/ckpt c
    w=$(bad $k c/latest)
    skip || expect_kind 2 c/latest "$w" "$MODTRAIN" ckpt export --ckpt c --out o.st
    skip || expect_kind 2 c/latest "$w" "$MODTRAIN" eval --ckpt c --data data/val_000000.bin
    skip || expect_kind 1 c/latest "$w" "$MODTRAIN" ckpt list --ckpt c
    ki=$((ki + 1))
done
rm -rf x

# a vocabulary of 0 tokens (an index edited, a safetensors file made so)
# exports and imports nothing usable: refused
rm -rf c && cp -r run/ckpt c
edit_index "c/$step" 'lines = [b"kv config.vocab_size 0" if l.startswith(b"kv config.vocab_size ") else l for l in lines]'
expect_exit 2 "ckpt export: 'c' has vocab_size = 0, below the 256" "$MODTRAIN" ckpt export --ckpt c --out o.st
"$PYTHON" - good.st v0.st <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head, data = json.loads(raw[8:8 + n]), raw[8 + n:]
meta = head.pop("__metadata__")
meta["vocab_size"] = "0"
h, body, off = {"__metadata__": meta}, b"", 0
for k, v in head.items():
    b = data[v["data_offsets"][0]:v["data_offsets"][1]]
    shape = v["shape"]
    if k == "wte.weight":
        b, shape = b"", [0, shape[1]]
    h[k] = {"dtype": v["dtype"], "shape": shape, "data_offsets": [off, off + len(b)]}
    body, off = body + b, off + len(b)
js = json.dumps(h).encode()
js += b" " * (-len(js) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(js)) + js + body)
PY
expect_exit 2 "ckpt import: 'v0.st' has vocab_size = 0, below the 256" "$MODTRAIN" ckpt import --in v0.st --ckpt imp


# jobs/get_gpt2_vocab.sh --from: a bad folder leaves a good vocabulary alone
G=$srcdir/jobs/get_gpt2_vocab.sh
"$G" gv --from vocab > /dev/null
cat gv/encoder.json gv/vocab.bpe > gv0
check_vocab() { # what: the placed vocabulary must be the good one
    if cat gv/encoder.json gv/vocab.bpe 2> /dev/null | cmp -s - gv0 && [ "$(ls -A gv | wc -l)" -eq 2 ]; then
        ok "$1: the vocabulary in place is untouched"
    else fail "$1 changed the vocabulary in place"; fi
}
for case in missing dir fifo json merges; do
    rm -rf gv && mkdir gv && cp vocab/encoder.json vocab/vocab.bpe gv/
    rm -rf src && cp -r vocab src # another vocabulary: one token more
    sed 's/}$/, "extra": 257}/' vocab/encoder.json > src/encoder.json
    case $case in
    missing) rm src/vocab.bpe ;;
    dir) rm src/encoder.json && mkdir src/encoder.json ;;
    fifo) rm src/vocab.bpe && mkfifo src/vocab.bpe ;;
    json) echo '["not", "an", "encoder"]' > src/encoder.json ;;
    merges) printf '\0\0\0\n' > src/vocab.bpe ;;
    esac
    expect_exit 1 "get_gpt2_vocab: 'src/" "$G" gv --from src
    check_vocab "--from a folder with $case"
done
mkdir h && (cd h && "$G" --help > ../out.txt 2>&1) && grep -q "^usage: jobs/get_gpt2_vocab.sh DIR" out.txt &&
    [ -z "$(ls -A h)" ] && ok "get_gpt2_vocab.sh --help prints the usage, exits 0, places nothing" ||
    fail "get_gpt2_vocab.sh --help: $(cat out.txt; ls -A h)"

[ ! -e r ] && [ ! -e p ] && [ ! -e imp ] && [ ! -e o.st ] &&
    ok "nothing was created by the refused commands" || fail "a refused command created output"

finish
