#!/bin/sh
# Asynchronous saves (ckpt_async 1, the default) on real ranks.
# - On 1 rank (2 threads), (tp 2, dp 2) and (pp 2, dp 2): the step-10 save
#   made in the background holds byte for byte what a synchronous save
#   holds, and 10 steps, an asynchronously written step-10 checkpoint, a
#   resume and 10 more steps end bitwise equal to 20 steps straight.
# - A process killed with SIGKILL at each phase of the step-10 save (state
#   copied, a round packed, a round written, index written before the
#   rename; and between data and index) leaves step 5 the newest
#   checkpoint, loadable, and the resumed run ends bitwise equal.
# - SIGUSR1 while a save is in flight (made slow): the save commits, then
#   the stop's checkpoint; exit 75; the resumed run ends bitwise equal.
# - time_limit with a save in flight stops after it committed.
# - A (tp 2, dp 2) asynchronously written checkpoint loads exactly under
#   one rank and under pp 2.
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --steps 20 --ckpt_keep 5 --eval_every 0 --log_every 1000 --threads 1 --peak_gflops 50 \
    --route_every 2 --capacity 0.25"
same_data_bin() { # A B WHAT: the same data.bin byte for byte
    cmp -s "$1/data.bin" "$2/data.bin" && ok "$3" || fail "$3: data.bin differs"
}
step20() { echo "$1/ckpt/step-00000020"; }

