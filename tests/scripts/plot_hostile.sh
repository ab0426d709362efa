#!/bin/bash
# The sweep's and the routing dump's plotting tools against crafted input,
# in seconds (no training): text of a results.csv or a routing file never
# becomes a gnuplot command (gnuplot's system(), backquotes, quotes, `!`,
# `%`, `@`): a field that should be a number and is not is refused with
# exit 2 and one line, hostile text where text belongs (the decoded tokens)
# is drawn as it is, and an output folder's name is only ever a name; no
# marker file appears. jobs/isoflop.sh refuses bad budgets (1e999, 1e-999,
# nan, negative, 0, more steps than train takes) and a grid that leaves every
# run out up front: exit 2, one line, nothing created. jobs/plot_run.sh
# refuses a missing folder, missing, empty, binary, deeply nested or
# non-run metrics, values that are not numbers and more than 32 phases (one
# line, exit 2), takes the last line of a repeated step, leaves out a last
# line cut short and draws a run resumed 15000 times.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
have_gnuplot=0
command -v gnuplot > /dev/null && have_gnuplot=1
no_marker() { # WHAT
    if ls marker* > /dev/null 2>&1; then fail "$1: a crafted field ran a command ($(ls marker*))"; rm -f marker*; fi
}
# refused NAME PATTERN CMD...: exit 2, one stderr line matching PATTERN, no marker
refused_plot() {
    local name=$1 pattern=$2 rc=0
    shift 2
    "$@" > out.txt 2> err.txt || rc=$?
    if [ "$rc" = 2 ] && [ "$(wc -l < err.txt)" = 1 ] && grep -q -- "$pattern" err.txt; then
        ok "$name: $(cat err.txt)"
    else
        fail "$name: exit $rc, '$(cat err.txt)', expected exit 2 and /$pattern/"
    fi
    no_marker "$name"
}
# a shell command in gnuplot's system(): no spaces (${IFS}), so that it
# survives being split into words
sys='system("touch${IFS}marker")'

# --- jobs/routing_plot.sh
hdr=$(printf '# modtrain routing: checkpoint step 1, seq_len 4, k 2\nseq\tpos\tblock\ttoken\ttext\ttopk\trouter\tweight\tcausal')
row() { printf '%s\t' "$@" | sed 's/\t$//'; echo; }
{ echo "$hdr"; row 0 0 1 65 A 1 0.3 0.5 1; row 0 1 "1\"0);$sys;#" 66 B 0 -0.1 -0.2 0; } > block.tsv
refused_plot "routing: a block that is a gnuplot command" "block.tsv': line 4: block = .* is not a whole number" \
    "$srcdir/jobs/routing_plot.sh" block.tsv b
[ ! -e b.png ] || fail "routing: a refused file drew b.png"
# shellcheck disable=SC2089 # the quotes are the messages' text
for col in "0 x 1 65 A 1 0.3 0.5 1:pos = 'x' is not a whole number" \
    "0 0 1 65 A 2 0.3 0.5 1:topk = '2' is not 0 or 1" \
    "0 0 1 65 A 1 $sys 0.5 1:router = .* is not a number" \
    "0 0 1 65 A 1 0.3 0.5:has 8 columns, not 9"; do
    # shellcheck disable=SC2086,SC2090 # the fields are words
    { echo "$hdr"; row ${col%%:*}; } > col.tsv
    refused_plot "routing: ${col#*:}" "${col#*:}" "$srcdir/jobs/routing_plot.sh" col.tsv c
