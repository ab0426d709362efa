#!/bin/sh
# The save, stop and resume path against what used to lose work:
# - a stale step-N.tmp holding a leftover file (index.tmp.PID, .nfsXXXX) is
#   cleared whole and step N saves; a leftover step-N.old is no obstacle to
#   a rollback's re-save of step N; a step-N.old whose step-N is missing (a re-save
#   stopped between its renames) is put back by resume = auto, and
#   `latest` naming a checkpoint that is gone with none left is an error,
#   not a fresh start;
# - a failed `latest` write reports the committed step as saved;
# - a run already at `steps` exits 0 without writing, under another layout too;
# - after resuming from an older checkpoint the newer ones move to
#   ckpt_dir/abandoned/, and pruning keeps this run's own line;
# - ckpt_chunk 64 on a vocabulary of 5000 writes a checkpoint that loads;
# - SIGINT saves and exits 75 (a second one ends at once, 130); a signal
#   during setup stops with 75 before any step and nothing lost; under
#   mpirun -np 2, SIGUSR1 to mpirun saves on every rank;
# - time_limit counts from the process start and budgets the stop's save
#   from a probe write, so a slow save still ends within the limit;
# - a NaN loss: on_nonfinite stop exits 65 with the last checkpoint intact;
#   rollback gives up after nonfinite_tries rollbacks with 65;
# - watchdog_s: a rank that hangs ends the job with 124 naming rank and phase;
# - a pipeline micro-batch larger than one MPI message is refused up front;
# - a save under mpirun -np 2 goes on while Open MPI's machine-wide
#   semaphore for files named data.bin is held (as a rank killed holding it
#   leaves it), where Open MPI's default component for it hangs.
# MODTRAIN_SKIP_SLOW=1 (the sanitizer pass and distcheck) relaunches the
# finished run under dp 2 only (1 rank relaunched: crash_sweep.sh) and
# leaves out SIGUSR1 to mpirun (preempt.sh's twice-signalled run).
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --eval_every 0 --log_every 1000 --threads 1 --peak_gflops 50"

train ref --steps 8 --ckpt_every 4
[ "$rc" -eq 0 ] || { cat ref.log; fail "reference run"; finish; }

# 1. a stale step-8.tmp with a file in it
mkdir -p stale/ckpt/step-00000008.tmp
echo x > stale/ckpt/step-00000008.tmp/index.tmp.12345
echo x > stale/ckpt/step-00000008.tmp/.nfs000000001
train stale --steps 8 --ckpt_every 4
[ "$rc" -eq 0 ] && cmp -s "$(step_dir ref 8)/data.bin" "$(step_dir stale 8)/data.bin" &&
    [ ! -e stale/ckpt/step-00000008.tmp ] &&
    ok "a stale step-8.tmp holding leftovers is cleared and step 8 saves" ||
    { cat stale.log; fail "stale .tmp (exit $rc)"; }

# 10. Open MPI's machine-wide semaphore for a data.bin's shared file
# pointer, left taken as a rank killed while holding it leaves it: a 2-rank
# save goes on (modtrain does not use that component); Open MPI's default
# for it, named, hangs there (a control, not under MODTRAIN_SKIP_SLOW)
sem() { # unlink | take: Open MPI's semaphore for files named data.bin
    "$PYTHON" - "$1" <<'PY'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.sem_open.restype = ctypes.c_void_p
libc.sem_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint]
libc.sem_unlink(b"/OMPIO_data.bin")
if sys.argv[1] == "take" and libc.sem_open(b"/OMPIO_data.bin", os.O_CREAT | os.O_EXCL, 0o644, 0) in (None, 0):
    sys.exit("cannot create the semaphore: " + os.strerror(ctypes.get_errno()))
PY
}
trap 'sem unlink; rm -rf "$TMP"' EXIT
sem take
set +e
timeout -k 5 60 $MPIRUN -np 2 "$MODTRAIN" train $common --run_dir taken --steps 4 --ckpt_every 4 > taken.log 2>&1
rc=$?
set -e
[ "$rc" -eq 0 ] && "$MODTRAIN" ckpt verify --ckpt "$(step_dir taken 4)" > /dev/null &&
    ok "a 2-rank save with OMPIO_data.bin left taken: saved and verified" ||
    { cat taken.log; fail "a 2-rank save with OMPIO_data.bin left taken: exit $rc"; }
