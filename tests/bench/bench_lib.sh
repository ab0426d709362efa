# Shared by the benchmarks: sourced, not run.

# med FILE C: the median of column C of FILE (of an even count, the lower
# of the middle two)
med() { awk -v c="$2" '{ print $c }' "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# wholes V...: each V a whole number >= 1, else the bench's die naming it
wholes() {
    for v in "$@"; do
        case $v in '' | *[!0-9]* | 0*) die "'$v' is not a whole number >= 1" ;; esac
    done
}
