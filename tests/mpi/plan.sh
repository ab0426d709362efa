#!/bin/sh
# `modtrain plan` against real runs. `plan --calibrate` (2 ranks) writes a
# cluster file from this machine. A model whose state dominates the process
# baseline (d_model 512, 8 layers, vocabulary 50257: 51 M parameters) then
# trains under 1 rank and under tp 2, dp 2 and pp 2; for each, the plan's
# memory for every rank's stage is within 15% of that rank's measured peak
# RSS, and the tp, dp and pp bytes per step it predicts equal the ones the
# run counted (metrics.jsonl) exactly (dp's but for the embedding's rows,
# the step's distinct tokens: at most the plan's bound); so do a small Mixture-of-Depths
# model's under tp 2 and pp 2 (routed blocks all-reduce their k tokens
# only), and under tp 2 with recompute = block (each block's forward
# all-reduces again in its backward); an MoE model's candidates list ep layouts (the config's ep keeps
# its own), and its bytes under ep 2 and tp 2 are as counted, 2 steps each;
# and a llama MoD model's under tp 2 with recompute = attention.
# Bad cluster files and layouts are one-line errors. Under
# AddressSanitizer (its shadow memory, redzones and quarantine grow with
# every allocation) the memory figures are printed but not held to 15%.
# MODTRAIN_SKIP_SLOW=1 keeps the calibration, the plan-only checks and a
# run of each path the planner counts: MoD under pp 2 and under tp 2 with
# recompute = block, MoE under ep 2 and under tp 2 with recompute = block;
# it drops the dense model's runs (their memory, not held under the
# sanitizer; their bytes as the small models' layouts) and tp 2 without
# recompute, MoD's and MoE's (the same counts less the recompute's).
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
PEAKRSS=${PEAKRSS:-$(dirname "$MODTRAIN")/tests/tools/peakrss}
asan=0
ldd "$MODTRAIN" | grep -q libasan && asan=1
cd "$TMP"
$MPIRUN -np 2 "$MODTRAIN" plan --calibrate --out cluster.conf > cal.log 2>&1 ||
    { cat cal.log; fail "plan --calibrate"; finish; }
grep -q "^baseline_mib *= *[0-9]" cluster.conf && ok "$(cat cal.log)" || fail "calibrate wrote $(cat cluster.conf)"
cat > plan.conf <<CONF
n_layer = 8
n_head = 8
d_model = 512
seq_len = 64
vocab_size = 50257
route_every = 0
batch_size = 4
steps = 2
train_data = data/train_000000.bin
val_data = ""
ckpt_every = 0
log_every = 1000
resume = never
threads = 1
CONF
check_plan() { # NAME TP PP RANKS
    name=$1 tp=$2 pp=$3 n=$4
    "$MODTRAIN" plan --config plan.conf --cluster cluster.conf --layout "$tp,$pp,$n" > "$name.plan" 2>&1 ||
        { cat "$name.plan"; return 1; }
    timeout -k 10 300 $MPIRUN -np "$n" sh -c "exec '$PEAKRSS' '$name.rss.'\$OMPI_COMM_WORLD_RANK '$MODTRAIN' train \
        --config plan.conf --tp $tp --pp $pp --run_dir $name" > "$name.log" 2>&1 ||
        { cat "$name.log"; return 1; }
    "$PYTHON" - "$name" "$tp" "$n" "$asan" <<'PY'
import json, re, sys
name, tp, n, asan = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
plan = open(name + ".plan").read()
stage = [int(x) for x in re.findall(r"^stage \d+: (\d+) bytes per rank", plan, re.M)]
tpb, dpb, ppb = map(float, re.search(r"tp (\d+), dp (\d+), pp (\d+)", plan).groups())
last = [json.loads(l) for l in open(name + "/metrics.jsonl") if '"loss"' in l][-1]
out = []
for r in range(n):
    rss = int(open("%s.rss.%d" % (name, r)).read()) * 1024
    pp_rank = r // (n // len(stage))  # ranks are tp fastest, then dp, then pp
    want = stage[pp_rank]
    err = (want - rss) / rss
    out.append("rank %d %.0f MiB planned %.0f (%+.1f%%)" % (r, rss / 2**20, want / 2**20, 100 * err))
    assert asan or abs(err) <= 0.15, out
got = (last["tp_bytes"], last["dp_bytes"], last["pp_bytes"])
m = re.search(r"the embedding's rows at most (\d+)", plan)
rows = float(m.group(1)) if m else 0.0
# the embedding's rows are the step's distinct tokens: at most the bound
assert got[0] == tpb and got[2] == ppb and dpb - rows <= got[1] <= dpb, (got, (tpb, dpb, ppb), rows)
out.append("tp %d, dp %d, pp %d bytes per step, as counted" % got)
if rows:
    out.append("(dp: the embedding's rows %d bytes of at most %d planned)" % (got[1] - (dpb - rows), rows))
if asan:
    out.append("memory not held to 15% under AddressSanitizer")
print("; ".join(out))
PY
}
# WANT GOT ROWS ("tp dp pp" bytes each): tp and pp as planned, dp too but
# for the embedding's rows (the step's distinct tokens), at most ROWS
bytes_as_planned() {
    echo "$1 $2 $3" | awk '{ exit !($1 == $4 && $3 == $6 && $5 <= $2 && $5 >= $2 - $7) }'
}
[ $slow = 0 ] || for lay in "one 1 1 1" "tp2 2 1 2" "dp2 1 1 2" "pp2 1 2 2"; do
    set -- $lay
    if got=$(check_plan "$@" 2>&1); then ok "$1: $got"; else fail "$1: $got"; fi
