#!/bin/bash
# isoFLOP sweep (Raposo et al., 2024): for every FLOP budget and
# every model size of a grid, trains a model of each kind (--kinds: by
# default a dense model and a Mixture-of-Depths model) for exactly the steps
# that spend the budget (FLOPs per token as modtrain counts them, routed
# blocks at their realised capacity k / T), evaluates each under top-k and
# causal routing, and writes:
#   OUT/results.csv       one row per run
#   OUT/summary.txt       per budget: best dense, best MoD, the difference,
#                         and how much faster the best MoD model steps; with
#                         MoE kinds, the best of every kind and whether the
#                         paper's order holds (MoDE < MoE < dense,
#                         mode_integrated < moe_capped)
#   OUT/isoflop.png       final loss against parameters, one curve per budget
#                         and kind, the isoFLOP-optimal points marked
#   OUT/loss_vs_time.png  final loss against wall-clock time, every run,
#                         each point labelled with its size (d_model x n_layer)
# (jobs/isoflop.sh --report OUT draws them again from OUT/results.csv.)
# A sweep that stops (preempted, killed, a failed run) starts again where it
# was: finished runs are skipped, an unfinished one resumes from its newest
# checkpoint (modtrain's own resume).
#
# usage: jobs/isoflop.sh [options]
# (--key value or --key=value; dashes or underscores: --head-dim is --head_dim)
#   --out DIR             sweep folder (isoflop)
#   --budgets "B ..."     FLOP budgets (1e12 3e12 1e13)
#   --sizes "CxL ..."     d_model x n_layer grid, heads = d_model / head_dim
#                         (32x2 64x2 96x3 128x4 160x5 192x6)
#   --head_dim N          (32)
#   --arch A              the block, gpt2 or llama (gpt2): llama's RMSNorm,
#                         rotary positions, SwiGLU of modtrain's default
#                         width (8/3 d_model up to a multiple of 256, also
#                         the experts'), no biases, an untied head
#   --capacity F          MoD capacity (0.125)
#   --route_every N       MoD: every N-th block routed (2)
#   --kinds LIST          the kinds of model, comma-separated (dense,mod):
#                         dense      the dense transformer
#                         mod        MoD: every route_every-th block routed at
#                                    --capacity
#                         moe        every block MoE: --experts experts, top
#                                    --expert_top_k, --capacity_factor
#                         mode_staged      MoD routing as mod, and every
#                                    block MoE as moe (staged MoDE)
#                         mode_integrated  moe with as many no-op experts as
#                                    experts (integrated MoDE: a token the
#                                    router sends to a no-op skips the MLP)
#                         moe_capped moe with its capacity cut to
#                                    --capped_factor: dropped tokens take the
#                                    residual path (the paper's comparison
#                                    for integrated MoDE)
#   --experts N           MoE kinds: experts per MoE block (4)
#   --expert_top_k N      MoE kinds: experts per token, 1 or 2 (1)
#   --capacity_factor F   MoE kinds: an expert takes at most F x rows x top_k
#                         / experts rows of a micro-batch (1.25)
#   --capped_factor F     moe_capped's capacity_factor (experts / (experts +
#                         no-ops of mode_integrated) = 0.5: its experts keep
#                         at most half the slots, what mode_integrated's
#                         experts take when its router balances)
#                         MoE kinds are sized as the dense grid and matched in
#                         FLOPs per token, not parameters: an expert's MLP is
#                         4 x d_model wide (expert_d_ff), so a top-1 slot
#                         costs what the dense MLP costs, and a step of moe
#                         costs dense's plus the router's (E + no-ops) x
#                         d_model a token. Their steps spend the budget at
#                         the count of a balanced router (plan --flops:
#                         top_k x min(1, capacity_factor, E / (E + no-ops))
#                         slots a token); what the router really keeps is
#                         its choice during the run, so the table's flops
#                         and budget_spent are train's count of the slots
#                         kept
#   --causal_router M     aux_loss or predictor (aux_loss)
#   --seq_len N --batch N --lr F   (256, 16, 2e-3; min_lr is lr / 10)
#   --min_steps N         a run shorter than this is left out, with a note (30)
#   --eval_seqs N         validation sequences each final eval reads (256)
#   --train SPEC --val SPEC  token shards (a shard, a glob, a blend, as train_data
#                         takes); by default OUT/data from the
#                         fortunes and, when `bible` (bible-kjv) is installed,
#                         the King James Bible, byte tokens (ISOFLOP_NO_BIBLE=1:
#                         the fortunes alone)
#   --np N                launch every run with mpirun -np N (MODTRAIN_MPIRUN_ARGS
#                         adds options), or --launcher "CMD" (e.g. "srun --mpi=pmix")
#   --tp N --pp N         the layout of those ranks (dp is the rest); the final
#                         evals run as one process, or when tp x pp > 1 on
#                         tp x pp ranks (--np) or under --launcher
#   --quick               a sweep of seconds (two tiny sizes, two budgets) for tests
#   --report OUT          only the report, drawn again from OUT/results.csv
#   -- KEY VALUE ...      any other train config keys, for every run
# MODTRAIN names the binary (./modtrain, then the one of the tree this script
# lives in, then modtrain on the PATH).
set -euo pipefail
export LC_ALL=C
# Until the sweep starts there is nothing to save: a signal ends it at once
# with the exit code of a preempted sweep (see "the sweep" below).
trap 'exit 75' TERM INT

