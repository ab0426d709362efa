#!/bin/bash
# Data parallelism through a real, throttled network on one machine (no
# pass or fail; root). Open MPI's TCP transport over the loopback
# (--mca btl tcp,self --mca btl_tcp_if_include lo: it leaves the loopback
# out unless told), throttled by the kernel's tbf queueing discipline
# (tc qdisc ... tbf rate R burst 256kb latency 100ms), against shared
# memory (btl self,vader). Each run trains two ranks of one thread (dp 2,
# or pp 2) for --steps steps; per shape, link and variant it prints the
# mean over steps 2.. of the step time, the dp_comm and pp_wait phases, the
# pipeline's bubble (pp_wait over the step, averaged over the stages) beside
# the ideal (p - 1) / (v m + p - 1), the data-parallel bytes
# modtrain counts a step, and the bytes the qdisc sent over the whole run
# divided by the steps (start-up's traffic included), which prove the
# traffic went through the throttled link. The pml is ob1, so that the btl
# settings hold (another pml would bypass them).
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
# Beside them: the backward's time a step (what an overlap can hide behind),
# and each rank's peak RSS (/usr/bin/time), the larger of the two.
# The qdisc is removed on every exit path, and one left by a killed run is
# removed at the start.
# usage: tests/bench/bench_network.sh [--shapes "d256 gpt2"] [--links "shm 10gbit 1gbit"]
#            [--variants "after overlap zero1 pp2v1 pp2v2"] [--bucket_mb MB] [--steps N]
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
[ "$(id -u)" = 0 ] || die "needs root: it throttles the loopback with tc"
[ -x /usr/bin/time ] || die "/usr/bin/time is missing (apt-get install time)"
command -v tc > /dev/null || die "tc is missing (apt-get install iproute2)"
command -v mpirun > /dev/null || die "mpirun is missing (apt-get install openmpi-bin)"

unthrottle() { tc qdisc del dev lo root 2> /dev/null || true; }
unthrottle # one a killed run left behind
tmp=$(mktemp -d "${TMPDIR:-/tmp}/modtrain-bench.XXXXXX")
trap 'unthrottle; rm -rf "$tmp"' EXIT
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
    *) die "unknown variant '$1' (after, overlap, zero1, pp2v1 or pp2v2)" ;;
    esac
}
for v in $variants; do variant "$v"; done
"$PYTHON" "$top/tests/scripts/make_shards.py" text "$tmp/train.bin" \
    $(( (steps + 1) * 16 * 256 + 1 )) --vocab 256 --tokenizer 1

sent() { tc -s qdisc show dev lo | awk '/Sent/ { print $2; exit }'; }
# one LINK: trains dp 2 with the variant's keys and prints step_ms dp_comm_ms
# dp_MB qdisc_MB
one() {
    local link=$1 mca sent0=0 sent1=0
    if [ "$link" = shm ]; then
        mca="--mca pml ob1 --mca btl self,vader"
        unthrottle
    else
        mca="--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo"
        tc qdisc replace dev lo root tbf rate "$link" burst 256kb latency 100ms
        sent0=$(sent)
    fi
    rm -rf "$tmp/run"
    # shellcheck disable=SC2086 # the transport's and the model's keys
    rm -f "$tmp"/rss.*
    # each rank under /usr/bin/time, its peak RSS into rss.RANK
    mpirun --allow-run-as-root --oversubscribe -np 2 $mca sh -c \
        '/usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$tmp/rss" \
        "$MODTRAIN" train $model $keys --route_every 0 \
        --steps "$steps" --threads 1 --train_data "$tmp/train.bin" --val_data "" \
        --run_dir "$tmp/run" --resume never --ckpt_every 0 --log_every 1 > "$tmp/log" 2>&1 ||
        { cat "$tmp/log" >&2; die "train over $link failed"; }
    rss=$(cat "$tmp"/rss.* | sort -n | tail -n 1)
    [ "$link" = shm ] || sent1=$(sent)
    unthrottle
    awk -v q=$((sent1 - sent0)) -v steps="$steps" -v rss="$rss" '
        function val(k,   i, r) { i = index($0, "\"" k "\":"); if (!i) return 0
                                  r = substr($0, i + length(k) + 3); sub(/[,}].*/, "", r); return r }
        /"loss"/ && val("step") + 0 > 1 { n++; t += val("step_time_ms"); c += val("dp_comm")
                                          w += val("pp_wait"); bb += val("pp_bubble")
                                          bw += val("backward"); b += val("dp_bytes") + val("dp_gather_bytes") }
        END { printf "%.1f %.1f %.1f %.1f %.1f %.1f %.1f %.0f\n", t / n, c / n, w / n, 100 * bb / n, bw / n,
                     b / n / 1e6, q / steps / 1e6, rss / 1024 }' \
        "$tmp/run/metrics.jsonl"
}

echo "dp 2 or pp 2 (two ranks of one thread), means over steps 2..$steps; bubble and ideal in %"
echo "of the step; MB a step (zero1: the gradients reduce-scattered plus the parameters"
echo "gathered); peak RSS of the larger rank"
printf "%-6s %-8s %-8s %10s %10s %9s %7s %6s %10s %8s %9s %8s\n" shape link variant "step ms" \
    "dp_comm ms" "pp_wait" bubble ideal backward "dp MB" "qdisc MB" "RSS MiB"
for s in $shapes; do
    shape "$s"
    for l in $links; do
        for v in $variants; do
            variant "$v"
            out=$(one "$l") # its exit status ends the benchmark here
            read -r st dc pw bu bw db qb rs <<< "$out"
            [ "$l" = shm ] && qb=-
            printf "%-6s %-8s %-8s %10s %10s %9s %7s %6s %10s %8s %9s %8s\n" "$s" "$l" "$v" "$st" "$dc" \
                "$pw" "$bu" "$ideal" "$bw" "$db" "$qb" "$rs"
        done
    done
done
