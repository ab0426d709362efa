#!/bin/bash
# Parallelism through a real, throttled network on one machine (no pass or
# fail; root): two emulated hosts (tests/tools/nodes.sh: a network
# namespace and a hostname each, Open MPI's TCP between them on links a tbf
# qdisc throttles to the rate: tc qdisc ... tbf rate R, a bucket of 250
# us of it), against shared memory on one host (btl self,vader). Each run
# trains a rank on each host, pinned to a core of its own (two nodes of one
# core), of one thread (dp 2, or pp 2) for --steps steps; per shape, link
# and variant it prints the mean over steps 2.. of the step time, the
# dp_comm and pp_wait phases, the pipeline's bubble (pp_wait over the step,
# averaged over the stages) beside the ideal (p - 1) / (v m + p - 1), the
# data-parallel bytes modtrain counts a step, and the bytes the hosts'
# qdiscs sent over the whole run divided by the steps (start-up's traffic
# included), which prove the traffic went through the throttled links. The
# pml is ob1, so that the btl settings hold (another pml would bypass them).
#   shapes:   d256  d_model 256, 4 layers, T 256, micro-batch 8 (V 256)
#             gpt2  GPT-2 small (V 50257, d_model 768, 12 layers), T 256, micro-batch 4
#   links:    shm, or a tbf rate (10gbit, 1gbit, 500mbit, ...)
#   variants: after    dp_overlap 0: the reduction after the whole backward
#             overlap  dp_overlap 1: each bucket as the backward finishes it
#             zero1    dp_overlap 1 and zero 1 (ZeRO-1: reduce-scatter, a
#                      rank's half of the moments, all-gather)
#             pp2v1    pp 2, plain 1F1B, 8 micro-batches a step (a quarter
#                      of the shape's micro-batch)
#             pp2v2    the same interleaved: virtual_stages 2
#             GPT-2's head (V x C) costs 5.5 of its blocks, so its pipelines
#             balance the ranks by stage_layers: 9 blocks against 3 and the
#             head (v 1: 9,3; v 2: 5,2,4,1); d256's head is small: balanced
#             tpin     tp 2 x dp 2, two ranks a host (oversubscribed: two
#                      ranks a core), the grid's order: tp within a host,
#                      dp across
#             tpx      the same with rank_order dp-tp-pp: tp across the
#                      hosts, dp within
# "between" is the time from the end of one step's update to the start of
# the next step (interval_ms less step_time_ms: the metrics line, the data,
# and under zero1 what the all-gather in flight delays in them);
# zero1's "ag wait" is the part of dp_comm its forwards waited for the
# all-gather the step before left in flight (dp_gather_wait_ms). Beside
# them: the backward's time a step (what an overlap can hide behind),
# and each rank's peak RSS (/usr/bin/time), the largest.
# The hosts are removed on every exit path.
# usage: tests/bench/bench_network.sh [--shapes "d256 gpt2"] [--links "shm 10gbit 1gbit"]
#            [--variants "after overlap zero1 pp2v1 pp2v2 tpin tpx"] [--bucket_mb MB] [--steps N]
#   --bucket_mb: the overlap's dp_bucket_mb (default: train's, 25)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
MODTRAIN=${MODTRAIN:-$top/modtrain}
PYTHON=${PYTHON:-python3}
shapes="d256 gpt2" links="shm 10gbit 1gbit" variants="after overlap zero1 pp2v1 pp2v2" bucket_mb=""
steps=4
die() { echo "bench_network: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || die "$1 needs a value"
    case $1 in
    --shapes) shapes=$2 ;;
    --links) links=$2 ;;
    --variants) variants=$2 ;;
    --bucket_mb) bucket_mb=$2 ;;
    --steps) steps=$2 ;;
    *) die "unknown option '$1' (see the usage at the top of $0)" ;;
    esac
    shift 2
done
case $steps in '' | *[!0-9]* | 0*) die "--steps '$steps' is not a whole number >= 1" ;; esac
[ "$steps" -ge 2 ] || die "--steps $steps: at least 2 (the first is left out)"
for l in $links; do
    case $l in shm | [1-9]*[0-9]gbit | [1-9]*[0-9]mbit | [1-9]gbit | [1-9]mbit) ;;
    *) die "--links: '$l' is neither shm nor a rate like 10gbit or 500mbit" ;; esac
done
[ "$(id -u)" = 0 ] || die "needs root: it makes hosts (network namespaces) and throttles their links"
[ -x /usr/bin/time ] || die "/usr/bin/time is missing (apt-get install time)"
command -v tc > /dev/null || die "tc is missing (apt-get install iproute2)"
command -v mpirun > /dev/null || die "mpirun is missing (apt-get install openmpi-bin)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
NODES=$top/tests/tools/nodes.sh
down() { [ ! -f "$tmp/nodes/nodes.env" ] || "$NODES" down "$tmp/nodes" > /dev/null 2>&1 || true; }
trap 'down; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM # through the EXIT trap

