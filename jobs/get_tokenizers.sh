#!/bin/sh
# Places tiktoken's rank files, r50k_base.tiktoken (GPT-2's), cl100k_base.tiktoken
# and o200k_base.tiktoken, in DIR: rebuilt from the npm registry's tiktoken
# package (version pinned), which ships each encoding's ranks in a compact
# JSON form rather than as .tiktoken files, and checked against the
# SHA-256 of the rank files OpenAI publishes. A file already there and
# intact is kept; DIR changes only by whole, checked files.
# usage: jobs/get_tokenizers.sh DIR
# Needs npm (jobs/deps.sh --node) and python3.
set -eu
usage() {
    echo "usage: jobs/get_tokenizers.sh DIR"
    echo "Places r50k_base.tiktoken, cl100k_base.tiktoken and o200k_base.tiktoken in DIR,"
    echo "rebuilt from the npm package tiktoken@1.0.22 and checked against their SHA-256."
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
446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d  o200k_base.tiktoken"
if [ -d "$dir" ] && (cd "$dir" && echo "$sums" | sha256sum -c --status 2> /dev/null); then
    echo "get_tokenizers: $dir holds the three rank files"
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
    echo "get_tokenizers: the rebuilt rank files are not OpenAI's (SHA-256 differs)" >&2
    exit 1
}
mkdir -p "$dir"
for e in r50k_base cl100k_base o200k_base; do
    cp "$tmp/$e.tiktoken" "$dir/.$e.tiktoken.tmp"
    mv -f "$dir/.$e.tiktoken.tmp" "$dir/$e.tiktoken"
done
echo "get_tokenizers: placed r50k_base.tiktoken, cl100k_base.tiktoken and o200k_base.tiktoken in $dir"
