#!/bin/sh
# The random-kill soak: the complement of the crash-point sweep, knowing
# nothing of the fault points. A run is killed at random moments, over and
# over, each kill one of: SIGKILL of mpirun (and of its ranks, as a
# scheduler ends a job), SIGKILL of one rank, SIGTERM to mpirun and its
# ranks (as a scheduler sends it), SIGUSR1 to mpirun (a run that trains 5
# steps past a signal is then killed, as a scheduler's KillWait would).
# A kill waits for a save to begin, for a few more steps, or a moment
# after the launch; a rank's SIGKILL also waits for the run's first fault
# point, past MPI_Init (Open MPI 4.1.4's mpirun, with PMIx 4.2.2, deadlocks
# in its own finalize, every rank gone, when a rank dies inside its PMIx
# handshake: 8 launches of 100 killed in their first 0.1 s, none of 120
# killed after the first fault point). Each is followed by a relaunch with
# resume = auto:
# - at one layout (dp 2), the final checkpoint equals an uninterrupted
#   run's byte for byte (same_ckpt);
# - moving between layouts (1 rank, dp 2, tp 2, pp 2, tp 2 x dp 2) at each
#   relaunch, every step read the uninterrupted run's global batch (every
#   metrics line of a step, in every launch, carries its data_hash), none
#   was skipped;
# - in both, nothing is left in ckpt_dir: no .tmp, .old, .del or
#   abandoned/.
# The schedule is drawn from a seed, printed; MODTRAIN_SOAK_SEED replays
# it (CI draws a new one each run). The short form (make check) makes 20
# kills, each kind at least once and at least 5 of them while a save is in
# flight (the last fault point traced before the kill, MODTRAIN_FAULT_TRACE,
# lies inside a save; where the schedule made fewer, up to 10 more kills,
# while the run has steps left, wait for a save). MODTRAIN_SKIP_SLOW=1
# makes one kill of each kind, at the fixed layout only, on a run of 90
# steps (10 past what its 4 launches can reach: the uninterrupted run and
# the last relaunch train no more than the kills need);
# MODTRAIN_SOAK_KILLS=N (for instance 400) runs a long soak of N kills.
# Nothing waits unbounded: a launch still running 60 s after its kill fails
# the test (its processes' states printed, then killed with SIGKILL), and
# the uninterrupted run and each last relaunch have 300 s.
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
seed=${MODTRAIN_SOAK_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
case $seed in '' | *[!0-9]*) echo "soak: MODTRAIN_SOAK_SEED = '$seed' is not a whole number" >&2; exit 2 ;; esac
echo "soak: seed $seed (MODTRAIN_SOAK_SEED=$seed replays this schedule)"
state=$((seed % 2147483648))
rand() { # N: r = a draw in [0, N)
    state=$(((state * 1103515245 + 12345) % 2147483648))
    r=$(((state / 65536) % $1))
}
kills=${MODTRAIN_SOAK_KILLS:-20}
[ $slow = 1 ] || [ -n "${MODTRAIN_SOAK_KILLS:-}" ] || kills=4
fixed=$(((kills + 1) / 2)) # the rest move between layouts
[ $slow = 1 ] || [ -n "${MODTRAIN_SOAK_KILLS:-}" ] || fixed=4
# steps: more than the kills let a run reach (a launch trains at most 15
# steps before its kill and 5 after it), so every kill lands on a live run
steps=$((kills * 20 + 60))
# (the short forms leave 60 steps to spare; 4 kills need only a few)
[ $slow = 1 ] || [ -n "${MODTRAIN_SOAK_KILLS:-}" ] || steps=$((kills * 20 + 10))
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data= \
    --eval_every 0 --log_every 100000 --threads 1 --peak_gflops 50 --ckpt_every 5 --ckpt_keep 3 \
    --steps $steps"

layout() { # NAME: np and opts for mpirun
    case $1 in
    one) np=1 opts="" ;;
    dp2) np=2 opts="" ;;
    tp2) np=2 opts="--tp 2" ;;
    pp2) np=2 opts="--pp 2" ;;
    tp2dp2) np=4 opts="--tp 2" ;;
    esac
}

