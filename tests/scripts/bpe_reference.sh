#!/bin/sh
# GPT-2's BPE against an independent implementation: the token ids
# `modtrain tokenize` gives equal those of the npm package js-tiktoken's
# "gpt2" encoding (a port of OpenAI's tiktoken, run with node) on every
# fortunes file that is valid UTF-8 and on a Unicode stress text (emoji,
# CJK, combining marks, right-to-left text, contractions with curly quotes,
# long whitespace runs, digits next to letters, and characters regex
# engines' \s treats differently: U+FEFF, U+0085, U+180E, U+200B, U+2028);
# ids decode back to the exact bytes of every fortunes file, of the stress
# text and of random bytes (not UTF-8); `prep --tokenizer gpt2 --doc-sep %` writes every
# fortune after <|endoftext|> with js-tiktoken's ids, the same on 1 and 2
# threads; a missing or damaged vocabulary is a one-line error.
# MODTRAIN_SKIP_SLOW (the sanitizer pass): the first three fortunes files
# by name rather than every one (each goes through the same code); the
# stress text, the random bytes, prep on 1 and 2 threads and the damaged
# vocabularies stay.
# The vocabulary (jobs/get_gpt2_vocab.sh) and js-tiktoken are kept in
# $MODTRAIN_CACHE (default ~/.cache/modtrain). Without node/npm or the npm
# registry this test skips, unless MODTRAIN_REQUIRE_REFERENCE=1 (CI).
. "$(dirname "$0")/lib.sh"
top=$srcdir
. "$srcdir/tests/scripts/gpt2_ref.sh"
[ -d "${FORTUNES_DIR:-/usr/share/games/fortunes}" ] ||
    unavailable "the fortunes package is not installed (apt-get install fortunes)"
why=$(gpt2_ref_setup 2>&1) || unavailable "$why"
cd "$TMP"
cat > ref.js <<'JS'
// ids of each file given, one a line, into FILE.ids
const { getEncoding } = require("js-tiktoken");
const fs = require("fs");
const enc = getEncoding("gpt2");
for (const f of process.argv.slice(2)) {
    // "<|endoftext|>" in a text is text, as in modtrain: no special tokens
    const ids = enc.encode(fs.readFileSync(f, "utf8"), [], []);
    fs.writeFileSync(f + ".ids", ids.length ? ids.join("\n") + "\n" : "");
}
JS
# the stress text
"$PYTHON" - stress.txt <<'PY'
import sys
parts = [
    "Emoji: \U0001F600\U0001F680 family \U0001F468\u200D\U0001F469\u200D\U0001F467 flags \U0001F1EB\U0001F1F7!",
    "CJK: \u4F60\u597D\uFF0C\u4E16\u754C\u3002\u65E5\u672C\u8A9E\u306E\u30C6\u30AD\u30B9\u30C8\u3002\uD55C\uAD6D\uC5B4",
    "Combining: e\u0301 a\u0308 n\u0303 \u1E9B\u0323 Z\u0335\u0341a\u0336l\u0337g\u0338o\u0339",
    "RTL: \u05E9\u05DC\u05D5\u05DD \u05E2\u05D5\u05DC\u05DD \u0645\u0631\u062D\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 123",
    "Contractions: don't won't I'm you're we've they'll he'd it's DON'T don\u2019t I\u2019m it\u2019s",
    "Spaces:   a    b\t\t c \n\n\n   \n d" + " " * 40 + "e\u00A0\u00A0f\u2003g\u3000h",
    "Digits: abc123def 4.5e10 1,000,000 x2 \u0661\u0662\u0663 \u00BD \u2168 2nd 3rd",
    "Punct: ...!!! ??? --- ((x)) [y] {z} @#$%^&* <|endoftext|> \u00AB\u00BB \u2014 \u2026",
    "Unicode spaces: a \uFEFF\uFEFF b\uFEFFc \u0085\u0085d \u2028 e\u180Ef\u200Bg \u2029\u205F h",
    "Mixed: na\u00EFve caf\u00E9 \u00DCber stra\u00DFe \u0391\u03B8\u03AE\u03BD\u03B1 \u041C\u043E\u0441\u043A\u0432\u0430",
]
open(sys.argv[1], "w", encoding="utf-8").write("\n".join(parts) + "\n   \n")
PY
fortunes=$(find "${FORTUNES_DIR:-/usr/share/games/fortunes}" -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort)
[ $slow = 1 ] || fortunes=$(printf '%s\n' "$fortunes" | head -n 3)
valid=
n=0
for f in $fortunes; do
    n=$((n + 1))
    cp "$f" "f$n.txt"
    iconv -f UTF-8 -t UTF-8 "f$n.txt" > /dev/null 2>&1 && valid="$valid f$n.txt"
