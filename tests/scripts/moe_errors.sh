#!/bin/sh
# Hostile Mixture-of-Experts input: every bad combination of n_expert,
# n_noop_expert, expert_top_k, capacity_factor, moe_every, expert_d_ff and
# ep (on one process and under mpirun), an MoE checkpoint resumed or
# init_from'd as a dense model and the reverse, and an MoE checkpoint whose
# index was edited, end with exit 2 and one error line that names the key,
# before any work (no run directory is created). Resuming prints the
# mismatch and then the line every refused resume ends with ("cannot resume
# from ... (see above)"). eval and sample of an MoE checkpoint work.
# MODTRAIN_SKIP_SLOW (the sanitizer pass): one bad value per check of the
# code (a key out of its range, a number that is not one, each check of the
# keys against each other), two launches under mpirun (a layout's error, a
# config's), one resume and one init_from of the other kind of model (every
# model key is compared by the same loop), and one edit of the index per
# way it is refused (a tensor's shape, a missing tensor, a bad value); no
# dense checkpoint is trained.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader"
# expect_mpi_error NP PATTERN ARGS...: under mpirun, exit 2 and one error
# line (mpirun's own banner and thread warnings aside) matching PATTERN
expect_mpi_error() {
    np=$1 pattern=$2
    shift 2
    set +e
    timeout -k 10 120 $MPIRUN -np "$np" "$MODTRAIN" "$@" > out.txt 2> err.txt
    rc=$?
    set -e
    grep '^modtrain: ' err.txt | grep -v '^modtrain: warning: ' > lines.txt || true
    if [ "$rc" -eq 2 ] && [ "$(wc -l < lines.txt)" -eq 1 ] && grep -q -- "$pattern" lines.txt; then
        ok "-np $np: $(cat lines.txt)"
    else
        cat err.txt
        fail "-np $np $*: exit $rc, $(wc -l < lines.txt) error lines (expected 1 matching /$pattern/)"
    fi
}

printf 'the quick brown fox jumps over the lazy dog\n%%\n%.0s' $(seq 1 400) > text.txt
"$MODTRAIN" prep --out data --doc-sep % text.txt > /dev/null
T="--route_every 0 --train_data data/train_000000.bin --val_data data/val_000000.bin --run_dir run \
    --seq_len 16 --n_layer 2 --d_model 32 --threads 1 --eval_every 0 --log_every 1000"
E="$T --n_expert 4"

# the keys against each other
expect_error "n_expert = 4 experts do not split over ep = 3 ranks" "$MODTRAIN" train $E --ep 3
[ $slow = 0 ] || expect_error "n_expert = 6 experts do not split over ep = 4 ranks" "$MODTRAIN" train $T --n_expert 6 --ep 4
expect_error "expert_top_k = 2 is more than the n_expert = 1 experts" "$MODTRAIN" train $T --n_expert 1 --expert_top_k 2
expect_error "expert_top_k = 3 is out of range (expected an integer in \[1, 2\])" "$MODTRAIN" train $E --expert_top_k 3
[ $slow = 0 ] || expect_error "expert_top_k = 0 is out of range" "$MODTRAIN" train $E --expert_top_k 0
cf_out="0 -1 -0.5" cf_nan="nan inf -inf NaN 1e400 abc"
[ $slow = 1 ] || cf_out=0 cf_nan=nan
for cf in $cf_out; do
    expect_error "capacity_factor = $cf is out of range (expected a number in (0, " "$MODTRAIN" train $E --capacity_factor $cf
done
for cf in $cf_nan; do
    expect_error "capacity_factor = '$cf' is not a number" "$MODTRAIN" train $E --capacity_factor $cf
