#!/bin/sh
# The crash-point sweep (after SQLite's crash tests and etcd's failpoints):
# an uninterrupted run lists, through MODTRAIN_FAULT_TRACE, every fault
# point a save reaches (each write, fsync, rename and unlink of the data,
# the index, the commit, `latest` and pruning, and the asynchronous save's
# phases; tests/scripts/fault_points.sh checks that no such call escapes a
# point). Then, for each point, a run is stopped there (SIGKILL) or has
# that one call fail (EIO, ENOSPC, EDQUOT), and is relaunched with
# resume = auto twice, as a requeued job would be. Every case must end with
# a final checkpoint byte for byte equal to the uninterrupted run's, no
# .tmp, .old, .del or temp file left, no step trained more than twice
# (once, and once again after the interruption), and a second relaunch
# that trains and writes nothing.
#
# Every case's ckpt_dir holds symbolic links (a stale .tmp and .del naming
# a folder outside the run, a step-N naming another run's checkpoint) whose
# targets must come through untouched.
#
# Cases: 1 rank synchronous and asynchronous, tp 2 x dp 2 synchronous and
# asynchronous (over two emulated hosts where tests/tools/nodes.sh can make
# them: a rank dies on one host, the job ends on both), and a run whose loss turns NaN on one batch and rolls back
# (a re-save of the checkpoint's step: its replacement's points). `make
# check` runs a subset (kill at every point of the step-4 save and EIO at
# every point of it for 1 rank synchronous; ENOSPC and EDQUOT at the
# writes; the asynchronous phases; the rollback's re-save; two points of
# tp 2 x dp 2); MODTRAIN_SWEEP=full runs every point of every save (steps
# 4 and 6) with every action in every case; MODTRAIN_SWEEP_PARTS (some of
# "one roll tp2dp2"), MODTRAIN_SWEEP_STEPS and MODTRAIN_SWEEP_ACTIONS narrow
# it. MODTRAIN_SKIP_SLOW=1 (the sanitizer pass and distcheck) keeps a
# kill of each kind (a .tmp half written; a step committed, `latest`
# behind it with its temp file left), EIO at six call sites three to a run
# (a failed save of step 2, of step 4, and `latest` of step 6 failing), one
# asynchronous kill and EIO, the rollback's three recoveries (the .old put
# back, the .old removed, the rename undone) and the tp 2 x dp 2 kill of
# rank 3, relaunched once each; no ENOSPC or EDQUOT case (the kill and EIO
# cases take the same paths). But in the full sweep, the second relaunch
# (the same every time) follows the first case of each uninterrupted run.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
full=${MODTRAIN_SWEEP:-}
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --steps 6 --ckpt_every 2 --ckpt_keep 2 --eval_every 0 --log_every 1000 --threads 1 \
    --peak_gflops 50"
cases=0
t0=$(date +%s)

# launch NP LOG [--key value ...]: one run (its exit code in $rc)
launch() {
    np=$1 log=$2
    shift 2
    set +e
    if [ "$np" -eq 1 ]; then
        timeout -k 10 120 "$MODTRAIN" train $common "$@" > "$log" 2>&1
    elif [ -n "$NODES" ]; then # two ranks on each of two emulated hosts
        TRAIN_TIMEOUT=120 on_nodes --host node1:2,node2:2 "$MODTRAIN" train $common "$@" > "$log" 2>&1
    else
        timeout -k 10 120 $MPIRUN -np "$np" "$MODTRAIN" train $common "$@" > "$log" 2>&1
    fi
    rc=$?
    set -e
}

# reference NAME NP [opts]: the uninterrupted run and its trace
reference() {
    name=$1 np=$2
    shift 2
    MODTRAIN_FAULT_TRACE=$TMP/$name.trace launch "$np" "$name.log" --run_dir "$name" "$@"
    [ "$rc" -eq 0 ] || { cat "$name.log"; fail "$name: the uninterrupted run failed (exit $rc)"; }
}

# points TRACE STEP RANK: the points a save of STEP reached on RANK, in order, once each
points() { awk -v s="$2" -v r="$3" '$2 == s && $3 == r && !seen[$1]++ { print $1 }' "$1"; }