if [ $slow = 1 ]; then
    set +e
    OMPI_MCA_sharedfp=sm timeout -k 2 5 $MPIRUN -np 2 "$MODTRAIN" train $common --run_dir sm \
        --steps 4 --ckpt_every 4 > sm.log 2>&1
    rc=$?
    set -e
    pkill -KILL -f "modtrain train .*--run_dir sm\$" 2> /dev/null || true # (the ranks it left)
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && ok "the control, sharedfp sm: held at the save (exit $rc)" ||
        { cat sm.log; fail "the control, sharedfp sm, with OMPIO_data.bin taken, exit $rc: not held"; }
fi
sem unlink

# 2. a leftover step-8.old, then a re-save of step 8: a rollback's, after
# a NaN at step 10 of the run resumed from step 8
cp -r stale runold
cp -r "$(step_dir ref 4)" runold/ckpt/step-00000008.old
MODTRAIN_FAULT=nan-batch:9 train runold --steps 12 --ckpt_every 100 --ckpt_async 0 \
    --on_nonfinite rollback
[ "$rc" -eq 0 ] && grep -q "rolled back to step 8," runold.log &&
    cmp -s "$(step_dir ref 8)/data.bin" "$(step_dir runold 8)/data.bin" &&
    grep -q "^kv state.rollbacks 1$" "$(step_dir runold 8)/index" &&
    [ -z "$(ls -d runold/ckpt/*.old 2> /dev/null)" ] &&
    ok "a leftover .old does not block the rollback's re-save of step 8" ||
    { cat runold.log; ls runold/ckpt; fail "re-save over a leftover .old (exit $rc)"; }
# a re-save stopped between its renames: step-8 missing, step-8.old the good one
cp -r ref half
mv half/ckpt/step-00000008 half/ckpt/step-00000008.old
rm -rf half/ckpt/step-00000004
train half --steps 8 --ckpt_every 4 --ckpt_keep 1
[ "$rc" -eq 0 ] && grep -q "nothing to train or save" half.log &&
    cmp -s "$(step_dir ref 8)/data.bin" "$(step_dir half 8)/data.bin" &&
    ok "a step-8.old whose step-8 is missing is put back and resumed" ||
    { cat half.log; ls half/ckpt; fail "the .old of an interrupted re-save (exit $rc)"; }
# latest names a checkpoint that is gone and none is left: an error
mkdir -p gone/ckpt && echo step-00000008 > gone/ckpt/latest
train gone --steps 8
[ "$rc" -eq 2 ] && grep -q "names 'step-00000008' but 'gone/ckpt' holds no checkpoint" gone.log &&
    [ "$(cat gone/metrics.jsonl 2> /dev/null | grep -c '"loss"')" -eq 0 ] &&
    ok "latest naming a missing checkpoint: $(head -n 1 gone.log)" ||
    { cat gone.log; fail "a dangling latest with no checkpoint started over (exit $rc)"; }

# a failed `latest` write (injected): the step is committed and reported saved
MODTRAIN_FAULT=at:latest.rename:8:EIO train latefail --steps 8 --ckpt_every 4
[ "$rc" -eq 0 ] && grep -q "step-00000008 saved, but cannot rename" latefail.log &&
    cmp -s "$(step_dir ref 8)/data.bin" "$(step_dir latefail 8)/data.bin" &&
    ok "a failed latest write: $(grep -m 1 'saved, but' latefail.log | cut -c1-90)..." ||
    { cat latefail.log; fail "a failed latest write (exit $rc)"; }