done
expect_error "n_noop_expert = 2 needs experts, and n_expert = 0" "$MODTRAIN" train $T --n_noop_expert 2
[ $slow = 0 ] || expect_error "ep = 2 needs experts, and n_expert = 0" "$MODTRAIN" train $T --ep 2
[ $slow = 0 ] || expect_error "ep = 0 is out of range" "$MODTRAIN" train $E --ep 0
[ $slow = 0 ] || expect_error "n_expert = -1 is out of range" "$MODTRAIN" train $T --n_expert -1
[ $slow = 0 ] || expect_error "n_expert = 4097 is out of range" "$MODTRAIN" train $T --n_expert 4097
expect_error "moe_every = 3 makes no block of n_layer = 2 an MoE block" "$MODTRAIN" train $E --moe_every 3
[ $slow = 0 ] || expect_error "moe_every = 0 is out of range" "$MODTRAIN" train $E --moe_every 0
[ $slow = 0 ] || expect_error "moe_aux_weight = -1 is out of range" "$MODTRAIN" train $E --moe_aux_weight -1
printf 'seq_len = 16\nn_expert = 4\nexpert_top_k = 2\ncapacity_factor = nan\n' > cf.conf
[ $slow = 0 ] || expect_error "capacity_factor = 'nan' is not a number" "$MODTRAIN" train --config cf.conf $T
printf 'n_experts = 4\n' > typo.conf
expect_error "unknown key 'n_experts' (did you mean 'n_expert'?)" "$MODTRAIN" train --config typo.conf $T

# ep against the ranks: ep must divide dp
expect_error "ep = 2 does not divide dp = 1" "$MODTRAIN" train $E --ep 2
if command -v mpirun > /dev/null; then
    [ $slow = 0 ] || expect_mpi_error 2 "ep = 2 does not divide dp = 1" train $E --ep 2 --tp 2
    # the ep it suggests also split the 4 experts (not ep 3 here)
    expect_mpi_error 3 "ep = 2 does not divide dp = 3 (.*choose ep in {1}, or run a multiple of ep x tp x pp = 2 ranks)" \
        train $E --ep 2 --batch_size 12 --micro_batch 4
    [ $slow = 0 ] || expect_mpi_error 3 "ep = 2 does not divide dp = 3 (.*choose ep in {1, 3}, " \
        train $T --n_expert 6 --ep 2 --batch_size 12 --micro_batch 4
    [ $slow = 0 ] || expect_mpi_error 4 "ep = 4 does not divide dp = 2" train $E --ep 4 --pp 2
    expect_mpi_error 2 "experts' width 33 (expert_d_ff) is not divisible by tp = 2" \
        train $E --tp 2 --expert_d_ff 33
fi
[ ! -e run ] && ok "no run directory was created by the refused runs" || fail "a refused run created run/"

# an MoE checkpoint and a dense one
"$MODTRAIN" train $E --expert_top_k 2 --capacity_factor 1 --steps 2 --run_dir moe > moe.log 2>&1 ||
    { cat moe.log; fail "training the MoE checkpoint"; }
[ $slow = 0 ] || "$MODTRAIN" train $T --steps 2 --run_dir dense > dense.log 2>&1 ||
    { cat dense.log; fail "training the dense checkpoint"; }
moe_opts="--n_expert 4 --expert_top_k 2 --capacity_factor 1"

# resumed or init_from'd as the other kind of model: refused, naming n_expert
expect_resume_error() { # PATTERN ARGS...: exit 2, the mismatch, then "cannot resume"
    pattern=$1
    shift
    set +e
    "$MODTRAIN" train $T --steps 4 "$@" > out.txt 2> err.txt
    rc=$?
    set -e
    if [ "$rc" -eq 2 ] && [ "$(wc -l < err.txt)" -eq 2 ] && head -n 1 err.txt | grep -q -- "$pattern" &&
        tail -n 1 err.txt | grep -q "resume: cannot resume from" && [ ! -e run ]; then
        ok "$(head -n 1 err.txt)"
    else
        fail "resume $*: exit $rc: $(cat err.txt)"
    fi
}
expect_resume_error "checkpoint 'moe/ckpt/step-00000002' has n_expert = 4 but this run has n_expert = 0" \
    --resume moe/ckpt
[ $slow = 0 ] || expect_resume_error "checkpoint 'dense/ckpt/step-00000002' has n_expert = 0 but this run has n_expert = 4" \
    --resume dense/ckpt $moe_opts
