#!/bin/sh
# tiktoken rank files against OpenAI's tiktoken itself (the npm package
# tiktoken 1.0.22, its WASM build of the Rust library, run with node):
# - `modtrain tokenize` with cl100k_base.tiktoken, o200k_base.tiktoken and
#   llama3.tiktoken (jobs/get_tokenizers.sh; Llama 3's through tiktoken's
#   constructor of a custom encoding, as Meta's code builds it) gives
#   tiktoken's encode_ordinary ids on the
#   fortunes files that are valid UTF-8, one after another, and on a stress
#   text (mixed scripts,
#   long runs of digits and spaces, special-token look-alikes, which are
#   text);
# - ids decode back to the exact bytes of those texts and of random bytes
#   (not UTF-8, which tiktoken's JavaScript strings cannot carry);
# - GPT-2's vocabulary as a rank file (r50k_base) gives the ids GPT-2's two
#   files give: the merges derived from ranks are GPT-2's merges;
# - prep --tokenizer cl100k_base, o200k_base and llama3 write tiktoken's
#   ids of each fortune after <|endoftext|> (llama3: <|begin_of_text|>), in
#   uint32 shards recording the encoding;
# - a model of o200k_base's 200,019 tokens trains on them on one rank and
#   under tp 2 alike; its checkpoint records the encoding, and sample takes
#   the rank file and refuses another encoding's;
# - a damaged rank file, or one given as another encoding's, is one line.
# MODTRAIN_SKIP_SLOW (the sanitizer pass): three fortunes files by name
# rather than every one, and no training (the model's code is the other
# tests'; its 200,019-token head is this test's slowest part there). Skips like bpe_reference.sh without node, npm or
# the registry, unless MODTRAIN_REQUIRE_REFERENCE=1 (CI).
. "$(dirname "$0")/lib.sh"
. "$srcdir/tests/scripts/tok_texts.sh"
tok_ref tiktoken@1.0.22
tk=$pkg
# tiktoken's encoding NAME: its own, or for llama3 tiktoken's constructor
# of a custom encoding (as Meta's code makes it) on the rank file, with
# cl100k_base's pattern
cat > encoding.js <<'JS'
const { Tiktoken } = require("tiktoken/lite");
module.exports = function (name) {
    const own = name === "llama3" ? "cl100k_base" : name;
    const d = require("tiktoken/encoders/" + own + ".json");
    if (name !== "llama3") return [new Tiktoken(d.bpe_ranks, d.special_tokens, d.pat_str), d];
    const ranks = require("fs").readFileSync(process.env.LLAMA3, "utf8");
    const special_tokens = { "<|begin_of_text|>": 128000, "<|end_of_text|>": 128001 };
    return [new Tiktoken(ranks, special_tokens, d.pat_str), { special_tokens }];
};
JS
export LLAMA3="$ranks/llama3.tiktoken"
cat > ref.js <<'JS'
// ENCODING FILE...: tiktoken's ids of each file (text as text: no special
// token), one a line, into FILE.ENCODING
const fs = require("fs");
const name = process.argv[2];
const [enc] = require("./encoding.js")(name);
for (const f of process.argv.slice(3)) {
    const ids = Array.from(enc.encode_ordinary(fs.readFileSync(f, "utf8")));
    fs.writeFileSync(f + "." + name, ids.length ? ids.join("\n") + "\n" : "");
}
enc.free();
JS
tok_texts
files="stress.txt fortunes.txt"
for e in cl100k_base o200k_base llama3; do
    # shellcheck disable=SC2086 # the list
    NODE_PATH="$tk/node_modules" node ref.js $e $files
    same=0 differ=""
    for f in $files; do
        "$MODTRAIN" tokenize --vocab "$ranks/$e.tiktoken" "$f" > "$f.mine"
        if cmp -s "$f.mine" "$f.$e"; then same=$((same + 1)); else differ="$differ $f"; fi
    done
    [ -z "$differ" ] && ok "$e: tiktoken's ids on the stress text and $n fortunes files ($(cat ./*.txt.$e | wc -l) ids)" ||
        fail "$e: ids other than tiktoken's on:$differ"
    back=0
    for f in $files random.bin; do
        "$MODTRAIN" tokenize --vocab "$ranks/$e.tiktoken" "$f" |
            "$MODTRAIN" tokenize --vocab "$ranks/$e.tiktoken" --decode > "$f.back"
        cmp -s "$f" "$f.back" && back=$((back + 1)) || fail "$e: $f does not decode back"
    done
    ok "$e: the texts and random bytes decode back to their bytes"
done
differ=""
for f in $files; do
    "$MODTRAIN" tokenize --vocab "$vocab" "$f" > "$f.gpt2"
    "$MODTRAIN" tokenize --vocab "$ranks/r50k_base.tiktoken" "$f" | cmp -s - "$f.gpt2" ||
        differ="$differ $f"
done
[ -z "$differ" ] && ok "r50k_base.tiktoken: GPT-2's files' ids on every text" ||
    fail "r50k_base.tiktoken: ids other than GPT-2's files' on:$differ"
# prep --tokenizer ENCODING --doc_sep %: every fortune a document after
# <|endoftext|>, with tiktoken's ids of it, in uint32 shards that record
# the encoding (code 4 cl100k_base, 5 o200k_base) and its vocabulary
cat > docs.js <<'JS'
// ENCODING FILE: tiktoken's ids of each document prep --doc_sep % cuts
// FILE into, each after <|endoftext|> (llama3: <|begin_of_text|>), one a line
const splitDocs = require("gpt2_docs");
const [enc, d] = require(process.cwd() + "/encoding.js")(process.argv[2]);
const eot = d.special_tokens["<|endoftext|>"] ?? d.special_tokens["<|begin_of_text|>"];
const out = [];
for (const doc of splitDocs(require("fs").readFileSync(process.argv[3], "utf8"), "%"))
    out.push(eot, ...enc.encode_ordinary(doc));
