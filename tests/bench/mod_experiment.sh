#!/bin/sh
# Dense against Mixture-of-Depths: trains a dense model and a MoD model of the
# same size (capacity 12.5%, every other block routed) on the fortunes text
# for the same number of steps, one after the other, then prints side by side
# step time, tokens/s, FLOPs per token, final validation loss under top-k
# and causal routing, predictor accuracy and sampling tokens/s, and draws
# both loss curves into mod_vs_dense.png (gnuplot).
# usage: tests/bench/mod_experiment.sh [STEPS] [OUT_DIR] [--key value ...]
#   (the keys are passed to both training runs, e.g. --causal_router predictor)
#        tests/bench/mod_experiment.sh --plot OUT_DIR
#   (only the picture, drawn again from OUT_DIR/{dense,mod}/metrics.jsonl)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

# The picture: each run's training loss (every step's line) and validation
# loss, read by field name wherever the line holds it.
plot() {
    out=$1
    command -v gnuplot > /dev/null || { echo "plot: no gnuplot, no picture"; return 0; }
    for k in dense mod; do
        for f in loss val_loss; do
            awk -v f="$f" '
                function val(k,   r) { if (!match($0, "\"" k "\":[^,}]*")) return ""; r = substr($0, RSTART, RLENGTH)
                                     sub(/^[^:]*:/, "", r); return r }
                { v = val(f); if (v != "") print val("step"), v }' "$out/$k/metrics.jsonl" > "$out/$k.$f.dat"
        done
    done
    # the y range: from the lowest loss to the highest validation loss or
    # the 98th percentile of the training losses after the first tenth of
    # the steps (the first steps' loss, and a spike, would flatten the rest)
    last=$(cat "$out"/dense.loss.dat "$out"/mod.loss.dat | awk '$1 > m { m = $1 } END { print m + 0 }')
    top=$(cat "$out"/dense.loss.dat "$out"/mod.loss.dat | awk -v s="$last" '$1 > s / 10 { print $2 }' |
        sort -g | awk '{ v[NR] = $1 } END { print (NR ? v[int(NR * 0.98) > 0 ? int(NR * 0.98) : 1] : 0) }')
    yr=$(awk -v top="$top" '
        { if (lo == "" || $2 < lo) lo = $2 }
        FILENAME ~ /val_loss/ && $2 > top { top = $2 }
        END { pad = (top - lo) * 0.05; printf "%g:%g", lo - pad, top + pad }' \
        "$out"/dense.loss.dat "$out"/mod.loss.dat "$out"/dense.val_loss.dat "$out"/mod.val_loss.dat)
    gnuplot <<GP
set terminal png size 900,560
set output "$out/mod_vs_dense.png"
set title "dense vs Mixture-of-Depths (12.5% capacity, every other block): loss"
set xlabel "step"
set ylabel "loss (nats/byte)"
set yrange [$yr]
set grid
plot "$out/dense.loss.dat" using 1:2 with lines lc rgb "#8888ff" title "dense train", \
     "$out/mod.loss.dat" using 1:2 with lines lc rgb "#ff8888" title "MoD train", \
     "$out/dense.val_loss.dat" using 1:2 with linespoints lw 2 lc rgb "#0000cc" title "dense val", \
     "$out/mod.val_loss.dat" using 1:2 with linespoints lw 2 lc rgb "#cc0000" title "MoD val (top-k)"
GP
    echo "plot: $out/mod_vs_dense.png"
}
if [ "${1:-}" = --plot ]; then
    [ $# = 2 ] || { echo "usage: tests/bench/mod_experiment.sh --plot OUT_DIR" >&2; exit 2; }
    plot "$2"
    exit 0
fi

steps=${1:-400}
out=${2:-mod_experiment}
[ $# -ge 2 ] && shift 2 || shift $#
MODTRAIN=${MODTRAIN:-$top/modtrain}
mkdir -p "$out"
[ -f "$out/data/train_000000.bin" ] || MODTRAIN=$MODTRAIN "$top/jobs/prep_fortunes.sh" "$out/data" > /dev/null
model="--n_layer 8 --d_model 128 --n_head 4 --seq_len 256 --batch_size 8 --micro_batch 8"
opt="--lr 2e-3 --min_lr 2e-4 --warmup_steps 40 --eval_every 50 --eval_seqs 128 --log_every 50"
for kind in dense mod; do
    re=0
    [ "$kind" = mod ] && re=2
    rm -rf "$out/$kind"
    "$MODTRAIN" train $model $opt --route_every $re --capacity 0.125 --steps "$steps" \
        --train_data "$out/data/train_000000.bin" --val_data "$out/data/val_000000.bin" \
        --run_dir "$out/$kind" --resume never --ckpt_every 0 "$@" > "$out/$kind.log" 2>&1 ||
        { cat "$out/$kind.log"; exit 1; }
    "$MODTRAIN" eval --ckpt "$out/$kind/ckpt" --data "$out/data/val_000000.bin" --json > "$out/$kind.eval.json"
    "$MODTRAIN" sample --ckpt "$out/$kind/ckpt" --prompt "Q: " --tokens 512 --seed 1 --stats \
        > "$out/$kind.sample.txt" 2> "$out/$kind.sample.log"
done

# mean over steps 2.. of a metrics.jsonl key
mean() { awk -F"\"$2\":" 'NR > 1 && NF > 1 && /"loss"/ { split($2, a, /[,}]/); s += a[1]; n++ }
                           END { printf "%.6g", s / n }' "$1"; }
js() { sed -e "s/.*\"$2\":\\([^,}]*\\).*/\\1/" "$1"; }
sps() { sed -n 's/.*, \([0-9.]*\) tokens\/s.*/\1/p' "$1"; }
d="$out/dense/metrics.jsonl"
m="$out/mod/metrics.jsonl"
dt=$(mean "$d" step_time_ms)
mt=$(mean "$m" step_time_ms)
printf '%-28s %14s %14s %8s\n' "" dense MoD ratio
row() { awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN { printf "%-28s %14.6g %14.6g %8.3f\n", n, a, b, b / a }'; }
row "step time (ms)" "$dt" "$mt"
row "tokens/s" "$(mean "$d" tokens_per_s)" "$(mean "$m" tokens_per_s)"
row "FLOPs per token" "$(mean "$d" flops_per_token)" "$(mean "$m" flops_per_token)"
row "val loss (top-k)" "$(js "$out/dense.eval.json" loss)" "$(js "$out/mod.eval.json" loss)"
printf '%-28s %14s %14s\n' "val loss (causal routing)" "-" "$(js "$out/mod.eval.json" loss_causal)"
printf '%-28s %14s %14s\n' "predictor accuracy" "-" "$(js "$out/mod.eval.json" predictor_accuracy)"
printf '%-28s %14s %14s\n' "processed (causal), per block" "-" \
    "$(sed -e 's/.*"processed_causal":\[\([^]]*\)\].*/\1/' "$out/mod.eval.json")"
row "sampling tokens/s" "$(sps "$out/dense.sample.log")" "$(sps "$out/mod.sample.log")"
awk -v l="$(js "$out/mod.eval.json" loss)" -v c="$(js "$out/mod.eval.json" loss_causal)" \
    'BEGIN { printf "loss_causal / loss - 1: %+.3f%%\n", 100 * (c / l - 1) }'

plot "$out"
