#!/bin/sh
# Resuming reads on at the next unread sample: a run stopped at step 4 and
# resumed to step 8 (on 1 rank, under dp 2, tp 2 and pp 2, and with another
# batch_size) reads the same set of samples as an uninterrupted run (the
# metrics' "samples" tile [0, 64), the steps' data_hash sum to the same
# fingerprint); on the same layout it ends bitwise equal. A changed seed or
# dataset (a shard added, removed, rewritten, reordered) is refused with one
# line and exit 2 unless data_changed = continue. A blend reads each
# dataset in its weight's share (every prefix within 1 sample, every window
# within 2, across the schedule's period too) and validates each.
. "$(dirname "$0")/lib.sh"
set -f # the specs hold glob patterns: modtrain expands them, not the shell
[ -d "${FORTUNES_DIR:-/usr/share/games/fortunes}" ] || { echo "SKIP: no fortunes text"; exit 77; }
SHARDS="$PYTHON $srcdir/tests/scripts/make_shards.py"
cd "$TMP"
mkdir d b
for i in 0 1 2 3; do $SHARDS text d/train_$i.bin 20000 --skip $((i * 20000)); done
$SHARDS text d/val.bin 20000 --skip 100000
for i in 0 1; do $SHARDS text b/train_$i.bin 20000 --skip $((300000 + i * 20000)); done
$SHARDS text b/val.bin 20000 --skip 400000

common="--config $srcdir/jobs/tiny.conf --val_data d/val.bin --batch_size 8 --micro_batch 4 \
    --eval_every 0 --eval_seqs 4 --log_every 1000 --ckpt_every 0 --threads 1"
train_d() { # RUN_DIR NP [--key value ...]: trains on d/ unless told otherwise
    run=$1 np=$2
    shift 2
    train_ok "$run" "$np" --train_data "d/train_*.bin" "$@"
}
# samples RUN_DIR N: the run's steps 1..N (the last line of each), their
# "samples" tiling [0, total) without gap or repeat; prints the total and
# the sum of data_hash mod 2^64
samples() {
    "$PYTHON" - "$1/metrics.jsonl" "$2" <<'PY'
import json, sys
steps = {}
for l in open(sys.argv[1]):
    j = json.loads(l)
    if "samples" in j:
        steps[j["step"]] = j
n = int(sys.argv[2])
if sorted(steps) != list(range(1, n + 1)):
    sys.exit("steps %s, expected 1..%d" % (sorted(steps), n))
prev = 0
for s in range(1, n + 1):
    if steps[s]["samples"] <= prev:
        sys.exit("step %d ends at sample %d, after %d: a gap or a repeat" % (s, steps[s]["samples"], prev))
    prev = steps[s]["samples"]
print(prev, "%016x" % (sum(int(steps[s]["data_hash"], 16) for s in steps) % 2**64))
PY
}

train_d straight 1 --steps 8
ref=$(samples straight 8) || fail "straight run: $ref"
[ "${ref%% *}" = 64 ] && ok "straight run: 8 steps read samples [0, 64), fingerprint ${ref#* }" ||
    fail "straight run: $ref"

# stopped at step 4 on one rank, resumed to 8 on various layouts
# (MODTRAIN_SKIP_SLOW, the sanitizer pass: on 1 rank and under pp 2 only)
lays="one 1|dp2 2|tp2 2 --tp 2|pp2 2 --pp 2"
[ $slow = 1 ] || lays="one 1|pp2 2 --pp 2"
train_d base 1 --steps 4
IFS='|'
for lay in $lays; do
    unset IFS
    set -- $lay
    name=$1 np=$2
    shift 2
    cp -r base "$name"
    train_d "$name" "$np" --steps 8 "$@"
    got=$(samples "$name" 8) || true
    [ "$got" = "$ref" ] && ok "stopped at 4 on 1 rank, resumed to 8 ($name): samples [0, 64), the same fingerprint" ||
        fail "$name: resumed run read '$got', the straight run '$ref'"
done
# and the other way: stopped at 4 under dp 2, resumed to 8 on one rank
train_d base-dp2 2 --steps 4
cp -r base-dp2 from-dp2
train_d from-dp2 1 --steps 8
got=$(samples from-dp2 8) || true
[ "$got" = "$ref" ] && ok "stopped at 4 under dp 2, resumed to 8 on 1 rank: samples [0, 64), the same fingerprint" ||
    fail "from-dp2: resumed run read '$got', the straight run '$ref'"
cmp -s straight/ckpt/step-00000008/data.bin one/ckpt/step-00000008/data.bin &&
    ok "stopped and resumed on 1 rank: bitwise equal to the uninterrupted run" ||
    fail "stopped and resumed on 1 rank: data.bin differs from the uninterrupted run's"

