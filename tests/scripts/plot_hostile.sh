#!/bin/bash
# The sweep's and the routing dump's plotting tools against crafted input,
# in seconds (no training): text of a results.csv or a routing file never
# becomes a gnuplot command (gnuplot's system(), backquotes, quotes, `!`,
# `%`, `@`): a field that should be a number and is not is refused with
# exit 2 and one line, hostile text where text belongs (the decoded tokens)
# is drawn as it is, and an output folder's name is only ever a name; no
# marker file appears. jobs/isoflop.sh refuses bad budgets (1e999, 1e-999,
# nan, negative, 0, more steps than train takes) and a grid that leaves every
# run out up front: exit 2, one line, nothing created.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
have_gnuplot=0
command -v gnuplot > /dev/null && have_gnuplot=1
no_marker() { # WHAT
    if ls marker* > /dev/null 2>&1; then fail "$1: a crafted field ran a command ($(ls marker*))"; rm -f marker*; fi
}
# refused NAME PATTERN CMD...: exit 2, one stderr line matching PATTERN, no marker
refused() {
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
refused "routing: a block that is a gnuplot command" "block.tsv': line 4: block = .* is not a whole number" \
    "$srcdir/jobs/routing_plot.sh" block.tsv b
[ ! -e b.png ] || fail "routing: a refused file drew b.png"
# shellcheck disable=SC2089 # the quotes are the messages' text
for col in "0 x 1 65 A 1 0.3 0.5 1:pos = 'x' is not a whole number" \
    "0 0 1 65 A 2 0.3 0.5 1:topk = '2' is not 0 or 1" \
    "0 0 1 65 A 1 $sys 0.5 1:router = .* is not a number" \
    "0 0 1 65 A 1 0.3 0.5:has 8 columns, not 9"; do
    # shellcheck disable=SC2086,SC2090 # the fields are words
    { echo "$hdr"; row ${col%%:*}; } > col.tsv
    refused "routing: ${col#*:}" "${col#*:}" "$srcdir/jobs/routing_plot.sh" col.tsv c
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
refused "routing: no seq_len and no --positions" "nolen.tsv' does not record seq_len on its first line (give --positions N)" \
    "$srcdir/jobs/routing_plot.sh" nolen.tsv n
refused "routing: --positions 0" "--positions = '0' is not a whole number >= 1" \
    "$srcdir/jobs/routing_plot.sh" text.tsv n --positions 0
# an output prefix is a name, never a command
mkdir -p "x\";$sys;\""
rc=0
"$srcdir/jobs/routing_plot.sh" text.tsv "x\";$sys;\"/p" --positions 4 --min_count 1 > p.log 2>&1 || rc=$?
no_marker "routing: a hostile prefix"
[ "$rc" = 0 ] && { [ "$have_gnuplot" = 0 ] || [ -s "x\";$sys;\"/p.png" ]; } && ok "routing: a hostile prefix is a file name" ||
    fail "routing: a hostile prefix: exit $rc: $(cat p.log)"

# --- jobs/isoflop.sh --report
H=budget,kind,d_model,n_layer,params,steps,tokens,flops,epochs,budget_spent,val_loss,val_loss_causal,step_ms,tokens_per_s,wall_s,capacity,route_every
runs() { # BUDGET: a grid of two sizes, both kinds
    for k in dense mod; do for p in 31623 100000; do
        echo "$1,$k,64,2,$p,100,1000,1e15,1,1,2.$((p % 7)),2.5,10,100,1,1,0"
    done; done
}
csv() { mkdir -p "$1"; { echo "$H"; cat; } > "$1/results.csv"; }
runs "1e15\";$sys;x=\"1" | csv inj
refused "report: a budget that is a gnuplot command" "inj/results.csv: line 2: budget = .* is not a number > 0" \
    "$srcdir/jobs/isoflop.sh" --report inj
{ runs 1e15; echo "1e15,dense\"$sys,64,2,5,100,1000,1e15,1,1,2,2,10,100,1,1,0"; } | csv kind
refused "report: a kind that is not dense or mod" "kind/results.csv: line 6: kind = .* is not dense or mod" \
    "$srcdir/jobs/isoflop.sh" --report kind
runs 1e15 | sed '1s/,2\.[0-9],/,`touch marker`,/' | csv loss
refused "report: a loss that is a command" "loss/results.csv: line 2: val_loss = .* is not a number" \
    "$srcdir/jobs/isoflop.sh" --report loss
runs "../1e15" | csv dots
refused "report: a budget that is a path" "dots/results.csv: line 2: budget = '../1e15' is not a number > 0" \
    "$srcdir/jobs/isoflop.sh" --report dots
mkdir -p hdr
echo "$H,x" > hdr/results.csv
refused "report: another header" "hdr/results.csv: line 1 is not the header a sweep writes" \
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
sweep() { MODTRAIN=$MODTRAIN "$srcdir/jobs/isoflop.sh" --quick --out sweep --train none.bin --val none.bin "$@"; }
for b in 1e999 1e-999 nan -1 0 0.0 1e31 "2e10 inf"; do
    refused "budgets '$b'" "budget = '[^']*' is not a number > 0 and <= 1e30" sweep --budgets "$b"
done
refused "budget 1e29: more steps than train takes" "budget 1e29 buys size 32x2 (dense) more than 99999999 steps" \
    sweep --budgets 1e29
refused "a grid that leaves every run out" "every run is left out: no budget of '1e3 1e5' buys --min_steps 10 steps" \
    sweep --budgets "1e3 1e5"
refused "capacity 2" "--capacity = '2' is not a number > 0 and <= 1" sweep --capacity 2
[ ! -e sweep ] && ok "the refused sweeps created nothing" || fail "a refused sweep created sweep/"
finish