# Every case's ckpt_dir starts with symbolic links that cleanup must never
# enter: a leftover step-N.tmp and step-N.del naming folders outside the
# run, and a step-00000001 naming another run's checkpoint (shared so),
# older than every save, which pruning and resume must leave alone.
mkdir -p victim/dir
echo keep > victim/dir/file
links() { # RUN
    mkdir -p "$1/ckpt"
    ln -s "$TMP/victim/dir" "$1/ckpt/step-00000099.tmp"
    ln -s "$TMP/victim/dir" "$1/ckpt/step-00000098.del"
    ln -s "$TMP/victim/ckpt" "$1/ckpt/step-00000001"
}
victims_intact() { # RUN
    [ "$(cat victim/dir/file 2> /dev/null)" = keep ] && [ -s victim/ckpt/data.bin ] &&
        [ -L "$1/ckpt/step-00000001" ]
}

# one REF NP POINT STEP ACTION RANK [opts]: one case
one() {
    ref=$1 np=$2 point=$3 step=$4 action=$5 rank=$6
    shift 6
    name=c$cases
    cases=$((cases + 1))
    what="$ref: $action at $point (step $step, rank $rank)"
    links "$name"
    MODTRAIN_FAULT=${faults:-"at:$point:$step:$action:$rank"} launch "$np" "$name.1.log" --run_dir "$name" "$@"
    rc1=$rc
    for q in $point; do
        if ! grep -q "MODTRAIN_FAULT: .*$q" "$name.1.log"; then
            fail "$what: the fault at $q did not fire (exit $rc1)"
            return
        fi
    done
    if [ "$action" = kill ] && [ "$rc1" -eq 0 ]; then
        fail "$what: the killed run exited 0"
        return
    fi
    launch "$np" "$name.2.log" --run_dir "$name" "$@"
    [ "$rc" -eq 0 ] || { cat "$name.1.log" "$name.2.log"; fail "$what: the relaunch exited $rc"; return; }
    fin=$name/ckpt/step-00000006
    # (the first case of each uninterrupted run only, but in the full
    # sweep: the first relaunch ends with the same save of step 6 after
    # every fault in the save of step 4, so the second takes the same path)
    if [ -n "$full" ] || [ "$ref" != "${twice:-}" ]; then
        twice=$ref
        touch -d '2000-01-01' "$fin/data.bin" 2> /dev/null || true
        launch "$np" "$name.3.log" --run_dir "$name" "$@"
        [ "$rc" -eq 0 ] && grep -q "nothing to train or save" "$name.3.log" ||
            { cat "$name.3.log"; fail "$what: the second relaunch exited $rc or trained"; return; }
        [ "$(find "$fin/data.bin" -newermt '2001-01-01' | wc -l)" -eq 0 ] ||
            fail "$what: the second relaunch rewrote the final checkpoint"
    fi
    same_ckpt "$ref/ckpt/step-00000006" "$fin" ||
        { cat "$name".*.log; fail "$what: the final checkpoint differs from the uninterrupted run's"; return; }
    left=$(find "$name/ckpt" -name '*.tmp*' -o -name '*.old*' -o -name '*.del*' | head -n 3)
    [ -z "$left" ] || { fail "$what: left behind: $left"; return; }
    most=$(sed -n 's/^{"step":\([0-9]*\),"loss".*/\1/p' "$name/metrics.jsonl" | sort | uniq -c |
        sort -rn | awk 'NR == 1 { print $1 }')
    [ "${most:-0}" -le 2 ] || { fail "$what: a step was trained $most times"; return; }
    victims_intact "$name" || { fail "$what: a link's target was entered"; return; }
    echo "ok: $what: relaunched (exit $rc1 first), equal, clean"
}