[ $slow = 0 ] || expect_resume_error "has expert_top_k = 2 but this run has expert_top_k = 1" --resume moe/ckpt --n_expert 4 \
    --capacity_factor 1
[ $slow = 0 ] || expect_resume_error "has n_noop_expert = 0 but this run has n_noop_expert = 1" --resume moe/ckpt $moe_opts \
    --n_noop_expert 1
expect_error "init_from: 'moe/ckpt/step-00000002' has n_expert = 4 but this run has n_expert = 0 (the model must be the source's: set n_expert = 4)" \
    "$MODTRAIN" train $T --steps 4 --init_from moe/ckpt
[ $slow = 0 ] || expect_error "init_from: 'dense/ckpt/step-00000002' has n_expert = 0 but this run has n_expert = 4 (the model must be the source's: set n_expert = 0)" \
    "$MODTRAIN" train $T --steps 4 --init_from dense/ckpt $moe_opts
[ ! -e run ] && ok "no run directory was created by the refused resumes" || fail "a refused resume created run/"

# an MoE checkpoint's index edited: refused with the key or tensor named
for sub in "n_expert 4|n_expert 8|tensor param/h.0.mlp.router.weight is \[32, 4\], this run expects \[32, 8\]" \
    "n_expert 4|n_expert 0|holds no tensor param/h.0.mlp.c_fc.weight" \
    "expert_top_k 2|expert_top_k 3|bad value for 'config.expert_top_k'" \
    "capacity_factor 1|capacity_factor nan|bad value for 'config.capacity_factor'" \
    "capacity_factor 1|capacity_factor 0|bad value for 'config.capacity_factor'" \
    "moe_every 1|moe_every 0|bad value for 'config.moe_every'" \
    "n_noop_expert 0|n_noop_expert -1|bad value for 'config.n_noop_expert'"; do
    [ $slow = 1 ] || case $sub in "n_expert 4|"* | "expert_top_k 2|"*) ;; *) continue ;; esac
    from=${sub%%|*} rest=${sub#*|}
    to=${rest%%|*} pattern=${rest#*|}
    rm -rf edited
    cp -r moe/ckpt/step-00000002 edited
    edit_index edited "lines = [l.replace(b'kv config.$from', b'kv config.$to') if l == b'kv config.$from' else l for l in lines]"
    grep -q "kv config.$to\$" edited/index || fail "the edit $from -> $to did not apply"
    expect_error "$pattern" "$MODTRAIN" eval --ckpt edited --data data/val_000000.bin --seqs 4
done
[ $slow = 0 ] || { # a missing tensor, as n_expert 0 above
    rm -rf edited
    cp -r moe/ckpt/step-00000002 edited
    edit_index edited "lines = [l for l in lines if b'experts.3.c_fc.weight' not in l]"
    expect_error "holds no tensor param/h.0.mlp.experts.3.c_fc.weight" "$MODTRAIN" eval --ckpt edited --data data/val_000000.bin
}

# eval and sample of an MoE checkpoint work
if "$MODTRAIN" eval --ckpt moe/ckpt --data data/val_000000.bin --seqs 8 --json > e.json 2> e.err &&
    grep -q '"moe_aux":' e.json && grep -q '"expert_drop":' e.json; then
    ok "eval of an MoE checkpoint: $(tail -n 1 e.json)"
else
    fail "eval of an MoE checkpoint: $(cat e.json e.err)"
fi
"$MODTRAIN" eval --ckpt moe/ckpt --data data/val_000000.bin --seqs 8 > e.txt 2>&1 &&
    ok "eval of an MoE checkpoint, text: $(tail -n 1 e.txt)" || fail "eval (text): $(cat e.txt)"
"$MODTRAIN" sample --ckpt moe/ckpt --prompt "the " --tokens 20 --seed 3 > s.txt 2> s.err && [ -s s.txt ] &&
    ok "sampling an MoE checkpoint" || fail "sample of an MoE checkpoint: $(cat s.err)"
"$MODTRAIN" ckpt inspect --ckpt moe/ckpt | grep -q "config.n_expert *4" &&
    ok "ckpt inspect shows n_expert" || fail "ckpt inspect lacks config.n_expert"
finish
