#!/bin/sh
# Sizes that do not fit are refused before anything is allocated: each run
# below must end with exit 2 and one line saying how much memory the model
# needs, having touched little memory (peak RSS, measured by tests/tools/
# peakrss). And the accounting behind that line is checked against what a
# real run touches.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
PEAKRSS=${PEAKRSS:-$(dirname "$MODTRAIN")/tests/tools/peakrss}
LIMIT_KB=262144 # a refused run stays far below this (ASan's own use included)

printf 'the quick brown fox jumps over the lazy dog\n%%\n%.0s' $(seq 1 400) > text.txt
"$MODTRAIN" prep --out data --doc-sep % text.txt > /dev/null
T="--train_data data/train_000000.bin --val_data data/val_000000.bin --run_dir run --seq_len 16 --steps 1"

# refused PATTERN CMD...: exit 2, one stderr line matching PATTERN, peak RSS
# under LIMIT_KB, no run directory
refused_within() {
    pattern=$1
    shift
    rm -rf run
    set +e
    "$PEAKRSS" rss.txt "$@" > out.txt 2> err.txt
    rc=$?
    set -e
    rss=$(cat rss.txt)
    if [ "$rc" -ne 2 ] || [ "$(wc -l < err.txt)" -ne 1 ] || ! grep -q -- "$pattern" err.txt; then
        fail "'$*': exit $rc, expected 2 and one line /$pattern/: $(cat err.txt)"
    elif [ "$rss" -ge "$LIMIT_KB" ]; then
        fail "'$*' touched $rss KiB before refusing (limit $LIMIT_KB)"
    elif [ -e run/metrics.jsonl ]; then
        fail "'$*' started a run before refusing"
    else
        ok "$rss KiB: $(cat err.txt)"
    fi
}

needs="the model needs .* per rank (parameters and gradients .*, AdamW moments .*, activations .*), more than"
refused_within "train: $needs" "$MODTRAIN" train $T --d_model 65536 --n_head 4
refused_within "train: $needs" "$MODTRAIN" train $T --batch_size 16777216
refused_within "train: $needs" "$MODTRAIN" train $T --batch_size 1048576 --micro_batch 1048576
refused_within "train: $needs" "$MODTRAIN" train $T --n_layer 4096 --d_model 4096
# one micro-batch in flight is what counts: a batch in small pieces fits
"$MODTRAIN" train $T --batch_size 1048576 --micro_batch 2 --steps 0 > ok.txt 2>&1 &&
    ok "batch_size 1048576 in micro-batches of 2 fits" || fail "micro-batches of 2: $(cat ok.txt)"
rm -rf run

# a checkpoint whose config describes a model too big for this machine:
# eval, sample and export refuse it before building the model
"$MODTRAIN" train $T --d_model 32 --n_layer 2 --n_head 2 --batch_size 2 > /dev/null
mkdir huge
cp -r run/ckpt/step-00000001 huge/
cp -r run/ckpt/step-00000001 small
edit_index huge/step-00000001 '
lines = [b"kv config.d_model 65536" if l.startswith(b"kv config.d_model ") else l for l in lines]'
refused_within "ckpt: 'huge/step-00000001': $needs" "$MODTRAIN" eval --ckpt huge/step-00000001 --data data/val_000000.bin
refused_within "ckpt: 'huge/step-00000001': $needs" "$MODTRAIN" sample --ckpt huge/step-00000001 --tokens 4
refused_within "ckpt: 'huge/step-00000001': $needs" "$MODTRAIN" ckpt export --ckpt huge/step-00000001 --out x.safetensors
[ ! -e x.safetensors ] && ok "nothing exported" || fail "export wrote x.safetensors"

# sample --tokens N keeps a window of 2·T tokens, not N: under a 4 GiB
# address-space limit, --tokens 1073741824 (the most; 4 GiB of tokens, which
# the previous main allocated up front) streams until stopped. The sanitizer
# build is left out: AddressSanitizer reserves terabytes of address space.
if ldd "$MODTRAIN" | grep -q libasan; then
    echo "skip: sample under ulimit -v (AddressSanitizer build)"