process.stdout.write(out.join("\n") + "\n");
enc.free();
JS
for c in cl100k_base:4:100277 o200k_base:5:200019 llama3:6:128256; do
    e=${c%%:*} rest=${c#*:} code=${rest%%:*} V=${rest#*:}
    "$MODTRAIN" prep --out "prep-$e" --tokenizer "$e" --vocab "$ranks/$e.tiktoken" --doc-sep % \
        --val-fraction 0 --threads 2 "$fortunes/fortunes" > "prep-$e.log" ||
        { cat "prep-$e.log"; fail "prep --tokenizer $e failed"; }
    NODE_PATH="$tk/node_modules:$srcdir/tests/scripts" node docs.js "$e" "$fortunes/fortunes" > "docs-$e.ids"
    "$PYTHON" - "prep-$e/train_000000.bin" "$code" "$V" > "shard-$e.ids" <<'PY'
import struct, sys
raw = open(sys.argv[1], "rb").read()
h = struct.unpack("<9i", raw[:36])
if h[0] != 20240801 or h[1] != 7 or h[3] != int(sys.argv[3]) or h[4] != int(sys.argv[2]):
    sys.exit("header %s: expected magic 20240801, version 7, vocabulary %s, tokenizer %s" % (h, sys.argv[3], sys.argv[2]))
print("\n".join(str(t) for t in struct.unpack("<%dI" % h[2], raw[1024:])))
PY
    cmp -s "shard-$e.ids" "docs-$e.ids" &&
        ok "prep --tokenizer $e: $(grep -c '^'"$(head -n 1 "docs-$e.ids")"'$' "docs-$e.ids") fortunes, each after token $(head -n 1 "docs-$e.ids"), hold tiktoken's ids; uint32 shard, tokenizer $code, vocabulary $V" ||
        fail "prep --tokenizer $e: the shard differs from tiktoken's ids: $(diff "shard-$e.ids" "docs-$e.ids" | head -n 4 | tr '\n' ' ')"
done
# a model of o200k_base's 200,019 tokens trains on them, on one rank and
# under tp 2 (the vocabulary-parallel head), to the same losses and
# weights; the checkpoint records the encoding and its hash, and sample
# takes the rank file (and refuses another encoding's)
if [ $slow = 1 ]; then # (the sanitizer pass: the shards above are what is new)
    common="--config $srcdir/jobs/tiny.conf --train_data prep-o200k_base/train_*.bin --val_data= --steps 2 \
        --batch_size 4 --micro_batch 4 --d_model 32 --n_head 2 --eval_every 0 --log_every 1 --threads 1 --ckpt_every 0"
    train_ok one
    train_ok tp2 2 --tp 2
    close_runs one tp2 2e-5 2 && ok "vocabulary 200019: tp 2 (the head split by vocabulary) = one rank, 2 steps" ||
        { cat diff.txt; fail "vocabulary 200019: tp 2 differs from one rank"; }
    hash=$("$MODTRAIN" tokenize --vocab "$ranks/o200k_base.tiktoken" --hash | sed -n 's/^tokenizer_hash //p')
    "$MODTRAIN" ckpt inspect --ckpt one/ckpt > inspect.txt 2>&1 || true
    grep -q "tokenizer.*o200k_base" inspect.txt && grep -q "$hash" inspect.txt && grep -q "vocab_size.*200019" inspect.txt &&
        ok "2 steps on o200k_base shards: the checkpoint records tokenizer o200k_base, hash $hash, vocab_size 200019" ||
        { cat inspect.txt; fail "the checkpoint does not record o200k_base, $hash and 200019"; }
    "$MODTRAIN" sample --ckpt one/ckpt --vocab "$ranks/o200k_base.tiktoken" --prompt "The" --tokens 4 --ids ids.txt > sample.txt 2>&1 &&
        [ "$(awk '$1 >= 0 && $1 < 200019' ids.txt | wc -l)" -ge 4 ] &&
        ok "sample with the rank file: ids $(tr '\n' ' ' < ids.txt)" || { cat sample.txt ids.txt; fail "sample with o200k_base.tiktoken"; }
    expect_error "100256 tokens; o200k_base's rank file has 199998" "$MODTRAIN" sample --ckpt one/ckpt --vocab "$ranks/cl100k_base.tiktoken" --tokens 4
fi
# damaged rank files: one line each, exit 2
head -n 100 "$ranks/cl100k_base.tiktoken" > short.tiktoken
sed '5s/ 4$/ 3/' "$ranks/r50k_base.tiktoken" > twice.tiktoken
sed '7s/^[^ ]*/%%%/' "$ranks/r50k_base.tiktoken" > b64.tiktoken
for c in "short.tiktoken:cl100k_base:100 tokens; cl100k_base's rank file has 100256" \
    "twice.tiktoken:r50k_base:the rank 3 is given to two tokens" \
    "b64.tiktoken:r50k_base:line 7: expected a token in base64" \
    "$ranks/o200k_base.tiktoken:cl100k_base:199998 tokens; cl100k_base's rank file has 100256" \
    "short.tiktoken:p50k_base:'p50k_base' is not an encoding modtrain knows" \
    "stress.txt::a rank file needs its encoding"; do
    file=${c%%:*} rest=${c#*:} enc=${rest%%:*} says=${rest#*:}
    expect_error "$says" "$MODTRAIN" tokenize --vocab "$file" --encoding "$enc" stress.txt
done
finish
