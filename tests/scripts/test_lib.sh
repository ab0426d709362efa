#!/bin/sh
# One test library: every script test sources tests/scripts/lib.sh, no
# helper function is defined in two test scripts (or again beside the
# library's own), and none makes its own scratch folder or launcher: what
# two tests share lives in lib.sh.
. "$(dirname "$0")/lib.sh"
cd "$srcdir"
tests=$(sed -n '/^SCRIPT_TESTS = /,/[^\\]$/p' Makefile.am | tr ' \\\t' '\n\n\n' | grep '^tests/.*\.sh$')
[ "$(echo "$tests" | wc -l)" -ge 40 ] || fail "read only $(echo "$tests" | wc -l) script tests from Makefile.am"
bad=
for t in $tests; do
    grep -q '^\. "$(dirname "$0")/\(\.\./scripts/\)\?lib\.sh"' "$t" || bad="$bad $t"
done
[ -z "$bad" ] && ok "each of $(echo "$tests" | wc -w) script tests sources lib.sh" || fail "not sourcing lib.sh:$bad"

# NAME FILE for every function a test (or lib.sh) defines
# shellcheck disable=SC2086 # the list
defs=$(for f in tests/scripts/lib.sh $tests; do
    sed -n 's/^ *\([A-Za-z_][A-Za-z_0-9]*\)() *{.*/\1/p' "$f" | sort -u | sed "s|\$| $f|"
done)
twice=$(echo "$defs" | awk '{ n[$1]++; f[$1] = f[$1] " " $2 } END { for (k in n) if (n[k] > 1) print k ":" f[k] }')
[ -z "$twice" ] && ok "$(echo "$defs" | wc -l) helpers, none defined twice" ||
    fail "helpers defined in more than one file (move them to lib.sh): $twice"

# shellcheck disable=SC2086 # the list
launcher=$(sed -n 's/^MPIRUN="\(.*\)"$/\1/p' tests/scripts/lib.sh)
own=$(grep -lF -e 'mktemp -d' -e "MPIRUN=\"$launcher\"" $(echo "$tests" | grep -v test_lib) || true)
[ -z "$own" ] && ok "scratch folders and the launcher come from lib.sh" || fail "own scratch folder or launcher: $own"
finish