done
# hostile decoded text is data: drawn, never run
{
    echo "$hdr"
    p=0
    for t in "\`touch marker\`" "\"0);$sys;#" "'); $sys; ('" "!touch marker" "%s%d%n" "@ARG0" '"' "\\" " " ""; do
        row 0 $p 1 $((65 + p)) "$t" $((p % 2)) 0.$p 0.$p $((p % 2))
        row 0 $p 3 $((65 + p)) "$t" $(((p + 1) % 2)) -0.$p -0.$p 0
        p=$((p + 1))
    done
} > text.tsv
rc=0
"$srcdir/jobs/routing_plot.sh" text.tsv t --positions 10 --min_count 1 > t.log 2>&1 || rc=$?
no_marker "routing: hostile text"
if [ "$rc" = 0 ] && grep -q '^block 3: chose 5 of 10 tokens' t.txt &&
    { [ "$have_gnuplot" = 0 ] || [ "$(head -c 4 t.png | tail -c 3)" = PNG ]; }; then
    ok "routing: hostile decoded text drawn, not run$([ "$have_gnuplot" = 1 ] || echo ' (no gnuplot: the table only)')"
else
    fail "routing: hostile decoded text: exit $rc: $(cat t.log)"
fi
# --positions defaults to the file's seq_len (4 here, of the 10 positions
# drawn above): the same picture as --positions 4, a narrower one than 10
if [ "$have_gnuplot" = 1 ]; then
    "$srcdir/jobs/routing_plot.sh" text.tsv d --min_count 1 > d.log 2>&1 &&
        "$srcdir/jobs/routing_plot.sh" text.tsv d4 --positions 4 --min_count 1 > d4.log 2>&1 &&
        cmp -s d.png d4.png && ! cmp -s d.png t.png && ok "routing: --positions defaults to seq_len" ||
        fail "routing: the default --positions is not seq_len = 4: $(cat d.log d4.log)"
fi
sed '1s/seq_len 4, //' text.tsv > nolen.tsv
refused_plot "routing: no seq_len and no --positions" "nolen.tsv' does not record seq_len on its first line (give --positions N)" \
    "$srcdir/jobs/routing_plot.sh" nolen.tsv n
refused_plot "routing: --positions 0" "--positions = '0' is not a whole number >= 1" \
    "$srcdir/jobs/routing_plot.sh" text.tsv n --positions 0
# an output prefix is a name, never a command
mkdir -p "x\";$sys;\""
rc=0
"$srcdir/jobs/routing_plot.sh" text.tsv "x\";$sys;\"/p" --positions 4 --min_count 1 > p.log 2>&1 || rc=$?
no_marker "routing: a hostile prefix"
[ "$rc" = 0 ] && { [ "$have_gnuplot" = 0 ] || [ -s "x\";$sys;\"/p.png" ]; } && ok "routing: a hostile prefix is a file name" ||
    fail "routing: a hostile prefix: exit $rc: $(cat p.log)"

# --- jobs/plot_run.sh
pr=$srcdir/jobs/plot_run.sh
st() { printf '{"step":%s,"loss":%s,"lr":1e-3,"tokens_per_s":100,"phase_ms":{"forward":%s,"backward":2}}\n' "$@"; }
refused_plot "plot_run: no RUN_DIR" "usage: jobs/plot_run.sh RUN_DIR" "$pr"
refused_plot "plot_run: a missing folder" "'nowhere' is not a folder" "$pr" nowhere
mkdir -p none empty bin mid deep phase big arr
refused_plot "plot_run: a folder without metrics" "'none/metrics.jsonl' does not exist" "$pr" none
: > empty/metrics.jsonl
refused_plot "plot_run: empty metrics" "'empty/metrics.jsonl' is empty" "$pr" empty
head -c 4096 /dev/urandom > bin/metrics.jsonl
refused_plot "plot_run: binary garbage" "bin/metrics.jsonl': line 1 is not a JSON object" "$pr" bin
{ st 1 2 1; echo "set output '|touch marker'"; st 2 1 1; } > mid/metrics.jsonl
refused_plot "plot_run: a line of garbage before the last" "mid/metrics.jsonl': line 2 is not a JSON object" "$pr" mid
{ st 1 2 1; "$PYTHON" -c 'print("[" * 100000 + "]" * 100000)'; st 2 1 1; } > deep/metrics.jsonl
refused_plot "plot_run: JSON nested 100000 deep" "deep/metrics.jsonl': line 2 is not a JSON object" "$pr" deep
# (a bad line before the last: a last line that is not JSON is one cut short)
for v in '"`touch marker`"' true NaN 1e999 -1 2.5; do
    mkdir -p "v$v"
    { st 1 2 1; st "$v" 1 1; st 3 1 1; } > "v$v/metrics.jsonl"
    refused_plot "plot_run: step = $v" "line 2: step = .* is not a whole number >= 0" "$pr" "v$v"
