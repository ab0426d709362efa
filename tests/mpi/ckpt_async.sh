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
# MODTRAIN_SKIP_SLOW=1 runs one rank as one process (no launcher's start to
# pay, nor to count in time_limit's clock); keeps 1 rank and (tp 2, dp 2)
# without their resumed runs (the kills' and SIGUSR1's resumes load
# asynchronous saves too); kills one run at each phase in turn, each
# relaunch recovering the last kill's leftovers, and not at (tp 2, dp 2);
# sends SIGUSR1 to one process; loads (tp 2, dp 2) under one rank only.
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
# np NP: train's NP argument, none for one process under MODTRAIN_SKIP_SLOW
np() { [ $slow = 0 ] && [ "$1" = 1 ] || echo "$1"; }

for lay in "one:1:--threads 2" "tp2dp2:4:--tp 2" "pp2dp2:4:--pp 2"; do
    name=${lay%%:*} rest=${lay#*:} np=${rest%%:*} opts=${rest#*:}
    [ $slow = 1 ] || [ "$name" != pp2dp2 ] || continue
    train_ok "$name-sync" $(np "$np") $opts --ckpt_every 10 --ckpt_async 0
    train_ok "$name-async" $(np "$np") $opts --ckpt_every 10
    grep -q "^checkpoint: $name-async/ckpt/step-00000010 | [0-9.]*s in the background, stall" \
        "$name-async.log" && ok "$name: step 10 saved in the background" ||
        { cat "$name-async.log"; fail "$name: step 10 not saved in the background"; }
    same_data_bin "$name-sync/ckpt/step-00000010" "$name-async/ckpt/step-00000010" \
        "$name: the asynchronous step-10 save holds the synchronous one's bytes"
    [ $slow = 1 ] || continue
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
    killed "$name" "$np" "$fault" "$@" || return 0
    train_ok "$name" "$np" --ckpt_every 5 "$@"
    grep -q "resume: loaded $name/ckpt/step-00000005" "$name.log" || fail "$name: not resumed from step 5"
    same_data_bin "$(step20 "$ref")" "$(step20 "$name")" "$name: the resumed run ends bitwise equal"
}
killed() { # NAME NP FAULT [--key value ...]: fails (1) unless FAULT killed it
    name=$1 np=$2 fault=$3
    shift 3
    MODTRAIN_FAULT=$fault train "$name" $(np "$np") --ckpt_every 5 "$@"
    if [ "$rc" -eq 0 ] || ! grep -q "MODTRAIN_FAULT=${fault%:10}" "$name.log"; then
        cat "$name.log"
        fail "$name: $fault did not kill the run (exit $rc)"
        return 1
    fi
    newest=$("$MODTRAIN" ckpt list --ckpt "$name/ckpt" | awk '$1 ~ /^step-/ { print $1; exit }')
    [ "$newest" = step-00000005 ] && [ ! -e "$name/ckpt/step-00000010" ] &&
        "$MODTRAIN" ckpt verify --ckpt "$name/ckpt/step-00000005" > /dev/null &&
        ok "$name: killed by $fault (exit $rc), step 5 the newest checkpoint, verified" ||
        fail "$name: after $fault the newest checkpoint is '$newest'"
}
if [ $slow = 1 ]; then
    for phase in staged pack write rename; do
        killed_in_save "kill-$phase" 1 "save-kill:$phase:10" one-sync --threads 2
    done
    killed_in_save kill-index 1 "save-crash:10" one-sync --threads 2
    killed_in_save kill-write-tp2dp2 4 "save-kill:write:10" tp2dp2-sync --tp 2
else # one run killed at each phase in turn: each launch after the first
    # recovers the last kill's leftovers and resumes from step 5
    for fault in save-kill:staged:10 save-kill:pack:10 save-kill:write:10 save-kill:rename:10 save-crash:10 ""; do
        if [ -n "$fault" ]; then
            killed kill 1 "$fault" --threads 2 || break
        else
            train_ok kill $(np 1) --ckpt_every 5 --threads 2
        fi
        [ "$fault" = save-kill:staged:10 ] || grep -q "resume: loaded kill/ckpt/step-00000005" kill.log ||
            fail "kill: not resumed from step 5 after the kill before ${fault:-the last launch}"
    done
    same_data_bin "$(step20 one-sync)" "$(step20 kill)" "kill: the run resumed after 5 kills ends bitwise equal"
fi

# SIGUSR1 to mpirun while the step-5 save is in flight (each save made 2 s slower)
usr1_ref=dp2-sync usr1_np=2 usr1_launch="$MPIRUN -np 2" usr1_opts=
[ $slow = 1 ] || usr1_ref=one-sync usr1_np= usr1_launch= usr1_opts="--threads 2" # (to the process itself)
[ $slow = 0 ] || train_ok dp2-sync 2 --ckpt_every 10 --ckpt_async 0
MODTRAIN_FAULT=save-slow:2000 $usr1_launch "$MODTRAIN" train $common $usr1_opts --run_dir usr1 --ckpt_every 5 \
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
train_ok usr1 $usr1_np $usr1_opts --ckpt_every 5
same_data_bin "$(step20 $usr1_ref)" "$(step20 usr1)" "SIGUSR1: the resumed run ends bitwise equal"

# time_limit while a save is in flight: the save commits, then the stop's
# (the probe write at setup is slowed as much as a save, 1.5 s, and the
# stop's save is budgeted from it). The run's own clock, from its start to
# the stop's save committed, keeps to the limit: a stop's save left out of
# the budget would end at about the limit plus the 1.5 s save. The wall
# clock, from before exec to after exit, is checked loosely (a loaded
# machine, make -j3 on 2 cores, adds seconds there).
# (MODTRAIN_SKIP_SLOW: one process, without the launcher's start and end)
t0=$(date +%s.%N)
MODTRAIN_FAULT=save-slow:1500 train limit $(np 1) --ckpt_every 5 --steps 100000 --time_limit 8
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
k=$(sed -n 's/^stopping at step \([0-9]*\)\/.* on time_limit.*/\1/p' limit.log)
used=$(sed -n 's/^stopping at step .* on time_limit (\([0-9.]*\) s of 8 from the start).*/\1/p' limit.log)
check_ab "${used:-99}" 8 'a < b' && check_ab "$wall" 12 'a < b' &&
    ok "time_limit 8 with slow saves: the stop's save committed at ${used} s of the run's clock ($wall s wall)" ||
    fail "time_limit 8 with slow saves: the run's clock at the stop's save '${used}' s (under 8 wanted), ${wall} s wall"
# an asynchronously written (tp 2, dp 2) checkpoint under other layouts
for lay in "re-one:1:" "re-pp2:2:--pp 2"; do
    name=${lay%%:*} rest=${lay#*:} np=${rest%%:*} opts=${rest#*:}
    [ $slow = 1 ] || [ "$name" = re-one ] || continue
    mkdir -p "$name/ckpt"
    cp -r tp2dp2-async/ckpt/step-00000010 "$name/ckpt/"
    train_ok "$name" $(np "$np") $opts --steps 10
    expect_same_ckpt tp2dp2-async/ckpt/step-00000010 "$name/ckpt/step-00000010" \
        "asynchronous (tp 2, dp 2) step 10 loaded under ${name#re-}"
done
finish
