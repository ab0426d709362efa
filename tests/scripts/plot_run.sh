#!/bin/sh
# jobs/plot_run.sh on real runs of jobs/tiny.conf: a run stopped at step 20,
# cut back to its step-10 checkpoint and resumed to 30 (so steps 11-20 are
# logged twice), the same metrics with their last line cut short, without
# their evaluations, and without phase_ms. Each draws a PNG, and what the script read (steps,
# the last loss, the last val_loss, the resume) equals what awk reads from
# the file independently: the last line of a step counts.
. "$(dirname "$0")/lib.sh"
if ! command -v gnuplot > /dev/null; then
    echo "SKIP: no gnuplot (apt-get install gnuplot-nox)"
    exit 77
fi
prep_fortunes
cd "$TMP"
plot=$srcdir/jobs/plot_run.sh
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --log_every 1000 --seq_len 32"
"$MODTRAIN" train $common --steps 20 --eval_every 10 --ckpt_every 10 --run_dir res > res1.log 2>&1 ||
    { cat res1.log; fail "training failed"; finish; }
rm -rf res/ckpt/step-00000020
printf 'step-00000010\n' > res/ckpt/latest
"$MODTRAIN" train $common --steps 30 --eval_every 10 --ckpt_every 10 --run_dir res > res2.log 2>&1 ||
    { cat res2.log; fail "the resumed run failed"; finish; }
grep -q "resume: loaded res/ckpt/step-00000010" res2.log || fail "the run did not resume from step 10"

is_png() { [ -s "$1" ] && [ "$(head -c 4 "$1" | tail -c 3)" = PNG ]; }
# expected FILE: the summary plot_run should print, read by awk: the last
# line of each step, its loss, the last evaluation, where the steps went back
expected() {
    awk '
    function val(k,   r) { if (!match($0, "\"" k "\":[^,}]*")) return ""; r = substr($0, RSTART, RLENGTH)
                         sub(/^[^:]*:/, "", r); return r }
    /"loss"/ { s = val("step") + 0; if (!(s in loss)) n++; loss[s] = val("loss") + 0
               if (seen && s <= last) res = res (res == "" ? "" : ", ") s; last = s; seen = 1
               if (first == "" || s < first) first = s; if (s > top) top = s }
    /"val_loss"/ { s = val("step") + 0; if (!(s in ev)) ne++; ev[s] = val("val_loss") + 0; if (s >= elast) elast = s }
    END {
        printf "%d steps (%d to %d), loss %.4f to %.4f", n, first, top, loss[first], loss[top]
        if (ne) printf ", %d evaluation%s (val_loss %.4f at step %d)", ne, (ne > 1 ? "s" : ""), ev[elast], elast
        else printf ", no evaluation"
        nr = split(res, x, ", ")
        if (res != "") printf ", resumed %d time%s (at step %s)", nr, (nr > 1 ? "s" : ""), res
        print ""
    }' "$1"
}
check_plot() { # WHAT DIR EXPECTED [plot_run options]: DIR.out, DIR.err
    what=$1 dir=$2 want=$3
    shift 3
    rc=0
    "$plot" "$dir" "$@" > "$dir.out" 2> "$dir.err" || rc=$?
    png=$dir/metrics.png
    [ "${1:-}" = --out ] && png=$2
    got=$(sed -n 's/^plot_run: \([0-9].*\)/\1/p' "$dir.out")
    if [ "$rc" = 0 ] && [ ! -s "$dir.err" ] && is_png "$png" && [ "$got" = "$want" ]; then
        ok "$what: $got"
    else
        fail "$what: exit $rc, read '$got', expected '$want' ($(cat "$dir.err"))"
    fi
}

check_plot "a resumed run" res "$(expected res/metrics.jsonl)"
grep -q "resumed 1 time (at step 11)" res.out || fail "the resume at step 11 was not seen"

# the last line cut short, mid-number, as a run killed while writing leaves it
mkdir cut
awk '/"loss"/ { n = NR } { line[NR] = $0 } END { for (i = 1; i <= n; i++) print line[i] }' res/metrics.jsonl > cut/full
head -c $(($(wc -c < cut/full) - 40)) cut/full > cut/metrics.jsonl
check_plot "a last line cut short" cut "$(sed '$d' cut/metrics.jsonl | expected /dev/stdin); the last line, cut short, left out" \
    --out cut.png

# a run's metrics without its evaluations (a run ends with one even at
# eval_every = 0)
mkdir noeval
grep -v '"val_loss"' res/metrics.jsonl > noeval/metrics.jsonl
check_plot "a run without val_loss" noeval "$(expected noeval/metrics.jsonl)"
grep -q "no evaluation" noeval.out || fail "the run without val_loss was not said to have none"

# the same metrics without phase_ms (a run that times no phases): a normal
# run, drawn, its time panel empty
mkdir nophase
sed 's/,"phase_ms":{[^}]*}//' res/metrics.jsonl > nophase/metrics.jsonl
grep -q '"loss"' nophase/metrics.jsonl && ! grep -q phase_ms nophase/metrics.jsonl ||
    fail "phase_ms was not taken out of the metrics"
check_plot "a run without phase_ms" nophase "$(expected nophase/metrics.jsonl)"

# --help: the usage, nothing drawn
rm -f res/metrics.png
"$plot" res --help > help.out 2>&1 && grep -q "usage: jobs/plot_run.sh RUN_DIR \[--out FILE\]" help.out &&
    [ ! -e res/metrics.png ] && ok "--help prints the usage and draws nothing" || fail "--help: $(cat help.out)"
finish
