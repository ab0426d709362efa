#!/bin/sh
# Llama blocks under every layout (Open MPI, oversubscribed, a tiny model:
# 4 blocks, 4 query heads over 2 kv heads, an untied head): a llama MoD
# model (every 2nd block routed) at tp 2 x dp 2 and at pp 2 x virtual
# stages 2, and a llama staged MoDE model (4 SwiGLU experts, top-2, in the
# routed blocks) at tp 2 x ep 2 with ZeRO-1 over dp 2, each train what one
# rank trains; a checkpoint saved under tp 2 loads exactly on one rank;
# recompute = attention (MoD) and block (MoDE) train bit for bit what
# recompute = none trains; evaluation and sampling under tp 2 give one
# rank's loss and text; a run resumed from its step 10 under tp 2 x dp 2
# ends bit for bit where the uninterrupted run did; and an n_kv_head that
# tp does not split is one line.
#   loss per step: |a - b| <= 2e-5 * |b|;  weights and moments: max |a - b| <= 2e-5
#   (layouts.sh's tolerance)
# The new code each case reaches:
#   tp 2:  q, k and v split apart (their unequal blocks, param_block), kv
#          heads split, gate|up column-parallel, the head's lm_head split
#          by vocabulary; the checkpoint's slices of those blocks
#   pp 2 x v 2: a first stage without the head, a last without the
#          embedding (an untied head on one stage, no copies to sum)
#   tp 2 x ep 2 + zero 1: SwiGLU experts split over tp (gate|up) and
#          dispatched over ep, ZeRO's cut at the embedding's range, dp
#          overlap's head segment (lm_head, ln_f without a bias, one bucket)
#   recompute: rotary positions and the kv heads' expansion again
#          (attention), the SwiGLU made once (block)
#   eval and sample under tp 2: the KV cache of a rank's kv heads
#   resume: the untied head's and the routers' AdamW moments restored
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --arch llama --n_layer 4 --n_kv_head 2 --micro_batch 4 --steps 20 --ckpt_every 10 --ckpt_keep 5 \
    --eval_every 10 --log_every 1000 --threads 1 --debug_checks 1 --peak_gflops 50 --resume never"
mod="--route_every 2 --capacity 0.25"
mode="$mod --n_expert 4 --expert_top_k 2 --capacity_factor 1 --moe_every 2"
reshard() { # RUN WHAT: RUN's step 10 loaded on one rank, saved again, exact
    train_ok "$1-one" 1 $2 --resume "$1/ckpt/step-00000010" --steps 10
    "$MODTRAIN" ckpt diff --a "$1/ckpt/step-00000010" --b "$1-one/ckpt/step-00000010" > diff.txt &&
        ok "$1's checkpoint loads on one rank: weights and moments exact" ||
        { cat diff.txt; fail "$1's checkpoint changed on one rank"; }
}

train_ok mod-1 1 $mod
train_ok mod-tp2dp2 4 --tp 2 $mod
same_run mod-1 mod-tp2dp2 "llama MoD (tp 2, dp 2)" 2e-5 20
reshard mod-tp2dp2 "$mod"
train_ok mod-pp2v2 2 --pp 2 --virtual_stages 2 $mod
same_run mod-1 mod-pp2v2 "llama MoD (pp 2, virtual stages 2)" 2e-5 20
train_ok mode-1 1 $mode
train_ok mode-tp2ep2z 4 --tp 2 --ep 2 --zero 1 $mode
same_run mode-1 mode-tp2ep2z "llama staged MoDE (tp 2, ep 2, zero 1, dp 2)" 2e-5 20
reshard mode-tp2ep2z "$mode"

# recompute: what a block keeps changes nothing (one rank, bit for bit)
train_ok mod-1-att 1 $mod --recompute attention
train_ok mode-1-blk 1 $mode --recompute block
for run in mod-1-att mode-1-blk; do
    ref=${run%-*}
    cmp -s "$ref/ckpt/step-00000020/data.bin" "$run/ckpt/step-00000020/data.bin" &&
        [ "$(losses "$ref")" = "$(losses "$run")" ] &&
        ok "$run (recompute ${run##*-}) = recompute none, bit for bit" || fail "$run differs from $ref"
done

# evaluation and sampling under tp 2 give what one rank gives (sampling's
# KV cache holds each rank's kv heads, rotated at each token's position)
"$MODTRAIN" eval --ckpt mod-1/ckpt --data data/val_000000.bin --seqs 16 --json > e1.json
"$MODTRAIN" sample --ckpt mod-1/ckpt --prompt "Q: " --tokens 40 --seed 5 --temperature 0.7 > s1.txt
$MPIRUN -np 2 "$MODTRAIN" eval --ckpt mod-1/ckpt --data data/val_000000.bin --seqs 16 --json > e2.json
$MPIRUN -np 2 "$MODTRAIN" sample --ckpt mod-1/ckpt --prompt "Q: " --tokens 40 --seed 5 --temperature 0.7 > s2.txt
a=$(last_json e1.json loss) b=$(last_json e2.json loss)
check_ab "$a" "$b" 'a - b < 1e-5 && b - a < 1e-5' && ok "eval of the llama MoD model under tp 2: loss $b as on one rank" ||
    fail "eval under tp 2: $(cat e2.json), one rank $(cat e1.json)"
cmp -s s1.txt s2.txt && ok "sampling the llama MoD model under tp 2: the same text" || fail "sampling under tp 2 differs"

# resume: step 10 of the tp 2 x dp 2 run, trained on to 20 under the same layout
train_ok mod-resumed 4 --tp 2 $mod --resume mod-tp2dp2/ckpt/step-00000010
cmp -s mod-tp2dp2/ckpt/step-00000020/data.bin mod-resumed/ckpt/step-00000020/data.bin &&
    [ "$(losses mod-tp2dp2 | tail -n 10)" = "$(losses mod-resumed)" ] &&
    ok "llama MoD (tp 2, dp 2) resumed at step 10: step 20's checkpoint and losses bit for bit" ||
    fail "llama MoD (tp 2, dp 2) resumed at step 10 drifted"

expect_train_error 4 "n_kv_head = 2 key and value heads do not split over tp = 4" --tp 4
finish