done
sed -e 's/^n_layer = 8/n_layer = 4/' -e 's/^d_model = 512/d_model = 64/' -e 's/^vocab_size = 50257/vocab_size = 300/' \
    -e 's/^route_every = 0/route_every = 2\ncapacity = 0.25/' -e 's/^seq_len = 64/seq_len = 32\nmicro_batch = 2/' plan.conf > mod.conf
# (llama.conf: the same on Llama blocks, 2 kv heads of 8, an untied head)
printf 'arch = llama\nn_kv_head = 2\n' | cat mod.conf - > llama.conf
for lay in "mod 2 1 none" "mod 1 2 none" "mod 2 1 block" "llama 2 1 attention"; do
    set -- $lay
    [ $slow = 1 ] || [ "$1 $2 $4" != "mod 2 none" ] || continue # (tp 2 under block)
    conf=$1.conf name=$1-$2-$3-$4
    shift
    "$MODTRAIN" plan --config "$conf" --cluster cluster.conf --layout "$1,$2,2" --recompute "$3" > "$name.plan" 2>&1 &&
        timeout -k 10 300 $MPIRUN -np 2 "$MODTRAIN" train --config "$conf" --tp "$1" --pp "$2" --recompute "$3" \
            --run_dir "$name" > "$name.log" 2>&1 || { cat "$name.plan" "$name.log"; fail "$name"; continue; }
    want=$(sed -n 's/^bytes per step of the busiest rank: tp \([0-9]*\), dp \([0-9]*\), pp \([0-9]*\).*/\1 \2 \3/p' "$name.plan")
    rows=$(sed -n "s/.*the embedding's rows at most \([0-9]*\) of it.*/\1/p" "$name.plan")
    got=$(grep '"loss"' "$name/metrics.jsonl" | tail -n 1 |
        sed 's/.*"tp_bytes":\([0-9]*\),"dp_bytes":\([0-9]*\),"pp_bytes":\([0-9]*\).*/\1 \2 \3/')
    [ -n "$want" ] && bytes_as_planned "$want" "$got" "${rows:-0}" && ok "$conf MoD, tp $1, pp $2, recompute $3: tp, dp, pp bytes per step $got, as planned" ||
        fail "$conf MoD, tp $1, pp $2, recompute $3: planned '$want', counted '$got'"
done

# Mixture-of-Experts: the candidates of an MoE config list ep layouts; the
# plan of ep 2 (dp 2) and of tp 2 (also with recompute = block) holds its
# tp, dp and pp bytes to the run's count (capacity_factor 4 = n_expert / expert_top_k: no slot dropped, as
# the plan assumes), and each trains 2 steps. The model is small (the
# baseline dominates its RSS, as the MoD model's), so its memory is printed,
# not held to 15%: test_plan holds it to model_memory and model_init.
sed -e 's/^route_every = 2/route_every = 0/' mod.conf > moe.conf
printf 'n_expert = 4\nexpert_top_k = 1\ncapacity_factor = 4\nmoe_every = 2\n' >> moe.conf
printf 'nodes = 1\ncores_per_node = 2\n' > two.conf
"$MODTRAIN" plan --config moe.conf --cluster two.conf --top 100 > moe-all.plan 2>&1 &&
    grep -q "^ tp  pp   dp  ep  rpn" moe-all.plan && grep -Eq '^  1   1    2   2 ' moe-all.plan &&
    grep -Eq '^  1   1    2   1 ' moe-all.plan && ok "MoE candidates list ep 1 and ep 2 layouts" ||
    { cat moe-all.plan; fail "MoE candidates without ep layouts"; }
