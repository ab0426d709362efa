#!/bin/sh
# Per-phase step timers on real ranks: a single rank (with validation and
# synchronous saves), tp 2, pp 2 and dp 2. Every step's metrics line splits
# its interval into forward, backward, tp_comm, ep_comm, dp_comm, pp_wait, optimizer,
# ckpt_stall, eval, data and other; the phases sum to the interval, no measured
# phase is negative, and together they never claim more than the interval
# (other >= -2% of it: no time counted twice). A phase a layout cannot have
# is exactly 0 (no tp collective on one rank, no pipeline wait without
# stages), and the one it has is not (tp_comm under tp 2, pp_wait under
# pp 2, dp_comm's spread under dp 2); validation and synchronous saves
# land in the next step's eval and ckpt_stall; the table at the end of a
# run lists every phase and its shares add up to 100%; every step reads
# its data (the data phase is never 0).
. "$(dirname "$0")/../scripts/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --steps 8 --ckpt_every 3 --ckpt_async 0 --eval_every 4 --eval_seqs 16 --log_every 1000 \
    --threads 1 --peak_gflops 50 --resume never"
train_ok one 1
train_ok tp2 2 --tp 2
train_ok pp2 2 --pp 2
train_ok dp2 2
check_phases() { # NAME: the checks above; prints what it found
    "$PYTHON" - "$1" <<'PY'
import json, sys
name = sys.argv[1]
names = ["forward", "backward", "tp_comm", "ep_comm", "dp_comm", "pp_wait", "optimizer", "ckpt_stall", "eval", "data", "other"]
steps = [json.loads(l) for l in open(name + "/metrics.jsonl") if '"loss"' in l]
assert len(steps) == 8, len(steps)
for s in steps:
    ph, n = s["phase_ms"], s["interval_ms"]
    assert list(ph) == names, ph
    assert abs(sum(ph.values()) - n) <= 1e-3 * n + 0.01, (s["step"], ph, n)
    assert all(ph[k] >= 0 for k in names[:-1]), ph
    assert ph["other"] >= -0.02 * n, (s["step"], ph, n)
    for k, (lo, hi) in s["wait_ms"].items():
        assert 0 <= lo <= hi, (k, lo, hi)
tot = {k: sum(s["phase_ms"][k] for s in steps) for k in names}
after = lambda k: [s["step"] for s in steps if s["phase_ms"][k] > 0]
# validation after steps 4 and 8 (the last is after the line); saves after 3 and 6
assert after("eval") == [5], after("eval")
assert after("ckpt_stall") == [4, 7], after("ckpt_stall")
assert all(s["phase_ms"]["data"] > 0 for s in steps), [s["phase_ms"]["data"] for s in steps]
if name == "one":
    assert tot["tp_comm"] == 0 and tot["pp_wait"] == 0, tot
assert tot["ep_comm"] == 0, tot  # a dense model: no expert all-to-all
if name == "tp2":
    assert tot["tp_comm"] > 0 and tot["pp_wait"] == 0, tot
if name == "pp2":
    assert tot["pp_wait"] > 0 and tot["tp_comm"] == 0, tot
if name == "dp2":
    assert max(s["wait_ms"]["dp_comm"][1] for s in steps) > 0 and tot["tp_comm"] == 0, tot
print(" ".join("%s %.1f" % (k, v / len(steps)) for k, v in tot.items() if v))
PY
}
for name in one tp2 pp2 dp2; do
    [ -f "$name/metrics.jsonl" ] || continue
    if got=$(check_phases "$name" 2>&1); then ok "$name: ms per step: $got"; else fail "$name: $got"; fi
    share=$(sed -n '/^where the time went/,/^  other/p' "$name.log" | awk 'NR > 2 { s += $3 } END { print s }')
    rows=$(sed -n '/^where the time went/,/^  other/p' "$name.log" | wc -l)
    [ "$rows" -eq 13 ] && check_ab "$share" 100 'a > b - 0.6 && a < b + 0.6' &&
        ok "$name: the end-of-run table has the 11 phases, shares adding to $share%" ||
        fail "$name: the table: $(sed -n '/^where the time went/,/^  other/p' "$name.log")"
done
finish
