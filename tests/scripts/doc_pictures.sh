#!/bin/bash
# The pictures the guide shows are today's, and show what they name. Every
# image a page embeds is drawn again from the data committed beside it
# (an isoFLOP sweep's plots by jobs/isoflop.sh --report from its
# results.csv; a routing heatmap by jobs/routing_plot.sh from the
# routing.tsv.gz, what eval --routing wrote) and must equal the committed file
# byte for byte, with no series gnuplot found empty ("no valid points");
# an embedded image with no such recipe fails. mod_experiment.sh's picture,
# drawn from two short real runs (dense and MoD), has all four of its
# curves: gnuplot skips none.
. "$(dirname "$0")/lib.sh"
command -v gnuplot > /dev/null || {
    echo "SKIP: no gnuplot (apt-get install gnuplot-nox)"
    exit 77
}
cd "$TMP"
# draw WHAT CMD...: run a drawing, its stderr in draw.err: no empty series
draw() {
    what=$1
    shift
    if ! "$@" > draw.out 2> draw.err; then
        cat draw.out draw.err
        fail "$what: drawing failed"
    elif grep -q -i "no valid points\|warning" draw.err; then
        fail "$what: gnuplot drew a series without points: $(grep -i -m 1 'no valid points\|warning' draw.err)"
    fi
}
# each image the pages embed, by its folder
images=$(cd "$srcdir/docs" && grep -h -o '!\[[^]]*\]([^)]*\.png)' ./*.md ../README.md 2> /dev/null |
    sed 's/.*(\(.*\))$/\1/' | sort -u)
[ -n "$images" ] || fail "no page embeds a picture"
for img in $images; do
    dir=$(dirname "$img") name=$(basename "$img")
    committed=$srcdir/docs/$img
    rm -rf redraw && mkdir redraw
    case $name in
    isoflop.png | loss_vs_time.png)
        cp "$srcdir/docs/$dir/results.csv" redraw/
        draw "$img" "$srcdir/jobs/isoflop.sh" --report redraw
        ;;
    routing.png)
        draw "$img" "$srcdir/jobs/routing_plot.sh" "$srcdir/docs/$dir/routing.tsv.gz" redraw/routing --seq 0
        cmp -s redraw/routing.txt "$srcdir/docs/$dir/routing.txt" ||
            fail "docs/$dir/routing.txt is not what routing_plot.sh writes from routing.tsv.gz today"
        ;;
    *)
        fail "docs/$img: no recipe draws it again (add one here)"
        continue
        ;;
    esac
    if cmp -s "redraw/$name" "$committed"; then
        ok "docs/$img is what its script draws today"
    else
        fail "docs/$img differs from what its script draws today from the data beside it"
    fi
done

# mod_experiment.sh's picture, from two short runs
prep_fortunes
for kind in dense mod; do
    re=0
    [ $kind = mod ] && re=2
    "$MODTRAIN" train --config "$srcdir/jobs/tiny.conf" --train_data data/train_000000.bin \
        --val_data data/val_000000.bin --seq_len 32 --steps 12 --eval_every 4 --eval_seqs 8 \
        --ckpt_every 0 --log_every 100 --route_every $re --run_dir "exp/$kind" > "$kind.log" 2>&1 ||
        { cat "$kind.log"; fail "the $kind run"; }
done
draw "mod_vs_dense.png" sh "$srcdir/tests/bench/mod_experiment.sh" --plot exp
[ -s exp/mod_vs_dense.png ] && [ "$(head -c 4 exp/mod_vs_dense.png | tail -c 3)" = PNG ] &&
    ok "mod_vs_dense.png: every curve it names has points" || fail "mod_vs_dense.png was not drawn"
finish
