# Shared by the script tests: a scratch directory, the binary, and helpers.
# Sourced, not run. Each test exits 0 (pass), 77 (skip) or 1 (fail).
set -eu
MODTRAIN=${MODTRAIN:-$(pwd)/modtrain}
srcdir=${srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} # a thread a process (see Makefile.am)
export MODTRAIN_PEAK_GFLOPS=${MODTRAIN_PEAK_GFLOPS-100} # no run measures unless asked
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} # idle threads sleep (see Makefile.am)
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1} # waiting ranks yield
TMP=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-test.XXXXXX")
# nodes_up N RATE sets NODES; the emulated hosts go with the test
NODES=""
trap '[ -z "$NODES" ] || "$srcdir/tests/tools/nodes.sh" down "$NODES" > /dev/null 2>&1; rm -rf "$TMP"' EXIT
# Open MPI's session folders in the test's own scratch: a plain process
# (a singleton) names its folder by a 16-bit hash, and tests side by side
# must not meet in /tmp (once in CI a singleton's MPI_Init failed so)
mkdir "$TMP/.mpi"
export OMPI_MCA_orte_tmpdir_base="$TMP/.mpi"
# The suite starts thousands of processes, so each starts lighter (the docs'
# commands keep the defaults: readme_commands.sh): a plain process without
# Open MPI's daemon (0.15 s and a core's share each), and the ranks with
# ob1, the messaging layer Open MPI picks here anyway, named rather than
# found by loading and probing the others (0.2 s a process)
export OMPI_MCA_ess_singleton_isolated=${OMPI_MCA_ess_singleton_isolated:-1}
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
PYTHON=${PYTHON:-/usr/bin/python3}
# ranks as root, more ranks than cores, shared memory between them
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader"
failures=0
# slow = 0 under MODTRAIN_SKIP_SLOW (CI's passes after the first): tests
# trim their longest matrices by it (docs/development.md's Tests lists how)
slow=1
[ -z "${MODTRAIN_SKIP_SLOW:-}" ] || slow=0

fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

ok() { echo "ok: $*"; }

# unavailable WHY: a reference a test compares with cannot be had (node,
# npm, the registry): skip, or fail where MODTRAIN_REQUIRE_REFERENCE=1 (CI)
unavailable() {
    if [ "${MODTRAIN_REQUIRE_REFERENCE:-0}" = 1 ]; then
        echo "FAIL: $1" >&2
        exit 1
    fi
    echo "SKIP: $1"
    exit 77
}

# Prepares the fortunes text once per test into $TMP/data.
prep_fortunes() {
    if [ ! -d "${FORTUNES_DIR:-/usr/share/games/fortunes}" ]; then
        echo "SKIP: the fortunes package is not installed (apt-get install fortunes)"
        exit 77
    fi
    MODTRAIN=$MODTRAIN "$srcdir/jobs/prep_fortunes.sh" "$TMP/data" > /dev/null
}

