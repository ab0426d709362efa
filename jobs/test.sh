#!/bin/sh
# The whole test suite from a fresh Debian machine, in one command: installs
# what the tests need (jobs/deps.sh --slurm --node, when run as root), builds
# with warnings as errors, runs `make check`, and fails when a test failed or
# was skipped: the SLURM test starts its own cluster as root, and the
# tokenizer's reference tests fail rather than skip without node or the npm
# registry. More options go to jobs/deps.sh (--fuzz).
# usage: jobs/test.sh [--no-deps] [--fuzz]
set -eu
usage() {
    echo "usage: jobs/test.sh [--no_deps] [--fuzz]"
    echo "Installs the test dependencies (as root: jobs/deps.sh --slurm --node; --no_deps"
    echo "leaves the packages alone), builds with warnings as errors, runs make check and"
    echo "fails when a test failed or was skipped. --fuzz also installs libFuzzer's packages."
}
for opt in "$@"; do
    case $opt in --help | -h) usage; exit 0 ;; esac
done
cd "$(dirname "$0")/.."
[ -f configure.ac ] || {
    echo "test.sh: $(pwd) is not a modtrain source tree (an installed copy?): run it from a checkout" >&2
    exit 2
}
deps="--slurm --node"
install=1
for opt in "$@"; do
    case $opt in
    --no-deps | --no_deps) install=0 ;;
    --fuzz) deps="$deps $opt" ;;
    *)
        echo "test: unknown option '$opt' (expected --no_deps or --fuzz; see jobs/test.sh --help)" >&2
        exit 2
        ;;
    esac
done
if [ "$install" -eq 1 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        # shellcheck disable=SC2086 # the options
        jobs/deps.sh $deps
    else
        echo "test: not root, so the packages are not installed (jobs/deps.sh $deps as root does it)"
    fi
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MODTRAIN_REQUIRE_REFERENCE="${MODTRAIN_REQUIRE_REFERENCE:-1}"
unset MODTRAIN_SKIP_SLOW
./autogen.sh
./configure --enable-werror
rc=0
# one test more than the cores: the tests wait a third of their time (on
# mpirun's start, fsync, a scheduler), and the extra one fills it (the
# suite took 437 s at -j3 on 2 cores, 541 s at -j2)
make -j"$(($(nproc) + 1))" check || rc=$?
log=test-suite.log
pass=$(sed -n 's/^# PASS: *//p' "$log")
fail=$(($(sed -n 's/^# FAIL: *//p' "$log") + $(sed -n 's/^# ERROR: *//p' "$log")))
skip=$(sed -n 's/^# SKIP: *//p' "$log")
echo "test: ${pass:-0} passed, $fail failed, ${skip:-0} skipped"
if [ "$rc" -ne 0 ]; then
    cat "$log"
    exit 1
fi
if [ "${skip:-0}" -ne 0 ]; then
    grep -h '^SKIP' tests/*/*.log 2> /dev/null || true
    echo "test: ${skip} test(s) skipped; on a fresh Debian machine, as root, none should" >&2
    exit 1
fi
