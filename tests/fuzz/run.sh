#!/bin/sh
# `make fuzz`: builds every harness in tests/fuzz with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer, and runs each for
# FUZZ_SECONDS (default 60) from its seed corpus. Needs clang (Debian:
# clang, libclang-rt-14-dev, libomp-14-dev). Inputs that crash, leak, run
# out of memory or hang land in $FUZZ_OUT/crashes/NAME/; copy each into
# tests/fuzz/regressions/NAME/ once fixed, and `make check` replays it forever.
#
#   FUZZ_SECONDS=300 FUZZ_TARGETS="config index" make fuzz
set -eu
srcdir=${srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
seconds=${FUZZ_SECONDS:-60}
out=${FUZZ_OUT:-fuzz-out}
targets=${FUZZ_TARGETS:-config shard index safetensors vocab cluster plan merges decode spec prep}
mpicc=${MPICC:-mpicc}
if ! command -v "${FUZZ_CC:-clang}" > /dev/null; then
    echo "fuzz: ${FUZZ_CC:-clang} not found (apt-get install clang libclang-rt-14-dev libomp-14-dev)" >&2
    exit 2
fi
flags="-std=gnu11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fopenmp -I$srcdir \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
lib="src/base/util.c src/base/fault.c src/base/rng.c mpi/check.c src/config.c src/data.c checkpoint/ckio.c checkpoint/huff.c \
    checkpoint/safetensors.c src/bpe.c src/cluster.c src/dataset.c"
mkdir -p "$out"
status=0
for t in $targets; do
    srcs="$srcdir/tests/fuzz/fuzz_$t.c" more= libs=
    # the planner sizes models: the model, its kernels and collectives link in
    [ "$t" = plan ] && more="src/plan.c src/model.c src/model_mem.c src/routing.c src/mlp.c src/head.c src/decode.c src/kernels.c src/attention.c mpi/tp.c mpi/ep.c mpi/pipeline.c" libs="-lblis -lm"
    # prep reads gzip, zstd and JSON Lines
    [ "$t" = prep ] && more="src/prep.c" libs="-lzstd -ljansson -lm"
    for f in $lib $more; do srcs="$srcs $srcdir/$f"; done
    # shellcheck disable=SC2086 # word splitting of the flag and source lists is meant
    OMPI_CC=${FUZZ_CC:-clang} "$mpicc" $flags -o "$out/fuzz_$t" $srcs -lz -lpcre2-8 -ljansson $libs
    mkdir -p "$out/corpus/$t" "$out/crashes/$t"
    regress="$srcdir/tests/fuzz/regressions/$t"
    [ -d "$regress" ] || regress=
    # the bounds modtrain enforces: a config is at most 1 MiB, and nothing a
    # parser allocates exceeds a small multiple of its input
    # a merge table's load time is what the merges harness fuzzes, and the
    # planner plans any input it accepts in about a second at most (these
    # sanitizers and coverage slow it about eightfold: the seeds' 55440-core,
    # 4096-block plan, which also tries every ep of an MoE model's layouts,
    # takes 0.9 to 1.2 s here): 2 s is a hang for the merges, 4 s for a plan
    timeout=10
    case $t in merges) timeout=2 ;; plan) timeout=4 ;; esac
    echo "fuzz: $t for ${seconds}s"
    if ! "$out/fuzz_$t" -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=2048 \
        -malloc_limit_mb=64 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="$out/crashes/$t/" "$out/corpus/$t" "$srcdir/tests/fuzz/seeds/$t" \
        $regress > "$out/$t.log" 2>&1; then
        status=1 failed="${failed:-}$t "
        echo "fuzz: $t FOUND A PROBLEM: see $out/$t.log and $out/crashes/$t/; its report:" >&2
        # the report is what a CI log must show: the finding, its stack, the input's name
        grep -v -E '^#[0-9]+' "$out/$t.log" | tail -n 60 | sed "s/^/fuzz: $t: /" >&2
    fi
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$out/$t.log" | sed "s/^/fuzz: $t: /"
done
[ "$status" -eq 0 ] || echo "fuzz: problems found by: ${failed:-}" >&2
exit $status