for lay in "one:1:--threads 2" "tp2dp2:4:--tp 2" "pp2dp2:4:--pp 2"; do
    name=${lay%%:*} rest=${lay#*:} np=${rest%%:*} opts=${rest#*:}
    train_ok "$name-sync" "$np" $opts --ckpt_every 10 --ckpt_async 0
    train_ok "$name-async" "$np" $opts --ckpt_every 10
    grep -q "^checkpoint: $name-async/ckpt/step-00000010 | [0-9.]*s in the background, stall" \
        "$name-async.log" && ok "$name: step 10 saved in the background" ||
        { cat "$name-async.log"; fail "$name: step 10 not saved in the background"; }
    same_data_bin "$name-sync/ckpt/step-00000010" "$name-async/ckpt/step-00000010" \
        "$name: the asynchronous step-10 save holds the synchronous one's bytes"
    mkdir -p "$name-resumed/ckpt"
    cp -r "$name-async/ckpt/step-00000010" "$name-resumed/ckpt/"
    train_ok "$name-resumed" "$np" $opts --ckpt_every 10
    grep -q "resume: loaded $name-resumed/ckpt/step-00000010" "$name-resumed.log" ||
        fail "$name: did not resume from step 10"
    same_data_bin "$(step20 "$name-sync")" "$(step20 "$name-resumed")" \
        "$name: 10 steps + asynchronous save + resume + 10 = 20 steps straight"
done

# killed at each phase of the asynchronous save of step 10
killed_in_save() { # NAME NP FAULT REFERENCE [--key value ...]
    name=$1 np=$2 fault=$3 ref=$4
    shift 4
    MODTRAIN_FAULT=$fault train "$name" "$np" --ckpt_every 5 "$@"
    if [ "$rc" -eq 0 ] || ! grep -q "MODTRAIN_FAULT=${fault%:10}" "$name.log"; then
        cat "$name.log"
        fail "$name: $fault did not kill the run (exit $rc)"
        return
    fi
    newest=$("$MODTRAIN" ckpt list --ckpt "$name/ckpt" | awk '$1 ~ /^step-/ { print $1; exit }')
    [ "$newest" = step-00000005 ] && [ ! -e "$name/ckpt/step-00000010" ] &&
        "$MODTRAIN" ckpt verify --ckpt "$name/ckpt/step-00000005" > /dev/null &&
        ok "$name: killed by $fault (exit $rc), step 5 the newest checkpoint, verified" ||
        fail "$name: after $fault the newest checkpoint is '$newest'"
    train_ok "$name" "$np" --ckpt_every 5 "$@"
    grep -q "resume: loaded $name/ckpt/step-00000005" "$name.log" || fail "$name: not resumed from step 5"
    same_data_bin "$(step20 "$ref")" "$(step20 "$name")" "$name: the resumed run ends bitwise equal"
}
for phase in staged pack write rename; do
    killed_in_save "kill-$phase" 1 "save-kill:$phase:10" one-sync --threads 2
done
killed_in_save kill-index 1 "save-crash:10" one-sync --threads 2
killed_in_save kill-write-tp2dp2 4 "save-kill:write:10" tp2dp2-sync --tp 2

# SIGUSR1 to mpirun while the step-5 save is in flight (each save made 2 s slower)
train_ok dp2-sync 2 --ckpt_every 10 --ckpt_async 0
MODTRAIN_FAULT=save-slow:2000 $MPIRUN -np 2 "$MODTRAIN" train $common --run_dir usr1 --ckpt_every 5 \
    > usr1.log 2>&1 &
pid=$!
i=0
while [ $i -lt 600 ] && [ ! -d usr1/ckpt/step-00000005.tmp ]; do
    sleep 0.05
    i=$((i + 1))
done
kill -USR1 $pid
set +e
wait $pid
rc=$?
set -e
k=$(sed -n 's/^stopping at step \([0-9]*\)\/.* on SIGUSR1.*/\1/p' usr1.log)
order=$(grep -n "^checkpoint: usr1/ckpt/step-00000005 | .* in the background\|^stopping at step" usr1.log |
    cut -d: -f1 | tr '\n' ' ')
if [ "$rc" -eq 75 ] && [ -n "$k" ] && [ "$k" -gt 5 ] && [ "$(echo $order | wc -w)" -eq 2 ] &&
    "$MODTRAIN" ckpt verify --ckpt usr1/ckpt/step-00000005 > /dev/null &&
    "$MODTRAIN" ckpt verify --ckpt usr1/ckpt/step-$(printf %08d "$k") > /dev/null; then
    ok "SIGUSR1 during the step-5 save: it committed, then step $k's; exit 75"
else
    cat usr1.log
    fail "SIGUSR1 during a save (exit $rc, stopped at '$k')"
fi
stall=$(grep "\"step\":$k,\"ckpt_stall_ms\"" usr1/metrics.jsonl | head -n 1 |
    sed 's/.*"ckpt_stall_ms":\([0-9.]*\).*/\1/')
check_ab "${stall:-0}" 0 'a > 0' && ok "the wait for the save in flight is in metrics: ${stall} ms at step $k" ||
    fail "no ckpt_stall_ms at step $k: $(grep ckpt_stall usr1/metrics.jsonl)"
train_ok usr1 2 --ckpt_every 5
same_data_bin "$(step20 dp2-sync)" "$(step20 usr1)" "SIGUSR1: the resumed run ends bitwise equal"

# time_limit while a save is in flight: the save commits, then the stop's
# (the probe write at setup is slowed as much as a save, 1.5 s, and the
# stop's save is budgeted from it, so the whole run keeps to the limit).
# The limit counts from the process's start and this clock from before its
# exec, and the exit comes after: a loaded machine (make -j3 on 2 cores)
# adds up to a second there. A stop's save left out of the budget would
# end the run at about the limit plus the 1.5 s save, past 9 s.
t0=$(date +%s.%N)
MODTRAIN_FAULT=save-slow:1500 train limit 1 --ckpt_every 5 --steps 100000 --time_limit 8
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
k=$(sed -n 's/^stopping at step \([0-9]*\)\/.* on time_limit.*/\1/p' limit.log)
check_ab "$wall" 9 'a < b' && ok "time_limit 8 with slow saves: the run took ${wall} s (under 9)" ||
    fail "time_limit 8 with slow saves: the run took ${wall} s, not under 9"
[ "$rc" -eq 75 ] && [ -n "$k" ] &&
    "$MODTRAIN" ckpt verify --ckpt limit/ckpt/step-00000005 > /dev/null &&
    "$MODTRAIN" ckpt verify --ckpt limit/ckpt/step-$(printf %08d "$k") > /dev/null &&
    ok "time_limit with a save in flight: step 5 and step $k committed, exit 75" ||
    { cat limit.log; fail "time_limit with a save in flight (exit $rc)"; }

# an asynchronously written (tp 2, dp 2) checkpoint under other layouts
for lay in "re-one:1:" "re-pp2:2:--pp 2"; do
    name=${lay%%:*} rest=${lay#*:} np=${rest%%:*} opts=${rest#*:}
    mkdir -p "$name/ckpt"
    cp -r tp2dp2-async/ckpt/step-00000010 "$name/ckpt/"
    train_ok "$name" "$np" $opts --steps 10
    expect_same_ckpt tp2dp2-async/ckpt/step-00000010 "$name/ckpt/step-00000010" \
        "asynchronous (tp 2, dp 2) step 10 loaded under ${name#re-}"
done
finish
