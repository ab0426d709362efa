#!/bin/bash
# Pictures of a Mixture-of-Depths model's routing (an MoE model's experts
# too, as a table), from the file that
# `modtrain eval --routing FILE` writes:
#   PREFIX.png   a heatmap of one sequence: positions across, routed blocks
#                up, coloured by the router weight g(r); the tokens top-k
#                chose ringed, those the causal decision takes dotted (black
#                marks outlined in white, so they read on every colour); the
#                decoded text along the bottom
#   PREFIX.txt   per routed block, the tokens it chooses most and least
#                often over every sequence of the file (tokens seen at least
#                --min_count times), and how often its causal decision
#                agrees with top-k; per MoE block (a file with the experts
#                column), the share of its slots each expert and no-op kept
#                and the share dropped
# usage: jobs/routing_plot.sh ROUTING_FILE PREFIX [--seq N] [--positions N] [--min_count N]
#   ROUTING_FILE may be gzip-compressed (a name ending .gz)
#   --seq N         the sequence the heatmap shows (0)
#   --positions N   its first N positions (the model's seq_len, from the
#                   file's first line)
#   --min_count N   (8)
set -euo pipefail
export LC_ALL=C
die() { echo "routing_plot: $*" >&2; exit 2; }
for a in "$@"; do
    case $a in --help | -h)
        sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' | sed -n '/^usage:/,$p'
        sed -n '2,/^# usage:/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    esac
done
[ $# -ge 2 ] || die "usage: jobs/routing_plot.sh ROUTING_FILE PREFIX [--seq N] [--positions N] [--min_count N]"
in=$1 prefix=$2
shift 2
seq=0 positions="" min_count=8
# --key value or --key=value; dashes or underscores (--min-count is --min_count)
while [ $# -gt 0 ]; do
    case $1 in --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;; esac
    [ $# -ge 2 ] || die "$1 needs a value"
    [[ $2 =~ ^[0-9]{1,9}$ ]] || die "$1 = '$2' is not a whole number"
    key=${1#--} && key=${key//-/_} && key=${key,,}
    [[ $1 == --* ]] || key="?"
    case $key in
    seq) seq=$2 ;; min_count) min_count=$2 ;;
    positions) [ "$2" -ge 1 ] || die "$1 = '$2' is not a whole number >= 1"; positions=$2 ;;
    *) die "unknown option '$1' (expected --seq, --positions or --min_count)" ;;
    esac
    shift 2
done
[ -f "$in" ] || die "'$in' does not exist (write it with modtrain eval --routing FILE)"
if [[ $in == *.gz ]]; then # a routing file kept compressed (docs/isoflop/routing.tsv.gz)
    plain=$(mktemp "${TMPDIR:-/tmp}/routing.XXXXXX")
    trap 'rm -f "$plain"' EXIT
    gzip -dc "$in" > "$plain" 2> /dev/null || die "'$in' is not a gzip file"
    in=$plain
fi
head -n 1 "$in" | grep -q '^# modtrain routing:' ||
    die "'$in' is not a routing file (its first line should start '# modtrain routing:')"
# an MoE model's file has a tenth column, each choice's expert (see eval --routing)
cols=9
if sed -n 2p "$in" | grep -q "^seq	pos	block	token	text	topk	router	weight	causal	experts$"; then
    cols=10
else
    sed -n 2p "$in" | grep -q "^seq	pos	block	token	text	topk	router	weight	causal$" ||
        die "'$in' has other columns than modtrain eval --routing writes"
fi
# the whole sequence unless told: seq_len as eval --routing records it
if [ -z "$positions" ]; then
    positions=$(head -n 1 "$in" | sed -n 's/.*[:,] seq_len \([0-9]\{1,9\}\),.*/\1/p')
    [ -n "$positions" ] || die "'$in' does not record seq_len on its first line (give --positions N)"
fi

