# A real single-node SLURM cluster for the tests: munged, slurmctld and slurmd
# with a generated slurm.conf under $1, all as root (MpiDefault from
# $SLURM_MPI_DEFAULT, SLURM's default none when unset). Sourced; defines
# slurm_test_skip, cluster_up DIR, cluster_down, job_state JOB and wait_done
# JOB. Exports SLURM_CONF.

# Exits 77 (skip) where a SLURM test cannot run: MODTRAIN_SKIP_SLOW set (CI
# runs the SLURM tests once, in its main pass, and sets it for the passes
# after it: the sanitizer build, make distcheck), SLURM or munge missing,
# or not root (the test cluster runs as root).
slurm_test_skip() {
    [ -n "${MODTRAIN_SKIP_SLOW:-}" ] && { echo "SKIP: MODTRAIN_SKIP_SLOW is set"; exit 77; }
    for t in slurmctld slurmd munged sbatch; do
        command -v $t > /dev/null || { echo "SKIP: $t not installed (apt-get install slurm-wlm munge)"; exit 77; }
    done
    [ "$(id -u)" -eq 0 ] || { echo "SKIP: the test cluster runs as root"; exit 77; }
}

cluster_up() {
    SLURM_DIR=$1
    # one test cluster at a time on this machine (make -j runs tests side by
    # side; they share the ports and munged): held until the test exits
    exec 9> "${TMPDIR:-/tmp}/modtrain-slurm-test.lock"
    flock -w 900 9 || return 1
    mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool" "$SLURM_DIR/munge"
    node=$(hostname -s)
    cat > "$SLURM_DIR/slurm.conf" <<CONF
ClusterName=modtraintest
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits out the credential's lifetime before it starts
# again (120 s by default): this cluster launches its steps in well
# under 10 s
AuthInfo=cred_expire=10
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.log
SlurmctldPort=${SLURMCTLD_PORT:-6817}
SlurmdPort=${SLURMD_PORT:-6818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=${SLURM_MPI_DEFAULT:-none}
ReturnToService=2
JobRequeue=1
KillWait=30
NodeName=$node CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
    export SLURM_CONF="$SLURM_DIR/slurm.conf"
    STARTED_MUNGE=0
    if ! pgrep -x munged > /dev/null; then
        munged --force --socket="/run/munge/munge.socket.2" 2> "$SLURM_DIR/munged.log" 9>&- ||
            { mkdir -p /run/munge && chown munge:munge /run/munge 2> /dev/null; munged --force 9>&-; } || return 1
        STARTED_MUNGE=1
    fi
    slurmctld -f "$SLURM_CONF" 9>&- || return 1 # the daemons do not hold the lock
    slurmd -f "$SLURM_CONF" -N "$node" 9>&- || return 1
    i=0
    while ! sinfo -h -o %t 2> /dev/null | grep -q idle; do
        sleep 0.5
        i=$((i + 1))
        [ $i -lt 120 ] || { cat "$SLURM_DIR"/*.log; return 1; }
    done
}

cluster_down() {
    scancel --full --quiet -u root 2> /dev/null || true
    # this cluster's daemons (by their config, should a pid file be missing),
    # then munged if this test started it; each gone before the next test
    # cluster may start
    pkill -f "^slurm(ctld|d) -f $SLURM_CONF" 2> /dev/null || true
    [ "${STARTED_MUNGE:-0}" -eq 1 ] && { pkill -x munged || true; }
    i=0
    while pgrep -f "^slurm(ctld|d) -f $SLURM_CONF" > /dev/null ||
        { [ "${STARTED_MUNGE:-0}" -eq 1 ] && pgrep -x munged > /dev/null; }; do
        sleep 0.2
        i=$((i + 1))
        [ $i -lt 150 ] || { pkill -9 -f "^slurm(ctld|d) -f $SLURM_CONF"; break; }
    done
}

job_state() { scontrol show job "$1" 2> /dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }

wait_done() { # JOB: until it has left the queue for good
    i=0
    while [ $i -lt 1800 ]; do
        case "$(job_state "$1")" in COMPLETED | FAILED | CANCELLED | TIMEOUT | "") return 0 ;; esac
        sleep 0.2
        i=$((i + 1))
    done
    return 1
}