# The uninterrupted run (dp 2): the final checkpoint and each step's batch
layout dp2
# shellcheck disable=SC2086 # the options
timeout -k 10 300 $MPIRUN -np $np "$MODTRAIN" train $common $opts --run_dir ref > ref.log 2>&1 ||
    { cat ref.log; fail "the uninterrupted run"; finish; }
hashes() { sed -n 's/^{"step":\([0-9]*\),"samples":[0-9]*,"data_hash":"\([0-9a-f]*\)".*/\1 \2/p' "$1"; }
hashes ref/metrics.jsonl > ref.hashes

# A save is in flight at a kill when the last point traced before it is a
# save's (a step >= 0), short of its last (latest.fsync_dir) and pruning
in_save() { # LINE
    set -- $1
    [ $# -ge 3 ] && [ "$2" -ge 0 ] 2> /dev/null || return 1
    case $1 in latest.fsync_dir | prune* | recover* | mkdirs) return 1 ;; esac
    return 0
}

logged() { # METRICS: the step lines it holds (0 before it exists)
    if [ -f "$1" ]; then grep -c '"loss"' "$1" || true; else echo 0; fi
}
n_kill=0 n_save=0 n_kind0=0 n_kind1=0 n_kind2=0 n_kind3=0 launches=0 order=""
# next_kind: kind = the next kill's kind, from a shuffle of the four made
# afresh every four kills, so that every kind comes in any four in a row
next_kind() {
    if [ -z "$order" ]; then
        left="0 1 2 3"
        for k in 4 3 2 1; do
            rand $k
            # shellcheck disable=SC2086 # the list
            set -- $left
            shift "$r"
            order="$order $1"
            left=$(echo " $left " | sed "s/ $1 / /")
        done
    fi
    # shellcheck disable=SC2086 # the list
    set -- $order
    kind=$1
    shift
    order="$*"
}
# kill_one RUN LAYOUT [save]: one launch, killed at a random moment (save:
# once a save is under way)
kill_one() {
    run=$1 lay=$2 only=${3:-}
    layout "$lay"
    launches=$((launches + 1))
    trace=$TMP/$run.trace.$launches
    : > "$trace"
    # shellcheck disable=SC2086 # the options
    MODTRAIN_FAULT_TRACE=$trace $MPIRUN -np $np "$MODTRAIN" train $common $opts --run_dir "$TMP/$run" \
        >> "$run.log" 2>&1 &
    pid=$!
    # the moment: when a save begins (or, missed, 15 more steps), after 1 to
    # 12 more steps, or 0 to 0.4 s after the launch (in mpirun's start or the
    # setup); bounded by steps, so that a launch's progress does not depend
    # on the host's speed. One process watches and kills (polling from the
    # shell, a fork a look, lagged by tens of steps on a loaded host).
    base=$(logged "$run/metrics.jsonl")
    rand 3
    [ -z "$only" ] || r=0
    case $r in
    0) mode=save n=$((base + 15)) ;;
    1) rand 12 && mode=steps n=$((base + r + 1)) ;;
    *) rand 400 && mode=delay n=$r ;; # (and at most 15 more steps)
    esac
    next_kind
    rand 4
    last=$("$PYTHON" - $pid "$trace" "$run/metrics.jsonl" $mode $n $kind $r $((base + 15)) <<'PY'
import os, signal, sys, time
pid, trace, metrics, mode, n, kind, pick, cap = sys.argv[1:]
pid, n, kind, pick, cap = int(pid), int(n), int(kind), int(pick), int(cap)
def alive(p):
    try:
        return open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
def last_line():
    try:
        lines = open(trace).read().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""
def in_save(line):
    f = line.split()
    return (len(f) >= 3 and f[1].lstrip("-").isdigit() and int(f[1]) >= 0 and
            f[0] not in ("latest.fsync_dir", "mkdirs") and not f[0].startswith(("prune", "recover")))
count, at = 0, 0
def logged():
    global count, at
    try:
        with open(metrics, "rb") as f:
            f.seek(at)
            chunk = f.read()
    except OSError:
        return count
    end = chunk.rfind(b"\n") + 1  # whole lines only
    count += chunk[:end].count(b'"loss"')
    at += end
    return count
t0 = time.monotonic()
while alive(pid) and time.monotonic() - t0 < 30:
    if mode == "delay" and (time.monotonic() - t0 >= n / 1000 or logged() >= cap):
        break
    if mode != "delay" and logged() >= n:
        break
    if mode == "save" and in_save(last_line()):
        break
    time.sleep(0.002)
def ranks():
    kids = []
    for d in os.listdir("/proc"):
        try:
            st = open("/proc/%s/stat" % d).read()
        except OSError:
            continue
        name, rest = st.split("(", 1)[1].rsplit(")", 1)
        if name == "modtrain" and int(rest.split()[1]) == pid:
            kids.append(int(d))
    return kids
def send(procs, sig):
    for p in procs:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
if kind == 1:  # past MPI_Init (the header says why)
    while alive(pid) and not last_line() and time.monotonic() - t0 < 30:
        time.sleep(0.002)
kids = ranks()
last = last_line()
if kind == 0:
    send([pid] + kids, signal.SIGKILL)
elif kind == 1:
    send([kids[pick % len(kids)] if kids else pid], signal.SIGKILL)
elif kind == 2:  # as a scheduler sends it: to every task too
    send([pid] + kids, signal.SIGTERM)
else:
    send([pid], signal.SIGUSR1)
# a run told to stop saves at its next step; one that trains 5 steps more
# (mpirun signalled before its ranks began) is killed, as a scheduler's
# KillWait would: no launch trains more than 20 steps
stop_at = logged() + 5
t0 = time.monotonic()
while alive(pid) and time.monotonic() - t0 < 30:
    if logged() >= stop_at:
        send([pid] + ranks(), signal.SIGKILL)
        break
    time.sleep(0.002)
print(last)
PY
)
    set +e
    timeout -k 10 60 sh -c "while kill -0 $pid 2> /dev/null; do sleep 0.05; done"
    hung=$?
    # no rank outlives its job (as a scheduler ends what a job started): the
    # ranks of this launch alone (its run_dir is under this test's $TMP)
    ranks=$(pgrep -f "modtrain train .*--run_dir $TMP/$run\$")
    if [ "$hung" -ne 0 ]; then # what each process was doing, then as KillWait would
        ps -o pid,ppid,stat,wchan:24,etime,time,args -p "$(echo $pid $ranks | tr " " ,)" 2>&1 | cut -c1-160
        kill -KILL $pid $ranks 2> /dev/null
    fi
    wait $pid
    rc=$?
    [ -z "$ranks" ] || kill -KILL $ranks 2> /dev/null
    set -e
    if [ "$hung" -ne 0 ]; then
        tail -n 30 "$run.log"
        fail "$run: launch $launches still ran 60 s after its kill (kind $kind, last point ${last:-none}); killed then"
    fi
    # (mpirun signalled before its ranks start may exit 0, having run nothing)
    if [ -d "$run/ckpt/step-$(printf %08d "$steps")" ]; then
        fail "$run: launch $launches finished before its kill (steps = $steps too few for the kills)"
        return
    fi
    n_kill=$((n_kill + 1))
    eval "n_kind$kind=\$((n_kind$kind + 1))"
    if in_save "$last"; then n_save=$((n_save + 1)); fi
    echo "kill $n_kill: $run at $lay, kind $kind (0 mpirun, 1 a rank, 2 TERM, 3 USR1), exit $rc, last point: ${last:-none}"
}

