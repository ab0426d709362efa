#!/bin/bash
# The isoFLOP sweep in --quick mode (jobs/isoflop.sh) and the routing dump
# (modtrain eval --routing, jobs/routing_plot.sh):
# - every run trains for the steps that spend its budget within 1% or one
#   step, counted from the run's own metrics.jsonl, at the FLOPs per token
#   `plan --flops` promised, and its final checkpoint is at that step;
# - the table has every run once, the summary every budget, the plots exist;
#   the optimum between grid points is the vertex of losses that lie on a
#   parabola in log parameters;
# - a sweep stopped by SIGTERM (as SLURM preempts) exits 75, and run again
#   skips the finished runs (their files untouched) and resumes the stopped
#   one from its checkpoint;
# - a sweep of one budget under mpirun -np 2 (dp 2) spends the same FLOPs;
# - --kinds with every kind (dense, mod, moe, mode_staged, mode_integrated,
#   moe_capped): every run is in the table once and spends its budget at
#   the FLOPs per token train counted (MoE kinds at a balanced router's
#   count, so mode_integrated and moe_capped take alike and more steps than
#   moe, and spend near the budget as their routers kept), each kind's keys took
#   (no-ops, a capacity that drops), the summary states the best of every
#   kind and the paper's order checks, which a table of known losses
#   answers rightly; the report refuses a row of a kind no sweep trains;
# - the routing dump holds exactly k top-k tokens per sequence and block,
#   the k largest router logits; its causal decisions are the router's sign
#   and agree with top-k as often as eval's predictor_accuracy says; --vocab
#   on a byte model, an unwritable path and a dense model are refused
#   before evaluating; routing_plot.sh draws the whole sequence by default;
# - bad sweep options are one-line errors with exit 2.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
isoflop_quick() { MODTRAIN=$MODTRAIN "$srcdir/jobs/isoflop.sh" --quick --train data/train_000000.bin --val data/val_000000.bin "$@"; }
budgets="2e10 5e10" sizes="32x2 64x2"