# a run already at `steps`, relaunched, under the same and another layout
before=$(ls -l --time-style=+%s.%N "$(step_dir ref 8)/data.bin")
rc1=0 logs=ref2.log
[ $slow = 0 ] || { train ref --steps 8 --ckpt_every 4; rc1=$rc logs="ref.log ref2.log"; }
set +e
timeout -k 10 120 $MPIRUN -np 2 "$MODTRAIN" train $common --run_dir ref --steps 8 > ref2.log 2>&1
rc2=$?
set -e
[ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ] && grep -q "nothing to train or save" $logs &&
    [ "$before" = "$(ls -l --time-style=+%s.%N "$(step_dir ref 8)/data.bin")" ] &&
    ok "a finished run relaunched (1 rank, dp 2) exits 0 and writes nothing" ||
    { cat ref.log ref2.log; fail "a finished run relaunched (exit $rc1, $rc2)"; }

# 4. resumed from step 4 while 8 and 12 exist (12 corrupt): they move aside,
# and keep-2 keeps this run's 8 and 12
train line --steps 12 --ckpt_every 4 --ckpt_keep 5
printf 'garbage' > "$(step_dir line 12)/index"
train line --steps 16 --ckpt_every 4 --ckpt_keep 2 --resume "$(step_dir line 4)"
ls line/ckpt line/ckpt/abandoned > line.ls 2>&1 || true
[ "$rc" -eq 0 ] && [ -d line/ckpt/abandoned/step-00000008 ] &&
    [ -d line/ckpt/abandoned/step-00000012 ] && [ -d "$(step_dir line 12)" ] &&
    [ -d "$(step_dir line 16)" ] && [ ! -e "$(step_dir line 4)" ] && [ ! -e "$(step_dir line 8)" ] &&
    grep -q "^step-00000016$" line/ckpt/latest &&
    ok "resumed from step 4: steps 8 and 12 moved to abandoned/, keep 2 kept this line's 12 and 16" ||
    { cat line.log line.ls; fail "pruning after a resume from an older checkpoint"; }

# 9. ckpt_chunk 64 on a vocabulary of 5000 (5000 rows of 64: a row a chunk)
train chunk --steps 2 --vocab_size 5000 --ckpt_chunk 64
"$MODTRAIN" ckpt verify --ckpt chunk/ckpt > chunk.verify 2>&1 &&
    [ "$rc" -eq 0 ] && ok "ckpt_chunk 64, vocabulary 5000: the checkpoint verifies" ||
    { cat chunk.log chunk.verify; fail "ckpt_chunk 64 on a vocabulary of 5000"; }

# 6. SIGINT once: saves and exits 75; twice: 130 at once
long="--steps 100000 --ckpt_every 0"
# signal PID RUN STEPS SIG...: once RUN has trained STEPS steps (0: after
# a second), sends the job PID each SIG, a second apart; its exit code in
# $rc and the step it stopped at on the first SIG in $k. (No `timeout`
# around a process signalled: it would take the signal.)
signal() {
    pid=$1 run=$2 n=$3
    shift 3
    if [ "$n" -gt 0 ]; then wait_steps "$run" "$n" || true; else sleep 1; fi
    gap=
    for sig in "$@"; do
        [ -z "$gap" ] || sleep 1
        kill -"$sig" "$pid"
        gap=1
    done
    set +e
    wait "$pid"
    rc=$?
    set -e
    k=$(sed -n "s/^stopping at step \([0-9]*\)\/.* on SIG$1.*/\1/p" "$run.log")
}
saved() { [ -n "$k" ] && "$MODTRAIN" ckpt verify --ckpt "$(step_dir "$1" "$k")" > /dev/null; }
"$MODTRAIN" train $common --run_dir int1 $long > int1.log 2>&1 &
signal $! int1 3 INT
[ "$rc" -eq 75 ] && saved int1 && ok "SIGINT: saved step $k, exit 75" ||
    { cat int1.log; fail "SIGINT (exit $rc)"; }
MODTRAIN_FAULT=save-slow:5000 "$MODTRAIN" train $common --run_dir int2 $long > int2.log 2>&1 &
signal $! int2 3 INT INT
[ "$rc" -eq 130 ] && grep -q "second SIGINT" int2.log && ok "a second SIGINT: exit 130 at once" ||
    { cat int2.log; fail "a second SIGINT (exit $rc)"; }
# a signal during setup (here: while the probe write of time_limit is slow)
MODTRAIN_FAULT=save-slow:2000 "$MODTRAIN" train $common --run_dir early $long \
    --time_limit 1000 > early.log 2>&1 &
