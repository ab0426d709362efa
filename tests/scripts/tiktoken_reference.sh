#!/bin/sh
# tiktoken rank files against OpenAI's tiktoken itself (the npm package
# tiktoken 1.0.22, its WASM build of the Rust library, run with node):
# - `modtrain tokenize` with cl100k_base.tiktoken and o200k_base.tiktoken
#   (jobs/get_tokenizers.sh) gives tiktoken's encode_ordinary ids on the
#   fortunes files that are valid UTF-8, one after another, and on a stress
#   text (mixed scripts,
#   long runs of digits and spaces, special-token look-alikes, which are
#   text);
# - ids decode back to the exact bytes of those texts and of random bytes
#   (not UTF-8, which tiktoken's JavaScript strings cannot carry);
# - GPT-2's vocabulary as a rank file (r50k_base) gives the ids GPT-2's two
#   files give: the merges derived from ranks are GPT-2's merges;
# - a damaged rank file, or one given as another encoding's, is one line.
# MODTRAIN_SKIP_SLOW (the sanitizer pass): three fortunes files by name
# rather than every one. Skips like bpe_reference.sh without node, npm or
# the registry, unless MODTRAIN_REQUIRE_REFERENCE=1 (CI).
. "$(dirname "$0")/lib.sh"
top=$srcdir
. "$srcdir/tests/scripts/gpt2_ref.sh"
fortunes=${FORTUNES_DIR:-/usr/share/games/fortunes}
[ -d "$fortunes" ] || unavailable "the fortunes package is not installed (apt-get install fortunes)"
why=$(gpt2_ref_setup 2>&1) || unavailable "$why"
ranks=$cache/tiktoken
tk=$cache/tiktoken-1.0.22
"$srcdir/jobs/get_tokenizers.sh" "$ranks" > /dev/null || unavailable "jobs/get_tokenizers.sh failed"
if [ ! -f "$tk/node_modules/tiktoken/package.json" ]; then
    mkdir -p "$tk"
    (cd "$tk" && npm install --silent --no-save --no-audit --no-fund tiktoken@1.0.22 > /dev/null) ||
        unavailable "tiktoken could not be installed from the npm registry"
fi
cd "$TMP"
cat > ref.js <<'JS'
// ENCODING FILE...: tiktoken's ids of each file (text as text: no special
// token), one a line, into FILE.ENCODING
const { Tiktoken } = require("tiktoken/lite");
const fs = require("fs");
const name = process.argv[2];
const d = require("tiktoken/encoders/" + name + ".json");
const enc = new Tiktoken(d.bpe_ranks, d.special_tokens, d.pat_str);
for (const f of process.argv.slice(3)) {
    const ids = Array.from(enc.encode_ordinary(fs.readFileSync(f, "utf8")));
    fs.writeFileSync(f + "." + name, ids.length ? ids.join("\n") + "\n" : "");
}
enc.free();
JS
"$PYTHON" - stress.txt <<'PY'
import sys
parts = [
    "Scripts: \u4F60\u597D\u4E16\u754C \u65E5\u672C\u8A9E\u306E\u30C6\u30AD\u30B9\u30C8 \uD55C\uAD6D\uC5B4 "
    "\u0645\u0631\u062D\u0628\u0627 \u05E9\u05DC\u05D5\u05DD \u0928\u092E\u0938\u094D\u0924\u0947 "
    "\u0E2A\u0E27\u0E31\u0E2A\u0E14\u0E35 \u041F\u0440\u0438\u0432\u0435\u0442 \u0393\u03B5\u03B9\u03AC",
    "CamelCase HTTPServer iPhone McDonald's O'Neil DON'T don\u2019t I'M we'VE",
    "Digits: " + "1234567890" * 12 + " 3.14159 1,000,000 0x7FFF 12ab34 \u0661\u0662\u0663",
    "Spaces:" + " " * 70 + "x\t\t\ty\n\n\n\n   \n z\u00A0\u2003\u3000w" + "\n" * 5,
    "Specials as text: <|endoftext|> <|fim_prefix|><|fim_middle|> <|endofprompt|> <|im_start|>",
    "Emoji: \U0001F600\U0001F468\u200D\U0001F469\u200D\U0001F467 \U0001F1EB\U0001F1F7 e\u0301 a\u0308",
    "Paths: /usr/share/games/fortunes ../a/b//c http://example.com/x?y=1&z=2",
]
open(sys.argv[1], "w", encoding="utf-8").write("\n".join(parts) + "\n")
PY
head -c 100000 /dev/urandom > random.bin
# the fortunes text: every file that is valid UTF-8, one after another (the
# two tokenizers see the same text, so where files meet does not matter)
: > fortunes.txt
n=0
for f in "$fortunes"/*; do
    case $f in *.dat | *.u8) continue ;; esac
    [ -f "$f" ] || continue
    "$PYTHON" -c "open('$f', 'rb').read().decode('utf-8')" 2> /dev/null || continue
    [ $slow = 1 ] || [ $n -lt 3 ] || break
    n=$((n + 1))
    cat "$f" >> fortunes.txt
done
files="stress.txt fortunes.txt"
for e in cl100k_base o200k_base; do
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
