#!/bin/sh
# Interleaved 1F1B (virtual_stages) on real ranks (Open MPI, oversubscribed,
# an 8-block model, 8 micro-batches a step). Each chunk runs its
# micro-batches in order, so every gradient sums as under plain 1F1B:
# - dense and MoD, (pp 2, v 2), (pp 2, v 4) and (pp 4, v 2) train bit for
#   bit as plain 1F1B at the same pp (every loss, val_loss and the
#   checkpoints); so do (pp 2, v 2) with tp 2, with dp 2 (the overlapped
#   reduction), with zero 1, with recompute = block, with chunks of
#   unequal size (7 blocks; stage_layers 1,3,3,1); MoDE at ep 2 x dp 2;
# - a rank holds at most (pp - s - 1) * 2 + (v - 1) * pp + 1 micro-batch
#   chunks of activations (Megatron's warm-up and one more);
# - checkpoints reshard: step 6 of (pp 2, v 2) loads exactly under pp 1 and
#   under (pp 4, v 2), step 6 of plain pp 4 under (pp 2, v 2), and the
#   resumed runs' step 12 equals the uninterrupted run's;
# - layouts it cannot run are one-line errors.
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --n_layer 8 --micro_batch 2 --steps 12 --ckpt_every 6 --ckpt_keep 5 --eval_every 6 \
    --log_every 1000 --threads 1 --debug_checks 1 --peak_gflops 50 --resume never"
# every loss and val_loss of a run, in order
curve() { grep -o '"\(val_\)*loss":[^,}]*' "$1/metrics.jsonl"; }
same_curve() { # A B: the same curve and checkpoints, bit for bit
    [ "$(curve "$1" | wc -l)" -ge 14 ] && [ "$(curve "$1")" = "$(curve "$2")" ] &&
        "$MODTRAIN" ckpt diff --a "$1/ckpt" --b "$2/ckpt" > diff.txt
}
expect_same_curve() { # A B WHAT
    if same_curve "$1" "$2"; then ok "$3: bit for bit as $1"; else cat diff.txt; fail "$3 differs from $1"; fi
}

# MODTRAIN_SKIP_SLOW (the sanitizer pass, after a first pass of all of
# it): one pair, MoD at (pp 2, v 2) with tp 2 and recompute = block, in
# chunks of unequal size (stage_layers 1,3,3,1), against plain pp 2 with
# the same, in place of the pairs below; pp 4 is the reshard's, to
# (pp 4, v 2) alone and on to step 12 alone (pipeline.sh checks a load
# under pp 4 exactly); no MoDE and no 7 blocks (moe_layouts.sh,
# dp_overlap.sh and zero.sh run those paths under it); no error that
# another check already reaches (schedule gpipe is pp = 1's line;
# stage_layers' and the range's refusals are test_config's and
# cli_errors.sh's)
models="dense mod" vs="2 4" lays="tp dp zero recompute" pps="2 4" tp=1 both="" uneven=""
[ $slow = 1 ] || models=mod vs=2 lays="" pps=2 tp=2 both="--tp 2 --recompute block" \
    uneven="--stage_layers 1,3,3,1"
for model in $models; do
    extra=""
    [ "$model" = mod ] && extra="--route_every 2 --capacity 0.25"
    for pp in $pps; do
        train "$model-pp$pp" $((pp * tp)) --pp $pp $extra $both
        for v in $vs; do
            [ $((pp * v)) -le 8 ] || continue
            name="$model-pp$pp-v$v"
            train_ok "$name" $((pp * tp)) --pp $pp --virtual_stages $v $extra $both $uneven
            expect_same_curve "$model-pp$pp" "$name" \
                "$model (pp $pp, virtual_stages $v${both:+, $both}${uneven:+, $uneven})"
            grep -q "^layout dp=1 tp=$tp pp=$pp ($v chunks a rank)" "$name.log" ||
                fail "$name: the banner does not say the pipeline is interleaved"
            bound=$(((pp - 1) * 2 + (v - 1) * pp + 1))
            l=$(pp_live_max "$name")
            [ "$l" -le "$bound" ] && [ "$l" -gt "$(pp_live_max "$model-pp$pp")" ] &&
                ok "$model (pp $pp, v $v): at most $l chunks of activations in flight (bound $bound)" ||
                fail "$model (pp $pp, v $v): $l chunks in flight, bound $bound"
        done
    done
