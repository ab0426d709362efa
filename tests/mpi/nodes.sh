#!/bin/sh
# A real multi-host job on emulated hosts (tests/tools/nodes.sh: a network
# namespace, a UTS namespace and a hostname each, their links throttled by
# tbf to 1 Gbit/s): two hosts of two ranks, Open MPI's daemon on node2
# started by the launch agent.
#  - tp 2 x dp 2 over node1:2,node2:2 (--host) ends bitwise equal to the
#    same layout on one host (ckpt diff --tol 0, every step's loss), and
#    its bytes crossed node2's throttled link;
#    The grid keeps each tp group on one host (rank 0 says so);
#  - the same from a hostfile, resumed from that run's step-4 checkpoint
#    onto the other host order (node2 first) with the ranks dealt round the
#    hosts (--map-by node, so that world ranks 0 and 1 sit on different
#    hosts), equals the uninterrupted run, its tp groups still each on one
#    host;
#  - a rank killed on node2 mid-step ends the job on both hosts within
#    seconds, with a non-zero exit and no process left on either; that run
#    lays dp innermost (rank_order dp-tp-pp), which puts tp across the
#    hosts, and is warned of it in one line naming the order that would not;
#  - after the test, nothing it made is left (nodes.sh down, run on exit,
#    removes the namespaces, links, bridge and hosts files).
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
nodes_up 2 1gbit
common="--config $srcdir/jobs/tiny.conf --train_data $TMP/data/train_000000.bin
    --val_data $TMP/data/val_000000.bin --seq_len 32 --ckpt_every 4 --log_every 100 --threads 1 --tp 2"
S=$(sed -n 's/^S=//p' nodes/nodes.env)

train_ok one 4 --steps 8
b0=$("$srcdir/tests/tools/nodes.sh" bytes nodes node2)
set +e
# shellcheck disable=SC2086 # the options
on_nodes --host node1:2,node2:2 "$MODTRAIN" train $common --steps 8 --run_dir "$TMP/two" \
    > two.log 2>&1
rc=$?
set -e
b1=$("$srcdir/tests/tools/nodes.sh" bytes nodes node2)
if [ "$rc" = 0 ] && [ "$(losses one)" = "$(losses two)" ] &&
    "$MODTRAIN" ckpt diff --a one/ckpt --b two/ckpt --tol 0 > diff.txt 2>&1; then
    ok "tp 2 x dp 2 over two hosts equals one host's run bit for bit ($((b1 - b0)) bytes over node2's link)"
    grep -q "groups that span nodes: tp 0 of 2, dp 2 of 2" two.log ||
        { grep "grid:" two.log; fail "the grid did not keep tp on a host and dp across"; }
else
    cat two.log diff.txt
    fail "tp 2 x dp 2 over two hosts (exit $rc) differs from one host's run"
fi
[ "$((b1 - b0))" -gt 100000 ] || fail "only $((b1 - b0)) bytes crossed node2's link: the ranks did not talk over it"

# plan counts the groups that span nodes as the grid found them
printf 'nodes = 2\ncores_per_node = 2\n' > two.cluster
for order in tp-dp-pp dp-tp-pp; do
    "$MODTRAIN" plan --config "$srcdir/jobs/tiny.conf" --cluster two.cluster --layout 2,1,2 \
        --rank_order "$order" > "plan-$order.txt" 2>&1 || { cat "plan-$order.txt"; fail "plan --rank_order $order"; }
done
grep -q " tp-dp-pp dp 2/2$" plan-tp-dp-pp.txt && grep -q " dp-tp-pp tp 2/2$" plan-dp-tp-pp.txt &&
    ok "plan's count of the groups that span nodes agrees with the grid's, in both orders" ||
    { cat plan-*.txt; fail "plan's groups across nodes differ from the grid's"; }

# a hostfile, node2 first, resuming the two-host run's step-4 checkpoint
printf 'node2 slots=2\nnode1 slots=2\n' > hostfile
mkdir -p res/ckpt && cp -R two/ckpt/step-00000004 res/ckpt/ && echo step-00000004 > res/ckpt/latest
set +e
# shellcheck disable=SC2086 # the options
on_nodes --hostfile "$TMP/hostfile" --map-by node "$MODTRAIN" train $common --steps 8 --run_dir "$TMP/res" \
    > res.log 2>&1
rc=$?
set -e
if [ "$rc" = 0 ] && grep -q "resume: loaded" res.log && grep -q "span nodes: tp 0 of 2" res.log &&
    "$MODTRAIN" ckpt diff --a one/ckpt --b res/ckpt --tol 0 > diff.txt 2>&1; then
    ok "resumed from a hostfile onto the hosts in the other order, ranks dealt round them: equal to the straight run, tp on one host"
else
    cat res.log diff.txt
    fail "the resume from a hostfile (exit $rc) differs from the straight run"
fi

# a rank dies on node2: the whole job ends, on both hosts
t0=$(date +%s)
set +e
# shellcheck disable=SC2086 # the options
MODTRAIN_FAULT=rank-exit:3:2 on_nodes --host node1:2,node2:2 "$MODTRAIN" train $common \
    --steps 8 --run_dir "$TMP/dead" --rank_order dp-tp-pp > dead.log 2>&1
rc=$?
set -e
dt=$(($(date +%s) - t0))
left=$(for i in 1 2; do ip netns pids "mtn${S}h$i" 2> /dev/null; done | wc -l)
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$dt" -le 60 ] && [ "$left" = 0 ] &&
    grep -q "MODTRAIN_FAULT: rank 3 exits at step 2" dead.log &&
    [ "$(grep -c "layout: 2 of the 2 tp groups span nodes.*rank_order = tp-dp-pp keeps" dead.log)" = 1 ]; then
    ok "rank 3 died on node2: the job ended in $dt s (exit $rc), no process left on either host (tp across hosts warned of once)"
else
    cat dead.log
    fail "a rank dead on node2: exit $rc after $dt s, $left processes left"
fi

"$srcdir/tests/tools/nodes.sh" down nodes
NODES=""
left=$(ip netns list | grep -c "^mtn${S}h" || true)
[ "$left" = 0 ] && ! ip link show "mtn${S}br" > /dev/null 2>&1 && [ ! -e "/etc/netns/mtn${S}h1" ] &&
    [ ! -e "/run/modtrain-nodes/$S" ] && ok "nodes.sh down left no namespace, link, bridge, hosts file or lock" ||
    fail "nodes.sh down left $left namespaces or the bridge, a hosts file or the lock"
finish
