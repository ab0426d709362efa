#!/bin/sh
# Each test's wall time in a run of the suite, the longest first, from the
# "# time:" line tests/tools/timed.sh adds to every test's log, and their
# sum: what each test costs CI.
# usage: tests/tools/test_times.sh [BUILD_DIR] (default: .)
dir=${1:-.}
[ -d "$dir/tests" ] || { echo "test_times: '$dir' has no tests/ folder (give the build folder)" >&2; exit 2; }
find "$dir/tests" -name '*.log' ! -name 'test-suite.log' -exec grep -H '^# time: ' {} + |
    sed -e "s|^$dir/||" -e 's|\.log:# time: | |' -e 's| s$||' |
    sort -k2,2 -rn |
    awk '{ printf "%8.1f s  %s\n", $2, $1; sum += $2 } END { printf "%8.1f s  in all (%d tests)\n", sum, NR }'