done
# shellcheck disable=SC2086 # the file list
gpt2_node ref.js stress.txt $valid
compared=0 differ=0
for f in stress.txt $valid; do
    "$MODTRAIN" tokenize --vocab "$vocab" "$f" > "$f.mine"
    if cmp -s "$f.mine" "$f.ids"; then
        compared=$((compared + 1))
    else
        differ=$((differ + 1))
        fail "$f: ids differ from js-tiktoken's: $(diff "$f.mine" "$f.ids" | head -n 4 | tr '\n' ' ')"
    fi
done
[ "$differ" -eq 0 ] && ok "ids equal js-tiktoken's gpt2 on $compared texts (the stress text and $((compared - 1)) of $n fortunes files; the rest are not UTF-8)"
# prep --tokenizer gpt2: every fortune a document, after <|endoftext|>,
# against js-tiktoken's ids of each fortune; 1 and 2 threads write the same
cat > docs.js <<'JS'
// FILE...: <|endoftext|> and the ids of every fortune (the pieces between
// lines equal to "%"), one id a line
const { getEncoding } = require("js-tiktoken");
const splitDocs = require("gpt2_docs");
const fs = require("fs");
const enc = getEncoding("gpt2");
const out = [];
for (const f of process.argv.slice(2))
    for (const d of splitDocs(fs.readFileSync(f, "utf8"), "%"))
        out.push(50256, ...enc.encode(d, [], []));
process.stdout.write(out.join("\n") + "\n");
JS
# shellcheck disable=SC2086 # the file list
gpt2_node docs.js $valid > docs.ids
for t in 1 2; do
    # shellcheck disable=SC2086
    "$MODTRAIN" prep --out "prep$t" --tokenizer gpt2 --vocab "$vocab" --doc-sep % --val-fraction 0 \
        --threads $t $valid > "prep$t.log" || { cat "prep$t.log"; fail "prep --tokenizer gpt2 failed"; }
done
"$PYTHON" - prep1/train_000000.bin > shard.ids <<'PY'
import struct, sys
raw = open(sys.argv[1], "rb").read()
head = struct.unpack("<256i", raw[:1024])
assert head[0] == 20240520 and head[3] == 50257, head[:4]
print("\n".join(map(str, struct.unpack("<%dH" % head[2], raw[1024:]))))
PY
cmp -s shard.ids docs.ids && ok "prep --tokenizer gpt2 --doc-sep %: $(grep -c '^50256$' docs.ids) fortunes, each after <|endoftext|>, hold js-tiktoken's ids (vocabulary 50257 in the header)" ||
    fail "prep --tokenizer gpt2: the shard's ids differ from js-tiktoken's: $(diff shard.ids docs.ids | head -n 4 | tr '\n' ' ')"
cmp -s prep1/train_000000.bin prep2/train_000000.bin && ok "prep on 1 and 2 threads writes the same shard" ||
    fail "prep on 1 and 2 threads wrote different shards"

head -c 200000 /dev/urandom > random.bin
trips=0
for f in stress.txt random.bin f*.txt; do
    case $f in *.ids | *.mine) continue ;; esac
    "$MODTRAIN" tokenize --vocab "$vocab" "$f" | "$MODTRAIN" tokenize --vocab "$vocab" --decode > back
    if cmp -s "$f" back; then trips=$((trips + 1)); else fail "$f: decode(encode(x)) differs from x"; fi
done
ok "decode(encode(x)) == x byte for byte on $trips texts (every fortunes file, the stress text, random bytes)"

# a missing or damaged vocabulary: one line, exit 2
mkdir -p broken
cp "$vocab/encoder.json" broken/
expect() { # WHAT MESSAGE-PART
    if out=$("$MODTRAIN" tokenize --vocab broken stress.txt 2>&1); then
        fail "$1: accepted"
    elif [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && printf '%s' "$out" | grep -q "$2"; then
        ok "$1: $out"
    else
        fail "$1: '$out'"
    fi
}
expect "vocab.bpe missing" "cannot open 'broken/vocab.bpe'"
head -c 500000 "$vocab/encoder.json" > broken/encoder.json
cp "$vocab/vocab.bpe" broken/
expect "encoder.json cut short" "broken/encoder.json: at byte"
cp "$vocab/encoder.json" broken/
sed '5s/ .*/ Qzx/' "$vocab/vocab.bpe" > broken/vocab.bpe
expect "a merge naming no token" "broken/vocab.bpe: line 5"
finish