# --- an interrupted sweep: SIGTERM once a run has finished and another has
# a checkpoint. The run seen with a checkpoint may still finish before the
# signal lands, so the stopped run is the one without result.csv after the
# sweep has exited; without one, the next run is stopped the same way.
unfinished() { # the runs with a checkpoint and no result.csv
    local d
    for d in s/runs/*/; do
        [ -f "$d/result.csv" ] || ! ls "$d"ckpt/step-* > /dev/null 2>&1 || echo "$d"
    done
}
victim=""
for attempt in 1 2 3; do
    setsid bash -c 'exec "$0" "$@"' env MODTRAIN="$MODTRAIN" "$srcdir/jobs/isoflop.sh" --quick \
        --train data/train_000000.bin --val data/val_000000.bin --out s > first.log 2>&1 &
    pid=$!
    for _ in $(seq 1 1200); do # up to 60 s: a finished run, and another with a checkpoint
        [ -n "$(unfinished)" ] && ls s/runs/*/result.csv > /dev/null 2>&1 && break
        kill -0 "$pid" 2> /dev/null || break
        sleep 0.05
    done
    kill -TERM -- -"$pid" 2> /dev/null || true
    rc=0
    wait "$pid" || rc=$?
    [ "$rc" = 75 ] || { cat first.log; fail "SIGTERM: the sweep exited $rc, not 75"; exit 1; }
    victim=$(unfinished | head -n 1)
    [ -n "$victim" ] && break
done
if [ -z "$victim" ]; then
    cat first.log
    fail "three sweeps stopped by SIGTERM left no run with a checkpoint to resume"
    exit 1
fi
ok "SIGTERM: the sweep stopped with exit code 75 (try $attempt), $victim unfinished with a checkpoint"
done_before=$(ls s/runs/*/result.csv 2> /dev/null | wc -l)
sums() { for f in s/runs/*/result.csv; do md5sum "$f" "$(dirname "$f")/metrics.jsonl"; done; }
before=$(sums)
isoflop_quick --out s > second.log 2>&1 || { cat second.log; fail "the resumed sweep failed"; }
skipped=$(grep -c 'done before, skipped' second.log || true)
[ "$skipped" = "$done_before" ] && ok "resumed sweep skipped the $skipped finished runs" ||
    fail "resumed sweep skipped $skipped runs, $done_before had finished"
after=$(for f in $(echo "$before" | awk '{ print $2 }'); do md5sum "$f"; done)
[ "$before" = "$after" ] && ok "finished runs untouched (result.csv, metrics.jsonl)" ||
    fail "the resumed sweep rewrote a finished run"
grep -q 'resume: loaded' "$victim/train.log" && ok "the stopped run resumed: $(grep 'resume: loaded' "$victim/train.log" | tail -n 1)" ||
    { cat "$victim/train.log"; fail "the stopped run $victim did not resume from its checkpoint"; }

# --- the table and the budgets
rows=$(tail -n +2 s/results.csv | wc -l)
[ "$rows" = 8 ] && ok "results.csv has the 8 runs" || fail "results.csv has $rows runs, not 8"
for b in $budgets; do for z in $sizes; do for k in dense mod; do
    n=$(awk -F, -v b="$b" -v d="${z%x*}" -v l="${z#*x}" -v k="$k" \
        '$1 == b && $3 == d && $4 == l && $2 == k' s/results.csv | wc -l)
    [ "$n" = 1 ] || fail "results.csv has $n rows of budget $b size $z $k"
    dir=s/runs/b${b}_${z}_$k
    steps=$(awk -F, -v b="$b" -v d="${z%x*}" -v k="$k" '$1 == b && $3 == d && $2 == k { print $6 }' s/results.csv)
    # the run's own count: every step's flops_per_token x tokens per step
    spent=$(awk -v bt=$((8 * 64)) '/"loss"/ { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7)
            match($0, /"flops_per_token":[0-9.e+]+/); f[s] = substr($0, RSTART + 18, RLENGTH - 18) }
            END { for (s in f) { t += f[s] * bt; n++ } printf "%.0f %d %.0f", t, n, f[1] }' "$dir/metrics.jsonl")
    set -- $spent
    keys="--vocab_size 256 --d_model ${z%x*} --n_layer ${z#*x} --n_head $((${z%x*} / 32)) --seq_len 64 --batch_size 8"
    [ "$k" = mod ] && keys="$keys --route_every 2 --capacity 0.125" || keys="$keys --route_every 0"
    planned=$("$MODTRAIN" plan --flops $keys | sed -e 's/.*"flops_per_token":\([0-9]*\).*/\1/')
    if [ "$2" = "$steps" ] && [ "$3" = "$planned" ] &&
        check_ab "$1" "$b" "(a - b < 0 ? b - a : a - b) <= (b / 100 > a / $2 ? b / 100 : a / $2)" &&
        [ -d "$dir/ckpt/step-$(printf %08d "$steps")" ]; then
        ok "$b $z $k: $steps steps spent $1 FLOPs at $3 a token"
    else
        fail "$b $z $k: $2 steps (table: $steps) spent $1 FLOPs of $b at $3 a token (plan: $planned)"
    fi
done; done; done
for b in $budgets; do
    grep -q "^budget $b FLOPs: best dense .* best MoD .* steps [0-9.]*x as fast" s/summary.txt ||
        fail "summary.txt has no line for budget $b"
done
for p in isoflop.png loss_vs_time.png; do
    [ -s "s/$p" ] && [ "$(head -c 4 "s/$p" | tail -c 3)" = PNG ] || fail "s/$p is not a PNG"
done
ok "summary and plots written"
# the optimum between grid points, on losses exactly (x - 5)^2 + 2 in x =
# log10(parameters) for dense and (x - 5.5)^2 + 1 for MoD: vertices at
# 0.1M and 0.316M parameters
mkdir -p syn
{ head -n 1 s/results.csv
  for k in dense mod; do for p in 31623 100000 316228 1000000; do
    awk -v k="$k" -v p="$p" 'BEGIN { x = log(p) / log(10); y = (k == "dense" ? (x - 5) ^ 2 + 2 : (x - 5.5) ^ 2 + 1)
        printf "1e15,%s,64,2,%d,100,1000,1e15,1,1,%.6f,%.6f,10,100,1,1,0\n", k, p, y, y }'
  done; done; } > syn/results.csv
MODTRAIN=$MODTRAIN "$srcdir/jobs/isoflop.sh" --report syn > syn.log 2>&1
grep -q "optimum of dense lies at 0.1M parameters, loss 2.0000; of MoD at 0.316M parameters, loss 1.0000" syn/summary.txt &&
    ok "the optimum between grid points: the parabola's vertex" || { cat syn/summary.txt; fail "the fitted optimum is not the parabola's vertex"; }

