#!/bin/sh
# Stopping early and coming back, without a scheduler: SIGUSR1 to mpirun
# (which forwards it to every rank) twice in a row, SIGTERM to the ranks
# themselves, and time_limit each make every rank save at the next step
# boundary and exit 75; a resumed run then ends bitwise equal to an
# uninterrupted one. time_limit = auto reads SLURM_JOB_END_TIME, and a
# hostile one is one line. MODTRAIN_SKIP_SLOW=1 (the sanitizer pass and
# distcheck) makes each stop, but resumes only the twice-signalled run (a
# resume after a stop is the same whatever stopped it), that run and the
# reference 60 steps long rather than 120, and tries one hostile end time
# rather than three (they fail the same check).
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --steps 120 --log_every 1000 --eval_every 0 --ckpt_every 0 --threads 1"
train_2ranks() { $MPIRUN -np 2 "$MODTRAIN" train $common "$@"; }
len=120 short=
[ $slow = 1 ] || len=60 short="--steps 60" # the signalled runs' length
train_2ranks --run_dir ref $short > ref.log 2>&1 || { cat ref.log; fail "reference run"; finish; }

# started, signalled once it has trained a few steps, resumed
stop_and_resume() { # NAME SIGNALS...
    name=$1
    shift
    # mpirun itself in the background, so that $! is its pid
    $MPIRUN -np 2 "$MODTRAIN" train $common --run_dir "$name" $short > "$name.log" 2>&1 &
    pid=$!
    i=0
    while [ $i -lt 600 ]; do
        n=$(cat "$name/metrics.jsonl" 2> /dev/null | grep -c '"loss"' || true)
        [ "${n:-0}" -ge 10 ] && break
        sleep 0.1
        i=$((i + 1))
    done
    for sig in "$@"; do
        case $sig in
        # SIGTERM as a scheduler sends it: to every task, not to the launcher
        TERM) pkill -TERM -f "^$MODTRAIN train .*--run_dir $name" ;;
        *) kill -"$sig" $pid ;;
        esac
    done
    set +e
    wait $pid
    rc=$?
    set -e
    step=$(sed -n 's/^stopping at step \([0-9]*\)\/.*/\1/p' "$name.log")
    if [ "$rc" -eq 75 ] && [ -n "$step" ] && [ "$step" -lt $len ] &&
        "$MODTRAIN" ckpt verify --ckpt "$name/ckpt" > /dev/null; then
        ok "$name: $* stopped the run at step $step with a verified checkpoint, exit 75"
    else
        cat "$name.log"
        fail "$name: $* (exit $rc)"
        return
    fi
    [ $slow = 1 ] || [ "$name" = twice ] || return 0
    train_2ranks --run_dir "$name" $short > "$name.2.log" 2>&1 &&
        cmp -s "$(step_dir ref $len)/data.bin" "$(step_dir "$name" $len)/data.bin" &&
        ok "$name: resumed from step $step, ended bitwise equal to the uninterrupted run" ||
        { cat "$name.2.log"; fail "$name: resumed run differs"; }
}
# (one SIGUSR1 or SIGTERM to mpirun, then a relaunch: tests/mpi/soak.sh)
stop_and_resume twice USR1 USR1
stop_and_resume term TERM

# time_limit: saves and stops before the limit without any signal
set +e
train_2ranks --run_dir limited --time_limit 1.5 > limited.log 2>&1
rc=$?
set -e
step=$(sed -n 's/^stopping at step \([0-9]*\)\/.* on time_limit.*/\1/p' limited.log)
[ "$rc" -eq 75 ] && [ -n "$step" ] && ok "time_limit 1.5 s: stopped at step $step, exit 75" ||
    { cat limited.log; fail "time_limit (exit $rc)"; }
[ $slow = 0 ] || { train_2ranks --run_dir limited > limited.2.log 2>&1 &&
    cmp -s ref/ckpt/step-00000120/data.bin limited/ckpt/step-00000120/data.bin &&
    ok "time_limit: the next run completed it, bitwise equal" || { cat limited.2.log; fail "after time_limit"; }; }

# time_limit = auto: the job's end from SLURM_JOB_END_TIME (3 s from now,
# so the limit is at most 3 s from the start); outside a job, no limit
set +e
end=$(($(date +%s) + 3))
SLURM_JOB_ID=7 SLURM_JOB_END_TIME=$end train_2ranks --run_dir auto --steps 100000 --time_limit auto > auto.log 2>&1
rc=$?
set -e
t=$(sed -n 's/^train: time_limit = auto: job 7 ends at .* (SLURM_JOB_END_TIME): \([0-9]*\) s from the start.*/\1/p' auto.log)
[ "$rc" -eq 75 ] && [ -n "$t" ] && [ "$t" -ge 1 ] && [ "$t" -le 4 ] && grep -q "^stopping at step .* on time_limit" auto.log &&
    ok "time_limit = auto, SLURM_JOB_END_TIME 3 s ahead: a limit of $t s, stopped with exit 75" ||
    { cat auto.log; fail "time_limit = auto under SLURM_JOB_END_TIME (exit $rc, limit '$t')"; }
# an end time past the calendar (it crashed in localtime) or not a number:
# one line from one rank, exit 2
values="9223372036854775807 100000000000000000 12x"
[ $slow = 1 ] || values=9223372036854775807
for v in $values; do
    rc=0
    SLURM_JOB_ID=7 SLURM_JOB_END_TIME=$v train_2ranks --run_dir hostile --steps 1 --time_limit auto \
        > hostile.log 2> hostile.err || rc=$?
    [ "$rc" -eq 2 ] && [ "$(grep -c "^modtrain:" hostile.err)" -eq 1 ] &&
        grep -q "SLURM_JOB_END_TIME = '$v' is not seconds since 1970" hostile.err &&
        ok "SLURM_JOB_END_TIME = $v: $(grep "^modtrain:" hostile.err | cut -c1-70)..." ||
        { cat hostile.log hostile.err; fail "SLURM_JOB_END_TIME = $v (exit $rc)"; }
done
env -u SLURM_JOB_ID -u SLURM_JOB_END_TIME $MPIRUN -np 2 "$MODTRAIN" train $common --steps 3 --run_dir noslurm \
    --time_limit auto > noslurm.log 2>&1 &&
    grep -q "^train: time_limit = auto: not inside a SLURM job (SLURM_JOB_ID is not set): no time limit" noslurm.log &&
    grep -q "^done: step 3" noslurm.log && ok "time_limit = auto outside SLURM: no limit, logged" ||
    { cat noslurm.log; fail "time_limit = auto outside SLURM"; }
finish
