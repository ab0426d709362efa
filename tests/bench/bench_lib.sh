# Shared by the benchmarks: sourced, not run.

# med FILE C: the median of column C of FILE (of an even count, the lower
# of the middle two)
med() { awk -v c="$2" '{ print $c }' "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
