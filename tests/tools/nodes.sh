#!/bin/bash
# Emulated hosts on one machine, for multi-node runs: each host is a network
# namespace (its own loopback and an eth0), joined to the others by a veth
# pair on a bridge of its own, and each process runs in its own UTS
# namespace under the host's name (Open MPI tells nodes apart by hostname:
# two "nodes" sharing one map the same shared-memory segments). Inside a
# host ranks talk over shared memory; between hosts over TCP on eth0,
# whose egress a tbf qdisc throttles to --rate (this kernel has tbf, not
# netem: links are slow in bandwidth only). The hosts resolve each other by
# name from a hosts file of their own (/etc/netns/NS/hosts, mounted over
# /etc/hosts for the host's processes), and `agent` is an Open MPI launch
# agent (plm_rsh_agent) that starts a daemon inside the host it is given.
# Addresses come from the benchmarking range 198.18.0.0/15, one /24 per
# set of hosts, and live only inside these namespaces and on their bridge,
# with no route off the machine; the root namespace's interfaces are not
# touched. Each set has names, a bridge and a subnet of its own, so tests
# running side by side do not meet.
#
# usage: tests/tools/nodes.sh up DIR N [--rate RATE] [--gateway]
#            makes hosts node1..nodeN (RATE: 10gbit, 1gbit, 500mbit; none:
#            unthrottled) and records them in DIR; exit 77 without the
#            rights (CAP_NET_ADMIN, CAP_SYS_ADMIN) or the tools (ip, tc).
#            --gateway gives the bridge 198.18.S.254, so that a daemon of
#            this namespace (slurmctld) reaches the hosts and they it
#        tests/tools/nodes.sh run DIR NODE CMD...
#            runs CMD on host NODE (mpirun on node1 starts a job whose other
#            hosts' daemons the agent starts); with MODTRAIN_NODES_PRIVATE=P
#            set, the host sees its own P (P.NODE, mounted over P): a path
#            every host names alike but holds apart (slurmd's spool)
#        tests/tools/nodes.sh mpirun DIR [mpirun options] PROGRAM ...
#            mpirun on node1, with the agent and TCP on eth0 between hosts
#        tests/tools/nodes.sh agent HOST COMMAND...   (Open MPI calls it;
#            the set is MODTRAIN_NODES, which `mpirun` exports)
#        tests/tools/nodes.sh bytes DIR NODE
#            bytes NODE's link has sent (its qdisc's count)
#        tests/tools/nodes.sh down DIR
#            removes every namespace, link, bridge, hosts file and lock the
#            set made, and every process left in its hosts
set -euo pipefail
LOCKS=/run/modtrain-nodes
die() { echo "nodes: $*" >&2; exit 2; }
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

# the set's recorded names: S (its subnet's third byte), N, RATE
load() {
    [ -f "$1/nodes.env" ] || die "'$1' holds no set of hosts (make one with: nodes.sh up DIR N)"
    # shellcheck disable=SC1091
    . "$1/nodes.env"
}
ns_of() { echo "mtn${S}h$1"; } # node i's namespace
node_index() {
    [[ $1 =~ ^node([1-9][0-9]?)$ ]] && [ "${BASH_REMATCH[1]}" -le "$N" ] ||
        die "'$1' is not a host of this set (node1 to node$N)"
    echo "${BASH_REMATCH[1]}"
}