out=isoflop budgets="1e12 3e12 1e13" sizes="32x2 64x2 96x3 128x4 160x5 192x6" head_dim=32
capacity=0.125 route_every=2 causal=aux_loss seq_len=256 batch=16 lr=2e-3 min_steps=30
eval_seqs=256 train="" val="" np=0 launcher="" tp=1 pp=1 arch=gpt2
kinds=dense,mod experts=4 top_k=1 cf=1.25 capped_cf=""
all_kinds="dense mod moe mode_staged mode_integrated moe_capped"
extra=()
header="budget,kind,d_model,n_layer,params,steps,tokens,flops,epochs,budget_spent,val_loss,val_loss_causal,step_ms,tokens_per_s,wall_s,capacity,route_every"
die() { echo "isoflop: $*" >&2; exit 2; }
need() { [ $# -ge 2 ] || die "$1 needs a value (see jobs/isoflop.sh --help)"; }

# ---------------------------------------------------------------- report
# The report of OUT/results.csv: summary.txt, isoflop.png, loss_vs_time.png.
# columns: 1 budget 2 kind 3 d_model 4 n_layer 5 params 6 steps 7 tokens 8 flops
# 9 epochs 10 budget_spent 11 val_loss 12 val_loss_causal 13 step_ms
# 14 tokens_per_s 15 wall_s 16 capacity 17 route_every
report() {
    local out=$1 csv=$1/results.csv plot=$1/plot budgets bad
    [ -f "$csv" ] || die "$csv not found (run the sweep first)"
    # every row, strictly: a budget is a number > 0, a kind one of the
    # kinds a sweep trains, the rest numbers (nothing of the file is ever
    # part of a gnuplot command)
    bad=$(awk -F, -v header="$header" -v kinds="$all_kinds" '
    BEGIN { nk = split(kinds, kl, " "); for (i = 1; i <= nk; i++) ok[kl[i]] = 1
            kinds_or = kl[1]; for (i = 2; i <= nk; i++) kinds_or = kinds_or (i < nk ? ", " : " or ") kl[i] }
    function num(x) { return x ~ /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/ || x ~ /^[-+]?(nan|inf)$/ }
    NR == 1 { if ($0 != header) { e = 1; print "line 1 is not the header a sweep writes (" header ")"; exit } next }
    {
        split(header, name, ","); c = 0
        if (NF != 17) { e = 1; printf "line %d has %d columns, not 17", NR, NF; exit }
        if ($1 !~ /^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$/ || !($1 + 0 > 0 && $1 + 0 < 1e300)) c = 1
        else if (!($2 in ok)) c = 2
        else for (i = 3; i <= 17 && !c; i++) if (i <= 7 ? $i !~ /^[0-9]+$/ || length($i) > 15 : !num($i)) c = i
        if (c) { e = 1; v = substr($c, 1, 24); gsub(/[^ -~]/, "?", v)
                 printf "line %d: %s = \047%s\047 is not %s", NR, name[c], v,
                     c == 1 ? "a number > 0" : c == 2 ? kinds_or : c <= 7 ? "a whole number" : "a number"
                 exit }
        rows++
    }
    END { if (!e && !rows) print NR ? "no runs in it" : "empty (not a sweep'"'"'s table)" }' "$csv")
    [ -z "$bad" ] || die "$csv: $bad"
    awk -F, -v kinds="$all_kinds" '
    BEGIN { nk = split(kinds, kl, " "); kw = 5 }
    NR == 1 { next }
    {
        n++; b[n] = $1; k[n] = $2; line[n] = $0
        if (length($2) > kw) kw = length($2)
        if ($2 != "dense" && $2 != "mod") has_moe = 1
        if (!($1 in seen)) { seen[$1] = 1; order[++nb] = $1 }
        key = $1 SUBSEP $2
        if (!(key in best) || $11 < best_loss[key]) { best[key] = n; best_loss[key] = $11 }
        split($0, f, ","); for (i = 1; i <= 17; i++) c[n, i] = f[i]
        n_all = n
    }
    END {
        printf "%-8s %-" kw "s %7s %9s %6s %9s %7s %9s %9s %8s %9s %8s\n", "budget", "kind", "size",
            "params", "steps", "tokens", "epochs", "val loss", "causal", "step ms", "tokens/s", "wall s"
        for (i = 1; i <= n; i++)
            printf "%-8s %-" kw "s %7s %9d %6d %9d %7.2f %9.4f %9.4f %8.1f %9.0f %8.1f\n", c[i, 1], c[i, 2],
                c[i, 3] "x" c[i, 4], c[i, 5], c[i, 6], c[i, 7], c[i, 9], c[i, 11], c[i, 12], c[i, 13],
                c[i, 14], c[i, 15]
        print ""
        for (j = 1; j <= nb; j++) {
            B = order[j]; d = best[B, "dense"]; m = best[B, "mod"]
            if (!d || !m) { if (!has_moe) printf "budget %s: no %s run\n", B, d ? "MoD" : "dense"
                            else moe_lines(B)
                            continue }
            printf "budget %s FLOPs: best dense %sx%s (%.2fM parameters) %.4f; best MoD %sx%s (%.2fM) " \
                   "%.4f top-k, %.4f causal; MoD - dense %+.4f (%+.2f%%); the best MoD model steps " \
                   "%.2fx as fast (%.1f against %.1f ms)\n",
                B, c[d, 3], c[d, 4], c[d, 5] / 1e6, c[d, 11], c[m, 3], c[m, 4], c[m, 5] / 1e6,
                c[m, 11], c[m, 12], c[m, 11] - c[d, 11], 100 * (c[m, 11] / c[d, 11] - 1),
                c[d, 13] / c[m, 13], c[m, 13], c[d, 13]
            printf "  between the grid'"'"'s sizes (a parabola in log parameters through the best and its " \
                   "neighbours) the optimum of dense lies %s; of MoD %s\n", fit(B, "dense"), fit(B, "mod")
            if (has_moe) moe_lines(B)
        }
        if (has_moe)
            print "\nFLOPs of the MoE kinds: an expert is 4 x d_model wide, so a top-1 expert slot costs what " \
                  "the dense MLP costs and every kind shares the d_model x n_layer grid (matched in FLOPs per " \
                  "token, not parameters); each run'"'"'s steps spend the budget at the count of a balanced router " \
                  "(modtrain plan --flops: expert_top_k x min(1, capacity_factor, E / (E + no-ops)) slots a token, " \
                  "plus the router), so mode_integrated and moe_capped (half the slots to experts) take more steps " \
                  "than moe. What a router really kept is its choice during the run: the table'"'"'s flops and " \
                  "budget_spent are train'"'"'s count of the slots kept, below the budget where tokens drop and " \
                  "above it where fewer go to no-ops (MoD'"'"'s " \
                  "routed blocks, by contrast, are counted at their realised capacity k / T, exact before " \
                  "the run). The order checks compare final val loss (top-k routing); MoDE is mode_staged " \
                  "and mode_integrated, each checked."
    }
    # per budget, with MoE kinds: the best of every kind, the paper'"'"'s order
    # of losses, the optimum of each MoE kind between grid sizes
    function moe_lines(B,   i, K, r, line, sep) {
        cb = B; line = sprintf("budget %s FLOPs, the best of each kind:", B); sep = " "
        for (i = 1; i <= nk; i++) {
            K = kl[i]; r = best[B, K]
            if (!r) continue
            line = line sprintf("%s%s %sx%s %.4f (%.1f ms a step)", sep, K, c[r, 3], c[r, 4], c[r, 11], c[r, 13])
            sep = ", "
        }
        print line
        printf "  the paper'"'"'s order MoDE < MoE < dense: staged %s; integrated %s\n",
            chain("mode_staged", "moe", "dense"), chain("mode_integrated", "moe", "dense")
        printf "  the paper'"'"'s order mode_integrated < moe_capped: %s\n", chain("mode_integrated", "moe_capped", "")
        line = "  between the grid'"'"'s sizes the optimum of"; sep = " "
        for (i = 3; i <= nk; i++) {
            K = kl[i]
            if (!best[B, K]) continue
            line = line sprintf("%s%s lies %s", sep, K, fit(B, K)); sep = "; of "
        }
        if (sep != " ") print line
    }
    # of budget cb: "A x < B y < C z: holds" (C may be ""), or ": fails
    # (why)", or "n/a (no K run)"
    function chain(a, b2, c3,   ra, rb, rc, s, why) {
        ra = best[cb, a]; rb = best[cb, b2]; rc = (c3 == "" ? 0 : best[cb, c3])
        if (!ra || !rb || (c3 != "" && !rc))
            return sprintf("n/a (no %s run)", !ra ? a : !rb ? b2 : c3)
        s = sprintf("%s %.4f < %s %.4f", a, c[ra, 11], b2, c[rb, 11])
        if (c3 != "") s = s sprintf(" < %s %.4f", c3, c[rc, 11])
        if (!(c[ra, 11] < c[rb, 11])) why = a " is not below " b2
        else if (c3 != "" && !(c[rb, 11] < c[rc, 11])) why = b2 " is not below " c3
        return s ": " (why == "" ? "holds" : "fails (" why ")")
    }
    # the optimum between grid points: the parabola in x = log10(parameters)
    # through the best run and its two neighbours in size (none at an edge)
    function fit(B, K,   i, j, n, t, X, Y, best, x1, x2, x3, y1, y2, y3, d, qa, qb, xv) {
        for (i = 1; i <= n_all; i++)
            if (c[i, 1] == B && c[i, 2] == K) { n++; X[n] = log(c[i, 5]) / log(10); Y[n] = c[i, 11] }
        for (i = 2; i <= n; i++) for (j = i; j > 1 && X[j - 1] > X[j]; j--) {
            t = X[j]; X[j] = X[j - 1]; X[j - 1] = t; t = Y[j]; Y[j] = Y[j - 1]; Y[j - 1] = t }
        best = 1
        for (i = 2; i <= n; i++) if (Y[i] < Y[best]) best = i
        if (n < 3 || best == 1 || best == n)
            return sprintf("at the grid'"'"'s %s size", best == 1 ? "smallest" : "largest")
        x1 = X[best - 1]; x2 = X[best]; x3 = X[best + 1]; y1 = Y[best - 1]; y2 = Y[best]; y3 = Y[best + 1]
        d = (x1 - x2) * (x1 - x3) * (x2 - x3)
        qa = (x3 * (y2 - y1) + x2 * (y1 - y3) + x1 * (y3 - y2)) / d
        qb = (x3 * x3 * (y1 - y2) + x2 * x2 * (y3 - y1) + x1 * x1 * (y2 - y3)) / d
        xv = -qb / (2 * qa)
        return sprintf("at %.3gM parameters, loss %.4f", 10 ^ xv / 1e6,
                       y2 + qa * (xv - x2) * (xv - x2) + (2 * qa * x2 + qb) * (xv - x2))
    }' "$csv" > "$out/summary.txt"
    cat "$out/summary.txt"

    command -v gnuplot > /dev/null || { echo "isoflop: no gnuplot, no plots"; return 0; }
    rm -rf "$plot"
    mkdir -p "$plot"
    budgets=$(awk -F, 'NR > 1 && !s[$1]++ { printf "%s ", $1 }' "$csv")
    # the kinds drawn: dense and mod always (as before), then each MoE kind
    # the table has, in the order of all_kinds; their labels in the keys
    local kinds="dense mod" labels="dense MoD" k
    local -A label=([moe]=MoE [mode_staged]=MoDE-staged [mode_integrated]=MoDE-integrated [moe_capped]=MoE-capped)
    for k in $all_kinds; do
        [ "$k" != dense ] && [ "$k" != mod ] || continue
        awk -F, -v K="$k" 'NR > 1 && $2 == K { f = 1; exit } END { exit !f }' "$csv" || continue
        kinds="$kinds $k" labels="$labels ${label[$k]}"
    done
    for B in $budgets; do
        for kind in $kinds; do
            awk -F, -v B="$B" -v K="$kind" 'NR > 1 && $1 == B && $2 == K { print $5, $11, $15, $3 "x" $4 }' "$csv" |
                sort -n > "$plot/${B}_$kind.dat"
            sort -k2,2g "$plot/${B}_$kind.dat" | head -n 1 >> "$plot/opt_$kind.dat"
        done
    done
    for kind in $kinds; do touch "$plot/opt_$kind.dat"; done
    # the script is fixed text: the folders and budgets come in as gnuplot -c
    # arguments (ARG1 ...), strings; the paths begin with / or ./ (never < or
    # |, which gnuplot would run as commands)
    local dir=$out
    case $dir in /*) ;; *) dir=./$dir ;; esac
    cat > "$plot/isoflop.gp" <<'GP'
dir = ARG1; plot = ARG1."/plot/"; budgets = ARG2; kinds = ARG3; labels = ARG4
# kind j: dash type j, point type pts[j], its optimal points in colour ocs[j]
pts = "7 5 9 13 11 15"
ocs = "black red dark-green blue dark-violet orange"
set terminal pngcairo size 960,600
set termoption noenhanced
set datafile missing "?"
set style line 1 lc rgb "#1f77b4" lw 2 pt 7
set output dir."/isoflop.png"
set title (words(kinds) == 2 ? "isoFLOP curves: dense (solid) and MoD (dashed), isoFLOP-optimal points ringed" \
    : "isoFLOP curves: one line style per kind, one colour per budget, isoFLOP-optimal points ringed")
set xlabel "parameters"
set ylabel "final validation loss (nats/token)"
set logscale x
set grid
set key outside right
plot for [j=1:words(kinds)] for [i=1:words(budgets)] plot.word(budgets, i)."_".word(kinds, j).".dat" \
        using 1:2 with linespoints lw 2 dt j pt int(word(pts, j)) lc i \
        title word(budgets, i)." ".word(labels, j), \
     for [j=1:words(kinds)] plot."opt_".word(kinds, j).".dat" using 1:2 with points \
        pt int(word(pts, j)) - 1 ps 3 lw 2 lc rgb word(ocs, j) title "optimal ".word(labels, j)
set output dir."/loss_vs_time.png"
set terminal pngcairo size 1200,700
set termoption noenhanced
set title (words(kinds) == 2 ? "final validation loss against wall-clock time: dense (circles) and MoD (squares),\neach labelled d_model x n_layer (dense to the left, MoD to the right)" \
    : "final validation loss against wall-clock time: one point type per kind, one colour per budget,\neach labelled d_model x n_layer (dense to the left, the other kinds to the right)")
set xlabel "wall-clock seconds of training"
set autoscale xfix
set offsets graph 0.1, graph 0.1, graph 0.03, graph 0.03
plot for [j=1:words(kinds)] for [i=1:words(budgets)] plot.word(budgets, i)."_".word(kinds, j).".dat" \
        using 3:2 with points pt int(word(pts, j)) ps 1.5 lc i title word(budgets, i)." ".word(labels, j), \
     for [i=1:words(budgets)] plot.word(budgets, i)."_dense.dat" using 3:2:4 \
        with labels right offset char -1, 0 font ",8" tc lt i notitle, \
     for [j=2:words(kinds)] for [i=1:words(budgets)] plot.word(budgets, i)."_".word(kinds, j).".dat" \
        using 3:2:4 with labels left offset char 1, 0 font ",8" tc lt i notitle
GP
    gnuplot -c "$plot/isoflop.gp" "$dir" "$budgets" "$kinds" "$labels"
    echo "isoflop: wrote $out/summary.txt, $out/isoflop.png, $out/loss_vs_time.png"
}

# --help (before the rest, wherever it is): the usage line, then the comment
for a in "$@"; do
    [ "$a" != -- ] || break
    case $a in --help | -h)
        echo "usage: jobs/isoflop.sh [options]"
        sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    esac
done
# Options are spelt with underscores or dashes (--head-dim is --head_dim),
# --key value or --key=value; typed[key] keeps the spelling for the errors.
declare -A typed=()
while [ $# -gt 0 ]; do
    [ "$1" != -- ] || { shift; extra=("$@"); break; }
    case $1 in --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;; esac
    key=${1#--} && key=${key//-/_} && key=${key,,}
    [[ $1 == --* ]] && typed[$key]=$1 || key="?"
    case $key in
    report) need "$@"; report "$2"; exit 0 ;;
    quick) budgets="2e10 5e10" sizes="32x2 64x2" seq_len=64 batch=8 min_steps=10 eval_seqs=32
        shift; continue ;;
    esac
    need "$@"
    case $key in
    out) out=$2 ;; budgets) budgets=$2 ;; sizes) sizes=$2 ;; head_dim) head_dim=$2 ;;
    capacity) capacity=$2 ;; route_every) route_every=$2 ;; causal_router) causal=$2 ;;
    seq_len) seq_len=$2 ;; batch) batch=$2 ;; lr) lr=$2 ;; min_steps) min_steps=$2 ;;
    eval_seqs) eval_seqs=$2 ;; train) train=$2 ;; val) val=$2 ;; np) np=$2 ;;
    launcher) launcher=$2 ;; tp) tp=$2 ;; pp) pp=$2 ;; arch) arch=$2 ;;
    kinds) kinds=$2 ;; experts) experts=$2 ;; expert_top_k) top_k=$2 ;;
    capacity_factor) cf=$2 ;; capped_factor) capped_cf=$2 ;;
    *) die "unknown option '$1' (see jobs/isoflop.sh --help)" ;;
    esac
    shift 2
done
# how the user spelt option KEY, for an error about its value
as() { echo "${typed[$1]:---$1}"; }
int() { [[ $2 =~ ^[1-9][0-9]{0,6}$ ]] || die "$1 = '$2' is not a whole number >= 1"; }
# a number > 0 and at most MAX (1e30: any FLOP budget), as digits, a point
# and an exponent; its value in awk (x + 0: -v gives a string), so that
# 1e999 (inf) and 1e-999 (0) are refused here, not by a run hours later
num() { [[ $2 =~ ^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$ ]] &&
    awk -v x="$2" -v max="${3:-1e30}" 'BEGIN { exit !(x + 0 > 0 && x + 0 <= max + 0) }' ||
    die "$1 = '$2' is not a number > 0 and <= ${3:-1e30}"; }
int "$(as head_dim)" "$head_dim"
[ "$arch" = gpt2 ] || [ "$arch" = llama ] || die "$(as arch) = '$arch' is not gpt2 or llama"
for b in $budgets; do num "budget" "$b"; done
for s in $sizes; do
    [[ $s =~ ^[1-9][0-9]{0,5}x[1-9][0-9]{0,3}$ ]] || die "size '$s' is not D_MODELxN_LAYER (e.g. 128x4)"
    (( ${s%x*} % head_dim == 0 )) || die "size '$s': d_model ${s%x*} is not a multiple of $(as head_dim) $head_dim"
done
[ -n "$budgets" ] && [ -n "$sizes" ] || die "--budgets and --sizes need at least one value each"
int "$(as route_every)" "$route_every"; int "$(as seq_len)" "$seq_len"
int "$(as batch)" "$batch"; int "$(as min_steps)" "$min_steps"; int "$(as eval_seqs)" "$eval_seqs"
int "$(as tp)" "$tp"; int "$(as pp)" "$pp"; num "$(as capacity)" "$capacity" 1; num "$(as lr)" "$lr"
[ "$np" = 0 ] || int "$(as np)" "$np"
# the kinds, in the order given, each once
kind_list=""
for k in ${kinds//,/ }; do
    [[ " $all_kinds " == *" $k "* ]] || die "$(as kinds): '$k' is not a kind (${all_kinds// /, })"
    [[ " $kind_list " != *" $k "* ]] || die "$(as kinds): '$k' is named twice"
    kind_list="${kind_list:+$kind_list }$k"
done
[ -n "$kind_list" ] || die "$(as kinds) needs at least one kind (${all_kinds// /, })"
int "$(as experts)" "$experts"
[[ $top_k =~ ^[12]$ ]] || die "$(as expert_top_k) = '$top_k' is not 1 or 2"
(( top_k <= experts )) || die "$(as expert_top_k) $top_k is more than the $(as experts) $experts experts"
num "$(as capacity_factor)" "$cf" 1e6
[ -n "$capped_cf" ] || capped_cf=$(awk -v e="$experts" 'BEGIN { printf "%.6g", e / (e + e) }')
num "$(as capped_factor)" "$capped_cf" 1e6
is_moe() { [[ $1 == moe* || $1 == mode_* ]]; }
routed() { [ "$1" = mod ] || [ "$1" = mode_staged ]; }
moe_kinds=0
for k in $kind_list; do ! is_moe "$k" || moe_kinds=1; done
case $causal in aux_loss | predictor) ;; *) die "$(as causal_router) '$causal' is not aux_loss or predictor" ;; esac

tree=$(cd "$(dirname "$0")/.." && pwd)
MODTRAIN=${MODTRAIN:-$( [ -x ./modtrain ] && echo "$PWD/modtrain" || { [ -x "$tree/modtrain" ] && echo "$tree/modtrain"; } || command -v modtrain || true)}
[ -n "$MODTRAIN" ] && [ -x "$MODTRAIN" ] || die "no modtrain binary (build it, or set MODTRAIN)"
# ---------------------------------------------------------------- the grid
# model keys of one run: kind size
# (dense and mod: the keys they always had; an MoE kind adds its own)
model_keys() {
    local d=${2%x*} l=${2#*x} re=0
    ! routed "$1" || re=$route_every
    echo "--vocab_size 256 --tokenizer byte --d_model $d --n_layer $l --n_head $((d / head_dim))" \
        "--seq_len $seq_len --batch_size $batch --route_every $re --capacity $capacity" \
        "--causal_router $causal --tp $tp --pp $pp"
    # (gpt2 says nothing of its block: the keys of sweeps from before --arch)
    [ "$arch" = gpt2 ] || echo "--arch $arch"
    is_moe "$1" || return 0
    local noop=0 f=$cf ff=$((4 * d))
    [ "$1" = mode_integrated ] && noop=$experts
    [ "$1" = moe_capped ] && f=$capped_cf
    [ "$arch" = gpt2 ] || ff=0 # (an expert as wide as llama's MLP: d_ff)
    echo "--n_expert $experts --n_noop_expert $noop --expert_top_k $top_k --expert_d_ff $ff" \
        "--capacity_factor $f --moe_every 1"
}
json() { sed -n "s/.*\"$2\":\\([^,}]*\\).*/\\1/p" "$1" | head -n 1; }

# Every run's steps, before any work: the FLOPs a step of each size and kind
# costs (plan --flops, which also checks the model keys), the steps each
# budget buys; a budget that buys more steps than train takes, or a grid
# that leaves every run out (fewer than --min_steps), is refused here.
runs=0
for size in $sizes; do
    for kind in $kind_list; do
        # shellcheck disable=SC2046 # the keys are words
        f=$("$MODTRAIN" plan --flops $(model_keys "$kind" "$size") 2>&1) ||
            die "size $size ($kind): $(printf '%s' "$f" | head -n 1)"
        fstep=$(printf '%s\n' "$f" | sed -n 's/.*"flops_per_step":\([0-9.e+]*\).*/\1/p')
        [ -n "$fstep" ] || die "size $size ($kind): modtrain plan --flops printed no flops_per_step"
        for budget in $budgets; do
            steps=$(awk -v b="$budget" -v f="$fstep" 'BEGIN { s = b / f; if (s > 99999999) print "many"
                else printf "%.0f", s }')
            [ "$steps" != many ] || die "budget $budget buys size $size ($kind) more than 99999999 steps" \
                "(train's most); choose a smaller budget"
            (( steps < min_steps )) || runs=$((runs + 1))
        done
    done
done
(( runs > 0 )) || die "every run is left out: no budget of '$budgets' buys --min_steps $min_steps steps of any" \
    "size of '$sizes'; raise the budgets or lower --min_steps"
# the tokens of a dataset spec (a shard, a glob, a blend), or nothing when
# it does not open (modtrain data says why on stderr)
spec_tokens() { "$MODTRAIN" data --data "$1" --seq_len 1 | sed -n 's/^data: .* shards\{0,1\}, \([0-9]*\) tokens,.*/\1/p'; }
check_specs() {
    [ -n "$(spec_tokens "$train")" ] || die "--train '$train' is not a dataset (see above)"
    [ -n "$val" ] && [ -n "$(spec_tokens "$val")" ] ||
        die "--val '$val' is not a dataset (see above; the final losses are measured on it)"
}
[ -z "$train" ] || check_specs
if [ -z "$launcher" ] && [ "$np" != 0 ]; then
    launcher="mpirun -np $np ${MODTRAIN_MPIRUN_ARGS:-}"
    # mpirun's own reason, before any run, when it cannot start N ranks here
    # (as root without Open MPI's two variables, too few slots)
    if ! why=$($launcher true 2>&1 > /dev/null); then
        reason=$(printf '%s\n' "$why" | grep -v '^-*$' | head -n 1)
        case $why in *OMPI_ALLOW_RUN_AS_ROOT*) reason="$reason (as root: export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)" ;; esac
        die "--np $np: mpirun cannot start the ranks: $reason"
    fi
fi
# eval: one process, unless the model is split (tp x pp ranks hold it)
eval_launcher=""
if (( tp * pp > 1 )); then
    eval_launcher=$launcher
    [ "$np" = 0 ] || eval_launcher="mpirun -np $((tp * pp)) ${MODTRAIN_MPIRUN_ARGS:-}"
fi
run_mt() { $launcher "$MODTRAIN" "$@"; } # word splitting of the launcher is intended
run_eval() { $eval_launcher "$MODTRAIN" eval "$@"; }
mkdir -p "$out/runs"
log() { echo "isoflop: $*" | tee -a "$out/sweep.log"; }

# ---------------------------------------------------------------- data
prepare_data() {
    if [ -z "$train" ]; then
        train="$out/data/train_*.bin" val="$out/data/val_*.bin"
        if ! ls "$out"/data/train_*.bin > /dev/null 2>&1; then
            src=${FORTUNES_DIR:-/usr/share/games/fortunes}
            [ -d "$src" ] || die "$src not found: apt-get install fortunes, or pass --train and --val"
            mkdir -p "$out/text"
            texts=$(find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
            if [ -z "${ISOFLOP_NO_BIBLE:-}" ] && command -v bible > /dev/null; then
                # the verses without their "Ge1:1 " references
                bible -f "gen1:1-rev22:21" | sed -e 's/^[1-3A-Za-z]*[0-9]*:[0-9]* //' > "$out/text/kjv.txt"
                texts="$texts $out/text/kjv.txt"
            fi
            # shellcheck disable=SC2086
            "$MODTRAIN" prep --out "$out/data" --doc-sep % --val-fraction 0.05 $texts > "$out/text/prep.log"
            rm -f "$out/text/kjv.txt"
            log "data: $(tr '\n' ' ' < "$out/text/prep.log")"
        fi
    fi
    check_specs
    train_tokens=$(spec_tokens "$train")
}

# ---------------------------------------------------------------- runs
# Trains and evaluates one run unless its result.csv exists. Returns 0, or
# the train's exit code (75 when it was preempted and saved).
one_run() {
    local budget=$1 size=$2 kind=$3
    local name=b${budget}_${size}_$kind dir=$out/runs/b${budget}_${size}_$kind
    [ -f "$dir/result.csv" ] && { log "$name: done before, skipped"; return 0; }
    local keys; keys=$(model_keys "$kind" "$size")
    # shellcheck disable=SC2086
    "$MODTRAIN" plan --flops $keys > "$out/runs/.flops" 2>&1 || {
        (( stop )) && return 75
        die "$name: modtrain plan --flops failed: $(cat "$out/runs/.flops")"
    }
    local fstep params steps
    fstep=$(json "$out/runs/.flops" flops_per_step)
    params=$(json "$out/runs/.flops" params)
    steps=$(awk -v b="$budget" -v f="$fstep" 'BEGIN { printf "%.0f", b / f }')
    if (( steps < min_steps )); then
        log "$name: left out: the budget buys $steps steps, fewer than --min_steps $min_steps"
        return 0
    fi
    mkdir -p "$dir"
    local warm=$(( steps / 10 < 50 ? steps / 10 : 50 )) every=$(( steps / 4 > 1 ? steps / 4 : 1 ))
    log "$name: $params parameters, $steps steps of $fstep FLOPs"
    local t0 rc=0; t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    run_mt train $keys --steps "$steps" --lr "$lr" --min_lr "$(awk -v x="$lr" 'BEGIN { print x / 10 }')" \
        --warmup_steps "$warm" --train_data "$train" --val_data "$val" --eval_every 0 --run_dir "$dir" \
        --ckpt_every "$every" --resume auto --log_every "$every" "${extra[@]}" \
        >> "$dir/train.log" 2>&1 || rc=$?
    if (( rc != 0 )); then
        log "$name: train stopped with exit code $rc (see $dir/train.log); rerun the sweep to continue"
        return $rc
    fi
    local micro=$(( eval_seqs < 16 ? eval_seqs : 16 ))
    run_eval --ckpt "$dir/ckpt" --data "$val" --seqs "$eval_seqs" \
        --micro_batch "$micro" --pp "$pp" --json > "$dir/eval.json" 2> "$dir/eval.log" ||
        { log "$name: eval failed (see $dir/eval.log)"; return 1; }
    # the run's own account: FLOPs as train counted them step by step, mean
    # step time and tokens/s (the first step excluded), wall time as the sum
    # of the step intervals (the last record of each step counts)
    awk -v budget="$budget" -v kind="$kind" -v size="$size" -v params="$params" \
        -v steps="$steps" -v bt="$((batch * seq_len))" -v tt="$train_tokens" \
        -v cap="$capacity" -v re="$route_every" -v routed="$(routed "$kind" && echo 1 || echo 0)" \
        -v loss="$(json "$dir/eval.json" loss)" -v lossc="$(json "$dir/eval.json" loss_causal)" '
        function val(k,   i, r) { i = index($0, "\"" k "\":"); if (!i) return ""
            r = substr($0, i + length(k) + 3); sub(/[,}].*/, "", r); return r }
        /"loss"/ { s = val("step") + 0; f[s] = val("flops_per_token"); ms[s] = val("step_time_ms")
                   tps[s] = val("tokens_per_s"); iv[s] = val("interval_ms") }
        END {
            split(size, dl, "x"); fl = 0; w = 0; n = 0; mst = 0; mtps = 0
            for (s = 1; s <= steps; s++) {
                if (!(s in f)) { print "step " s " is not in metrics.jsonl" > "/dev/stderr"; exit 1 }
                fl += f[s] * bt; w += iv[s]
                if (s > 1 || steps == 1) { mst += ms[s]; mtps += tps[s]; n++ }
            }
            if (lossc == "") lossc = loss
            printf "%s,%s,%d,%d,%d,%d,%d,%.0f,%.3f,%.6f,%s,%s,%.3f,%.1f,%.2f,%s,%s\n",
                budget, kind, dl[1], dl[2], params, steps, steps * bt, fl, steps * bt / tt,
                fl / budget, loss, lossc, mst / n, mtps / n, w / 1000,
                (routed ? cap : 1), (routed ? re : 0)
        }' "$dir/metrics.jsonl" > "$dir/result.tmp" 2>> "$dir/train.log" ||
        { log "$name: $dir/metrics.jsonl lacks steps (see $dir/train.log)"; return 1; }
    mv "$dir/result.tmp" "$dir/result.csv"
    log "$name: val loss $(json "$dir/eval.json" loss), $(awk -v t0="$t0" -v t1="$(date +%s.%N)" \
        'BEGIN { printf "%.0f", t1 - t0 }') s"
}

# ---------------------------------------------------------------- the sweep
# A preemption signals every process of the job at once (SLURM does; the
# tests kill the process group). train saves a checkpoint and exits 75, but
# a short command or command substitution of this shell dies of it, and set
# -e then ends the shell with that command's status. So the sweep runs in a
# subshell, which waits for train as before, and this shell, which does
# nothing but wait for it, turns any end after a signal into 75.
sweep() {
    stop=0
    trap 'stop=1' TERM INT
    prepare_data
    local moe_note="" budget size kind rc
    (( moe_kinds )) && moe_note="; kinds $kind_list: $experts experts, top-$top_k, capacity_factor $cf (moe_capped $capped_cf)"
    [ "$kind_list" = "dense mod" ] || [ -n "$moe_note" ] || moe_note="; kinds $kind_list"
    log "sweep: budgets $budgets; sizes $sizes; capacity $capacity every $route_every; seq_len $seq_len, batch $batch$moe_note${launcher:+; launched by $launcher}"
    for budget in $budgets; do
        for size in $sizes; do
            for kind in $kind_list; do
                rc=0
                one_run "$budget" "$size" "$kind" || rc=$?
                (( stop )) && exit 75
                (( rc == 0 )) || exit "$rc"
            done
        done
    done
    {
        echo "$header"
        for budget in $budgets; do for size in $sizes; do for kind in $kind_list; do
            f=$out/runs/b${budget}_${size}_$kind/result.csv
            [ -f "$f" ] && cat "$f"
        done; done; done
    } > "$out/results.csv"
    report "$out"
}

stop=0
trap 'stop=1' TERM INT
# (not `( sweep ) || rc=$?`: under ||, bash ignores set -e inside the subshell)
set +e
( set -e; sweep )
rc=$?
set -e
(( stop )) && { log "stopped by a signal; rerun the same command to continue"; exit 75; }
exit "$rc"
