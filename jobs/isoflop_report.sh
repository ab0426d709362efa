#!/bin/bash
# The report of an isoFLOP sweep (jobs/isoflop.sh) from OUT/results.csv:
#   OUT/summary.txt       every run, then per budget the best dense and the
#                         best MoD model, their losses' difference and how
#                         much faster the best MoD model steps
#   OUT/isoflop.png       final loss against parameters (log scale), one
#                         curve per budget and kind, the isoFLOP-optimal
#                         points ringed (gnuplot; left out without it)
#   OUT/loss_vs_time.png  final loss against wall-clock time, every run
# usage: jobs/isoflop_report.sh OUT
set -euo pipefail
export LC_ALL=C
out=${1:?usage: jobs/isoflop_report.sh OUT}
csv=$out/results.csv
[ -f "$csv" ] || { echo "isoflop_report: $csv not found (run jobs/isoflop.sh first)" >&2; exit 2; }

# columns: 1 budget 2 kind 3 d_model 4 n_layer 5 params 6 steps 7 tokens 8 flops
# 9 epochs 10 budget_spent 11 val_loss 12 val_loss_causal 13 step_ms
# 14 tokens_per_s 15 wall_s 16 capacity 17 route_every
awk -F, '
NR == 1 { next }
{
    n++; b[n] = $1; k[n] = $2; line[n] = $0
    if (!($1 in seen)) { seen[$1] = 1; order[++nb] = $1 }
    key = $1 SUBSEP $2
    if (!(key in best) || $11 < best_loss[key]) { best[key] = n; best_loss[key] = $11 }
    split($0, f, ","); for (i = 1; i <= 17; i++) c[n, i] = f[i]
}
END {
    printf "%-8s %-5s %7s %9s %6s %9s %7s %9s %9s %8s %9s %8s\n", "budget", "kind", "size",
        "params", "steps", "tokens", "epochs", "val loss", "causal", "step ms", "tokens/s", "wall s"
    for (i = 1; i <= n; i++)
        printf "%-8s %-5s %7s %9d %6d %9d %7.2f %9.4f %9.4f %8.1f %9.0f %8.1f\n", c[i, 1], c[i, 2],
            c[i, 3] "x" c[i, 4], c[i, 5], c[i, 6], c[i, 7], c[i, 9], c[i, 11], c[i, 12], c[i, 13],
            c[i, 14], c[i, 15]
    print ""
    for (j = 1; j <= nb; j++) {
        B = order[j]; d = best[B, "dense"]; m = best[B, "mod"]
        if (!d || !m) { printf "budget %s: no %s run\n", B, d ? "MoD" : "dense"; continue }
        printf "budget %s FLOPs: best dense %sx%s (%.2fM parameters) %.4f; best MoD %sx%s (%.2fM) " \
               "%.4f top-k, %.4f causal; MoD - dense %+.4f (%+.2f%%); the best MoD model steps " \
               "%.2fx as fast (%.1f against %.1f ms)\n",
            B, c[d, 3], c[d, 4], c[d, 5] / 1e6, c[d, 11], c[m, 3], c[m, 4], c[m, 5] / 1e6,
            c[m, 11], c[m, 12], c[m, 11] - c[d, 11], 100 * (c[m, 11] / c[d, 11] - 1),
            c[d, 13] / c[m, 13], c[m, 13], c[d, 13]
    }
}' "$csv" > "$out/summary.txt"
cat "$out/summary.txt"

command -v gnuplot > /dev/null || { echo "isoflop_report: no gnuplot, no plots"; exit 0; }
plot=$out/plot
rm -rf "$plot"
mkdir -p "$plot"
budgets=$(awk -F, 'NR > 1 && !s[$1]++ { printf "%s ", $1 }' "$csv")
for B in $budgets; do
    for kind in dense mod; do
        awk -F, -v B="$B" -v K="$kind" 'NR > 1 && $1 == B && $2 == K { print $5, $11, $15 }' "$csv" |
            sort -n > "$plot/${B}_$kind.dat"
        sort -k2,2g "$plot/${B}_$kind.dat" | head -n 1 >> "$plot/opt_$kind.dat"
    done
done
touch "$plot/opt_dense.dat" "$plot/opt_mod.dat"
gnuplot <<GP
set terminal pngcairo size 960,600
set termoption noenhanced
set datafile missing "?"
budgets = "$budgets"
set style line 1 lc rgb "#1f77b4" lw 2 pt 7
set output "$out/isoflop.png"
set title "isoFLOP curves: dense (solid) and MoD (dashed), isoFLOP-optimal points ringed"
set xlabel "parameters"
set ylabel "final validation loss (nats/token)"
set logscale x
set grid
set key outside right
plot for [i=1:words(budgets)] "$plot/".word(budgets, i)."_dense.dat" using 1:2 \
        with linespoints lw 2 pt 7 lc i title word(budgets, i)." dense", \
     for [i=1:words(budgets)] "$plot/".word(budgets, i)."_mod.dat" using 1:2 \
        with linespoints lw 2 dt 2 pt 5 lc i title word(budgets, i)." MoD", \
     "$plot/opt_dense.dat" using 1:2 with points pt 6 ps 3 lw 2 lc rgb "black" title "optimal dense", \
     "$plot/opt_mod.dat" using 1:2 with points pt 4 ps 3 lw 2 lc rgb "red" title "optimal MoD"
set output "$out/loss_vs_time.png"
set title "final validation loss against wall-clock time: dense (circles) and MoD (squares)"
set xlabel "wall-clock seconds of training"
plot for [i=1:words(budgets)] "$plot/".word(budgets, i)."_dense.dat" using 3:2 \
        with points pt 7 ps 1.5 lc i title word(budgets, i)." dense", \
     for [i=1:words(budgets)] "$plot/".word(budgets, i)."_mod.dat" using 3:2 \
        with points pt 5 ps 1.5 lc i title word(budgets, i)." MoD"
GP
echo "isoflop_report: wrote $out/summary.txt, $out/isoflop.png, $out/loss_vs_time.png"
