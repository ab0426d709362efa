#!/bin/sh
# The data path's costs, measured (no pass or fail):
#  (a) the startup of `modtrain data` (every shard's header read) on 1,000
#      shards against 1 shard of the same tokens: seconds, the median of
#      REPEAT runs each, and their ratio;
#  (b) the data phase's share of a step of jobs/small.conf (byte tokens,
#      vocab 256) reading a 1,000-shard dataset (TOKENS tokens a shard) from
#      a cold page cache (sync; echo 3 > /proc/sys/vm/drop_caches, as root,
#      where permitted: said when not), and the same run warm: from
#      metrics.jsonl, the sum of "phase_ms"."data" over the sum of
#      "interval_ms", and the data row of the end-of-run phase table.
# usage: tests/bench/bench_data.sh [STEPS (20)] [TOKENS (100000)] [REPEAT (5)]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}
PYTHON=${PYTHON:-python3}
steps=${1:-20} tokens=${2:-100000} repeat=${3:-5}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
SHARDS="$PYTHON $top/tests/scripts/make_shards.py"
mkdir many one
$SHARDS many many/s_ 1000 "$tokens"
$SHARDS text one/s_000000.bin $((1000 * tokens))

# (a) startup: the median of REPEAT runs
startup() { # SPEC: prints the median seconds of `modtrain data --data SPEC`
    i=0
    while [ $i -lt "$repeat" ]; do
        t0=$(date +%s.%N)
        "$MODTRAIN" data --data "$1" --seq_len 128 > /dev/null
        t1=$(date +%s.%N)
        awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f\n", b - a }'
        i=$((i + 1))
    done | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
a=$(startup "$tmp/many/s_*.bin")
b=$(startup "$tmp/one/s_000000.bin")
awk -v a="$a" -v b="$b" 'BEGIN { printf "(a) modtrain data startup: 1,000 shards %.4f s, 1 shard %.4f s: %.2fx (median of '"$repeat"'; %d tokens in each)\n", a, b, a / b, 1000 * '"$tokens"' }'
# and cold, once each
if sync && (echo 3 > /proc/sys/vm/drop_caches) 2> /dev/null; then
    cold=1
    t0=$(date +%s.%N)
    "$MODTRAIN" data --data "$tmp/many/s_*.bin" --seq_len 128 > /dev/null
    t1=$(date +%s.%N)
    echo 3 > /proc/sys/vm/drop_caches
    t2=$(date +%s.%N)
    "$MODTRAIN" data --data "$tmp/one/s_000000.bin" --seq_len 128 > /dev/null
    t3=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" 'BEGIN { printf "    cold page cache: 1,000 shards %.4f s, 1 shard %.4f s\n", b - a, d - c }'
else
    cold=0
    echo "    (cannot drop the page cache here: not root, or /proc/sys/vm/drop_caches not writable)"
fi

# (b) the data phase of small.conf's steps
share() { # RUN_DIR LABEL
    "$PYTHON" - "$1/metrics.jsonl" "$2" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"phase_ms"' in l]
data = sum(j["phase_ms"]["data"] for j in steps)
total = sum(j["interval_ms"] for j in steps)
first = steps[0]["phase_ms"]["data"]
print("(b) %s: data %.3f ms/step of %.1f ms/step: %.3f%% of the step (first step's data %.3f ms; %d steps)"
      % (sys.argv[2], data / len(steps), total / len(steps), 100 * data / total, first, len(steps)))
PY
    sed -n 's/^  data  */    phase table: data /p' "$1.log"
}
run() { # RUN_DIR
    "$MODTRAIN" train --config "$top/jobs/small.conf" --train_data "$tmp/many/s_*.bin" --val_data "" \
        --steps "$steps" --ckpt_every 0 --eval_every 0 --log_every 1000 --threads 1 --run_dir "$1" \
        > "$1.log" 2>&1 || { cat "$1.log"; exit 1; }
}
if [ "$cold" = 1 ]; then
    sync
    echo 3 > /proc/sys/vm/drop_caches
    run cold
    share cold "small.conf, 1,000 shards, cold page cache"
fi
run warm
share warm "small.conf, 1,000 shards, warm page cache"