# another batch_size on resume: 4 steps of 8, then 8 steps of 4
cp -r base rebatch
train_d rebatch 1 --steps 12 --batch_size 4 --micro_batch 4
got=$(samples rebatch 12) || true
[ "$got" = "$ref" ] && ok "4 steps of batch 8 + 8 of batch 4: samples [0, 64), the straight run's fingerprint" ||
    fail "batch 8 then 4: '$got', the straight run '$ref'"
grep '"step":12,' rebatch/metrics.jsonl | grep -q '"samples":64,' && ok "step 12 ends at sample 64" ||
    fail "rebatch: step 12 does not end at sample 64"

# refused: exit 2, one line naming the difference
refused_on_resume() { # NAME PATTERN SPEC [--key value ...]
    name=$1 pattern=$2 spec=$3
    shift 3
    rm -rf "r-$name"
    cp -r base "r-$name"
    set +e
    "$MODTRAIN" train $common --train_data "$spec" --run_dir "r-$name" --steps 8 "$@" > out.txt 2> err.txt
    rc=$?
    set -e
    if [ "$rc" -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] && grep -q -- "$pattern" err.txt &&
        [ ! -e "r-$name/ckpt/step-00000008" ]; then
        ok "$name refused: $(cat err.txt)"
    else
        cat out.txt err.txt
        fail "$name: exit $rc, expected 2 and one line /$pattern/"
    fi
}
refused_on_resume seed "seed = 7, but the checkpoint's run used seed = 1337" "d/train_*.bin" --seed 7
cp -r d added && $SHARDS text added/train_4.bin 20000 --skip 200000
refused_on_resume "a shard added" "has a shard 4, 'added/train_4.bin'" "added/train_*.bin"
cp -r d removed && rm removed/train_3.bin
refused_on_resume "a shard removed" "lacks the shard 'train_3.bin" "removed/train_*.bin"
cp -r d rewritten && $SHARDS text rewritten/train_2.bin 20000 --skip 500000
[ "$(stat -c %s rewritten/train_2.bin)" = "$(stat -c %s d/train_2.bin)" ] || fail "rewritten shard's size"
refused_on_resume "a shard rewritten" "shard 2 of dataset 0 is 'train_2.bin 20000 crc32:" "rewritten/train_*.bin"
cp -r d reordered && mv reordered/train_0.bin t && mv reordered/train_1.bin reordered/train_0.bin &&
    mv t reordered/train_1.bin
refused_on_resume "shards reordered" "shard 0 of dataset 0 is 'train_0.bin" "reordered/train_*.bin"
refused_on_resume "a blend for one dataset" "a blend of 1 datasets, this spec has 2" "0.5:d/train_*.bin,0.5:b/train_*.bin"

# data_changed = continue carries on over the new data
cp -r base cont
train_d cont 1 --steps 8 --train_data "added/train_*.bin" --data_changed continue
grep -q "resume: data_changed = continue: dataset 0 ('added/train_\*.bin') has a shard 4" cont.log &&
    [ -e cont/ckpt/step-00000008 ] && ok "data_changed = continue: carried on to step 8, logged" ||
    { cat cont.log; fail "data_changed = continue"; }
# the data a continued run read is what its checkpoints record from then on
train_d cont 1 --steps 9 --train_data "added/train_*.bin"
grep -q '"step":9,"samples":72,' cont/metrics.jsonl && ok "resumed on over the new data without data_changed" ||
    { cat cont.log; fail "resuming after data_changed = continue"; }
rm -rf r-back && cp -r cont r-back
set +e
"$MODTRAIN" train $common --train_data "d/train_*.bin" --run_dir r-back --steps 10 > out.txt 2> err.txt
rc=$?
set -e
[ "$rc" -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] && grep -q "lacks the shard 'train_4.bin" err.txt &&
    ok "and the old data is refused after it: $(cut -c1-100 err.txt)..." || { cat err.txt; fail "old data after continue: exit $rc"; }
cp -r base cont-seed
train_d cont-seed 1 --steps 8 --seed 7 --data_changed continue
grep -q "seed 7 replaces the checkpoint's 1337" cont-seed.log && [ -e cont-seed/ckpt/step-00000008 ] &&
    ok "data_changed = continue: a new seed, logged" || { cat cont-seed.log; fail "data_changed = continue, seed"; }

# a blend: each dataset's share, each validated
train_d blend 1 --steps 8 --train_data "0.7:d/train_*.bin,0.3:b/train_*.bin" \
    --val_data "0.5:d/val.bin,0.5:b/val.bin"
