#!/bin/bash
# usage: jobs/plot_run.sh RUN_DIR [--out FILE]
#
# One picture of a training run, from the RUN_DIR/metrics.jsonl that
# `modtrain train` writes (gnuplot, four panels):
#   loss (and val_loss, val_loss_causal where the run evaluated) by step,
#   the learning rate, tokens/s, and where each step's time went (the
#   phases of phase_ms, stacked, in ms; empty for metrics without phase_ms)
# A resumed run logs the steps after its checkpoint again: the last line of
# a step counts, and each resume is a dashed line (the summary names the
# first 10). A last line cut short (a run still writing, or killed) is left
# out, with a note.
#
#   RUN_DIR     a run's run_dir (runs/small for jobs/small.conf)
#   --out FILE  the PNG (RUN_DIR/metrics.png)
# PYTHON names the Python 3 that reads the metrics (python3).
set -euo pipefail
export LC_ALL=C
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "plot_run: $*" >&2; exit 2; }
for a in "$@"; do case $a in --help | -h) usage; exit 0 ;; esac; done
run="" out=""
while [ $# -gt 0 ]; do
    case $1 in
    --out | --out=*)
        if [ "$1" = --out ]; then [ $# -ge 2 ] && out=$2 && shift; else out=${1#--out=}; fi
        [ -n "$out" ] || die "--out needs a value (a file name, e.g. run.png)"
        shift ;;
    -*) die "unknown option '$1' (expected --out FILE; see jobs/plot_run.sh --help)" ;;
    *) [ -z "$run" ] || die "one RUN_DIR only ('$run', then '$1')"; run=$1; shift ;;
    esac
done
[ -n "$run" ] || die "usage: jobs/plot_run.sh RUN_DIR [--out FILE] (RUN_DIR: a run's run_dir, e.g. runs/small)"
[ -d "$run" ] || die "'$run' is not a folder (give a run's run_dir, e.g. runs/small)"
metrics=$run/metrics.jsonl
[ -e "$metrics" ] || die "'$metrics' does not exist (modtrain train writes it into its run_dir)"
[ -f "$metrics" ] || die "'$metrics' is not a file"
[ -s "$metrics" ] || die "'$metrics' is empty (the run has not logged a step yet)"
[ -n "$out" ] || out=$run/metrics.png
case $out in */) die "--out '$out' is a folder's name, not a file's" ;; esac
[ -d "$(dirname -- "$out")" ] || die "--out '$out': the folder '$(dirname -- "$out")' does not exist"
[ ! -d "$out" ] || die "--out '$out' is a folder (give a file name, e.g. run.png)"
# a FIFO would hold gnuplot until a reader came, a device takes no picture
[ ! -e "$out" ] || [ -f "$out" ] ||
    die "--out '$out' is not a regular file (a FIFO or a device: give a file name, e.g. run.png)"
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" > /dev/null || die "no $PYTHON to read the metrics (apt-get install python3)"
command -v gnuplot > /dev/null || die "no gnuplot to draw with (apt-get install gnuplot-nox)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/plot_run.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# the metrics, strictly, into plain columns: every value drawn is a number
# (nothing of the file ever becomes part of a gnuplot command); prints the
# summary, or one line of what is wrong (exit 2)
"$PYTHON" - "$metrics" "$tmp" > "$tmp/summary" 2> "$tmp/err" <<'PY' || { tail -n 1 "$tmp/err" >&2; exit 2; }
import json, math, re, sys

path, tmp = sys.argv[1], sys.argv[2]
MAX_PHASES = 32  # a key names no more legibly; the names reach gnuplot as one argument


def bad(msg):
    sys.stderr.write("plot_run: '%s': %s\n" % (path, msg))
    sys.exit(2)


def number(line, obj, key, whole=False):
    v = obj.get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or (whole and (v != int(v) or v < 0 or v > 1e15)):
        shown = re.sub(r"[^ -~]", "?", json.dumps(v)[:24])
        bad("line %d: %s = %s is not %s" % (line, key, shown, "a whole number >= 0" if whole else "a number"))
    return int(v) if whole else v


with open(path, "rb") as f:
    raw = f.read()
lines = raw.split(b"\n")
if lines and lines[-1] == b"":
    lines.pop()