# every row, strictly: its numbers are numbers, its flags 0 or 1 (the text
# is only ever data, never part of a gnuplot command)
# (an MoE block that is not routed has "-" in topk .. causal; experts holds
# marks E, dE, nJ joined by commas, or skip, or -)
bad=$(awk -F'\t' -v cols="$cols" '
function num(x) { return x ~ /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/ || x ~ /^[-+]?(nan|inf)$/ }
NR <= 2 { next }
{
    split("seq pos block token text topk router weight causal experts", name, " ")
    if (NF != cols) { printf "line %d has %d columns, not %d", NR, NF, cols; exit }
    c = 0
    for (i = 1; i <= 4; i++) if ($i !~ /^[0-9]+$/ || length($i) > 9) { c = i; break }
    if (!c && cols == 10 && $10 !~ /^(-|skip|(d?[0-9]+|n[0-9]+)(,(d?[0-9]+|n[0-9]+))*)$/) c = 10
    moe = cols == 10 && $10 != "-" && $6 == "-" && $7 == "-" && $8 == "-" && $9 == "-"
    if (!c && !moe && $6 !~ /^[01]$/) c = 6
    if (!c && !moe && $9 !~ /^[01]$/) c = 9
    if (!c && !moe && !num($7)) c = 7
    if (!c && !moe && !num($8)) c = 8
    if (c) { v = substr($c, 1, 24); gsub(/[^ -~]/, "?", v)
             printf "line %d: %s = \047%s\047 is not %s", NR, name[c], v,
                 c <= 4 ? "a whole number" : c == 6 || c == 9 ? "0 or 1" : c == 10 ? "expert marks" : "a number"; exit }
}' "$in")
[ -z "$bad" ] || die "'$in': $bad"

# ------------------------------------------------------------ the table
# columns: 1 seq 2 pos 3 block 4 token 5 text 6 topk 7 router 8 weight 9 causal
awk -F'\t' -v min="$min_count" -v head="$(head -n 1 "$in")" '
NR <= 2 || $6 == "-" { next }
{
    b = $3; t = ($5 == "" ? "#" $4 : $5)
    if (!(b in seen)) { seen[b] = 1; blocks[++nb] = b }
    n[b, t]++; chosen[b, t] += $6; tok[b, t] = t
    all[b]++; picked[b] += $6; agree[b] += ($6 == $9)
}
END {
    sub(/^# /, "", head); print head
    for (i = 1; i <= nb; i++) {
        b = blocks[i]; m = 0
        for (k in n) { split(k, p, SUBSEP); if (p[1] == b && n[k] >= min) key[++m] = k }
        # sort by the rate each token is chosen at (then by count, then by text)
        for (x = 2; x <= m; x++) for (y = x; y > 1 && worse(key[y - 1], key[y]); y--) {
            tmp = key[y]; key[y] = key[y - 1]; key[y - 1] = tmp }
        printf "\nblock %s: chose %d of %d tokens (%.1f%%); the causal decision agrees with top-k " \
               "on %.1f%%\n", b, picked[b], all[b], 100 * picked[b] / all[b], 100 * agree[b] / all[b]
        printf "  most often (of tokens seen >= %d times):", min
        for (x = 1; x <= m && x <= 10; x++) show(key[x])
        printf "\n  least often:"
        for (x = m; x >= 1 && x > m - 10; x--) show(key[x])
        printf "\n"
        delete key
    }
}
function rate(k) { return chosen[k] / n[k] }
function worse(a, c) { return rate(a) < rate(c) || (rate(a) == rate(c) && n[a] < n[c]) }
function show(k,   t) { t = tok[k]; gsub(/"/, "\\\"", t); printf " \"%s\" %.0f%% (%d)", t, 100 * rate(k), n[k] }
' "$in" > "$prefix.txt"
# an MoE model's experts: per MoE block, the share of its slots each expert
# kept, the no-ops' and the dropped share
[ "$cols" = 10 ] && awk -F'\t' -v head="$(head -n 1 "$in")" '
BEGIN {
    E = head ~ /, n_expert [0-9]+,/ ? head : ""; sub(/.*, n_expert /, "", E); E += 0
    Nn = head ~ /, n_noop_expert [0-9]+,/ ? head : ""; sub(/.*, n_noop_expert /, "", Nn); Nn += 0
}
NR <= 2 || $10 == "-" { next }
{
    b = $3; if (!(b in seen)) { seen[b] = 1; blocks[++nb] = b }
    if ($10 == "skip") { skip[b]++; next }
    n = split($10, ch, ",")
    for (i = 1; i <= n; i++) {
        all[b]++; m = ch[i]
        if (m ~ /^d/) drop[b]++
        else cnt[b, m]++
        if (m ~ /^n/ && substr(m, 2) + 1 > Nn) Nn = substr(m, 2) + 1
        if (m !~ /^n/ && (m ~ /^d/ ? substr(m, 2) : m) + 1 > E) E = (m ~ /^d/ ? substr(m, 2) : m) + 1
    }
}
END {
    for (i = 1; i <= nb; i++) {
        b = blocks[i]
        printf "\nblock %d experts: %d slots, %.1f%% dropped%s; kept by", b, all[b],
            all[b] ? 100 * drop[b] / all[b] : 0, skip[b] ? sprintf(", %d tokens not routed to it", skip[b]) : ""
        for (e = 0; e < E; e++) printf " expert %d %.1f%%", e, all[b] ? 100 * cnt[b, e ""] / all[b] : 0
        for (e = 0; e < Nn; e++) printf " no-op %d %.1f%%", e, all[b] ? 100 * cnt[b, "n" e] / all[b] : 0
        printf "\n"
    }
}' "$in" >> "$prefix.txt"
cat "$prefix.txt"

# ---------------------------------------------------------- the heatmap
command -v gnuplot > /dev/null || { echo "routing_plot: no gnuplot, no heatmap"; exit 0; }
dat=$prefix.heat.dat xlab=$prefix.heat.x ylab=$prefix.heat.y
# the data, tab-separated: position, row, weight, top-k, causal; the labels
# in two more files, once each: the rows' blocks, and the positions' decoded
# text (a data column gnuplot only ever shows: a double quote would open a
# quoted field, so it is drawn as '')
# (the file names from the environment: -v would read their backslashes as escapes)
RP_DAT=$dat RP_X=$xlab RP_Y=$ylab awk -F'\t' -v s="$seq" -v P="$positions" '
BEGIN { dat = ENVIRON["RP_DAT"]; xlab = ENVIRON["RP_X"]; ylab = ENVIRON["RP_Y"] }
NR > 2 && $1 == s && $2 < P && $6 != "-" {
    if (!($3 in row)) { row[$3] = nr++; printf "%d\tblock %d\n", row[$3], $3 > ylab }
    if (!($2 in seen)) {
        seen[$2] = 1; t = ($5 == "" ? "#" $4 : $5); gsub(/"/, "\047\047", t)
        if (t ~ /^ *$/) t = "_"
        printf "%d\t%s\n", $2, t > xlab
    }
    printf "%d\t%d\t%s\t%d\t%d\n", $2, row[$3], $8, $6, $9 > dat
}' "$in"
touch "$dat" "$xlab" "$ylab"
if [ ! -s "$dat" ] && [ "$cols" = 10 ] && ! awk -F'\t' 'NR > 2 && $6 != "-" { f = 1; exit } END { exit !f }' "$in"; then
    rm -f "$dat" "$xlab" "$ylab"; echo "routing_plot: no routed blocks (experts only): no heatmap"; exit 0
fi
[ -s "$dat" ] || { rm -f "$dat" "$xlab" "$ylab"; die "'$in' has no sequence $seq"; }
nrow=$(awk -F'\t' '!s[$2]++ { n++ } END { print n }' "$dat")
# no wider than the sequence is long (a --positions beyond it draws no more)
positions=$(awk -F'\t' '$1 >= m { m = $1 + 1 } END { print m }' "$dat")
# white at 0 for a raw gate (weights of both signs), at 0.5 for a sigmoid one
read -r cbmin cbmax < <(awk -F'\t' '{ a = $3 < 0 ? -$3 : $3; if (a > m) m = a; if ($3 < 0) neg = 1 }
                               END { if (neg) print -m, m; else print 0, 1 }' "$dat")
# the script is fixed text: every value comes in as a gnuplot -c argument
# (ARG1 ...), a string; the paths begin with / or ./ (never < or |, which
# gnuplot would run as commands)
case $prefix in /*) at=$prefix ;; *) at=./$prefix ;; esac
gp=$prefix.heat.gp
cat > "$gp" <<'GP'
png = ARG1.".png"; dat = ARG1.".heat.dat"; seq = ARG2; positions = ARG3 + 0; nrow = ARG4 + 0
set terminal pngcairo size 300 + 14 * positions, 160 + 60 * nrow font ",9"
set termoption noenhanced
set output png
set datafile separator "\t"
set datafile commentschars ""
set title "routing of sequence ".seq.": colour = router weight g(r); rings = top-k; dots = causal decision"
set xtics scale 0 font "Mono,8"
set ytics scale 0
set xrange [-0.5:positions - 0.5]
set yrange [-0.5:nrow - 0.5]
set palette defined (0 "#2b4c9b", 1 "#f7f7f7", 2 "#c0392b")
set cblabel "g(r)"
set cbrange [ARG5 + 0:ARG6 + 0]
# the marks: black, each drawn over a wider white copy of itself, so that
# a mark reads on the palette's dark ends and on its white middle alike
set tmargin 5
set title offset 0, 1
set key at graph 0.5, graph 1 center bottom horizontal samplen 1
plot dat using 1:2:(0.5):(0.5):3 with boxxyerror fs solid 1.0 noborder lc palette notitle, \
     "" using ($4 > 0 ? $1 : 1/0):2 with points pt 6 ps 1.7 lw 4.5 lc rgb "white" notitle, \
     "" using ($4 > 0 ? $1 : 1/0):2 with points pt 6 ps 1.7 lw 2 lc rgb "black" title "top-k", \
     "" using ($5 > 0 ? $1 : 1/0):2 with points pt 7 ps 0.95 lc rgb "white" notitle, \
     "" using ($5 > 0 ? $1 : 1/0):2 with points pt 7 ps 0.6 lc rgb "black" title "causal decision", \
     ARG1.".heat.x" using 1:(NaN):xticlabels(2) with points notitle, \
     ARG1.".heat.y" using (NaN):1:yticlabels(2) with points notitle
GP
gnuplot -c "$gp" "$at" "$seq" "$positions" "$nrow" "$cbmin" "$cbmax"
rm -f "$gp" "$dat" "$xlab" "$ylab"
echo "routing_plot: wrote $prefix.png and $prefix.txt"