# finish_run RUN LAYOUT: the last relaunch, to the end
finish_run() {
    layout "$2"
    set +e
    # shellcheck disable=SC2086 # the options
    timeout -k 10 300 $MPIRUN -np $np "$MODTRAIN" train $common $opts --run_dir "$TMP/$1" >> "$1.log" 2>&1
    rc=$?
    set -e
    [ "$rc" -eq 0 ] || { tail -n 30 "$1.log"; fail "$1: the last relaunch exited $rc"; }
}

# what every run must show: each step's batch as the uninterrupted run's,
# none skipped, nothing left behind
check_soak_run() { # RUN
    hashes "$1/metrics.jsonl" > "$1.hashes"
    bad=$(awk 'NR == FNR { want[$1] = $2; next } want[$1] != $2 { print; exit }' ref.hashes "$1.hashes")
    [ -z "$bad" ] || fail "$1: step ${bad% *} read batch ${bad#* }, not the uninterrupted run's"
    missing=$(awk -v n="$steps" '{ seen[$1] = 1 } END { for (s = 1; s <= n; s++) if (!seen[s]) { print s; exit } }' "$1.hashes")
    [ -z "$missing" ] || fail "$1: step $missing was never trained"
    left=$(find "$1/ckpt" -name '*.tmp*' -o -name '*.old*' -o -name '*.del*' -o -name abandoned | head -n 3)
    [ -z "$left" ] || fail "$1: left behind in ckpt_dir: $left"
    [ -z "$bad$missing$left" ] && ok "$1: every step read the uninterrupted run's batch, none skipped, nothing left"
}