# --- every kind (24 runs, 16 of them trained: the sanitizer pass,
# MODTRAIN_SKIP_SLOW, leaves them to the first pass; test_moe,
# moe_layouts.sh and moe_cmds.sh train every MoE kind under it)
if [ $slow = 1 ]; then
all="dense mod moe mode_staged mode_integrated moe_capped"
# its dense and MoD runs are the first sweep's, finished (the same keys,
# data and budgets): the sweep skips them, as a rerun skips finished runs
mkdir -p k/runs
cp -R s/runs/*_dense s/runs/*_mod k/runs/
isoflop_quick --out k --kinds "${all// /,}" > k.log 2>&1 || { cat k.log; fail "the sweep of every kind failed"; }
rows=$(tail -n +2 k/results.csv | wc -l)
skipped=$(grep -c 'done before, skipped' k.log || true)
[ "$rows" = 24 ] && [ "$skipped" = 8 ] && ok "--kinds ${all// /,}: results.csv has the 24 runs (the 8 dense and MoD runs skipped as done)" ||
    fail "--kinds ${all// /,}: results.csv has $rows runs, not 24, and $skipped were skipped, not 8"
spent_ok=1
for b in $budgets; do for z in $sizes; do for kd in $all; do
    row=$(awk -F, -v b="$b" -v d="${z%x*}" -v l="${z#*x}" -v k="$kd" '$1 == b && $3 == d && $4 == l && $2 == k' k/results.csv)
    [ "$(printf '%s' "$row" | grep -c .)" = 1 ] || { spent_ok=0; fail "k/results.csv: not one row of budget $b size $z $kd"; continue; }
    IFS=, read -r _ _ _ _ _ steps _ flops _ _ _ _ _ _ _ cap re <<< "$row"
    dir=k/runs/b${b}_${z}_$kd
    # the run's own count, step by step
    spent=$(awk -v bt=$((8 * 64)) '/"loss"/ { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7)
            match($0, /"flops_per_token":[0-9.e+]+/); f[s] = substr($0, RSTART + 18, RLENGTH - 18) }
            END { for (s in f) { t += f[s] * bt; n++ } printf "%.0f %d", t, n }' "$dir/metrics.jsonl")
    set -- $spent
    want_cap=1 want_re=0
    case $kd in mod | mode_staged) want_cap=0.125 want_re=2 ;; esac
    # dense and MoD spend the budget exactly (within 1% or a step); an MoE
    # kind's steps are set at the FLOPs a balanced router spends, and what
    # its router really kept (train's count) lands near the budget: below
    # it where tokens drop, above it where fewer slots than E / (E + Nn)
    # go to no-ops
    near="(a - b < 0 ? b - a : a - b) <= (b / 100 > a / $2 ? b / 100 : a / $2)"
    case $kd in moe | mode_staged | moe_capped) near="a <= b * 1.01 + a / $2 && a >= b * 0.5" ;;
        mode_integrated) near="a <= b * 1.6 && a >= b * 0.5" ;; esac
    if [ "$2" = "$steps" ] && check_ab "$1" "$b" "$near" &&
        check_ab "$1" "$flops" "a == b" && [ "$cap" = "$want_cap" ] && [ "$re" = "$want_re" ]; then
        eval "steps_${b//./_}_${z}_$kd=$steps"
    else
        spent_ok=0
        fail "$b $z $kd: $2 steps (table: $steps) spent $1 FLOPs of $b (table: $flops), capacity $cap route_every $re"
    fi
done; done; done
(( spent_ok )) && ok "every kind's runs spend their budget at the FLOPs per token train counted (MoE kinds: near it, as their routers kept)"
nominal=1
for b in $budgets; do for z in $sizes; do
    v=${b//./_}_$z
    m=$(eval echo "\${steps_${v}_moe:-}") i=$(eval echo "\${steps_${v}_mode_integrated:-}")
    c=$(eval echo "\${steps_${v}_moe_capped:-}") d=$(eval echo "\${steps_${v}_dense:-}")
    st=$(eval echo "\${steps_${v}_mode_staged:-}")
    # at a balanced router's count: moe keeps every slot (capacity 1.25),
    # so its step costs a dense step and the router (a few steps fewer);
    # mode_integrated and moe_capped send half the slots to experts (E of
    # E + Nn, capacity 0.5), so their MLPs cost half and they take more
    # steps, alike within 2% (integrated's router scores the no-ops too);
    # staged MoDE's routed blocks run at 12.5%, so more steps still
    [ -n "$m" ] && (( m <= d && m * 10 >= d * 9 && i <= c && i * 50 >= c * 49 && i * 100 >= m * 115 && st > m )) ||
        { nominal=0; fail "$b $z: steps dense $d, moe $m, mode_integrated $i, moe_capped $c, mode_staged $st"; }
done; done
(( nominal )) && ok "MoE kinds at a balanced router's count: moe about dense's steps, mode_integrated and moe_capped alike and at least 15% more"
js() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1"; }
drop_moe=$(js k/runs/b5e10_32x2_moe/eval.json expert_drop)
drop_cap=$(js k/runs/b5e10_32x2_moe_capped/eval.json expert_drop)
[ -z "$(js k/runs/b5e10_32x2_dense/eval.json expert_drop)" ] && [ -n "$drop_moe" ] &&
    check_ab "$drop_cap" 0.5 "a >= b - 1e-6" && check_ab "$drop_moe" "$drop_cap" "a < b" &&
    ok "moe_capped drops at least half its slots ($drop_cap; moe $drop_moe)" ||
    fail "expert_drop: moe '$drop_moe', moe_capped '$drop_cap' (capacity_factor 0.5 drops at least half)"
# the no-op experts are columns of the router: d_model x 4 no-ops x n_layer
# parameters more than moe's
pd=$(awk -F, '$1 == "5e10" && $3 == 64 && $2 == "dense" { d = $5 } $1 == "5e10" && $3 == 64 && $2 == "moe" { m = $5 }
              $1 == "5e10" && $3 == 64 && $2 == "mode_integrated" { i = $5 } END { print d, m, i }' k/results.csv)
set -- $pd
[ "$(($3 - $2))" = $((64 * 4 * 2)) ] && (( $2 > $1 )) && ok "mode_integrated has 4 no-op experts (params: dense $1, moe $2, mode_integrated $3)" ||
    fail "params: dense $1, moe $2, mode_integrated $3 (want mode_integrated - moe = 64 x 4 x 2)"
for b in $budgets; do
    grep -q "^budget $b FLOPs: best dense .* best MoD .* steps [0-9.]*x as fast" k/summary.txt &&
    grep -q "^budget $b FLOPs, the best of each kind: dense [0-9x]* [0-9.]* (.*), mod .*, moe .*, mode_staged .*, mode_integrated .*, moe_capped [0-9x]* [0-9.]* ([0-9.]* ms a step)$" k/summary.txt ||
        fail "k/summary.txt has no best of each kind for budget $b"
done
n=$(grep -cE "^  the paper's order MoDE < MoE < dense: staged mode_staged [0-9.]+ < moe [0-9.]+ < dense [0-9.]+: (holds|fails \(.*\)); integrated mode_integrated [0-9.]+ < moe [0-9.]+ < dense [0-9.]+: (holds|fails \(.*\))$" k/summary.txt)
n2=$(grep -cE "^  the paper's order mode_integrated < moe_capped: mode_integrated [0-9.]+ < moe_capped [0-9.]+: (holds|fails \(.*\))$" k/summary.txt)
[ "$n" = 2 ] && [ "$n2" = 2 ] && grep -q "^FLOPs of the MoE kinds: .*balanced router" k/summary.txt &&
    ok "summary: the best of every kind, the order checks, the FLOP count's note" ||
    { cat k/summary.txt; fail "k/summary.txt lacks the order checks ($n, $n2) or the note"; }
for p in isoflop.png loss_vs_time.png; do
    [ -s "k/$p" ] && [ "$(head -c 4 "k/$p" | tail -c 3)" = PNG ] || fail "k/$p is not a PNG"
done
for kd in $all; do [ -s k/plot/5e10_$kd.dat ] || fail "k/plot/5e10_$kd.dat: $kd is not drawn"; done
fi
# the order checks on known losses: staged holds, integrated is not below
# moe, moe_capped is missing at 1e15; all hold at 2e15
mkdir -p ord
{ head -n 1 s/results.csv
  for r in "1e15 dense 3.0" "1e15 mod 2.9" "1e15 moe 2.8" "1e15 mode_staged 2.7" "1e15 mode_integrated 2.85" \
           "2e15 dense 3.0" "2e15 moe 2.8" "2e15 mode_staged 2.7" "2e15 mode_integrated 2.6" "2e15 moe_capped 2.9"; do
    set -- $r
    echo "$1,$2,64,2,100000,100,1000,$1,1,1,$3,$3,10,100,1,1,0"
  done; } > ord/results.csv
MODTRAIN=$MODTRAIN "$srcdir/jobs/isoflop.sh" --report ord > ord.log 2>&1 || { cat ord.log; fail "--report ord failed"; }
grep -qx "  the paper's order MoDE < MoE < dense: staged mode_staged 2.7000 < moe 2.8000 < dense 3.0000: holds; integrated mode_integrated 2.8500 < moe 2.8000 < dense 3.0000: fails (mode_integrated is not below moe)" ord/summary.txt &&
grep -qx "  the paper's order mode_integrated < moe_capped: n/a (no moe_capped run)" ord/summary.txt &&
grep -qx "  the paper's order mode_integrated < moe_capped: mode_integrated 2.6000 < moe_capped 2.9000: holds" ord/summary.txt &&
[ "$(grep -c ': holds; integrated .*: holds$' ord/summary.txt)" = 1 ] &&
    ok "the order checks answer rightly on known losses" || { cat ord/summary.txt; fail "the order checks are wrong on known losses"; }
mkdir -p badk
{ head -n 1 s/results.csv; echo "1e15,moe_tiny,64,2,100000,100,1000,1e15,1,1,2.5,2.5,10,100,1,1,0"; } > badk/results.csv
rc=0
MODTRAIN=$MODTRAIN "$srcdir/jobs/isoflop.sh" --report badk > bad.out 2> bad.err || rc=$?
[ "$rc" = 2 ] && [ "$(wc -l < bad.err)" = 1 ] && grep -q "line 2: kind = 'moe_tiny' is not dense, mod, moe, mode_staged, mode_integrated or moe_capped" bad.err &&
    [ ! -e badk/summary.txt ] && ok "--report refuses a bad kind: $(cat bad.err)" ||
    fail "--report of a bad kind: exit $rc, '$(cat bad.err)'"

# --- under mpirun: dp 2
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    MODTRAIN_MPIRUN_ARGS="--oversubscribe --bind-to none --mca btl self,vader" \
    isoflop_quick --out dp --np 2 --budgets 2e10 --sizes 32x2 > dp.log 2>&1 ||
    { cat dp.log; fail "the sweep under mpirun -np 2 failed"; }
one=$(awk -F, '$1 == "2e10" && $3 == 32 { print $2, $6, $8 }' s/results.csv)
two=$(awk -F, 'NR > 1 { print $2, $6, $8 }' dp/results.csv)
[ -n "$two" ] && [ "$one" = "$two" ] && ok "mpirun -np 2: the same steps and FLOPs" ||
    fail "mpirun -np 2 spent [$two], one rank [$one]"
grep -q "launched by mpirun -np 2" dp/sweep.log || fail "dp/sweep.log does not name its launcher"

# --- Llama blocks (--arch llama): dense and MoD runs of one budget, each a
# llama model that spends the budget at its own FLOPs per token (SwiGLU's
# three matrices a block), more than GPT-2's of the same size, so fewer steps
isoflop_quick --out ll --arch llama --budgets 2e10 --sizes 32x2 > ll.log 2>&1 ||
    { cat ll.log; fail "the llama sweep failed"; }
gpt=$(awk -F, '$1 == "2e10" && $3 == 32 { print $2 ":" $6 }' s/results.csv | tr '\n' ' ')
llama=$(awk -F, 'NR > 1 { print $2 ":" $6 }' ll/results.csv | tr '\n' ' ')
archs=$(for r in ll/runs/*/ckpt; do "$MODTRAIN" ckpt inspect --ckpt "$r" | awk '$1 == "config.arch" { print $2 }'; done | sort -u)
steps_ok=$(awk -F, 'NR > 1 { n++; if ($6 > 0 && $10 + 0 > 0.99 && $10 + 0 < 1.01) k++ } END { print (n == 2 && k == 2) }' ll/results.csv)
[ "$archs" = llama ] && [ "$steps_ok" = 1 ] && [ "$llama" != "$gpt" ] &&
    ok "--arch llama: llama runs spending their budget, steps $llama (GPT-2's: $gpt)" ||
    fail "--arch llama: archs '$archs', runs $llama (GPT-2's $gpt), $(cat ll/results.csv)"