# A subnet of its own: the first free S in 1..254 whose lock this set takes
# (mkdir is atomic), owned by the process that asked for the set (`up`'s
# parent: a test, a user's shell), which outlives `up`; a lock whose owner
# died is taken over, after clearing what that owner left.
take_subnet() {
    mkdir -p "$LOCKS"
    for s in $(seq 1 254); do
        if mkdir "$LOCKS/$s" 2> /dev/null; then
            echo "$PPID" > "$LOCKS/$s/pid"
            echo "$s"
            return 0
        fi
        owner=$(cat "$LOCKS/$s/pid" 2> /dev/null || true)
        if [ -n "$owner" ] && ! kill -0 "$owner" 2> /dev/null && [ -f "$LOCKS/$s/dir" ]; then
            "$self" down "$(cat "$LOCKS/$s/dir")" > /dev/null 2>&1 || true
            rm -rf "$LOCKS/$s"
            mkdir "$LOCKS/$s" 2> /dev/null || continue
            echo "$PPID" > "$LOCKS/$s/pid"
            echo "$s"
            return 0
        fi
    done
    die "no free subnet of 198.18.1.0 to 198.18.254.0 (all 254 taken)"
}

up() {
    local dir=$1 n=$2 rate=none gateway=0
    shift 2
    while [ $# -gt 0 ]; do
        case $1 in
        --rate) [ $# -ge 2 ] || die "up: --rate needs a value"; rate=$2; shift ;;
        --gateway) gateway=1 ;;
        *) die "up: unknown option '$1' (expected --rate RATE or --gateway)" ;;
        esac
        shift
    done
    [[ $n =~ ^[1-9][0-9]?$ ]] || die "up: N = '$n' is not a count of hosts (1 to 99)"
    [[ $rate == none || $rate =~ ^[1-9][0-9]*(gbit|mbit|kbit)$ ]] ||
        die "up: --rate '$rate' is not a rate like 10gbit or 500mbit"
    command -v ip > /dev/null && command -v tc > /dev/null ||
        { echo "SKIP: no ip or tc (apt-get install iproute2)"; exit 77; }
    [ "$(id -u)" = 0 ] || { echo "SKIP: emulated hosts need root (CAP_NET_ADMIN)"; exit 77; }
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    S=$(take_subnet)
    N=$n
    echo "$dir" > "$LOCKS/$S/dir"
    printf 'S=%s\nN=%s\nRATE=%s\n' "$S" "$N" "$rate" > "$dir/nodes.env"
    local br=mtn${S}br
    # tbf's bucket: what leaves at once, past the rate. A real link has
    # none, and a deep one let a tensor-parallel run's all-reduces of 256
    # KiB, a compute apart, through at no cost (650 ms a step at 1 Gbit/s
    # with 256 KiB, 866 with 128; the plan 1035). So 250 us of the rate, at
    # least 32 KiB, with the packets the stack hands tbf (GSO) at most half
    # of it: with 64 KiB ones and a 32 KiB bucket a link loaded both ways
    # moved 77 MB/s each way at 1 Gbit/s, with 16 KiB ones 118.
    burst_of() {
        local v=${1%[gmk]bit} scale=1000
        case $1 in *gbit) scale=1000000000 ;; *mbit) scale=1000000 ;; esac
        local bytes=$((v * scale / 8 / 4000))
        echo "$((bytes > 32768 ? bytes : 32768))"
    }
    # what the kernel or the rights refuse is a skip, with its reason
    can() {
        "$@" 2> "$dir/up.err" && return 0
        down "$dir" > /dev/null 2>&1 || true
        echo "SKIP: emulated hosts cannot be made here: '$*': $(head -n 1 "$dir/up.err")"
        exit 77
    }
    can ip link add "$br" type bridge
    ip link set "$br" up
    [ "$gateway" = 0 ] || can ip addr add "198.18.$S.254/24" dev "$br"
    local hosts="127.0.0.1 localhost"$'\n'
    for i in $(seq 1 "$n"); do hosts+="198.18.$S.$i node$i"$'\n'; done
    [ "$gateway" = 0 ] || hosts+="198.18.$S.254 $(hostname -s)"$'\n'
    for i in $(seq 1 "$n"); do
        local ns
        ns=$(ns_of "$i")
        can ip netns add "$ns"
        can ip link add "mtn${S}v$i" type veth peer name eth0 netns "$ns"
        ip link set "mtn${S}v$i" master "$br" up
        ip -n "$ns" addr add "198.18.$S.$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        if [ "$rate" != none ]; then
            local burst gso
            burst=$(burst_of "$rate")
            gso=$((burst / 2 < 65536 ? burst / 2 : 65536))
            # an older kernel keeps its packets' size: slower both ways, still a link
            ip -n "$ns" link set dev eth0 gso_max_size "$gso" 2> /dev/null || true
            can tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
        fi
        mkdir -p "/etc/netns/$ns"
        printf '%s' "$hosts" > "/etc/netns/$ns/hosts"
    done
    can "$self" run "$dir" node1 true # a UTS namespace of its own, and the hostname
    seq -f "node%g" 1 "$n"
}