done
{ st 1 2 1; st 2 '"1); system(\"touch marker\"); (1"' 1; st 3 1 1; } > big/metrics.jsonl
refused_plot "plot_run: a loss that is a command" "big/metrics.jsonl': line 2: loss = .* is not a number" "$pr" big
{ st 1 2 1; echo '{"step":2,"loss":1,"lr":1,"tokens_per_s":1,"phase_ms":{"a\"$sys":1}}'; } > phase/metrics.jsonl
refused_plot "plot_run: a phase that is a command" "phase/metrics.jsonl': line 2: phase_ms has a key .*, not a phase's name" "$pr" phase
echo '[1, 2]' > arr/metrics.jsonl
refused_plot "plot_run: JSON that is not a run's" "arr/metrics.jsonl': line 1 is not a JSON object" "$pr" arr
refused_plot "plot_run: --out in a missing folder" "the folder 'nowhere' does not exist" "$pr" mid --out nowhere/x.png
refused_plot "plot_run: an unknown option" "unknown option '--bogus'" "$pr" mid --bogus
[ ! -e mid/metrics.png ] || fail "plot_run: a refused run drew mid/metrics.png"
# the last line of a step counts (a resume logs it again), a last line cut
# short is left out, and a hostile folder name is only a name
out="r\";$sys;\""
mkdir -p "$out"
{ st 1 3 1; st 2 2.5 1; st 1 9 1; st 2 8 1; echo '{"step":2,"val_loss":7.5}'; printf '{"step":3,"lo'; } > "$out/metrics.jsonl"
rc=0
"$pr" "$out" > pr.log 2>&1 || rc=$?
no_marker "plot_run: a hostile folder name"
want="2 steps (1 to 2), loss 9.0000 to 8.0000, 1 evaluation (val_loss 7.5000 at step 2), resumed 1 time (at step 1); the last line, cut short, left out"
if [ "$rc" = 0 ] && grep -qF "plot_run: $want" pr.log && { [ "$have_gnuplot" = 0 ] || [ -s "$out/metrics.png" ]; }; then
    ok "plot_run: the last line of a step counts; a cut last line and a hostile folder name are harmless"
else
    fail "plot_run: repeated steps / hostile name: exit $rc: $(cat pr.log)"
fi

# a run resumed 15000 times, its steps 8 digits: the resumes, one word each,
# would be 132 KiB, past the 128 KiB one argument may hold; the picture has a
# dashed line at each, the summary names the first 10
mkdir -p resumed
awk 'BEGIN { for (r = 0; r <= 15000; r++) for (s = r; s <= r + 1; s++)
    printf "{\"step\":%d,\"loss\":2,\"lr\":1e-3,\"tokens_per_s\":100,\"phase_ms\":{\"forward\":1}}\n",
        10000000 + s }' > resumed/metrics.jsonl
rc=0
"$pr" resumed > resumed.log 2>&1 || rc=$?
want="15002 steps (10000000 to 10015001), loss 2.0000 to 2.0000, no evaluation, resumed 15000 times"
want="$want (at step $(seq -s ', ' 10000001 10000010), ...)"
if [ "$rc" = 0 ] && grep -qxF "plot_run: $want" resumed.log &&
    { [ "$have_gnuplot" = 0 ] || [ -s resumed/metrics.png ]; }; then
    ok "plot_run: a run resumed 15000 times is drawn"
else
    fail "plot_run: a run resumed 15000 times: exit $rc: $(head -c 300 resumed.log)"
fi
# more phases than a key can name: one line, nothing drawn
mkdir -p phases
awk 'BEGIN { printf "{\"step\":1,\"loss\":2,\"lr\":1,\"tokens_per_s\":1,\"phase_ms\":{"
    for (i = 0; i < 33; i++) printf "%s\"p_%c%c\":1", (i ? "," : ""), 97 + int(i / 26), 97 + i % 26
    print "}}" }' > phases/metrics.jsonl
