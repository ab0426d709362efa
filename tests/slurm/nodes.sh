#!/bin/sh
# SLURM over several hosts: three emulated hosts (tests/tools/nodes.sh,
# links of 20 Mbit/s), a slurmd on each in its own namespaces under its
# name, slurmctld beside them on their bridge. jobs/train.sbatch with -N 2
# (a rank a node):
#  - under srun, as the script chooses it on a stock SLURM (MpiDefault=none:
#    srun --mpi=pmix), its final checkpoint bitwise equal to the same run
#    under mpirun on one host; its time_limit = auto reads the job's end
#    (--time=10) from squeue on node1 and every rank keeps it;
#  - under mpirun inside the allocation (MODTRAIN_LAUNCH=mpirun), the same;
#  - warned with SIGUSR1: it saves and requeues, node1 is drained meanwhile,
#    and it resumes on node2 and node3 to finish bitwise equal;
#  - resubmitted onto 3 nodes from its step-20 checkpoint (dp 2 -> dp 3,
#    resharded), it ends within 1e-5 of the straight run (a sum of three
#    rounds otherwise than a sum of two).
. "$(dirname "$0")/../scripts/lib.sh"
. "$srcdir/tests/slurm/cluster.sh"
slurm_test_skip
prep_fortunes
cd "$TMP"
trap 'cluster_down; rm -rf "$TMP"' EXIT
set +e
cluster_up_nodes "$TMP/slurm" 3 20mbit # slow links: a step takes long enough to be signalled mid-run
rc=$?
set -e
[ "$rc" = 77 ] && exit 77
[ "$rc" = 0 ] || { fail "could not start the SLURM cluster of three hosts"; finish; }
ok "SLURM over three emulated hosts: $(sinfo -h -N -o '%N %t' | tr '\n' ' ')"

cat > run.conf <<CONF
seq_len = 32
n_layer = 2
n_head = 4
d_model = 64
batch_size = 12
micro_batch = 2
steps = 40
lr = 3e-3
warmup_steps = 5
train_data = $TMP/data/train_000000.bin
val_data =
eval_every = 0
log_every = 1000
ckpt_every = 10
CONF
export MODTRAIN OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0
mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 "$MODTRAIN" train \
    --config run.conf --run_dir "$TMP/ref2" --resume never --threads 1 > ref2.log 2>&1 ||
    { cat ref2.log; fail "the one-host reference"; finish; }
same() { cmp -s "$TMP/ref$1/ckpt/step-00000040/data.bin" "$2/ckpt/step-00000040/data.bin"; }
sbatch_nodes() { sbatch --parsable --ntasks-per-node=1 --cpus-per-task=1 --output="$TMP/%j.out" "$@"; }

# srun, then mpirun, across two hosts
for launch in auto mpirun; do
    job=$(MODTRAIN_LAUNCH=$launch sbatch_nodes -N 2 --time=10 "$srcdir/jobs/train.sbatch" run.conf \
        --run_dir "$TMP/$launch" --time_limit auto)
    wait_done "$job" || fail "$launch: job $job never finished"
    [ "$(job_state "$job")" = COMPLETED ] && same 2 "$TMP/$launch" &&
        ok "-N 2, $(sed -n 's/.*: launching with \([a-z]*\).*/\1/p' "$TMP/$job.out" | head -n 1) on $(scontrol show job "$job" | sed -n 's/^ *NodeList=\([^ ]*\).*/\1/p'): bitwise the one-host run" ||
        { cat "$TMP/$job.out"; fail "-N 2 under $launch"; }
    [ "$launch" = auto ] || continue
    grep -q "launching with srun --kill-on-bad-exit=1 --mpi=pmix (srun --mpi=list offers pmix; MpiDefault=none)" "$TMP/$job.out" ||
        { grep "launching" "$TMP/$job.out"; fail "a stock SLURM's job did not choose srun --mpi=pmix"; }
    # squeue gives the end to the second: 600 s and a fraction from the start prints as 601
    t=$(sed -n 's/^train: time_limit = auto: job [0-9]* ends at .* (squeue): \([0-9]*\) s from the start.*/\1/p' "$TMP/$job.out")
    [ -n "$t" ] && [ "$t" -gt 500 ] && [ "$t" -le 601 ] && ok "time_limit = auto over two hosts under --time=10: $t s, from squeue" ||
        fail "time_limit = auto over two hosts under --time=10 gave '$t' s: $(grep time_limit "$TMP/$job.out")"
done

# SIGUSR1, requeued onto other nodes
job=$(sbatch_nodes -N 2 "$srcdir/jobs/train.sbatch" run.conf --run_dir "$TMP/pre")
wait_steps "$TMP/pre" 12 || { cat "$TMP/$job.out"; fail "job $job did not start training"; finish; }
first=$(scontrol show job "$job" | sed -n 's/^ *NodeList=\([^ ]*\).*/\1/p')
scontrol update nodename=node1 state=drain reason=moved
scancel --signal=USR1 --batch "$job"
wait_done "$job" || { cat "$TMP/$job.out"; fail "job $job never finished"; }
then=$(scontrol show job "$job" | sed -n 's/^ *NodeList=\([^ ]*\).*/\1/p')
scontrol update nodename=node1 state=resume
grep -q "stopping at step" "$TMP/$job.out" && grep -q "requeueing" "$TMP/$job.out" &&
    [ "$(job_state "$job")" = COMPLETED ] && same 2 "$TMP/pre" && [ "$then" != "$first" ] &&
    ok "SIGUSR1 on $first: saved, requeued, resumed on $then, bitwise the uninterrupted run" ||
    { cat "$TMP/$job.out"; fail "SIGUSR1 and a requeue onto other nodes ($first, then $then)"; }

# onto three nodes from the two-node run's step-20 checkpoint
mkdir -p three/ckpt && cp -R auto/ckpt/step-00000020 three/ckpt/ && echo step-00000020 > three/ckpt/latest
job=$(sbatch_nodes -N 3 "$srcdir/jobs/train.sbatch" run.conf --run_dir "$TMP/three")
wait_done "$job" || fail "job $job never finished"
grep -q "resume: loaded" "$TMP/$job.out" && [ "$(job_state "$job")" = COMPLETED ] &&
    "$MODTRAIN" ckpt diff --a ref2/ckpt --b three/ckpt --tol 1e-5 > diff3.txt 2>&1 &&
    ok "resubmitted onto 3 nodes from step 20 (dp 2 -> 3): $(tail -n 1 diff3.txt | sed 's/ckpt diff: //')" ||
    { head -n 30 "$TMP/$job.out"; cat diff3.txt; ls -la three three/ckpt; fail "the resubmission onto 3 nodes"; }
finish