# CMD on host i: its network namespace, and a UTS and a mount namespace of
# its own holding its hostname and its hosts file (the rest of the file
# system, /sys and its cgroups included, is the machine's: slurmd needs them)
on() {
    local i=$1
    shift
    local private=${MODTRAIN_NODES_PRIVATE:-}
    [ -z "$private" ] || mkdir -p "$private" "$private.node$i"
    exec nsenter --net="/run/netns/$(ns_of "$i")" unshare --uts --mount /bin/sh -c \
        'mount --bind "$1" /etc/hosts && { [ -z "$2" ] || mount --bind "$2.$0" "$2"; } &&
         hostname "$0" && shift 2 && exec "$@"' \
        "node$i" "/etc/netns/$(ns_of "$i")/hosts" "$private" "$@"
}

agent() {
    # Open MPI: AGENT [args] HOST COMMAND..., the command one shell line
    [ -n "${MODTRAIN_NODES:-}" ] || die "agent: MODTRAIN_NODES names no set of hosts"
    load "$MODTRAIN_NODES"
    while [[ ${1:-} == -* ]]; do shift; done
    local i
    i=$(node_index "${1:?agent: no host}")
    shift
    on "$i" /bin/sh -c "$*"
}

down() {
    local dir=$1
    load "$dir"
    for i in $(seq 1 "$N"); do
        local ns
        ns=$(ns_of "$i")
        if ip netns list | grep -q "^$ns\b"; then
            for p in $(ip netns pids "$ns" 2> /dev/null); do kill -9 "$p" 2> /dev/null || true; done
            ip netns del "$ns" 2> /dev/null || true
        fi
        ip link del "mtn${S}v$i" 2> /dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    ip link del "mtn${S}br" 2> /dev/null || true
    rm -rf "${LOCKS:?}/$S" "$dir/nodes.env"
}

cmd=${1:-}
[ $# -ge 1 ] && shift
case $cmd in
up) [ $# -ge 2 ] || die "usage: nodes.sh up DIR N [--rate RATE]"; up "$@" ;;
down) [ $# = 1 ] || die "usage: nodes.sh down DIR"; down "$1" ;;
run)
    [ $# -ge 3 ] || die "usage: nodes.sh run DIR NODE CMD..."
    load "$1"
    i=$(node_index "$2")
    shift 2
    on "$i" "$@"
    ;;
mpirun)
    [ $# -ge 2 ] || die "usage: nodes.sh mpirun DIR [mpirun options] PROGRAM ..."
    dir=$(cd "$1" && pwd)
    load "$dir"
    shift
    export MODTRAIN_NODES=$dir
    on 1 mpirun --allow-run-as-root --mca plm_rsh_agent "$self agent" \
        --mca btl self,vader,tcp --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
        --mca pml ob1 -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "$@"
    ;;
agent) agent "$@" ;;
bytes)
    [ $# = 2 ] || die "usage: nodes.sh bytes DIR NODE"
    load "$1"
    i=$(node_index "$2")
    tc -n "$(ns_of "$i")" -s qdisc show dev eth0 | sed -n 's/^ *Sent \([0-9]*\) bytes.*/\1/p' | head -n 1
    ;;
--help | -h) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' ;;
*) die "unknown command '$cmd' (expected up, run, mpirun, agent, bytes or down; see --help)" ;;
esac