# joined REF NP "POINT:STEP ..." ACTION RANK [opts]: one case whose first
# run meets ACTION at each POINT in the save of its STEP (a save each)
joined() {
    ref=$1 np=$2 list=$3 action=$4 rank=$5
    shift 5
    faults= at= saves=
    for ps in $list; do
        faults="${faults:+$faults,}at:${ps%:*}:${ps#*:}:$action:$rank"
        at="${at:+$at }${ps%:*}" saves="${saves:+$saves }${ps#*:}"
    done
    one "$ref" "$np" "$at" "$saves" "$action" "$rank" "$@"
    faults=
}

# sweep REF NP STEPS ACTIONS RANK EVERY [opts]: every EVERY-th point of the
# saves of STEPS with each action (errno actions skip the phase points,
# which guard no call, and ENOSPC/EDQUOT all but the writes)
crash_sweep() {
    ref=$1 np=$2 steps=$3 actions=$4 rank=$5 every=$6
    shift 6
    for step in $steps; do
        k=0
        for p in $(points "$ref.trace" "$step" "$rank"); do
            k=$((k + 1))
            [ $((k % every)) -eq 0 ] || [ "$every" -eq 1 ] || continue
            for a in $actions; do
                case $a:$p in
                kill:*) ;;
                *:phase.*) continue ;;
                EIO:*) ;;
                *:*.write) ;;
                *) continue ;;
                esac
                one "$ref" "$np" "$p" "$step" "$a" "$rank" "$@"
            done
        done
    done
}

every=1
[ -z "$full" ] || slow=1 # the full sweep is never trimmed
if [ -n "$full" ]; then
    steps=${MODTRAIN_SWEEP_STEPS:-4 6} actions=${MODTRAIN_SWEEP_ACTIONS:-kill EIO ENOSPC EDQUOT}
else
    steps=4 actions=""
fi
parts=" ${MODTRAIN_SWEEP_PARTS:-one roll tp2dp2} "
part() { case $parts in *" $1 "*) return 0 ;; esac; return 1; }

reference victim-src 1 --steps 2 --ckpt_async 0
cp -r victim-src/ckpt/step-00000002 victim/ckpt

if part one; then
# 1 rank, synchronous saves
reference one-sync 1 --ckpt_async 0
if [ $slow = 1 ]; then
    crash_sweep one-sync 1 "$steps" "${actions:-kill EIO}" 0 "$every" --ckpt_async 0
else
    # killed with the index half written (a .tmp to clear), and between
    # the commit and `latest` (its temp file to remove, latest behind)
    for p in index.write latest.write; do one one-sync 1 "$p" 4 kill 0 --ckpt_async 0; done
    # EIO at three call sites a run: a data file's, then the index's or
    # the commit's (steps 2 and 4 not saved), then `latest`'s (a warning)
    joined one-sync 1 "data.truncate:2 index.write:4 latest.open:6" EIO 0 --ckpt_async 0
    joined one-sync 1 "data.sync:2 commit.fsync_tmp:4 latest.fsync_dir:6" EIO 0 --ckpt_async 0
fi
[ -n "$full" ] || [ $slow = 0 ] || for a in ENOSPC EDQUOT; do
    for p in data.write index.write latest.write; do one one-sync 1 "$p" 4 "$a" 0 --ckpt_async 0; done
done

# 1 rank, asynchronous periodic saves (the final one is synchronous)
reference one-async 1 --threads 2
if [ -n "$full" ]; then
    crash_sweep one-async 1 "$steps" "$actions" 0 1 --threads 2
else
    points="phase.staged phase.pack data.write phase.index commit.rename latest.rename"
    [ $slow = 1 ] || points=phase.staged # a kill is a kill (the sync cases recover)
    for p in $points; do
        one one-async 1 "$p" 4 kill 0 --threads 2
    done
    one one-async 1 data.sync 4 EIO 0 --threads 2
fi
fi

# a NaN loss on batch 4 (step 5), rolled back onto step 4: the re-save of
# step 4 replaces it (commit.rename_old, .old removed), and every relaunch
# meets the bad batch again and must skip it the same way
roll="--on_nonfinite rollback --ckpt_async 0"
if part roll; then
MODTRAIN_FAULT=nan-batch:4 reference roll 1 $roll
grep -q "rolled back to step 4, skipping the batches of steps 5-5" roll.log &&
    ok "rollback: $(grep -m 1 'rolled back' roll.log)" || { cat roll.log; fail "rollback reference"; }