shape() { # NAME: sets model, pp_micro (a pipeline's micro-batch: 8 a step) and
          # pp_layers1, pp_layers2 (its stage_layers at v 1 and 2)
    case $1 in
    d256) model="--vocab_size 256 --d_model 256 --n_head 8 --n_layer 4 --seq_len 256 --batch_size 16 --micro_batch 8"
          pp_micro=2 pp_layers1="" pp_layers2="" ;;
    gpt2) model="--vocab_size 50257 --d_model 768 --n_head 12 --n_layer 12 --seq_len 256 --batch_size 8 --micro_batch 4"
          pp_micro=1 pp_layers1=9,3 pp_layers2=5,2,4,1 ;;
    *) die "unknown shape '$1' (d256 or gpt2)" ;;
    esac
}
for s in $shapes; do shape "$s"; done
variant() { # NAME: sets keys, and ideal (the bubble's, or -)
    ideal=-
    case $1 in
    after) keys="--dp_overlap 0" ;;
    overlap) keys="--dp_overlap 1 ${bucket_mb:+--dp_bucket_mb $bucket_mb}" ;;
    zero1) keys="--dp_overlap 1 --zero 1 ${bucket_mb:+--dp_bucket_mb $bucket_mb}" ;;
    pp2v[12]) # 8 micro-batches over 2 stages: (2 - 1) / (8 v + 1)
        keys="--pp 2 --virtual_stages ${1#pp2v} --micro_batch $pp_micro"
        lay=pp_layers${1#pp2v}
        [ -z "${!lay}" ] || keys="$keys --stage_layers ${!lay}"
        ideal=$(awk -v v="${1#pp2v}" 'BEGIN { printf "%.1f", 100 / (8 * v + 1) }') ;;
    tpin) keys="--tp 2 --rank_order auto" ;;
    tpx) keys="--tp 2 --rank_order dp-tp-pp" ;;
    *) die "unknown variant '$1' (after, overlap, zero1, pp2v1, pp2v2, tpin or tpx)" ;;
    esac
    per=1 # ranks a host
    case $1 in tp*) per=2 ;; esac
}
for v in $variants; do variant "$v"; done
"$PYTHON" "$top/tests/scripts/make_shards.py" text "$tmp/train.bin" \
    $(( (steps + 1) * 16 * 256 + 1 )) --vocab 256 --tokenizer 1

sent() { echo $(($("$NODES" bytes "$tmp/nodes" node1) + $("$NODES" bytes "$tmp/nodes" node2))); }
# one LINK: trains the variant (per ranks on each of two hosts, or all on
# this one under shm) and prints step_ms dp_comm_ms pp_wait bubble backward
# dp_MB qdisc_MB rss_MiB
one() {
    local link=$1 sent0=0 sent1=0 launch
    if [ "$link" = shm ]; then
        launch="mpirun --allow-run-as-root --oversubscribe --bind-to none -np $((2 * per)) --mca pml ob1 --mca btl self,vader"
    else
        launch="$NODES mpirun $tmp/nodes --oversubscribe --bind-to none --host node1:$per,node2:$per"
        sent0=$(sent)
    fi
    rm -rf "$tmp/run"
    rm -f "$tmp"/rss.*
    # each rank pinned to a core (rank mod cores), under /usr/bin/time, its
    # peak RSS into rss.RANK
    # shellcheck disable=SC2086 # the launcher's, the transport's and the model's keys
    $launch sh -c 'taskset -c $((OMPI_COMM_WORLD_RANK % $(nproc))) /usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' \
        "$tmp/rss" "$MODTRAIN" train $model $keys --route_every 0 \
        --steps "$steps" --threads 1 --train_data "$tmp/train.bin" --val_data "" \
        --run_dir "$tmp/run" --resume never --ckpt_every 0 --log_every 1 > "$tmp/log" 2>&1 ||
        { cat "$tmp/log" >&2; die "train over $link failed"; }
    rss=$(cat "$tmp"/rss.* | sort -n | tail -n 1)
    [ "$link" = shm ] || sent1=$(sent)
    awk -v q=$((sent1 - sent0)) -v steps="$steps" -v rss="$rss" '
        function val(k,   i, r) { i = index($0, "\"" k "\":"); if (!i) return 0
                                  r = substr($0, i + length(k) + 3); sub(/[,}].*/, "", r); return r }
        /"loss"/ && val("step") + 0 > 1 { n++; t += val("step_time_ms"); c += val("dp_comm")
                                          w += val("pp_wait"); bb += val("pp_bubble")
                                          bw += val("backward"); b += val("dp_bytes") + val("dp_gather_bytes")
                                          ag += val("dp_gather_wait_ms"); iv += val("interval_ms") }
        END { printf "%.1f %.1f %.1f %.1f %.1f %.1f %.1f %.0f %.1f %.1f\n", t / n, c / n, w / n, 100 * bb / n, bw / n,
                     b / n / 1e6, q / steps / 1e6, rss / 1024, ag / n, (iv - t) / n }' \
        "$tmp/run/metrics.jsonl"
}

echo "dp 2 or pp 2 (a rank of one thread on each of two hosts; tpin, tpx: two a host), means over"
echo "steps 2..$steps; bubble and ideal in %"
echo "of the step; MB a step (zero1: the gradients reduce-scattered plus the parameters"
echo "gathered); peak RSS of the larger rank"
printf "%-6s %-8s %-8s %10s %8s %10s %9s %9s %7s %6s %10s %8s %9s %8s\n" shape link variant "step ms" \
    "between" "dp_comm ms" "ag wait" "pp_wait" bubble ideal backward "dp MB" "qdisc MB" "RSS MiB"
for s in $shapes; do
    shape "$s"
    for l in $links; do
        down
        [ "$l" = shm ] || "$NODES" up "$tmp/nodes" 2 --rate "$l" > /dev/null ||
            die "could not make two hosts (tests/tools/nodes.sh up) at $l"
        for v in $variants; do
            variant "$v"
            out=$(one "$l") # its exit status ends the benchmark here
            read -r st dc pw bu bw db qb rs ag gap <<< "$out"
            [ "$l" = shm ] && qb=-
            [ "$v" = zero1 ] || ag=-
            printf "%-6s %-8s %-8s %10s %8s %10s %9s %9s %7s %6s %10s %8s %9s %8s\n" "$s" "$l" "$v" "$st" "$gap" \
                "$dc" "$ag" "$pw" "$bu" "$ideal" "$bw" "$db" "$qb" "$rs"
        done
    done
done