t0=$(date +%s)
i=0
while [ $i -lt "$fixed" ]; do
    kill_one fixed dp2
    i=$((i + 1))
done
finish_run fixed dp2
check_soak_run fixed
same_ckpt "ref/ckpt/step-$(printf %08d "$steps")" "fixed/ckpt/step-$(printf %08d "$steps")" &&
    ok "fixed layout: the final checkpoint equals the uninterrupted run's" ||
    fail "fixed layout: the final checkpoint differs from the uninterrupted run's"

i=$fixed
while [ $i -lt "$kills" ]; do
    rand 5
    case $r in 0) l=one ;; 1) l=dp2 ;; 2) l=tp2 ;; 3) l=pp2 ;; *) l=tp2dp2 ;; esac
    kill_one moved $l
    i=$((i + 1))
done
# kills while a save is in flight, until there are 5 (at most 10 more)
extra=0
newest() { sed -n 's/^{"step":\([0-9]*\),"samples".*/\1/p' "$1" | sort -n | tail -n 1; }
while [ $slow = 1 ] && [ "$kills" -gt "$fixed" ] && [ "$n_save" -lt 5 ] && [ $extra -lt 10 ] &&
    [ "$(newest moved/metrics.jsonl)" -lt $((steps - 40)) ]; do
    rand 5
    case $r in 0) l=one ;; 1) l=dp2 ;; 2) l=tp2 ;; 3) l=pp2 ;; *) l=tp2dp2 ;; esac
    kill_one moved $l save
    extra=$((extra + 1))
done
if [ "$kills" -gt "$fixed" ]; then
    rand 5
    case $r in 0) l=one ;; 1) l=dp2 ;; 2) l=tp2 ;; 3) l=pp2 ;; *) l=tp2dp2 ;; esac
    finish_run moved $l
    check_soak_run moved
fi

echo "soak: $n_kill kills ($n_kind0 of mpirun, $n_kind1 of a rank, $n_kind2 TERM, $n_kind3 USR1), $n_save while a save was in flight, $launches launches, $(($(date +%s) - t0)) s (seed $seed)"
[ "$n_kill" -ge "$kills" ] || fail "only $n_kill of $kills kills landed"
[ "$n_kind0" -ge 1 ] && [ "$n_kind1" -ge 1 ] && [ "$n_kind2" -ge 1 ] && [ "$n_kind3" -ge 1 ] ||
    fail "not every kind of kill was made"
[ $slow = 0 ] || [ "$n_save" -ge 5 ] || fail "only $n_save kills landed while a save was in flight (5 wanted)"
finish