done
for key in $lays; do
    args="--pp 2 --route_every 2 --capacity 0.25"
    case $key in
    tp) np=4 val=2 args="$args --tp 2" ;;
    dp) np=4 val=2 ;;
    zero) np=4 val=1 args="$args --zero 1" ;;
    recompute) np=2 val=block args="$args --recompute block" ;;
    esac
    # plain pp 2 recomputing blocks trains mod-pp2's bits (recompute changes
    # no bit: pipeline.sh, test_recompute)
    plain=plain-$key
    [ "$key" = recompute ] && plain=mod-pp2 || train "$plain" $np $args
    train "v2-$key" $np $args --virtual_stages 2
    expect_same_curve "$plain" "v2-$key" "mod (pp 2, v 2, $key $val)"
done

# MoDE (MoE blocks beside routed ones) under ep 2 x dp 2: every rank of an
# expert group runs the same chunks' blocks in the same order
moe="--n_expert 4 --ep 2 --moe_every 2 --route_every 2 --capacity 0.5"
if [ $slow = 1 ]; then
    train_ok mode-pp2 4 --pp 2 $moe
    train_ok mode-pp2-v2 4 --pp 2 --virtual_stages 2 $moe
    expect_same_curve mode-pp2 mode-pp2-v2 "MoDE (pp 2, v 2, ep 2 x dp 2)"
fi

# chunks of unequal size share the sets: 7 blocks (2, 2, 2, 1), and
# stage_layers' counts per virtual stage
if [ $slow = 1 ]; then
    train_ok dense-l7 2 --pp 2 --n_layer 7
    train_ok dense-l7-v2 2 --pp 2 --n_layer 7 --virtual_stages 2
    expect_same_curve dense-l7 dense-l7-v2 "dense, 7 blocks (pp 2, v 2)"
fi
if [ $slow = 1 ]; then
    train_ok mod-pp2-v2-uneven 2 --pp 2 --virtual_stages 2 --stage_layers 1,3,3,1 --route_every 2 --capacity 0.25
    expect_same_curve mod-pp2 mod-pp2-v2-uneven "mod (pp 2, v 2), stage_layers 1,3,3,1"
fi

# resharding: (pp 2, v 2) -> pp 1 and (pp 4, v 2); plain pp 4 -> (pp 2, v 2)
reshard_interleaved() { # FROM NP NAME ARGS...: loaded and saved at once, then on to step 12
    src=$1 n=$2 dst=$3 how=""
    shift 3
    if [ $slow = 1 ]; then
        train_ok "$dst-6" "$n" --route_every 2 --capacity 0.25 --resume "$src/ckpt/step-00000006" --steps 6 "$@"
        "$MODTRAIN" ckpt diff --a "$src/ckpt/step-00000006" --b "$dst-6/ckpt/step-00000006" > diff.txt ||
            { cat diff.txt; fail "$src -> $dst: the state did not load exactly"; }
        how="loads exactly; "
    fi
    train_ok "$dst" "$n" --route_every 2 --capacity 0.25 --resume "$src/ckpt/step-00000006" "$@"
    "$MODTRAIN" ckpt diff --a "$src/ckpt/step-00000012" --b "$dst/ckpt/step-00000012" --tol 2e-5 > diff.txt &&
        ok "$src -> $dst: ${how}step 12 $(tail -n 1 diff.txt | sed 's/ckpt diff: //')" ||
        { cat diff.txt; fail "$src -> $dst: step 12 differs"; }
}
[ $slow = 0 ] || reshard_interleaved mod-pp2-v2 1 to-pp1
reshard_interleaved mod-pp2-v2 4 to-pp4-v2 --pp 4 --virtual_stages 2
[ $slow = 0 ] || reshard_interleaved mod-pp4 2 to-pp2-v2 --pp 2 --virtual_stages 2

expect_train_error 1 "virtual_stages = 2 interleaves a 1F1B pipeline, not pp = 1" --virtual_stages 2
[ $slow = 0 ] || expect_train_error 2 "not schedule gpipe" --pp 2 --virtual_stages 2 --schedule gpipe
expect_train_error 2 "pp = 2 x virtual_stages = 8 = 16 virtual stages cannot split n_layer = 8" --pp 2 --virtual_stages 8
expect_train_error 2 "each dp rank has 3 a step" --pp 2 --virtual_stages 2 --batch_size 6
if [ $slow = 1 ]; then
    expect_train_error 2 "stage_layers = '4,4' does not split n_layer = 8 over pp x virtual_stages = 4" \
        --pp 2 --virtual_stages 2 --stage_layers 4,4
    expect_train_error 2 "virtual_stages = 9" --pp 2 --virtual_stages 9
fi
finish
