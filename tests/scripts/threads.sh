#!/bin/sh
# Threads and honest figures. train, eval and sample warn once a node, in
# one line, when its ranks x threads exceed the cores the ranks are bound to
# (taskset -c 0: one core), and say what would fit; nothing when they fit.
# A calibration file from `plan --calibrate` supplies the sgemm peak (its
# gflops_per_core x threads), and an MFU over 100% (a peak absurdly low) is
# reported as a mismeasured peak, in the log and the metrics, not clamped.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
command -v taskset > /dev/null || { echo "SKIP: taskset not installed (util-linux)"; exit 77; }
taskset -c 0 true 2> /dev/null || { echo "SKIP: cannot bind to core 0 here"; exit 77; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader"

printf 'the quick brown fox jumps over the lazy dog\n%%\n%.0s' $(seq 1 400) > text.txt
"$MODTRAIN" prep --out data --doc-sep % text.txt > /dev/null
T="--seq_len 16 --n_layer 2 --n_head 2 --d_model 16 --route_every 0 --batch_size 4 --steps 2
   --train_data data/train_000000.bin --val_data= --log_every 1 --resume never"
warn="warning: .* exceed the .* bound to"

# expect_warning NAME COUNT PATTERN CMD...: the run succeeds and its stderr
# has COUNT lines matching the warning, the first also matching PATTERN
expect_warning() {
    name=$1 count=$2 pattern=$3
    shift 3
    if ! "$@" > "$name.out" 2> "$name.err"; then
        cat "$name.out" "$name.err"
        fail "$name: the run failed"
        return
    fi
    n=$(grep -c -- "$warn" "$name.err" || true)
    if [ "$n" -eq "$count" ] && { [ "$count" -eq 0 ] || grep -- "$warn" "$name.err" | grep -q -- "$pattern"; }; then
        ok "$name: $n warning(s)${count:+ $(grep -- "$warn" "$name.err" | head -n 1)}"
    else
        cat "$name.err"
        fail "$name: $n warning line(s), expected $count matching /$pattern/"
    fi
}

expect_warning one-core-2-threads 1 "1 rank x 2 threads on .* the 1 core it is bound to.*set threads = 1" \
    taskset -c 0 "$MODTRAIN" train $T --threads 2 --run_dir r1
expect_warning one-core-1-thread 0 "" taskset -c 0 "$MODTRAIN" train $T --threads 1 --run_dir r2
expect_warning two-ranks-one-core 1 "2 ranks x 1 thread on .* the 1 core they are bound to.*run at most 1 rank on" \
    taskset -c 0 $MPIRUN -np 2 "$MODTRAIN" train $T --threads 1 --run_dir r3
if [ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ] && taskset -c 0,1 true 2> /dev/null; then
    expect_warning two-ranks-two-cores 0 "" taskset -c 0,1 $MPIRUN -np 2 "$MODTRAIN" train $T --threads 1 --run_dir r4
    expect_warning two-ranks-two-cores-2-threads 1 "2 ranks x 2 threads on .* the 2 cores they are bound to.*set threads = 1" \
        taskset -c 0,1 $MPIRUN -np 2 "$MODTRAIN" train $T --threads 2 --run_dir r5
fi
expect_warning eval-2-threads 1 "1 rank x 2 threads" \
    taskset -c 0 "$MODTRAIN" eval --ckpt r2/ckpt --data data/val_000000.bin --threads 2
expect_warning sample-2-threads 1 "1 rank x 2 threads" \
    taskset -c 0 "$MODTRAIN" sample --ckpt r2/ckpt --tokens 4 --threads 2
expect_warning sample-1-thread 0 "" taskset -c 0 "$MODTRAIN" sample --ckpt r2/ckpt --tokens 4 --threads 1

# the peak from a calibration file: plan --calibrate writes one; a peak of
# 0.001 GFLOP/s a core makes every step's MFU far above 100%
"$MODTRAIN" plan --calibrate --out measured.txt > cal.log 2>&1 || { cat cal.log; fail "plan --calibrate"; }
# cal.txt: twice the measured peak, as a calibration taken under outside load
# (this machine is shared) may undercount it, and a run's MFU then tops 100%
awk '/^gflops_per_core/ { $0 = "gflops_per_core = " 2 * $3 } { print }' measured.txt > cal.txt
sed 's/^gflops_per_core *=.*/gflops_per_core = 0.001/' cal.txt > low.txt
"$MODTRAIN" train $T --threads 1 --calibration low.txt --run_dir low > low.out 2>&1 ||
    { cat low.out; fail "the run with low.txt"; }
"$MODTRAIN" train $T --threads 1 --calibration cal.txt --run_dir cal > cal.out 2>&1 ||
    { cat cal.out; fail "the run with cal.txt"; }
peak=$(sed -n 's/^gflops_per_core *= *\([0-9.e+-]*\).*/\1/p' cal.txt)
grep -q "sgemm peak .* (low.txt's gflops_per_core x 1 threads)" low.out &&
    grep -q "sgemm peak .* (cal.txt's gflops_per_core x 1 threads)" cal.out &&
    ok "the banner names the calibration file: $(grep -o 'sgemm peak .*' cal.out)" ||
    fail "the banner does not name the calibration: $(grep 'sgemm peak' low.out cal.out)"
# each step's MFU is its FLOPs over the file's peak, however far above 1
line=$(grep '"loss"' low/metrics.jsonl | tail -n 1)
mfu=$(echo "$line" | sed 's/.*"mfu":\([^,]*\).*/\1/')
fpt=$(echo "$line" | sed 's/.*"flops_per_token":\([^,]*\).*/\1/')
tps=$(echo "$line" | sed 's/.*"tokens_per_s":\([^,]*\).*/\1/')
want=$(awk -v f="$fpt" -v t="$tps" 'BEGIN { printf "%.6f", f * t / 1e6 }')
if check_ab "$mfu" "$want" 'a > 1 && (a - b) * (a - b) < (0.001 * b) * (0.001 * b)' &&
    echo "$line" | grep -q '"peak_mismeasured":true' &&
    [ "$(grep -c 'MFU [0-9.]*% (over 100%: the peak was mismeasured)' low.out)" -eq 2 ]; then
    ok "calibration 0.001 GFLOP/s: MFU $mfu (= FLOPs over that peak), logged and recorded as a mismeasured peak"
else
    cat low.out
    fail "calibration 0.001: mfu $mfu, expected $want (FLOPs per token x tokens/s over 1e6) and the mismeasured note: $line"
fi
# the measured machine's own figure: no step above 100%, nothing said
if ! grep -q "peak_mismeasured" cal/metrics.jsonl && ! grep -q "mismeasured" cal.out &&
    check_ab "$(last_json cal/metrics.jsonl mfu)" 1 'a > 0 && a <= b'; then
    ok "calibration $peak GFLOP/s a core (measured): MFU $(last_json cal/metrics.jsonl mfu), no note"
else
    cat cal.out
    fail "the measured calibration reported a mismeasured peak or an MFU over 1"
fi
# no calibration: every rank measures its own peak (the suite sets
# MODTRAIN_PEAK_GFLOPS so that other tests do not), or takes
# MODTRAIN_PEAK_GFLOPS, read strictly
env -u MODTRAIN_PEAK_GFLOPS "$MODTRAIN" train $T --threads 1 --run_dir meas > meas.out 2>&1 ||
    { cat meas.out; fail "the run that measures its peak"; }
mp=$(sed -n 's/.*sgemm peak \([0-9.]*\) GFLOP\/s (measured on rank 0).*/\1/p' meas.out)
check_ab "${mp:-0}" 1 'a > b' && check_ab "$(last_json meas/metrics.jsonl mfu)" 1 'a > 0 && a <= b' &&
    ok "no calibration: measured $mp GFLOP/s, MFU $(last_json meas/metrics.jsonl mfu)" ||
    { cat meas.out; fail "the measured peak: '$mp'"; }
MODTRAIN_PEAK_GFLOPS=1.5e3 "$MODTRAIN" train $T --threads 1 --run_dir envp > envp.out 2>&1 ||
    { cat envp.out; fail "the run with MODTRAIN_PEAK_GFLOPS=1.5e3"; }
grep -q "sgemm peak 1500.0 GFLOP/s (MODTRAIN_PEAK_GFLOPS)" envp.out &&
    ok "MODTRAIN_PEAK_GFLOPS=1.5e3: $(grep -o 'sgemm peak .*' envp.out)" ||
    { cat envp.out; fail "MODTRAIN_PEAK_GFLOPS=1.5e3 was not the peak"; }
for v in 0 -3 12x nan 1e13; do
    rc=0
    MODTRAIN_PEAK_GFLOPS=$v "$MODTRAIN" train $T --threads 1 --run_dir "badenv$v" > be.out 2> be.err || rc=$?
    [ "$rc" -eq 2 ] && [ "$(wc -l < be.err)" -eq 1 ] &&
        grep -q "^modtrain: MODTRAIN_PEAK_GFLOPS = '$v' is not a peak in GFLOP/s" be.err &&
        [ ! -e "badenv$v/metrics.jsonl" ] && ok "MODTRAIN_PEAK_GFLOPS=$v: $(cat be.err)" ||
        fail "MODTRAIN_PEAK_GFLOPS=$v: rc $rc, $(cat be.err)"
done
# a calibration that is not a cluster file: one line, exit 2, before work
set +e
"$MODTRAIN" train $T --calibration text.txt --run_dir bad > bad.out 2> bad.err
rc=$?
set -e
[ "$rc" -eq 2 ] && [ "$(wc -l < bad.err)" -eq 1 ] && grep -q "^modtrain: config: calibration = 'text.txt': text.txt:1: " bad.err &&
    [ ! -e bad/metrics.jsonl ] && ok "$(cat bad.err)" || fail "a bad calibration file: rc $rc, $(cat bad.err)"
finish
