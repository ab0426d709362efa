# A real single-node SLURM cluster for the tests: munged, slurmctld and slurmd
# with a generated slurm.conf under $1, all as root (MpiDefault from
# $SLURM_MPI_DEFAULT, SLURM's default none when unset), or one of several
# emulated hosts. Sourced; defines slurm_test_skip, cluster_up DIR,
# cluster_up_nodes DIR N [RATE], cluster_down, job_state JOB and wait_done
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

# The lines of slurm.conf every test cluster shares.
common_conf() {
    cat <<CONF
ClusterName=modtraintest
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits out the credential's lifetime before it starts
# again (120 s by default): this cluster launches its steps in well
# under 10 s
AuthInfo=cred_expire=10
StateSaveLocation=$SLURM_DIR/state
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
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
CONF
}

# one test cluster at a time on this machine (make -j runs tests side by
# side; they share the ports and munged): held until the test exits
cluster_lock() {
    exec 9> "${TMPDIR:-/tmp}/modtrain-slurm-test.lock"
    flock -w 900 9
}

start_munge() {
    STARTED_MUNGE=0
    if ! pgrep -x munged > /dev/null; then
        munged --force --socket="/run/munge/munge.socket.2" 2> "$SLURM_DIR/munged.log" 9>&- ||
            { mkdir -p /run/munge && chown munge:munge /run/munge 2> /dev/null; munged --force 9>&-; } || return 1
        STARTED_MUNGE=1
    fi
}

# until sinfo shows N idle nodes (the slurmds registered)
wait_idle() {
    i=0
    while [ "$(sinfo -h -N -o %t 2> /dev/null | grep -c idle)" -lt "$1" ]; do
        sleep 0.5
        i=$((i + 1))
        [ $i -lt 120 ] || { cat "$SLURM_DIR"/*.log; return 1; }
    done
}

cluster_up() {
    SLURM_DIR=$1
    cluster_lock || return 1
    mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool" "$SLURM_DIR/munge"
    node=$(hostname -s)
    { common_conf; cat <<CONF; } > "$SLURM_DIR/slurm.conf"
SlurmctldHost=$node
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmdLogFile=$SLURM_DIR/slurmd.log
NodeName=$node CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
    export SLURM_CONF="$SLURM_DIR/slurm.conf"
    start_munge || return 1
    slurmctld -f "$SLURM_CONF" 9>&- || return 1 # the daemons do not hold the lock
    slurmd -f "$SLURM_CONF" -N "$node" 9>&- || return 1
    wait_idle 1
}

# cluster_up_nodes DIR N [RATE]: a cluster of N emulated hosts
# (tests/tools/nodes.sh, their links throttled to RATE), node1..nodeN of
# one CPU each: slurmctld here, on the hosts' bridge (198.18.S.254), and a
# slurmd on each host, in its namespaces under its name, with its own
# spool, pid and log files. Returns 77 where the hosts cannot be made.
cluster_up_nodes() {
    SLURM_DIR=$1
    cluster_lock || return 1
    mkdir -p "$SLURM_DIR/state"
    NODES=$SLURM_DIR/hosts
    "$srcdir/tests/tools/nodes.sh" up "$NODES" "$2" --rate "${3:-none}" --gateway > "$SLURM_DIR/up.log" 2>&1 ||
        { rc=$?; cat "$SLURM_DIR/up.log"; NODES=""; return $rc; }
    S=$(sed -n 's/^S=//p' "$NODES/nodes.env")
    { common_conf; cat <<CONF; } > "$SLURM_DIR/slurm.conf"
SlurmctldHost=$(hostname -s)(198.18.$S.254)
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmdPidFile=$SLURM_DIR/slurmd.%n.pid
SlurmdLogFile=$SLURM_DIR/slurmd.%n.log
NodeName=node[1-$2] NodeAddr=198.18.$S.[1-$2] CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=node[1-$2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
    # the PMIx plugin's client folders too (it names them alike on every host)
    echo "PMIxCliTmpDirBase=$SLURM_DIR/spool" > "$SLURM_DIR/mpi.conf"
    export SLURM_CONF="$SLURM_DIR/slurm.conf"
    start_munge || return 1
    slurmctld -f "$SLURM_CONF" 9>&- || return 1
    # each host's own spool at the one path (the PMIx plugin reaches another
    # host's step daemon by the spool's path, so %n in it would not do)
    for i in $(seq 1 "$2"); do
        MODTRAIN_NODES_PRIVATE=$SLURM_DIR/spool "$srcdir/tests/tools/nodes.sh" run "$NODES" "node$i" \
            slurmd -f "$SLURM_CONF" -N "node$i" 9>&- || return 1
    done
    wait_idle "$2"
}

cluster_down() {
    if [ -z "${SLURM_CONF:-}" ]; then # no cluster came up: only the hosts may be left
        [ -z "${NODES:-}" ] || "$srcdir/tests/tools/nodes.sh" down "$NODES" > /dev/null 2>&1 || true
        NODES=""
        return 0
    fi
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
    done    # the emulated hosts, with whatever of a job is left on them
    [ -z "${NODES:-}" ] || "$srcdir/tests/tools/nodes.sh" down "$NODES" > /dev/null 2>&1 || true
    NODES=""
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
