#!/bin/sh
# The tree's structure holds: every #include names its room from the top of
# the tree and points to a room below (the table in rooms() below, drawn in
# docs/architecture.md), library code never prints errors or chooses exit
# codes (only src/cmd does; src/train returns a status), nothing but
# mpi/pipeline.c calls MPI point-to-point, no two files call each other
# round a circle (the graph of which object uses a symbol another defines,
# from nm), no function in src/, mpi/ or checkpoint/ is longer than 100
# lines, and no file there is longer than 800 or opens without a comment
# saying what it is for.
. "$(dirname "$0")/lib.sh"
cd "$srcdir"

room() { # FILE: the room it stands in
    case $1 in
    src/*/*) f=${1#src/} && echo "${f%%/*}" ;;
    mpi/* | checkpoint/*) echo "${1%%/*}" ;;
    *) echo "?" ;;
    esac
}
# ROOM: the rooms it may include from, itself first; from the ground floor up
below() {
    case $1 in
    base) echo base ;;
    mpi | kernels | config | data | tokenizer) echo "$1 base" ;;
    model) echo "model kernels config mpi base" ;;
    prep) echo "prep tokenizer data base" ;;
    plan) echo "plan model data config kernels mpi base" ;;
    checkpoint) echo "checkpoint model config kernels mpi base" ;;
    train) echo "train checkpoint plan model data config kernels mpi base" ;;
    cmd) echo "cmd train checkpoint plan prep model tokenizer data config kernels mpi base" ;;
    *) echo "" ;;
    esac
}

files=$(find src mpi checkpoint -name '*.[ch]' | LC_ALL=C sort)
bad=0
for f in $files; do
    from=$(room "$f")
    [ -n "$(below "$from")" ] || { fail "$f stands in no room of the table (src/ROOM/, mpi/ or checkpoint/)"; bad=1; }
    for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
        if [ ! -f "$inc" ]; then
            fail "$f includes \"$inc\", which is not a path from the top of the tree"
            bad=1
        elif ! echo " $(below "$from") " | grep -q " $(room "$inc") "; then
            fail "$f (room $from) includes $inc (room $(room "$inc")), which is not below it: $from may include $(below "$from")"
            bad=1
        fi
    done
done
[ "$bad" -eq 0 ] && ok "every include points to its own room or one below it"

lib=$(echo "$files" | grep -v '^src/cmd/' | grep -v '^src/base/util\.c$' | grep '\.c$')
# shellcheck disable=SC2086
printing=$(grep -n '\berrorf(\|\blog0(\|\berr_print(\|\bprintf(\|\bexit(' $lib | grep -v '^mpi/check\.c' || true)
[ -z "$printing" ] && ok "library code returns errors; only src/cmd prints them" ||
    fail "library code prints or exits: $printing"

# the trainer returns a TrainStatus; src/cmd/train.c chooses the exit code
# shellcheck disable=SC2086
exits=$(grep -n 'exit(\|EXIT_' $(echo "$files" | grep '^src/train/') || true)
[ -z "$exits" ] && ok "src/train ends no process and names no exit code" ||
    fail "src/train exits or names an exit code: $exits"

# shellcheck disable=SC2086
p2p=$(grep -n 'MPI_I\?[SR][ec][nc]v\?\b\|MPI_Sendrecv\|MPI_Isend\|MPI_Irecv\|MPI_Send\b\|MPI_Recv\b' $files |
    grep -v '^mpi/pipeline\.c' || true)
[ -z "$p2p" ] && ok "only mpi/pipeline.c calls MPI point-to-point" || fail "point-to-point elsewhere: $p2p"

# The calls between files: an edge A -> B when A's object uses a symbol
# B's defines; tsort finds any circle. The objects are the build's (next to
# the binary the tests run).
build=$(dirname "$MODTRAIN")
objs=$(cd "$build" && find src mpi checkpoint -name '*.o' | LC_ALL=C sort)
if [ -z "$objs" ]; then
    fail "no object files under $build/src: the call graph needs a build"
else
    # each live object's FILE.c and SYMBOL, defined (global) or used
    live=$(for o in $objs; do [ -f "$srcdir/${o%.o}.c" ] && echo "$o"; done) # not a removed file's
    # shellcheck disable=SC2086 # the object list
    (cd "$build" && nm -A -P --defined-only $live) |
        awk '$3 ~ /^[TDBRGSVW]$/ { sub(/\.o:$/, ".c", $1); print $2, $1 }' > "$TMP/defs"
    # shellcheck disable=SC2086
    calls=$(cd "$build" && nm -A -P -u $live | awk '{ sub(/\.o:$/, ".c", $1); print $2, $1 }' |
        awk 'NR == FNR { def[$1] = $2; next } ($1 in def) && def[$1] != $2 { print $2, def[$1] }' \
            "$TMP/defs" - | LC_ALL=C sort -u)
    n=$(printf '%s\n' "$calls" | grep -c .)
    circles=$(printf '%s\n' "$calls" | tsort 2>&1 > /dev/null | sed -e 's/^tsort: //' -e 's/^-: input contains a loop:/;/' | tr '\n' ' ')
    if [ "$n" -lt 100 ]; then
        fail "only $n calls between files found in $build's objects: the scan is broken"
    elif [ -z "$circles" ]; then
        ok "no circle among the $n calls between files (from nm)"
    else
        fail "files call each other round a circle: $circles"
    fi
fi

# A function starts at a line beginning with a type and ending in "{" (or
# continued from such a line) and ends at the first "}" in column 0.
long=$(for f in $(echo "$files" | grep '\.c$'); do
    awk -v f="$f" '
        start == 0 && /^[A-Za-z].*\(/ && !/;$/ && !/^static const/ { start = NR; name = $0 }
        start && /^}/ { if (NR - start + 1 > 100) print f ": " NR - start + 1 " lines: " name; start = 0 }
        start && /;$/ && NR == start { start = 0 }
    ' "$f"
done)
[ -z "$long" ] && ok "no function is longer than 100 lines" || fail "too long: $long"

# shellcheck disable=SC2086 # the list
big=$(wc -l $files | awk '$2 != "total" && $1 > 800 { print $2 ": " $1 " lines" }')
[ -z "$big" ] && ok "no file is longer than 800 lines" || fail "files too long (split them by concern): $big"
bare=$(for f in $files; do head -n 1 "$f" | grep -q '^/\*' || echo "$f"; done)
[ -z "$bare" ] && ok "every file opens with what it is for" || fail "no opening comment: $bare"
finish