"$MODTRAIN" plan --config moe.conf --cluster two.conf --ep 2 --top 100 > moe-ep2.plan 2>&1 &&
    ! grep -Eq '^ +[0-9]+ +[0-9]+ +[0-9]+ +1 ' moe-ep2.plan && grep -Eq '^  1   1    2   2 ' moe-ep2.plan &&
    ok "the config's ep 2 keeps the ep 2 layouts only" || { cat moe-ep2.plan; fail "--ep 2 did not restrict"; }
for lay in "moe-ep2 1 1 2 --ep 2" "moe-tp2 2 1 2 --ep 1" "moe-tp2-block 2 1 2 --ep 1 --recompute block"; do
    set -- $lay
    [ $slow = 1 ] || [ "$1" != moe-tp2 ] || continue # (tp 2 under block)
    name=$1 tp=$2 pp=$3 n=$4
    shift 4
    "$MODTRAIN" plan --config moe.conf --cluster cluster.conf --layout "$tp,$pp,$n" "$@" > "$name.plan" 2>&1 &&
        timeout -k 10 300 $MPIRUN -np "$n" sh -c "exec '$PEAKRSS' '$name.rss.'\$OMPI_COMM_WORLD_RANK '$MODTRAIN' train \
            --config moe.conf --tp $tp --pp $pp $* --run_dir $name" > "$name.log" 2>&1 ||
        { cat "$name.plan" "$name.log"; fail "$name"; continue; }
    want=$(sed -n 's/^bytes per step of the busiest rank: tp \([0-9]*\), dp \([0-9]*\), pp \([0-9]*\).*/\1 \2 \3/p' "$name.plan")
    steps=$(grep -c '"loss"' "$name/metrics.jsonl")
    got=$(grep '"loss"' "$name/metrics.jsonl" | tail -n 1 |
        sed 's/.*"tp_bytes":\([0-9]*\),"dp_bytes":\([0-9]*\),"pp_bytes":\([0-9]*\).*/\1 \2 \3/')
    planned=$(sed -n 's/^stage 0: \([0-9]*\) bytes per rank$/\1/p' "$name.plan")
    mem=$("$PYTHON" -c "import sys; p=int(sys.argv[1]); r=[int(open(sys.argv[2]+'.rss.%d'%i).read())*1024 for i in range(int(sys.argv[3]))]; e=[(p-x)/x for x in r]; print(' '.join('%+.1f%%' % (100*x) for x in e))" "$planned" "$name" "$n")
    rows=$(sed -n "s/.*the embedding's rows at most \([0-9]*\) of it.*/\1/p" "$name.plan")
    [ -n "$want" ] && bytes_as_planned "$want" "$got" "${rows:-0}" && [ "$steps" -ge 2 ] &&
        ok "MoE $name: $steps steps, tp, dp, pp bytes per step $got, as planned; memory planned against peak RSS $mem" ||
        fail "MoE $name: planned '$want', counted '$got', $steps steps, memory $mem"
done

printf 'nodes = 2\ncores_per_node = x\n' > bad.conf
out=$("$MODTRAIN" plan --config plan.conf --cluster bad.conf 2>&1) && fail "a bad cluster file was accepted" ||
    { [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && printf '%s' "$out" | grep -q "bad.conf:2: cores_per_node = 'x' is not an integer" &&
        ok "$out" || fail "bad cluster file: $out"; }
out=$("$MODTRAIN" plan --config plan.conf --cluster cluster.conf --layout 3,1,2 2>&1) && fail "tp 3 was accepted" ||
    { printf '%s' "$out" | grep -q "tp 3 x pp 1 does not divide 2 ranks" && ok "$out" || fail "tp 3: $out"; }
finish
