#!/bin/sh
# Parity with an independent implementation: PyTorch (Debian's python3-torch)
# loads modtrain's safetensors export, computes the loss and every gradient
# on the same batch, and they must match modtrain's:
#   loss:      |a - b| <= 1e-5 * |b|
#   gradients: max |a - b| <= 1e-4 * max |b| per tensor (fp32, different
#              summation orders; a wrong gradient is off by O(1))
# for the dense model, and for Mixture-of-Depths models (raw gate with the
# router's BCE; sigmoid gate with the predictor) under top-k and causal routing.
. "$(dirname "$0")/lib.sh"
if ! "$PYTHON" -c "import torch" 2> /dev/null; then
    echo "SKIP: $PYTHON cannot import torch (apt-get install python3-torch)"
    exit 77
fi
prep_fortunes
cd "$TMP"
check() { # NAME ROUTING [--key value ...]
    name=$1
    routing=$2
    shift 2
    if [ ! -d "$name" ]; then
        # train a little first so that the weights are no longer at their init
        "$MODTRAIN" train --config "$srcdir/jobs/tiny.conf" --train_data data/train_000000.bin \
            --val_data data/val_000000.bin --steps 30 --seq_len 32 --eval_every 0 --run_dir "$name" \
            "$@" > "$name.log" 2>&1 || { cat "$name.log"; fail "$name: training failed"; return; }
        "$MODTRAIN" ckpt export --ckpt "$name/ckpt" --format safetensors --out "$name.safetensors" > /dev/null
    fi
    "$MODTRAIN" eval --ckpt "$name/ckpt" --data data/val_000000.bin --seqs 6 --micro-batch 3 \
        --grads "$name-$routing.grads" --grads_routing "$routing" --aux-weight 0.5 --json > "$name-$routing.json"
    cat "$name-$routing.json"
    if [ "$routing" = causal ]; then
        # a causal test needs tokens that go through the routed block and tokens that skip it
        frac=$(sed -e 's/.*"processed_causal":\[\([0-9.]*\).*/\1/' "$name-$routing.json")
        awk -v f="$frac" 'BEGIN { exit !(f > 0.05 && f < 0.95) }' ||
            fail "$name: causal routing processed a fraction $frac of the tokens, not a mix"
    fi
    if PYTHONPATH="$srcdir/tests/scripts" "$PYTHON" "$srcdir/tests/scripts/torch_parity.py" \
        "$name.safetensors" "$name-$routing.grads" data/val_000000.bin "$name-$routing.json" "$routing" 0.5; then
        ok "$name, $routing routing: loss and all gradients match PyTorch"
    else
        fail "$name, $routing routing: modtrain and PyTorch disagree"
    fi
}
check dense topk --route_every 0
check mod topk --route_every 2 --capacity 0.5 --aux_weight 1 --steps 60
check mod causal
# the predictor needs 200 steps before it sends a mix of the validation tokens
# through the routed block (at 60 it sends none)
check modpred topk --route_every 2 --capacity 0.5 --aux_weight 1 --steps 200 --router_gate sigmoid --causal_router predictor \
    --predictor_hidden 16
check modpred causal
finish