grep -q "^kv state.batch_offset 1$" roll/ckpt/step-00000006/index &&
    ok "rollback: the final checkpoint records batch_offset 1" ||
    fail "rollback: state.batch_offset not recorded"
# MODTRAIN_FAULT holds the NaN, MODTRAIN_FAULT_AT the point: its last
# occurrence in the saves of step 4 is the re-save's
rollone() { # POINT ACTION
    name=c$cases
    cases=$((cases + 1))
    what="roll: $2 at $1 (the re-save of step 4)"
    links "$name"
    nth=$(awk -v p="$1" '$1 == p && $2 == 4' roll.trace | wc -l)
    MODTRAIN_FAULT=nan-batch:4 MODTRAIN_FAULT_AT="at:$1:4:$2:0:$nth" launch 1 "$name.1.log" \
        --run_dir "$name" $roll
    rc1=$rc
    grep -q "MODTRAIN_FAULT: .*$1" "$name.1.log" || { cat "$name.1.log"; fail "$what: did not fire"; return; }
    MODTRAIN_FAULT=nan-batch:4 launch 1 "$name.2.log" --run_dir "$name" $roll
    [ "$rc" -eq 0 ] || { cat "$name.1.log" "$name.2.log"; fail "$what: the relaunch exited $rc"; return; }
    same_ckpt roll/ckpt/step-00000006 "$name/ckpt/step-00000006" ||
        { cat "$name".*.log; fail "$what: the final checkpoint differs"; return; }
    left=$(find "$name/ckpt" -name '*.tmp*' -o -name '*.old*' -o -name '*.del*' | head -n 3)
    [ -z "$left" ] || { fail "$what: left behind: $left"; return; }
    victims_intact "$name" || { fail "$what: a link's target was entered"; return; }
    echo "ok: $what: relaunched (exit $rc1 first), equal, clean"
}
points="commit.rename_old commit.rename commit.old.unlink commit.old.rmdir"
# the .old put back (killed between the renames) and the .old removed
[ $slow = 1 ] || points="commit.rename commit.old.unlink"
for p in $points; do rollone "$p" kill; done
rollone commit.rename EIO
fi

# tp 2 x dp 2: rank 3 dies in the collective write, rank 0 in the commit;
# over two emulated hosts (tests/tools/nodes.sh), ranks 2 and 3 on node2,
# where they can be made, else on this one
if part tp2dp2; then
set +e
"$srcdir/tests/tools/nodes.sh" up "$TMP/nodes" 2 > nodes.out 2>&1
nrc=$?
set -e
case $nrc in
0) NODES=$TMP/nodes && echo "tp 2 x dp 2 over two emulated hosts, two ranks each" ;;
77) echo "tp 2 x dp 2 on this host: $(grep SKIP nodes.out)" ;;
*) cat nodes.out && fail "emulated hosts: nodes.sh up failed" ;;
esac
reference tp2dp2-sync 4 --tp 2 --ckpt_async 0
[ $slow = 0 ] || reference tp2dp2-async 4 --tp 2 # only the slow cases use it
if [ -n "$full" ]; then
    for r in 0 3; do
        crash_sweep tp2dp2-sync 4 "$steps" "$actions" "$r" 1 --tp 2 --ckpt_async 0
        crash_sweep tp2dp2-async 4 "$steps" "$actions" "$r" 1 --tp 2
    done
else
    one tp2dp2-sync 4 data.write 4 kill 3 --tp 2 --ckpt_async 0
    [ $slow = 0 ] || {
        one tp2dp2-sync 4 commit.rename 4 kill 0 --tp 2 --ckpt_async 0
        one tp2dp2-sync 4 data.open 4 EIO 3 --tp 2 --ckpt_async 0
        one tp2dp2-async 4 phase.pack 4 kill 3 --tp 2
        one tp2dp2-async 4 latest.rename 4 kill 0 --tp 2
    }
fi
fi
echo "sweep: $cases cases in $(($(date +%s) - t0)) s"
finish