else
    set +e
    (ulimit -v 4194304 && exec timeout -k 10 5 "$MODTRAIN" sample --ckpt small \
        --tokens 1073741824 --threads 1) > s.txt 2> se.txt
    rc=$?
    set -e
    [ "$rc" -eq 124 ] && [ "$(wc -c < s.txt)" -gt 1000 ] &&
        ok "sample --tokens 1073741824 streams under a 4 GiB limit ($(wc -c < s.txt) bytes in 5 s)" ||
        fail "sample --tokens 1073741824 under a 4 GiB limit: exit $rc, $(wc -c < s.txt) bytes: $(cat se.txt)"
fi

# hostile vocabularies: encoder.json is parsed by jansson, whose tree takes
# about 140 bytes an entry, so the largest file allowed (8 MiB) of 950,000
# short tokens is refused within 512 MiB (jansson's many small allocations
# under ASan's redzones too); nesting, which costs jansson up to 80 times
# its input, is refused before the tree is built; a larger file unread
mkdir -p hv
echo '#version: 0.2' > hv/vocab.bpe
vocab() {
    "$PYTHON" - "$1" hv/encoder.json <<'PY'
import sys
kind, out, cap = sys.argv[1], sys.argv[2], 8 << 20
a = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
def name(i):
    s = a[i % 52]
    while i >= 52: i //= 52; s += a[i % 52]
    return s
if kind == "nested": s = '{"a": ' + "[" * 2000 + "]" * 2000 + "}"
else:
    parts, size, i = [], 2, 0
    while True:
        e = '"%s":%d' % (name(i), i if kind == "dense" else 0)
        if size + len(e) + 1 > cap + (1 << 20 if kind == "big" else 0): break
        parts.append(e); size += len(e) + 1; i += 1
    s = "{" + ",".join(parts) + "}"
open(out, "w").write(s)
PY
}
LIMIT_KB=524288
vocab flat
refused_within "encoder.json: 9[0-9]* tokens with ids up to 0; expected the ids 0 to" "$MODTRAIN" tokenize --vocab hv --hash
vocab dense
refused_within "encoder.json: no token for the byte 0x00" "$MODTRAIN" tokenize --vocab hv --hash
vocab nested
refused_within "encoder.json: at byte 6: a '\['" "$MODTRAIN" tokenize --vocab hv --hash
vocab big
refused_within "encoder.json' is [0-9]* bytes, more than the 8388608 it may have" "$MODTRAIN" tokenize --vocab hv --hash
# a tokenizer.json (at most 32 MiB): jansson's tree is held to 256 MiB, so
# the file of the costliest JSON a byte (empty arrays), and one of a
# model.vocab of short tokens, are refused within 512 MiB (1 GiB under
# AddressSanitizer, whose redzones and shadow double small blocks); a
# larger file unread
ldd "$MODTRAIN" | grep -q libasan && LIMIT_KB=1048576
"$PYTHON" - <<'PY'
cap = 32 << 20
open("arrays.json", "w").write("[" + ",".join(["[]"] * ((cap - 2) // 3)) + "]")
a = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
head, parts, size, i = '{"model": {"type": "BPE", "merges": [], "vocab": {', [], 40, 0
while size < cap - 16:
    j, k = i, ""
    while True:
        k += a[j % 52]; j //= 52
        if not j: break
    e = '"%s":%d' % (k, i)
    parts.append(e); size += len(e) + 1; i += 1
open("short.json", "w").write(head + ",".join(parts) + "}}}")
open("big.json", "w").write(" " * (cap + 1))
PY
refused_within "its JSON would take more than 256 MiB to hold" "$MODTRAIN" tokenize --vocab arrays.json --hash
refused_within "its JSON would take more than 256 MiB to hold" "$MODTRAIN" tokenize --vocab short.json --hash
refused_within "big.json' is [0-9]* bytes, more than the 33554432 it may have" "$MODTRAIN" tokenize --vocab big.json --hash
LIMIT_KB=262144

# prep's JSON Lines under --mem 64M: jansson's tree takes about 46 bytes a
# byte of empty arrays (78 of empty objects), so a line of them under the
# cap (4 MiB) took 173 MiB, and two of half the size as much on 2 threads.
# Such a line is refused, one line naming it, and a file of smaller ones
# (each within what --mem leaves for parsing) goes through; at 1 and 2
# threads the peak RSS stays within --mem plus what a prep of an empty input
# touches.
"$PYTHON" - <<'PY'
def line(k): return '{"text": "a document", "a": [' + ",".join(["[]"] * k) + ']}\n'
open("wide.jsonl", "w").write(line(1266000))      # 3.8 MB
open("halves.jsonl", "w").write(line(633000) * 2) # 1.9 MB each
open("fits.jsonl", "w").write(line(120000) * 12)  # 360 kB each: 17 MiB to parse
PY
: > empty.jsonl
set +e
"$PEAKRSS" rss0.txt "$MODTRAIN" prep --out pj --jsonl text --mem 64M empty.jsonl > /dev/null 2>&1
set -e
bound=$((65536 + $(cat rss0.txt)))
asan=$(ldd "$MODTRAIN" | grep libasan || true)
# prep_within PATTERN FILE THREADS: refused with one line /PATTERN/ (or, for
# an empty PATTERN, done), within the bound
prep_within() {
    rm -rf pj
    set +e
    "$PEAKRSS" rss.txt "$MODTRAIN" prep --out pj --jsonl text --mem 64M --val_fraction 0 \
        --threads "$3" "$2" > out.txt 2> err.txt
    rc=$?
    set -e
    what="prep --mem 64M --threads $3 $2: $(cat rss.txt) KiB (bound $bound)"
    # AddressSanitizer holds what is freed in its quarantine (256 MiB): a
    # prep that parses a lot is measured without it
    if [ -z "$1" ] && [ -n "$asan" ] && [ "$rc" -eq 0 ]; then
        ok "$what under AddressSanitizer, which keeps freed memory: done"
    elif [ "$(cat rss.txt)" -gt "$bound" ]; then
        fail "$what, exit $rc: $(cat err.txt)"
    elif [ -z "$1" ] && [ "$rc" -eq 0 ]; then
        ok "$what, done"
    elif [ -n "$1" ] && [ "$rc" -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] && grep -q -- "$1" err.txt; then
        ok "$what: $(cat err.txt)"
    elif [ -n "$1" ]; then
        fail "$what: exit $rc, expected 2 and one line /$1/: $(cat err.txt)"
    else
        fail "$what: exit $rc, expected 0: $(cat err.txt)"
    fi
}
for t in 1 2; do
    prep_within "prep: 'wide.jsonl' line 1: parsing it would take" wide.jsonl $t
    prep_within "prep: 'halves.jsonl' line 1: parsing it would take" halves.jsonl $t
    prep_within "" fits.jsonl $t
done

# the accounting: the activations of 8 more sequences per micro-batch, as
# the banner counts them, against the peak RSS they add to a real run
M="--d_model 128 --n_layer 2 --n_head 4 --seq_len 256 --route_every 2 --threads 1"
for b in 4 12; do
    rm -rf run
    "$PEAKRSS" rss$b.txt "$MODTRAIN" train $T $M --batch_size $b > log$b.txt
    sed -n 's/^memory (rank 0): .*(\([0-9]*\) bytes)$/\1/p' log$b.txt > acc$b.txt
done
counted=$(awk -v a="$(cat acc4.txt)" -v b="$(cat acc12.txt)" 'BEGIN { printf "%.0f", (b - a) / 1024 }')
touched=$(($(cat rss12.txt) - $(cat rss4.txt)))
check_ab "$touched" "$counted" 'b > 0 && a >= 0.9 * b && a <= 1.3 * b' &&
    ok "8 more sequences: counted $counted KiB, touched $touched KiB" ||
    fail "8 more sequences: counted $counted KiB, the run touched $touched KiB more"
finish