steps, evals, resumes, cut, phases = {}, {}, [], False, []
last = None
for i, text in enumerate(lines, 1):
    try:
        obj = json.loads(text.decode("utf-8"))
        if not isinstance(obj, dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError):
        if i == len(lines) and i > 1:
            cut = True  # cut short: a run still writing it, or killed mid-line
            break
        bad("line %d is not a JSON object (not a run's metrics.jsonl?)" % i)
    if "step" not in obj:
        bad("line %d has no \"step\" (not a run's metrics.jsonl?)" % i)
    step = number(i, obj, "step", whole=True)
    if "loss" in obj:
        row = [number(i, obj, k) for k in ("loss", "lr", "tokens_per_s")]
        ph = obj.get("phase_ms", {})
        if not isinstance(ph, dict):
            bad("line %d: phase_ms is not an object" % i)
        for k in ph:
            if not re.fullmatch(r"[a-z_]{1,32}", k):
                bad("line %d: phase_ms has a key %s, not a phase's name" % (i, re.sub(r"[^ -~]", "?", json.dumps(k)[:24])))
            if k not in phases:
                phases.append(k)
        if len(phases) > MAX_PHASES:
            bad("line %d: phase_ms names more than %d phases, more than a key can tell apart"
                " (a run logs about 10)" % (i, MAX_PHASES))
        if last is not None and step <= last:
            resumes.append(step)  # logged again: a resume from an earlier checkpoint
        last = step
        steps[step] = (row, {k: number(i, ph, k) for k in ph})
    elif "val_loss" in obj:
        causal = number(i, obj, "val_loss_causal") if "val_loss_causal" in obj else None
        evals[step] = (number(i, obj, "val_loss"), causal)
if not steps:
    bad("no step line (a line with \"step\" and \"loss\"): not a run's metrics.jsonl, or no step logged yet")
order = sorted(steps)
drawn = [p for p in phases if any(steps[s][1].get(p, 0) > 0 for s in order)]
with open(tmp + "/steps.dat", "w") as f:
    for s in order:
        row, ph = steps[s]
        acc, cum = 0.0, []
        for p in drawn:
            acc += ph.get(p, 0.0)
            cum.append(acc)
        f.write(" ".join("%.9g" % x for x in [s] + row + cum) + "\n")
# the resumes as a column, not an argument: a run resumed 15000 times would
# pass the limit on an argument's length
with open(tmp + "/resumes.dat", "w") as f:
    f.write("".join("%d\n" % r for r in resumes))
with open(tmp + "/evals.dat", "w") as f:
    for s in sorted(evals):
        v, c = evals[s]
        f.write("%d %.9g %s\n" % (s, v, "?" if c is None else "%.9g" % c))