# --- the routing dump
ck=s/runs/b5e10_64x2_mod/ckpt
"$MODTRAIN" eval --ckpt "$ck" --data data/val_000000.bin --seqs 8 --micro_batch 8 --json \
    --routing routing.tsv --routing_seqs 8 > eval.json || fail "eval --routing failed"
acc=$(sed -e 's/.*"predictor_accuracy":\([^,}]*\).*/\1/' eval.json)
awk -F'\t' -v acc="$acc" '
NR == 1 { match($0, /k [0-9]+/); k = substr($0, RSTART + 2, RLENGTH - 2) + 0; next }
NR == 2 { next }
{ key = $1 " " $3; r[key, $2] = $7; tk[key, $2] = $6; if (!(key in T)) keys[++nk] = key
  T[key] = $2 + 1; agree += ($6 == $9); n++
  if ($9 != ($7 > 0)) bad = bad " causal@" key "," $2 }
END {
    if (k != 8) { print "k = " k ", not round(0.125 x 64) = 8"; exit 1 }
    for (i = 1; i <= nk; i++) {
        key = keys[i]; c = 0
        for (t = 0; t < T[key]; t++) {
            # top-k by hand: t is chosen when fewer than k tokens beat it
            above = 0
            for (u = 0; u < T[key]; u++)
                above += r[key, u] > r[key, t] || (r[key, u] == r[key, t] && u < t)
            c += tk[key, t]
            if ((above < k) != tk[key, t]) bad = bad " topk@" key "," t
        }
        if (c != k) bad = bad " count@" key "=" c
    }
    if (nk != 8) bad = bad " sequences x blocks = " nk
    if (bad != "") { print "wrong:" substr(bad, 1, 300); exit 1 }
    d = agree / n - acc
    if (d > 1e-6 || d < -1e-6) { printf "agreement %.6f, eval says %s\n", agree / n, acc; exit 1 }
    printf "%d sequences x blocks, k = %d each, agreement %.6f = eval\n", nk, k, agree / n
}' routing.tsv > routing.check && ok "routing dump: $(cat routing.check)" ||
    fail "routing dump: $(cat routing.check)"