# Entropy (nats) of the byte distribution of a shard: the loss of the best
# model that ignores context.
unigram_entropy() {
    "$PYTHON" - "$1" <<'PY'
import math, struct, sys
from collections import Counter
raw = open(sys.argv[1], "rb").read()[1024:]
c = Counter(struct.unpack("<%dH" % (len(raw) // 2), raw))
n = sum(c.values())
print("%.4f" % -sum(k / n * math.log(k / n) for k in c.values()))
PY
}

# Value of a JSON key on the last line of a file that has it.
last_json() { grep "\"$2\"" "$1" | tail -n 1 | sed -e "s/.*\"$2\":\([^,}]*\).*/\1/"; }

# Succeeds when the awk condition on a and b holds: check_ab A B 'a < b'
check_ab() { awk -v a="$1" -v b="$2" "BEGIN { exit !($3) }"; }

# edit_index DIR PYTHON: runs PYTHON on `lines` (the index's lines, bytes,
# without the end line), then writes them back with a valid end CRC: damage
# that only the index's own checks can find
edit_index() {
    "$PYTHON" - "$1/index" "$2" <<'PY'
import sys, zlib
path, code = sys.argv[1], sys.argv[2]
lines = [l for l in open(path, "rb").read().split(b"\n")[:-1] if not l.startswith(b"end ")]
exec(code)
text = b"".join(l + b"\n" for l in lines)
open(path, "wb").write(text + b"end %08x\n" % zlib.crc32(text))
PY
}

# expect_exit CODE PATTERN CMD...: CMD (stdin empty) exits CODE with one
# stderr line matching PATTERN; its output in out.txt and err.txt
expect_exit() {
    code=$1 pattern=$2
    shift 2
    set +e
    "$@" > out.txt 2> err.txt < /dev/null
    rc=$?
    set -e
    lines=$(wc -l < err.txt)
    if [ "$rc" -ne "$code" ]; then
        fail "'$*' exited $rc, expected $code ($(cat err.txt))"
    elif [ "$lines" -ne 1 ]; then
        fail "'$*' printed $lines lines on stderr, expected 1: $(cat err.txt)"
    elif ! grep -q -- "$pattern" err.txt; then
        fail "'$*' said '$(cat err.txt)', expected /$pattern/"
    else
        ok "$(cat err.txt)"
    fi
}
# expect_error PATTERN CMD...: exit 2 (bad input found before any work)
expect_error() { expect_exit 2 "$@"; }

# expect_train_error NP PATTERN ARGS...: `modtrain train $common ARGS`
# under $MPIRUN -np NP fails (not by time-out) with one "modtrain:" line
# matching PATTERN, mpirun's own lines aside
expect_train_error() {
    np=$1 pattern=$2
    shift 2
    set +e
    # shellcheck disable=SC2086 # the options
    timeout -k 10 120 $MPIRUN -np "$np" "$MODTRAIN" train $common --run_dir bad "$@" > bad.log 2>&1
    rc=$?
    set -e
    n=$(grep -c "^modtrain: " bad.log)
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$n" -eq 1 ] && grep -q -- "$pattern" bad.log &&
        ok "$(grep '^modtrain: ' bad.log)" || { cat bad.log; fail "expected one line matching /$pattern/"; }
}

# train RUN [NP] [--key value ...]: `modtrain train $common --run_dir RUN
# ...` (the test's $common), under `$MPIRUN -np NP` when NP is given and as
# one process when not, within $TRAIN_TIMEOUT seconds (300); its exit code
# in $rc, its output in RUN.log
train() {
    run=$1
    shift
    launch=
    case ${1:-} in
    [0-9]*) launch="$MPIRUN -np $1" && shift ;;
    esac
    set +e
    # shellcheck disable=SC2086 # the launcher and the options
    timeout -k 10 "${TRAIN_TIMEOUT:-300}" $launch "$MODTRAIN" train $common --run_dir "$run" "$@" > "$run.log" 2>&1
    rc=$?
    set -e
}
# train_ok RUN [NP] [--key value ...]: train, and a failure (with its log)
# unless it exits 0
train_ok() {
    train "$@"
    [ "$rc" -eq 0 ] || { cat "$run.log"; fail "$run: training ($*) failed (exit $rc)"; }
}

# losses RUN: the loss of each step in RUN/metrics.jsonl, a line each
losses() { grep '"loss"' "$1/metrics.jsonl" | sed -e 's/.*"loss":\([^,]*\).*/\1/'; }
# stable_metrics RUN: RUN's metrics lines without what timing and traffic
# change between layouts (speed, MFU, bytes sent, the bubble) or saves add
stable_metrics() {
    grep -v '"ckpt_' "$1/metrics.jsonl" | sed -e 's/"tokens_per_s":[^,]*,"step_time_ms":[^,]*,"mfu":[^,]*,//' \
        -e 's/"tp_bytes":[0-9]*,//' -e 's/"ep_bytes":[0-9]*,//' -e 's/,"pp_bubble".*//'
}
# close_runs A B TOL STEPS: runs A and B logged STEPS losses each, every
# one within TOL of the other (relative), and their final checkpoints
# agree within TOL (ckpt diff's report in diff.txt)
close_runs() {
    losses "$1" > a.txt
    losses "$2" > b.txt
    worst=$(paste a.txt b.txt | awk '{ d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.2g", m }')
    [ "$(wc -l < a.txt)" -eq "$4" ] && [ "$(wc -l < b.txt)" -eq "$4" ] && check_ab "$worst" "$3" 'a <= b' &&
        "$MODTRAIN" ckpt diff --a "$1/ckpt" --b "$2/ckpt" --tol "$3" > diff.txt
}
# same_run REF NAME WHAT TOL STEPS: ok when close_runs REF NAME TOL STEPS
# holds (saying how close), else a failure with both runs' losses
same_run() {
    if close_runs "$1" "$2" "$4" "$5"; then
        ok "$3 = $1: losses differ by at most $worst relative (as logged), $(tail -n 1 diff.txt | sed 's/ckpt diff: //')"
    else
        paste a.txt b.txt
        cat diff.txt 2> /dev/null || true # (none when the losses differed)
        fail "$3 differs from $1"
    fi
}
# need_torch: skips the test (exit 77) where $PYTHON cannot import torch
need_torch() {
    "$PYTHON" -c "import torch" 2> /dev/null && return 0
    echo "SKIP: $PYTHON cannot import torch (apt-get install python3-torch)"
    exit 77
}
# pp_live_max RUN: the most activations a stage held live, over RUN's steps
pp_live_max() { grep -o '"pp_live":[0-9]*' "$1/metrics.jsonl" | cut -d: -f2 | sort -n | tail -n 1; }
# step_dir RUN N: RUN's checkpoint directory of step N
step_dir() { printf '%s/ckpt/step-%08d' "$1" "$2"; }
# wait_steps RUN N: waits (up to 2 minutes) until RUN has logged N steps;
# fails (returns 1) if it never does
wait_steps() {
    i=0
    while [ $i -lt 1200 ]; do
        n=$(cat "$1/metrics.jsonl" 2> /dev/null | grep -c '"loss"' || true)
        [ "${n:-0}" -ge "$2" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# same_files A B: directories A and B hold the same names, byte for byte
same_files() {
    [ -d "$1" ] && [ -d "$2" ] || return 1
    [ "$(ls "$1")" = "$(ls "$2")" ] || return 1
    for f in "$1"/*; do cmp -s "$f" "$2/$(basename "$f")" || return 1; done
}
# expect_same_ckpt A B WHAT: checkpoints A and B hold the same state, bit for
# bit (ckpt diff --tol 0)
expect_same_ckpt() {
    if d=$("$MODTRAIN" ckpt diff --a "$1" --b "$2" --tol 0 2>&1); then ok "$3: $d"; else fail "$3: $d"; fi
}
# expect_same_step A B STEP WHAT: runs A and B logged the same losses and
# wrote the same checkpoint of step STEP, byte for byte
expect_same_step() {
    if cmp -s "$(step_dir "$1" "$3")/data.bin" "$(step_dir "$2" "$3")/data.bin" &&
        [ "$(losses "$1")" = "$(losses "$2")" ]; then
        ok "$4: byte for byte"
    else
        fail "$4: the losses or the final checkpoints differ"
    fi
}

# same_ckpt A B: two checkpoint directories hold the same state byte for
# byte: data.bin, and the index but for its record of the line (the run id
# drawn at each fresh start, the step it descends from) and the CRC that
# covers them
same_ckpt() {
    cmp -s "$1/data.bin" "$2/data.bin" &&
        [ "$(grep -av '^kv state.run_id \|^kv state.parent_step \|^end ' "$1/index")" = \
            "$(grep -av '^kv state.run_id \|^kv state.parent_step \|^end ' "$2/index")" ]
}

# nodes_up N RATE: N emulated hosts node1..nodeN (tests/tools/nodes.sh),
# their links throttled to RATE (none: not), removed when the test ends;
# skips the test (77) where they cannot be made. `on_nodes [mpirun options]
# PROGRAM ...` runs mpirun on node1 over them.
nodes_up() {
    NODES=$TMP/nodes
    set +e
    "$srcdir/tests/tools/nodes.sh" up "$NODES" "$1" --rate "$2" > "$TMP/nodes.out" 2>&1
    rc=$?
    set -e
    [ "$rc" = 77 ] && { grep SKIP "$TMP/nodes.out"; NODES=""; exit 77; }
    [ "$rc" = 0 ] || { cat "$TMP/nodes.out"; fail "emulated hosts: nodes.sh up failed"; finish; }
}
on_nodes() { timeout -k 10 "${TRAIN_TIMEOUT:-300}" "$srcdir/tests/tools/nodes.sh" mpirun "$NODES" "$@"; }

finish() {
    if [ "$failures" -ne 0 ]; then
        echo "$failures check(s) failed"
        exit 1
    fi
    echo "all checks passed"
    exit 0
}

# Writes a byte-level GPT-2-format vocabulary into DIR: the 256 bytes in
# GPT-2's alphabet and <|endoftext|>, no merges.
byte_vocab() {
    mkdir -p "$1"
    "$PYTHON" - "$1" <<'PY'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
enc = {chr(c): i for i, c in enumerate(cs)}
enc["<|endoftext|>"] = 256
open(sys.argv[1] + "/encoder.json", "w").write(json.dumps(enc))
open(sys.argv[1] + "/vocab.bpe", "w").write("#version: 0.2\n")
PY
}