has_causal = any(c is not None for _, c in evals.values())
# the phases' scale: a few steps with an evaluation or a save in them would
# flatten every other step, so it stops at 4x the median step (saying so)
totals = sorted(sum(steps[s][1].get(p, 0.0) for p in drawn) for s in order)
median = totals[len(totals) // 2]
clip = 4 * median if drawn and median > 0 and totals[-1] > 4 * median else 0
taller = sum(t > clip for t in totals) if clip else 0
open(tmp + "/args", "w").write("%d\n%d\n%d\n%s\n%s\n%.6g %d\n" % (
    len(order), len(evals), has_causal, " ".join(drawn), len(resumes), clip, taller))
s0, s1 = order[0], order[-1]
msg = "%d steps (%d to %d), loss %.4f to %.4f" % (len(order), s0, s1, steps[s0][0][0], steps[s1][0][0])
if evals:
    e = max(evals)
    msg += ", %d evaluation%s (val_loss %.4f at step %d)" % (len(evals), "s" if len(evals) > 1 else "",
                                                           evals[e][0], e)
else:
    msg += ", no evaluation"
if resumes:
    # the first 10: the line stays a line however often the run resumed
    msg += ", resumed %d time%s (at step %s%s)" % (len(resumes), "s" if len(resumes) > 1 else "",
                                                   ", ".join(str(r) for r in resumes[:10]),
                                                   ", ..." if len(resumes) > 10 else "")
if cut:
    msg += "; the last line, cut short, left out"
print(msg)
PY
{ read -r nsteps; read -r nevals; read -r causal; read -r phases; read -r nresumes; read -r clip; } < "$tmp/args"

# the script is fixed text: every value comes in as a gnuplot -c argument
# (ARG1 ...), a string; the paths begin with / or ./ (never < or |, which
# gnuplot would run as commands)
at() { case $1 in /*) printf '%s' "$1" ;; *) printf './%s' "$1" ;; esac; }
cat > "$tmp/plot.gp" <<'GP'
dir = ARG1; out = ARG2; run = ARG3; nsteps = ARG4 + 0; nevals = ARG5 + 0; causal = ARG6 + 0
phases = ARG7; nresumes = ARG8 + 0; clip = word(ARG9, 1) + 0; taller = word(ARG9, 2) + 0
st = dir."/steps.dat"; ev = dir."/evals.dat"; rs = dir."/resumes.dat"
set terminal pngcairo size 1280,900 font ",10"
set termoption noenhanced
set output out
if (nsteps < 2) { set style data points } else { set style data lines }
set grid
set key top right opaque
set xlabel "step"
# a dashed line at every resume, on every panel: the last plot of each (R),
# from the bottom (0) to the top (1) of y2
set y2range [0:1]
R = ', rs using 1:(0):(0):(1) axes x1y2 with vectors nohead dt 2 lw 1.5 lc rgb "#555555" notitle'
R = nresumes > 0 ? R : ''
rsd = nresumes > 0 ? "; dashed: resumed" : ""
set multiplot layout 2, 2 title "run ".run." (".nsteps." steps".rsd.")"
set title "loss (nats/token)"
if (nevals > 0 && causal) {
    plot st using 1:2 lw 1.5 lc rgb "#1f77b4" title "loss", \
         ev using 1:2 with linespoints pt 7 lw 2 lc rgb "#d62728" title "val_loss", \
         ev using 1:3 with linespoints pt 5 dt 2 lw 1.5 lc rgb "#ff7f0e" title "val_loss_causal" @R
} else {
    if (nevals > 0) {
        plot st using 1:2 lw 1.5 lc rgb "#1f77b4" title "loss", \
             ev using 1:2 with linespoints pt 7 lw 2 lc rgb "#d62728" title "val_loss" @R
    } else {
        plot st using 1:2 lw 1.5 lc rgb "#1f77b4" title "loss (no val_loss logged)" @R
    }
}
set title "learning rate"
set format y "%.1e"
plot st using 1:3 lw 1.5 lc rgb "#2ca02c" notitle @R
set format y "% h"
set title "throughput (tokens/s)"
set yrange [0:*]
plot st using 1:4 lw 1.5 lc rgb "#9467bd" notitle @R
set title "where the time went: ms per step by phase, stacked"
if (clip > 0) {
    set yrange [0:clip]
    set title sprintf("ms per step by phase, stacked (cut at %.0f ms: %d step%s above)", \
        clip, taller, taller == 1 ? "" : "s")
}
set key outside right top vertical
np = words(phases)
if (np == 0) {
    # metrics without phase_ms: an empty panel that says so, over the steps'
    # x range (a line nobody sees: a plot of no points at all is an error)
    set label 1 "no phase_ms in these metrics" at graph 0.5, graph 0.5 center
    set yrange [0:1]
    unset ytics
    plot st using 1:(0) with lines lc rgb "#FF000000" notitle @R
} else {
    if (nsteps < 2) {
        plot for [i = np:1:-1] st using 1:(column(4 + i)) with points pt 7 lc i title word(phases, i) @R
    } else {
        plot for [i = np:1:-1] st using 1:(column(4 + i)) with filledcurves x1 fs solid 0.85 \
            lc i title word(phases, i) @R
    }
}
unset multiplot
GP
# on failure, gnuplot's first line that is not a warning (a constant lr
# warns of an empty y range before any error)
gnuplot -c "$tmp/plot.gp" "$tmp" "$(at "$out")" "$run" "$nsteps" "$nevals" "$causal" "$phases" \
    "$nresumes" "$clip" 2> "$tmp/gp.err" || {
    { grep -v '^Warning' "$tmp/gp.err" || cat "$tmp/gp.err"; } | sed -n 1p >&2
    echo "plot_run: gnuplot failed (above)" >&2
    exit 1
}
echo "plot_run: $(cat "$tmp/summary")"
echo "plot_run: wrote $out"
