#!/bin/sh
# Errors under mpirun: `modtrain eval` and `modtrain sample` on two ranks
# print each error once (the lowest rank that found it), whole (no
# "modtrain: modtrain:"), the same line as one process prints; a layout
# that does not fit the ranks says which rank counts would. isoflop.sh --np
# as root without Open MPI's two variables shows mpirun's own reason.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader"
printf 'the quick brown fox jumps over the lazy dog\n%%\n%.0s' $(seq 1 400) > text.txt
"$MODTRAIN" prep --out data --doc-sep % text.txt > /dev/null
"$MODTRAIN" train --seq_len 16 --n_layer 2 --n_head 4 --d_model 16 --route_every 0 --batch_size 4 \
    --steps 1 --train_data data/train_000000.bin --val_data= --run_dir run --threads 1 > train.log 2>&1 ||
    { cat train.log; fail "training the checkpoint"; finish; }

# once NP PATTERN ARGS...: under mpirun -np NP, a non-zero exit and one
# error line (thread warnings aside) matching PATTERN; with NP 2, the line
# one process prints for the same arguments
once() {
    np=$1 pattern=$2
    shift 2
    set +e
    $MPIRUN -np "$np" "$MODTRAIN" "$@" > out.txt 2> err.txt
    rc=$?
    "$MODTRAIN" "$@" > /dev/null 2> one.txt
    set -e
    grep '^modtrain: ' err.txt | grep -v '^modtrain: warning: ' > lines.txt || true
    if [ "$rc" -ne 0 ] && [ "$(wc -l < lines.txt)" -eq 1 ] && grep -q -- "$pattern" lines.txt &&
        ! grep -q "modtrain: modtrain:" err.txt && { [ "$np" -ne 2 ] || cmp -s lines.txt one.txt; }; then
        ok "-np $np $1: $(cat lines.txt)"
    else
        cat err.txt
        fail "-np $np $*: exit $rc, $(wc -l < lines.txt) error lines (expected 1 matching /$pattern/; one process: $(cat one.txt))"
    fi
}
once 2 "ckpt: 'nowhere' is neither a checkpoint directory" eval --ckpt nowhere --data data/val_000000.bin
once 2 "eval: .*data.* required" eval --ckpt run/ckpt
once 2 "eval: unknown option .*bogus" eval --ckpt run/ckpt --data data/val_000000.bin --bogus 1
once 2 "data: .*missing.bin" eval --ckpt run/ckpt --data data/missing.bin
once 2 "sample: .*top.k.* is not an integer" sample --ckpt run/ckpt --top_k x
once 2 "ckpt: 'nowhere' is neither a checkpoint directory" sample --ckpt nowhere
once 3 "sample: --pp 2 does not divide the 3 ranks (run a multiple of 2 ranks, or choose --pp in {1, 3})" \
    sample --ckpt run/ckpt --pp 2
once 3 "ckpt: the model has n_head = 4, not divisible by tp = 3 (.*run 1, 2, 4 ranks with pp = 1)" \
    eval --ckpt run/ckpt --data data/val_000000.bin
once 3 "ckpt: the model's n_layer = 2 blocks cannot be split over pp = 3 stages (choose pp <= 2)" \
    sample --ckpt run/ckpt --pp 3

if [ "$(id -u)" -eq 0 ]; then
    set +e
    env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -u MODTRAIN_MPIRUN_ARGS \
        "$srcdir/jobs/isoflop.sh" --quick --np 2 --out iso --train data/train_000000.bin \
        --val data/val_000000.bin > iso.out 2> iso.err
    rc=$?
    set -e
    # mpirun's own first line, as mpirun prints it
    mine=$(env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM mpirun -np 2 true 2>&1 | grep -v '^-*$' | head -n 1 || true)
    [ "$rc" -eq 2 ] && [ -n "$mine" ] && grep -qF -- "$mine" iso.err && grep -q "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" iso.err &&
        [ ! -e iso/runs ] && ok "isoflop.sh --np 2 as root: $(cat iso.err)" ||
        fail "isoflop.sh --np 2 as root: exit $rc, '$(cat iso.err)', mpirun says '$mine'"
fi
finish