rm -rf r-reweigh && cp -r blend r-reweigh
set +e
"$MODTRAIN" train $common --train_data "0.6:d/train_*.bin,0.4:b/train_*.bin" --run_dir r-reweigh --steps 10 > out.txt 2> err.txt
rc=$?
set -e
[ "$rc" -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] && grep -q "dataset 0 ('d/train_\*.bin') is 'weight 0\.6 shards 4 tokens 80000' now but was 'weight 0\.7 shards" err.txt &&
    ok "a blend reweighed on resume refused: $(cut -c1-120 err.txt)..." || { cat err.txt; fail "reweighed blend: exit $rc"; }
"$PYTHON" - blend/metrics.jsonl <<'PY' && ok "blend 0.7/0.3: data_share within 1/64 of the weights at every step; val_loss_parts of 2" || fail "blend"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [j for j in lines if "data_share" in j]
vals = [j for j in lines if "val_loss_parts" in j]
assert len(steps) == 8, steps
for j in steps:
    a, b = j["data_share"]
    n = j["samples"]
    assert abs(a - 0.7) <= 1.0 / n + 1e-9 and abs(b - 0.3) <= 1.0 / n + 1e-9, j
print("data_share at step 8:", steps[-1]["data_share"])
assert len(vals) == 1 and len(vals[0]["val_loss_parts"]) == 2, vals
v = vals[0]
assert abs(0.5 * sum(v["val_loss_parts"]) - v["val_loss"]) < 1e-4, v
PY
# the blend's schedule: every prefix of the run within 1 sample of each
# dataset's share, every window within 2, also far into the run (past 2^20
# samples: many of these weights' exact periods, and one of a weight
# rounded to 2^-22), and each dataset's epochs whole there too
for i in 0 1 2 3 4; do $SHARDS text sched_$i.bin 3000 --skip $((i * 50000)); done
sched() { # SPEC FROM
    "$MODTRAIN" data --data "$1" --seq_len 64 --from "$2" --count 30000 > sched.txt
    "$PYTHON" - sched.txt "$1" "$2" <<'PY'
import json, sys
ws = [float(p.split(":")[0]) for p in sys.argv[2].split(",")]
ws = [w / sum(ws) for w in ws]
D = len(ws)
lines = [json.loads(l) for l in open(sys.argv[1])]
ds = [j["dataset"] for j in lines]
assert len(ds) == 30000
# each dataset's epochs (46 sequences a shard of 3000 tokens) seen whole
# read each sequence once: none repeated or skipped over the period's end
for k in range(D):
    ep = {}
    for j in lines:
        if j["dataset"] == k:
            ep.setdefault(j["epoch"], []).append(j["offset"])
    whole = sorted(ep)[1:-1]
    for e in whole:
        if sorted(ep[e]) != list(range(0, 46 * 64, 64)):
            sys.exit("%s: dataset %d's epoch %d reads %s" % (sys.argv[2], k, e, sorted(ep[e])))
c, pref, prefix = [0] * D, [[0] * D], 0
for n, d in enumerate(ds, 1):
    c[d] += 1
    pref.append(list(c))
    prefix = max(prefix, max(abs(c[k] - ws[k] * n) for k in range(D)))
window = 0
for N in (1, 7, 100, 1000, 10000):
    for s in range(0, len(ds) - N, max(1, N // 3)):
        window = max(window, max(abs(pref[s + N][k] - pref[s][k] - N * ws[k]) for k in range(D)))
if sys.argv[3] == "0" and prefix >= 1:
    sys.exit("%s: a prefix %.3f samples off its share" % (sys.argv[2], prefix))
if window >= 2:
    sys.exit("%s from %s: a window %.3f samples off its share" % (sys.argv[2], sys.argv[3], window))
print("%s from sample %s: prefixes within %.3f, windows within %.3f" % (sys.argv[2], sys.argv[3], prefix, window))
PY
}
for spec in "0.5:sched_0.bin,0.3:sched_1.bin,0.2:sched_2.bin" "0.001:sched_0.bin,0.999:sched_1.bin" \
    "1:sched_0.bin,1:sched_1.bin,1:sched_2.bin,1:sched_3.bin,3:sched_4.bin" \
    "0.37:sched_0.bin,0.21:sched_1.bin,0.13:sched_2.bin,0.17:sched_3.bin,0.12:sched_4.bin" \
    "0.123456789:sched_0.bin,0.3:sched_1.bin"; do
    out=$(sched "$spec" 0) && ok "$out" || fail "$out"
    out=$(sched "$spec" $((1048576 - 15000))) && ok "$out" || fail "$out"
done
finish
