#!/bin/sh
# `make fuzz`: builds every harness in tests/fuzz with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer, and runs each for
# FUZZ_SECONDS (default 60) from its seed corpus, FUZZ_JOBS harnesses at a
# time (default: the cores; the planner's alone, last). Needs clang (Debian: clang, libclang-rt-14-dev,
# libomp-14-dev). Inputs that crash, leak, run out of memory or hang land in
# $FUZZ_OUT/crashes/NAME/; copy each into tests/fuzz/regressions/NAME/ once
# fixed, and `make check` replays it forever.
#
#   FUZZ_SECONDS=300 FUZZ_TARGETS="config index" make fuzz
set -eu
srcdir=${srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
seconds=${FUZZ_SECONDS:-60}
out=${FUZZ_OUT:-fuzz-out}
targets=${FUZZ_TARGETS:-config shard index safetensors vocab ranks hf cluster plan merges decode spec prep}
jobs=${FUZZ_JOBS:-$(nproc)}
# the library compiles on every core, whatever FUZZ_JOBS runs side by side
build_jobs=$(nproc)
mpicc=${MPICC:-mpicc}
case $seconds in '' | *[!0-9]*) echo "fuzz: FUZZ_SECONDS='$seconds' is not a whole number" >&2; exit 2 ;; esac
case $jobs in '' | *[!0-9]* | 0*) echo "fuzz: FUZZ_JOBS='$jobs' is not a whole number >= 1" >&2; exit 2 ;; esac
if ! command -v "${FUZZ_CC:-clang}" > /dev/null; then
    echo "fuzz: ${FUZZ_CC:-clang} not found (apt-get install clang libclang-rt-14-dev libomp-14-dev)" >&2
    exit 2
fi
# The library (every source of src/, mpi/ and checkpoint/ but the command
# and the trainer's rooms) is compiled once into an archive, with the
# fuzzer's coverage but not its main; each harness links what it needs.
cflags="-std=gnu11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fopenmp -I$srcdir \
    -fno-sanitize-recover=undefined"
libs="-lz -lpcre2-8 -ljansson -lzstd -lblis -lm"

# $out/libfuzz.a; returns 1 (each failure's report printed) when a source
# did not build
build_library() {
    mkdir -p "$out/obj"
    rm -f "$out/libfuzz.a" "$out/obj/"*.o "$out/obj/"*.failed
    # shellcheck disable=SC2016 # the script given to sh -c expands its own arguments
    (cd "$srcdir" && find src mpi checkpoint -name '*.c' ! -path 'src/cmd/*' ! -path 'src/train/*') |
        LC_ALL=C sort | xargs -P "$build_jobs" -I{} sh -c '
            o="$3/obj/$(echo "${1%.c}" | tr / _).o"
            OMPI_CC="$4" "$5" $6 -fsanitize=fuzzer-no-link,address,undefined -c -o "$o" "$2/$1" \
                > "$o.log" 2>&1 || { cat "$o.log"; : > "$o.failed"; }' sh {} "$srcdir" "$out" \
        "${FUZZ_CC:-clang}" "$mpicc" "$cflags"
    ! ls "$out/obj/"*.failed > /dev/null 2>&1 || return 1
    ar rcs "$out/libfuzz.a" "$out/obj/"*.o
}

# one T: builds and runs harness T; its report goes to $out/T.report, and
# $out/T.failed marks a finding
one() {
    t=$1
    rm -f "$out/$t.failed"
    exec > "$out/$t.report" 2>&1
    # shellcheck disable=SC2086 # word splitting of the flag and library lists is meant
    if ! OMPI_CC=${FUZZ_CC:-clang} "$mpicc" $cflags -fsanitize=fuzzer,address,undefined -o "$out/fuzz_$t" \
        "$srcdir/tests/fuzz/fuzz_$t.c" "$out/libfuzz.a" $libs; then
        echo "fuzz: $t did not build"
        : > "$out/$t.failed"
        return 0
    fi
    mkdir -p "$out/corpus/$t" "$out/crashes/$t"
    regress="$srcdir/tests/fuzz/regressions/$t"
    [ -d "$regress" ] || regress=
    # the bounds modtrain enforces: a config is at most 1 MiB, and nothing a
    # parser allocates exceeds a small multiple of its input
    # a merge table's load time is what the merges harness fuzzes: 2 s is a
    # hang. The planner's largest inputs are slow, not hung: a 55440-core
    # node, 4096 blocks and 2520 experts (every ep of every layout) plan in
    # 0.6 s without sanitizers, 6.8 s with these on a 2-core VM, and
    # twice that again beside another harness or on a slower machine; the
    # harness's own bound on registry rows catches a planner that builds a
    # registry a stage. 30 s is a hang for a plan
    timeout=10
    case $t in merges) timeout=2 ;; plan) timeout=30 ;; esac
    echo "fuzz: $t for ${seconds}s"
    if ! "$out/fuzz_$t" -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=2048 \
        -malloc_limit_mb=64 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="$out/crashes/$t/" "$out/corpus/$t" "$srcdir/tests/fuzz/seeds/$t" \
        $regress > "$out/$t.log" 2>&1; then
        : > "$out/$t.failed"
        echo "fuzz: $t FOUND A PROBLEM: see $out/$t.log and $out/crashes/$t/; its report:"
        # the report is what a CI log must show: the finding, its stack, the input's name
        grep -v -E '^#[0-9]+' "$out/$t.log" | tail -n 60 | sed "s/^/fuzz: $t: /"
    fi
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$out/$t.log" | sed "s/^/fuzz: $t: /"
}

mkdir -p "$out"
build_library || { echo "fuzz: the library did not build" >&2; exit 1; }
# FUZZ_JOBS harnesses at a time, but the planner's alone and last: its
# time-out assumes a core to itself. Each report is printed whole, in order
running=0 status=0 failed= last=
for t in $targets; do
    [ "$t" != plan ] || { last=plan; continue; }
    (one "$t") &
    running=$((running + 1))
    [ "$running" -lt "$jobs" ] || { wait; running=0; }
done
wait
[ -z "$last" ] || (one "$last")
for t in $targets; do
    if [ -f "$out/$t.failed" ]; then
        cat "$out/$t.report" >&2
        status=1 failed="$failed$t "
    else
        cat "$out/$t.report"
    fi
done
[ "$status" -eq 0 ] || echo "fuzz: problems found by: $failed" >&2
exit $status
