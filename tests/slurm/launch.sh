#!/bin/sh
# jobs/train.sbatch starts on whatever SLURM it meets, with no launcher
# setting: on a stock SLURM (MpiDefault=none, where a plain srun leaves Open
# MPI without PMI) it finds pmix in `srun --mpi=list` and uses srun
# --mpi=pmix (tests/slurm/nodes.sh runs that choice over two hosts, and the
# jobs below on one); where MpiDefault is pmix it uses plain srun; where srun offers
# no PMIx plugin (a stand-in srun on the PATH) it falls back to mpirun. Each
# job says in its log which launcher it chose and why, its two ranks form
# one job (dp = 2), and its final checkpoint is bitwise equal to the same
# run under mpirun outside SLURM. An isoFLOP sweep (jobs/isoflop.sh) submitted
# as a batch job launches its runs with srun on the job's tasks.
. "$(dirname "$0")/../scripts/lib.sh"
. "$srcdir/tests/slurm/cluster.sh"
slurm_test_skip
cd "$TMP"
trap 'cluster_down; rm -rf "$TMP"' EXIT
printf 'the quick brown fox jumps over the lazy dog\n%%\n%.0s' $(seq 1 400) > text.txt
"$MODTRAIN" prep --out data --doc-sep % text.txt > /dev/null
cat > run.conf <<CONF
seq_len = 16
n_layer = 2
n_head = 2
d_model = 16
batch_size = 4
steps = 6
train_data = $TMP/data/train_000000.bin
val_data =
log_every = 1
ckpt_every = 0
CONF
unset MODTRAIN_LAUNCH MODTRAIN_SRUN_MPI
export MODTRAIN MODTRAIN_MPIRUN_ARGS="--allow-run-as-root --oversubscribe --mca btl self,vader"
mpirun $MODTRAIN_MPIRUN_ARGS -np 2 "$MODTRAIN" train --config run.conf --run_dir "$TMP/ref" --threads 1 \
    > ref.log 2>&1 || { cat ref.log; fail "reference run"; finish; }
mkdir nopmix
cat > nopmix/srun <<'SH'
#!/bin/sh
# a SLURM whose srun has no PMI plugin for Open MPI
[ "$*" = "--mpi=list" ] && { printf 'MPI plugin types are...\n\tnone\n' >&2; exit 0; }
echo "stand-in srun: called with '$*', where the job should have chosen mpirun" >&2
exit 1
SH
chmod +x nopmix/srun

cluster_up "$TMP/slurm" || { fail "could not start the SLURM cluster"; finish; }
set_mpi_default() { # PLUGIN: slurm.conf's MpiDefault, read again by slurmctld
    sed -i "s/^MpiDefault=.*/MpiDefault=$1/" "$SLURM_CONF"
    scontrol reconfigure
    i=0
    until scontrol show config | grep -q "^MpiDefault *= *$1\$"; do
        sleep 0.2
        i=$((i + 1))
        [ $i -lt 100 ] || { fail "slurmctld did not take MpiDefault=$1"; return 1; }
    done
}
case_run() { # NAME MPI_DEFAULT PATH EXPECTED-LAUNCH-LINE
    set_mpi_default "$2" || return
    job=$(PATH=$3 sbatch --parsable --ntasks=2 --cpus-per-task=1 --output="$TMP/$1.out" \
        "$srcdir/jobs/train.sbatch" run.conf --run_dir "$TMP/$1")
    wait_done "$job" || fail "$1: job $job never finished"
    state=$(job_state "$job")
    line=$(grep "launching with" "$TMP/$1.out" | sed 's/^modtrain job [0-9]*: //')
    if [ "$state" = COMPLETED ] && printf '%s' "$line" | grep -q -- "$4" && grep -q "dp=2 tp=1 pp=1" "$TMP/$1.out" &&
        cmp -s "$TMP/ref/ckpt/step-00000006/data.bin" "$TMP/$1/ckpt/step-00000006/data.bin"; then
        ok "$1 (MpiDefault=$2): $line; two ranks, bitwise equal to mpirun outside SLURM"
    else
        cat "$TMP/$1.out"
        fail "$1: job $job $state, '$line', expected '$4'"
    fi
}
case_run pmix-default pmix "$PATH" "launching with srun --kill-on-bad-exit=1 (MpiDefault=pmix)"
case_run no-pmix none "$TMP/nopmix:$PATH" "launching with mpirun -np 2 .*(srun --mpi=list offers no pmix plugin; MpiDefault=none)"

