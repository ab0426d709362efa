# Sourced by the tokenizer reference tests: tok_texts writes, in the
# current folder, the texts they compare on:
# - stress.txt: mixed scripts, CamelCase and contractions, a 120-digit run,
#   70 spaces and other whitespace, special-token look-alikes, emoji with
#   joiners, paths;
# - random.bin: 100 KB of random bytes (not UTF-8: for round trips only);
# - fortunes.txt: every fortunes file that is valid UTF-8, one after
#   another (three when $slow is 0), $n of them.
# Sourcing it (after lib.sh) skips the test (lib.sh's unavailable) without
# the fortunes package, whose folder is $fortunes, and sources gpt2_ref.sh.
# tok_ref NAME@VERSION: tokenizers_setup (gpt2_ref.sh) or the test skipped
# (failed under MODTRAIN_REQUIRE_REFERENCE=1); the package's folder in
# $pkg, and the test's folder entered.
fortunes=${FORTUNES_DIR:-/usr/share/games/fortunes}
[ -d "$fortunes" ] || unavailable "the fortunes package is not installed (apt-get install fortunes)"
top=$srcdir
. "$srcdir/tests/scripts/gpt2_ref.sh"
tok_ref() {
    why=$(tokenizers_setup "$1" 2>&1) || unavailable "$why"
    pkg=$cache/${1%@*}-${1#*@}
    cd "$TMP"
}
tok_texts() {
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
}
