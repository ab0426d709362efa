#!/bin/sh
# SLURM for real: a single-node cluster (munged, slurmctld, slurmd) runs
# jobs/train.sbatch (a job warned with SIGUSR1, which saves, requeues
# itself and finishes, is tests/slurm/nodes.sh's, over two hosts). A rank
# killed with kill -9
# fails the job without damaging what was committed, and a resubmission
# resumes from the last checkpoint; time_limit stops a job with a checkpoint
# and a chained job (--dependency=afterany) completes the run. Every final
# checkpoint is bitwise equal to an uninterrupted run's.
. "$(dirname "$0")/../scripts/lib.sh"
. "$srcdir/tests/slurm/cluster.sh"
slurm_test_skip
prep_fortunes
cd "$TMP"
trap 'cluster_down; rm -rf "$TMP"' EXIT
cluster_up "$TMP/slurm" || { fail "could not start the SLURM cluster"; finish; }
ok "single-node SLURM cluster up: $(sinfo -h -o '%P %t %c CPUs')"

cat > run.conf <<CONF
seq_len = 64
n_layer = 2
n_head = 4
d_model = 64
route_every = 2
batch_size = 16
micro_batch = 8
steps = 150
lr = 3e-3
warmup_steps = 10
train_data = $TMP/data/train_000000.bin
val_data =
eval_every = 0
log_every = 1000
ckpt_every = 10
CONF
export MODTRAIN MODTRAIN_LAUNCH=mpirun
export MODTRAIN_MPIRUN_ARGS="--allow-run-as-root --oversubscribe --mca btl self,vader"
MPIRUN="mpirun $MODTRAIN_MPIRUN_ARGS"
$MPIRUN -np 2 "$MODTRAIN" train --config run.conf --run_dir "$TMP/ref" --resume never --threads 1 \
    > ref.log 2>&1 || { cat ref.log; fail "reference run"; finish; }

submit() { sbatch --parsable --ntasks=2 --cpus-per-task=1 --output="$TMP/%j.out" "$@"; }
same_as_ref() { cmp -s "$TMP/ref/ckpt/step-00000150/data.bin" "$1/ckpt/step-00000150/data.bin"; }

# a rank killed with kill -9: the job fails, the committed checkpoints
# stay intact, and a resubmission resumes from the newest
job=$(MODTRAIN_MAX_RESTARTS=0 submit "$srcdir/jobs/train.sbatch" run.conf --run_dir "$TMP/kill")
wait_steps "$TMP/kill" 35 || { cat "$TMP/$job.out"; fail "job $job did not start"; finish; }
pkill -9 -f "^$MODTRAIN train .*--run_dir $TMP/kill" || true
wait_done "$job" || fail "job $job never ended"
"$MODTRAIN" ckpt list --ckpt "$TMP/kill/ckpt" > kl.txt 2>&1 || true
state=$(job_state "$job")
[ "$state" = FAILED ] && ! grep -q BAD kl.txt && grep -q verified kl.txt &&
    ok "kill -9 of a rank: job $state, every committed checkpoint verifies ($(grep -c verified kl.txt) of them)" ||
    { cat "$TMP/$job.out" kl.txt; fail "kill -9 (job state $state)"; }
job=$(submit "$srcdir/jobs/train.sbatch" run.conf --run_dir "$TMP/kill")
wait_done "$job"
grep -q "resume: loaded" "$TMP/$job.out" && [ "$(job_state "$job")" = COMPLETED ] && same_as_ref "$TMP/kill" &&
    ok "the resubmitted job resumed ($(sed -n 's/.*resume: loaded .*(step \([0-9]*\)).*/step \1/p' "$TMP/$job.out")) and finished bitwise equal" ||
    { cat "$TMP/$job.out"; fail "resubmission after kill -9"; }

# time_limit: the first job stops itself with a checkpoint (no requeue
# allowed), a chained job (afterany) completes the run
first=$(MODTRAIN_MAX_RESTARTS=0 submit "$srcdir/jobs/train.sbatch" run.conf --run_dir "$TMP/limit" --time_limit 1.5)
second=$(submit --dependency=afterany:"$first" "$srcdir/jobs/train.sbatch" run.conf --run_dir "$TMP/limit")
wait_done "$first"
wait_done "$second"
grep -q "on time_limit" "$TMP/$first.out" && [ "$(job_state "$second")" = COMPLETED ] && same_as_ref "$TMP/limit" &&
    ok "time_limit: job $first stopped at $(sed -n 's/^stopping at step \([0-9]*\).*/step \1/p' "$TMP/$first.out"), chained job $second finished bitwise equal" ||
    { cat "$TMP/$first.out" "$TMP/$second.out"; fail "time_limit and a chained job"; }
finish