for bad in "--routing r2.tsv --vocab nowhere" "--routing nowhere/r.tsv"; do
    rc=0
    # shellcheck disable=SC2086
    "$MODTRAIN" eval --ckpt "$ck" --data data/val_000000.bin --seqs 8 $bad > bad.out 2> bad.err || rc=$?
    [ "$rc" = 2 ] && [ "$(wc -l < bad.err)" = 1 ] && [ ! -s bad.out ] && [ ! -e r2.tsv ] &&
        ok "eval $bad: refused before evaluating: $(cat bad.err)" || fail "eval $bad: exit $rc, '$(cat bad.err)'"
done
rc=0
"$MODTRAIN" eval --ckpt s/runs/b5e10_64x2_dense/ckpt --data data/val_000000.bin --seqs 8 \
    --routing r2.tsv > bad.out 2> bad.err || rc=$?
[ "$rc" = 2 ] && [ "$(wc -l < bad.err)" = 1 ] && grep -q "is a dense model (route_every = 0, n_expert = 0)" bad.err &&
    [ ! -s bad.out ] && [ ! -e r2.tsv ] && ok "eval --routing on a dense model: $(cat bad.err)" ||
    fail "eval --routing on a dense model: exit $rc, '$(cat bad.err)'"
"$srcdir/jobs/routing_plot.sh" routing.tsv rp > rp.log 2>&1 ||
    { cat rp.log; fail "routing_plot.sh failed"; }
[ "$(grep -c '^block 1: chose 64 of 512 tokens' rp.txt)" = 1 ] && [ -s rp.png ] &&
    ok "routing_plot.sh: table and heatmap" || { cat rp.txt; fail "routing_plot.sh's table is wrong"; }

# --- bad options
for bad in "--budgets 1e10x" "--sizes 64" "--sizes 48x2" "--capacity 0" "--np two" "--bogus 1" \
    "--kinds dense,bogus" "--kinds mod,mod" "--kinds ," "--expert_top_k 3" "--experts 0" "--capped_factor 0"; do
    rc=0
    # shellcheck disable=SC2086
    isoflop_quick --out bad $bad > bad.out 2> bad.err || rc=$?
    [ "$rc" = 2 ] && [ "$(wc -l < bad.err)" = 1 ] && ok "$bad: $(cat bad.err)" ||
        fail "$bad: exit $rc, '$(cat bad.err)'"
done
[ ! -d bad/runs ] || [ -z "$(ls bad/runs)" ] || fail "a refused sweep trained something"
exit $((failures > 0))