refused_plot "plot_run: 33 phases" "phases/metrics.jsonl': line 1: phase_ms names more than 32 phases" "$pr" phases
[ ! -e phases/metrics.png ] || fail "plot_run: 33 phases drew phases/metrics.png"

# --- jobs/isoflop.sh --report
H=budget,kind,d_model,n_layer,params,steps,tokens,flops,epochs,budget_spent,val_loss,val_loss_causal,step_ms,tokens_per_s,wall_s,capacity,route_every
runs() { # BUDGET: a grid of two sizes, both kinds
    for k in dense mod; do for p in 31623 100000; do
        echo "$1,$k,64,2,$p,100,1000,1e15,1,1,2.$((p % 7)),2.5,10,100,1,1,0"
    done; done
}
csv() { mkdir -p "$1"; { echo "$H"; cat; } > "$1/results.csv"; }
runs "1e15\";$sys;x=\"1" | csv inj
refused_plot "report: a budget that is a gnuplot command" "inj/results.csv: line 2: budget = .* is not a number > 0" \
    "$srcdir/jobs/isoflop.sh" --report inj
{ runs 1e15; echo "1e15,dense\"$sys,64,2,5,100,1000,1e15,1,1,2,2,10,100,1,1,0"; } | csv kind
refused_plot "report: a kind that no sweep trains" "kind/results.csv: line 6: kind = .* is not dense, mod, moe, mode_staged, mode_integrated or moe_capped" \
    "$srcdir/jobs/isoflop.sh" --report kind
runs 1e15 | sed '1s/,2\.[0-9],/,`touch marker`,/' | csv loss
refused_plot "report: a loss that is a command" "loss/results.csv: line 2: val_loss = .* is not a number" \
    "$srcdir/jobs/isoflop.sh" --report loss
runs "../1e15" | csv dots
refused_plot "report: a budget that is a path" "dots/results.csv: line 2: budget = '../1e15' is not a number > 0" \
    "$srcdir/jobs/isoflop.sh" --report dots
mkdir -p hdr
echo "$H,x" > hdr/results.csv
refused_plot "report: another header" "hdr/results.csv: line 1 is not the header a sweep writes" \
    "$srcdir/jobs/isoflop.sh" --report hdr
out="r\";$sys;\""
runs 1e15 | csv "$out"
rc=0
"$srcdir/jobs/isoflop.sh" --report "$out" > r.log 2>&1 || rc=$?
no_marker "report: a hostile folder name"
[ "$rc" = 0 ] && grep -q "^budget 1e15 FLOPs: best dense" "$out/summary.txt" &&
    { [ "$have_gnuplot" = 0 ] || [ -s "$out/isoflop.png" ]; } && ok "report: a hostile folder name is a name" ||
    fail "report: a hostile folder name: exit $rc: $(cat r.log)"

# --- jobs/isoflop.sh: bad budgets and a grid of no runs, up front
isoflop_none() { MODTRAIN=$MODTRAIN "$srcdir/jobs/isoflop.sh" --quick --out sweep --train none.bin --val none.bin "$@"; }
for b in 1e999 1e-999 nan -1 0 0.0 1e31 "2e10 inf"; do
    refused_plot "budgets '$b'" "budget = '[^']*' is not a number > 0 and <= 1e30" isoflop_none --budgets "$b"
done
refused_plot "budget 1e29: more steps than train takes" "budget 1e29 buys size 32x2 (dense) more than 99999999 steps" \
    isoflop_none --budgets 1e29
refused_plot "a grid that leaves every run out" "every run is left out: no budget of '1e3 1e5' buys --min_steps 10 steps" \
    isoflop_none --budgets "1e3 1e5"
refused_plot "capacity 2" "--capacity = '2' is not a number > 0 and <= 1" isoflop_none --capacity 2
[ ! -e sweep ] && ok "the refused sweeps created nothing" || fail "a refused sweep created sweep/"
finish