signal $! early 0 TERM
[ "$rc" -eq 75 ] && grep -q "stopping before step 1/100000 on SIGTERM: nothing to save" early.log &&
    ok "SIGTERM during setup: $(grep stopping early.log)" || { cat early.log; fail "SIGTERM during setup (exit $rc)"; }
# under mpirun: SIGUSR1 to mpirun reaches every rank, which save and exit 75
[ $slow = 0 ] || {
$MPIRUN -np 2 "$MODTRAIN" train $common --run_dir mpi $long > mpi.log 2>&1 &
signal $! mpi 3 USR1
[ "$rc" -eq 75 ] && saved mpi && ok "mpirun -np 2, SIGUSR1 to mpirun: step $k saved, exit 75" ||
    { cat mpi.log; fail "mpirun SIGUSR1 (exit $rc)"; }
}

# 3. time_limit with saves slowed to 2 s (and the probe with them): the run
# keeps to its 6 s counted from its start, the stop's save included (its
# own clock; the wall clock around it, loosely: see ckpt_async.sh)
t0=$(date +%s.%N)
MODTRAIN_FAULT=save-slow:2000 train limit $long --time_limit 6
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
used=$(sed -n 's/^stopping at step .* on time_limit (\([0-9.]*\) s of 6 from the start).*/\1/p' limit.log)
[ "$rc" -eq 75 ] && check_ab "${used:-99}" 6 'a < b' && check_ab "$wall" 10 'a < b' &&
    ok "time_limit 6 with 2 s saves: stopped and saved at $used s of the run's clock ($wall s wall)" ||
    { cat limit.log; fail "time_limit 6 with 2 s saves: exit $rc, the stop's save at '$used' s, $wall s wall"; }

# 7. a NaN loss: stop exits 65, the checkpoint of step 4 intact
MODTRAIN_FAULT=nan-batch:5 train nan --steps 8 --ckpt_every 4 --ckpt_async 0
[ "$rc" -eq 65 ] && grep -q "no update made; stopping with exit 65" nan.log &&
    cmp -s "$(step_dir ref 4)/data.bin" "$(step_dir nan 4)/data.bin" &&
    ok "on_nonfinite stop: exit 65, step 4 intact" || { cat nan.log; fail "on_nonfinite stop (exit $rc)"; }
# rollback, with every batch from 5 on bad: gives up after 2 tries, exit 65
MODTRAIN_FAULT=nan-from:5 train nan2 --steps 8 --ckpt_every 4 --ckpt_async 0 \
    --on_nonfinite rollback --nonfinite_tries 2
[ "$rc" -eq 65 ] && [ "$(grep -c 'rolled back to step 4' nan2.log)" -eq 2 ] &&
    grep -q "after 2 rollbacks onto step 4: giving up" nan2.log &&
    ok "on_nonfinite rollback: 2 rollbacks, then exit 65" || { cat nan2.log; fail "rollback give-up (exit $rc)"; }

# watchdog: rank 1 hangs at step 3; the job ends with 124, naming rank and phase
set +e
MODTRAIN_FAULT=hang:1:3 timeout -k 10 120 $MPIRUN -np 2 "$MODTRAIN" train $common --run_dir dog \
    $long --watchdog_s 3 > dog.log 2>&1
rc=$?
set -e
[ "$rc" -eq 124 ] && grep -q "watchdog: rank [01] made no progress for [0-9]* s in" dog.log &&
    ok "watchdog: exit 124, $(grep -m 1 'watchdog:' dog.log | cut -c1-80)..." ||
    { cat dog.log; fail "watchdog (exit $rc)"; }

# a pipeline micro-batch too large for one MPI message
set +e
timeout -k 10 120 $MPIRUN -np 2 "$MODTRAIN" train $common --pp 2 --n_layer 2 --seq_len 1048576 \
    --d_model 4096 --n_head 4 --batch_size 1 --micro_batch 1 --run_dir big > big.log 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "exceed the 2^31 - 1 elements of one MPI message" big.log &&
    ok "an oversized pipeline message is refused" || { cat big.log; fail "oversized pipeline message (exit $rc)"; }
finish
