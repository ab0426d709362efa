#!/bin/sh
# The tree's structure holds: every #include names its layer from the top of
# the tree and points down (src/base <- mpi <- src <- checkpoint <- src/cmd),
# library code never prints errors or chooses exit codes (only src/cmd
# does), nothing but mpi/pipeline.c calls MPI point-to-point, and no
# function in src/, mpi/ or checkpoint/ is longer than 100 lines.
. "$(dirname "$0")/lib.sh"
cd "$srcdir"

layer() {
    case $1 in
    src/base/*) echo 0 ;;
    mpi/*) echo 1 ;;
    src/cmd/*) echo 4 ;;
    checkpoint/*) echo 3 ;;
    src/*) echo 2 ;;
    *) echo 9 ;;
    esac
}

files=$(find src mpi checkpoint -name '*.[ch]' | LC_ALL=C sort)
bad=0
for f in $files; do
    from=$(layer "$f")
    for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
        if [ ! -f "$inc" ]; then
            fail "$f includes \"$inc\", which is not a path from the top of the tree"
            bad=1
        elif [ "$(layer "$inc")" -gt "$from" ]; then
            fail "$f (layer $from) includes $inc (layer $(layer "$inc")), a layer above it"
            bad=1
        fi
    done
done
[ "$bad" -eq 0 ] && ok "every include points to its own layer or below"

lib=$(echo "$files" | grep -v '^src/cmd/' | grep -v '^src/base/util\.c$' | grep '\.c$')
# shellcheck disable=SC2086
printing=$(grep -n '\berrorf(\|\blog0(\|\berr_print(\|\bprintf(\|\bexit(' $lib | grep -v '^mpi/check\.c' || true)
[ -z "$printing" ] && ok "library code returns errors; only src/cmd prints them" ||
    fail "library code prints or exits: $printing"

# shellcheck disable=SC2086
p2p=$(grep -n 'MPI_I\?[SR][ec][nc]v\?\b\|MPI_Sendrecv\|MPI_Isend\|MPI_Irecv\|MPI_Send\b\|MPI_Recv\b' $files |
    grep -v '^mpi/pipeline\.c' || true)
[ -z "$p2p" ] && ok "only mpi/pipeline.c calls MPI point-to-point" || fail "point-to-point elsewhere: $p2p"

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
finish