# train.sbatch submitted from another folder (one holding a folder named
# modtrain, which the old default took for the binary) with MODTRAIN unset:
# it runs the binary of the tree it lives in, though SLURM runs a copy of
# it from its spool; with none there, modtrain on the PATH; with neither,
# one line and exit 2. The first job's time_limit = auto reads its end from
# squeue: its --time of 10 minutes.
set_mpi_default none
mkdir -p tree/jobs elsewhere/modtrain bin
cp "$srcdir/jobs/train.sbatch" tree/jobs/
ln -s "$MODTRAIN" tree/modtrain
ln -s "$MODTRAIN" bin/modtrain
case_tree() { # NAME PATH EXPECTED-STATE EXPECTED-LINE [sbatch options]
    name=$1 path=$2 want=$3 line=$4
    shift 4
    job=$(cd elsewhere && env -u MODTRAIN PATH=$path sbatch --parsable --ntasks=2 --cpus-per-task=1 \
        --output="$TMP/$name.out" "$@" ../tree/jobs/train.sbatch "$TMP/run.conf" --run_dir "$TMP/$name" \
        --time_limit auto)
    wait_done "$job" || fail "$name: job $job never finished"
    state=$(job_state "$job")
    if [ "$state" = "$want" ] && grep -q -- "$line" "$TMP/$name.out"; then
        ok "$name: job $state: $(grep -- "$line" "$TMP/$name.out" | head -n 1)"
    else
        cat "$TMP/$name.out"
        fail "$name: job $job $state (expected $want), no line '$line'"
    fi
}
case_tree tree "$PATH" COMPLETED "binary $TMP/tree/modtrain (the tree of " --time=10
t=$(sed -n 's/^train: time_limit = auto: job [0-9]* ends at .* (squeue): \([0-9]*\) s from the start.*/\1/p' tree.out)
# squeue gives the job's start and end to the second, so the end can lie
# 600 s and a fraction after the process's start, which prints as 601
[ -n "$t" ] && [ "$t" -gt 500 ] && [ "$t" -le 601 ] && ok "time_limit = auto under --time=10: $t s, from squeue" ||
    fail "time_limit = auto under --time=10 gave '$t' s: $(grep time_limit tree.out)"
rm tree/modtrain
case_tree path "$TMP/bin:$PATH" COMPLETED "binary $TMP/bin/modtrain (the PATH)"
case_tree none "$(dirname "$(command -v sbatch)"):/usr/bin:/bin" FAILED "^train.sbatch: no modtrain binary: MODTRAIN is not set, $TMP/tree/modtrain is not there"

# an isoFLOP sweep as a batch job, its runs launched by srun on the job's
# two tasks (dp 2): the same steps and FLOPs as the sweep in one process
set_mpi_default none
iso() { "$srcdir/jobs/isoflop.sh" --quick --budgets 2e10 --sizes 32x2 --train "$TMP/data/train_000000.bin" \
    --val "$TMP/data/val_000000.bin" "$@"; }
iso --out "$TMP/iso1" > iso1.log 2>&1 || { cat iso1.log; fail "the sweep in one process failed"; }
job=$(sbatch --parsable --ntasks=2 --cpus-per-task=1 --output="$TMP/iso.out" "$srcdir/jobs/isoflop.sh" \
    --quick --budgets 2e10 --sizes 32x2 --train "$TMP/data/train_000000.bin" --val "$TMP/data/val_000000.bin" \
    --out "$TMP/iso" --launcher "srun --mpi=pmix")
wait_done "$job" || fail "isoflop: job $job never finished"
one=$(cut -d, -f2,6,8 "$TMP/iso1/results.csv")
two=$(cut -d, -f2,6,8 "$TMP/iso/results.csv" 2> /dev/null || true)
if [ "$(job_state "$job")" = COMPLETED ] && [ "$one" = "$two" ] &&
    grep -q "dp=2 tp=1 pp=1" "$TMP/iso/runs/b2e10_32x2_mod/train.log"; then
    ok "isoflop.sh under sbatch, runs launched by srun --mpi=pmix (dp 2): the same steps and FLOPs as one process"
else
    cat "$TMP/iso.out"
    fail "isoflop.sh under sbatch: job $job $(job_state "$job"), [$two], one process [$one]"
fi
finish
