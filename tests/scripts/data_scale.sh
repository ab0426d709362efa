#!/bin/sh
# Datasets beyond 32-bit sizes, and many shards: three sparse shards of
# 2^31 - 1 tokens (4 GiB files each, no disk: truncate), 6.4e9 tokens in
# all. A sample chosen in the third shard (past token 2^32 of the dataset,
# past byte 2^31 of its file), and the one that reads the third shard's
# last sequence (past byte 2^32 of its file), read exactly the tokens
# planted there, both through `modtrain data --tokens` and in a training
# run resumed at that sample (MODTRAIN_DATA_TRACE); the peak RSS of a run on the 12 GiB dataset
# is that of a run on 1 MB (within 5%); 1,000 small shards open and train.
. "$(dirname "$0")/lib.sh"
set -f # the specs hold glob patterns: modtrain expands them, not the shell
[ -d "${FORTUNES_DIR:-/usr/share/games/fortunes}" ] || { echo "SKIP: no fortunes text"; exit 77; }
SHARDS="$PYTHON $srcdir/tests/scripts/make_shards.py"
PEAKRSS=${PEAKRSS:-$(dirname "$MODTRAIN")/tests/tools/peakrss}
cd "$TMP"
N=2147483647 # tokens a shard: the header's int32 count at its largest
mkdir big
for i in 1 2 3; do $SHARDS sparse big/big_$i.bin $N; done
size=$(stat -c %s big/big_3.bin)
[ "$size" -eq $((1024 + 2 * N)) ] && ok "three sparse shards of $N tokens, $size bytes each" ||
    fail "sparse shard is $size bytes"
BIG="$TMP/big/big_*.bin"
"$MODTRAIN" data --data "$BIG" --seq_len 64 --seed 1 > summary.txt
grep -q "3 shards, $((3 * N)) tokens, $((3 * ((N - 1) / 64))) sequences" summary.txt &&
    ok "summary: $(head -n 1 summary.txt | cut -c1-90)" || fail "summary: $(cat summary.txt)"

# the seed for which one of samples 16..23 (step 3 at batch 8) lies in the
# third shard past byte 2^31 of the file (token 2^32 of the dataset)
K=2
G=$((8 * K))
far='
import json, sys
N = 2147483647
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j["shard"].endswith("big_3.bin") and 1024 + 2 * j["offset"] > 2**31 and 2 * N + j["offset"] > 2**32:
        print(j["sample"], j["offset"])
        break
'
seed=""
for s in $(seq 1 200); do
    "$MODTRAIN" data --data "$BIG" --seq_len 64 --seed "$s" --from $G --count 8 > where.txt
    hit=$("$PYTHON" -c "$far" where.txt)
    if [ -n "$hit" ]; then
        seed=$s
        break
    fi
done
if [ -z "$seed" ]; then
    fail "no seed in 1..200 puts one of samples $G..$((G + 7)) past byte 2^31 of the third shard"
    finish
fi
set -- $hit
ok "seed $seed: sample $1 lies in big_3.bin at token $2 (byte $((1024 + 2 * $2)) of the file, token $((2 * N + $2)) of the dataset)"

# plant 65 distinct nonzero tokens at each of the 8 sequences
"$PYTHON" - where.txt > planted.txt <<'PY'
import array, json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    g = j["sample"]
    toks = array.array("H", [1 + (g * 37 + t * 5) % 255 for t in range(65)])
    with open(j["shard"], "r+b") as f:
        f.seek(1024 + 2 * j["offset"])
        f.write(toks.tobytes())
    print(json.dumps({"sample": g, "offset": j["offset"], "tokens": list(toks[:8])}))
PY
"$MODTRAIN" data --data "$BIG" --seq_len 64 --seed "$seed" --from $G --count 8 --tokens > read.txt
same='
import json, sys
def load(p, shard_index=False):
    out = []
    for l in open(p):
        j = json.loads(l)
        out.append((j["sample"], j["offset"], j["tokens"]))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
if a != b or len(a) != 8:
    print("differ:", a, b)
    sys.exit(1)
'
"$PYTHON" -c "$same" planted.txt read.txt && ok "modtrain data --tokens: the 8 planted windows, token for token" ||
    fail "modtrain data --tokens does not print the planted tokens"

# a run of K steps saved, then resumed for one step: it reads samples G..G+7
common="--config $srcdir/jobs/tiny.conf --train_data $BIG --val_data big/big_1.bin --vocab_size 256 \
    --batch_size 8 --micro_batch 8 --eval_every 0 --eval_seqs 8 --log_every 1000 --threads 1 --seed $seed"
"$MODTRAIN" train $common --steps $K --ckpt_every $K --run_dir run > run.log 2>&1 ||
    { cat run.log; fail "training $K steps on the 12 GiB dataset"; }
cp -r run far # saved at step K, for the resume past byte 2^32 below
MODTRAIN_DATA_TRACE="$TMP/trace" "$MODTRAIN" train $common --steps $((K + 1)) --ckpt_every $K \
    --resume auto --run_dir run > resumed.log 2>&1 || { cat resumed.log; fail "resuming at step $K"; }
if [ -f trace.0 ] && "$PYTHON" -c "$same" read.txt trace.0 &&
    "$PYTHON" - trace.0 read.txt <<'PY'; then
import json, sys
t = [json.loads(l) for l in open(sys.argv[1])]
d = [json.loads(l) for l in open(sys.argv[2])]
# the trace names the shard by its index in the glob's order
sys.exit(any(int(b["shard"][-5]) - 1 != a["shard"] or a["epoch"] != b["epoch"] for a, b in zip(t, d)))
PY
    ok "the resumed run read samples $G..$((G + 7)) exactly where and as modtrain data says"
else
    cat trace.0 2> /dev/null || true
    fail "the resumed run's reads differ from modtrain data's"
fi

# past byte 2^32 of its file: the last sequence of the third shard (token
# 2^31 - 128 of it, bytes 2^32 + 768 on). The sample that reads it is found
# by inverting the order (make_shards.py sample); modtrain data confirms it,
# and a checkpoint whose state.samples is edited to that sample's step
# resumes there.
nseq=$((3 * ((N - 1) / 64)))
last=$(((N - 1) / 64 * 64 - 64))
G=$($SHARDS sample "$seed" $nseq $((nseq - 1)))
G0=$((G - G % 8))
"$MODTRAIN" data --data "$BIG" --seq_len 64 --seed "$seed" --from "$G" --count 1 > last.txt
grep -q "big_3.bin\",\"offset\":$last," last.txt && [ $((1024 + 2 * last)) -gt 4294967296 ] &&
    ok "sample $G reads the third shard's last sequence, token $last, byte $((1024 + 2 * last)) > 2^32 of its file" ||
    fail "sample $G: $(cat last.txt), expected big_3.bin at token $last"
"$PYTHON" - big/big_3.bin $last <<'PY'
import array, sys
toks = array.array("H", [1 + (t * 11) % 255 for t in range(65)])
with open(sys.argv[1], "r+b") as f:
    f.seek(1024 + 2 * int(sys.argv[2]))
    f.write(toks.tobytes())
PY
want="[1,12,23,34,45,56,67,78]"
"$MODTRAIN" data --data "$BIG" --seq_len 64 --seed "$seed" --from $G0 --count 8 --tokens > far.txt
grep -q "\"sample\":$G,.*\"offset\":$last,.*\"tokens\":\\$want" far.txt &&
    ok "modtrain data --tokens: sample $G reads the tokens planted past byte 2^32" ||
    { cat far.txt; fail "modtrain data --tokens at sample $G"; }
edit_index far/ckpt/step-0000000$K "
lines = [l.split(b' ')[0] + b' ' + l.split(b' ')[1] + b' $G0' if l.startswith((b'kv state.samples ', b'kv state.data_cursor ')) else l for l in lines]"
MODTRAIN_DATA_TRACE="$TMP/far-trace" "$MODTRAIN" train $common --steps $((K + 1)) --ckpt_every $K \
    --resume auto --run_dir far > far.log 2>&1 || { cat far.log; fail "resuming at sample $G0"; }
if [ -f far-trace.0 ] && "$PYTHON" -c "$same" far.txt far-trace.0 &&
    grep -q "\"step\":$((K + 1)),\"samples\":$((G0 + 8))," far/metrics.jsonl; then
    ok "a run resumed at sample $G0 read samples $G0..$((G0 + 7)) as modtrain data says, $G past byte 2^32"
else
    cat far-trace.0 2> /dev/null || true
    fail "the run resumed at sample $G0 read otherwise"
fi

# peak RSS: 12 GiB of data costs what 1 MB does
$SHARDS text small.bin 500000
rss_run() { # NAME SPEC
    "$PEAKRSS" "$1.rss" "$MODTRAIN" train --config "$srcdir/jobs/tiny.conf" --train_data "$2" \
        --val_data small.bin --vocab_size 256 --batch_size 8 --micro_batch 8 --steps 4 --eval_every 0 \
        --eval_seqs 8 --ckpt_every 0 --log_every 1000 --threads 1 --run_dir "rss-$1" > "$1.log" 2>&1 ||
        { cat "$1.log"; fail "$1: training for the RSS figure"; }
}
rss_run big "$BIG"
rss_run small small.bin
a=$(cat big.rss) b=$(cat small.rss)
echo "peak RSS: 12 GiB dataset $a KiB, 1 MB dataset $b KiB"
check_ab "$a" "$b" 'a <= 1.05 * b && b <= 1.05 * a' && ok "peak RSS $a KiB on 12 GiB = $b KiB on 1 MB within 5%" ||
    fail "peak RSS $a KiB on 12 GiB vs $b KiB on 1 MB"

# an epoch is a permutation: shards of unequal sizes, some too short for a
# sequence (in the middle and at the end); two epochs of samples, each
# reading every sequence once, in another order the second time, and the
# tokens modtrain data prints are the file's at that offset
mkdir uneven
i=0
for n in 5000 10 64 65 3000 30; do
    $SHARDS text uneven/u_$i.bin $n --skip $((i * 9000))
    i=$((i + 1))
done
"$MODTRAIN" data --data "$TMP/uneven/u_*.bin" --seq_len 64 --seed 5 --from 0 --count 250 --tokens > epochs.txt
"$PYTHON" - epochs.txt <<'PY' && ok "uneven shards: 125 sequences, epochs 0 and 1 each read every one once, in two orders, the file's tokens" || fail "uneven shards: the epochs are not permutations"
import array, json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
seqs = set()
for f, n in ((0, 5000), (3, 65), (4, 3000)):
    seqs |= {("u_%d.bin" % f, o) for o in range(0, (n - 1) // 64 * 64, 64)}
assert len(seqs) == 125, len(seqs)
orders = []
for e in (0, 1):
    part = lines[125 * e:125 * (e + 1)]
    assert all(j["epoch"] == e for j in part), e
    got = [(j["shard"].rsplit("/", 1)[1], j["offset"]) for j in part]
    assert set(got) == seqs and len(got) == 125, e
    orders.append(got)
assert orders[0] != orders[1]
for j in lines:
    raw = open(j["shard"], "rb").read()[1024 + 2 * j["offset"]:1024 + 2 * j["offset"] + 16]
    assert list(array.array("H", raw)) == j["tokens"], j
PY

# 1,000 small shards
mkdir many
$SHARDS many many/s_ 1000 1000
t0=$(date +%s.%N)
"$MODTRAIN" data --data "$TMP/many/s_*.bin" --seq_len 64 --seed 1 > many.txt 2>&1
t1=$(date +%s.%N)
echo "modtrain data on 1,000 shards: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }') s"
grep -q "1000 shards, 1000000 tokens" many.txt && ok "1,000 shards: $(head -n 1 many.txt | cut -c1-60)" ||
    fail "1,000 shards: $(cat many.txt)"
# startup reads headers only: what the time above shows, counted in bytes
# (no timed assertion): under strace, every read of a shard is at most its
# 1 KiB header, one read a shard, and no shard is memory-mapped
if command -v strace > /dev/null; then
    strace -f -qq -y -e trace=read,pread64,readv,preadv,preadv2,mmap -e signal=none -o many.strace \
        "$MODTRAIN" data --data "$TMP/many/s_*.bin" --seq_len 64 --seed 1 > /dev/null 2>&1
    awk '/s_[0-9]+\.bin>/ { n++; if ($0 ~ /mmap\(/) m++; r = $NF + 0; if (r > 0) bytes += r; if (r > big) big = r }
         END { printf "%d %d %d %d\n", n, bytes, big, m }' many.strace > many.reads
    read -r nreads bytes big maps < many.reads
    [ "$nreads" -le 1000 ] && [ "$bytes" -le $((1000 * 1024)) ] && [ "$big" -le 1024 ] && [ "$maps" -eq 0 ] &&
        ok "startup on 1,000 shards of 2 KB of tokens each read $bytes bytes of them in $nreads reads (at most 1 KiB a read), mapped none" ||
        fail "startup read $bytes bytes of the shards in $nreads reads (largest $big), $maps maps: headers only expected"
else
    echo "note: no strace: the bytes startup reads are not counted"
fi
"$MODTRAIN" train --config "$srcdir/jobs/tiny.conf" --train_data "$TMP/many/s_*.bin" \
    --val_data "$TMP/many/s_00000*.bin" --batch_size 8 --micro_batch 8 --steps 1 --eval_seqs 8 \
    --ckpt_every 1 --log_every 1 --threads 1 --run_dir many-run > many-run.log 2>&1 &&
    [ "$(grep -c '"samples":8,' many-run/metrics.jsonl)" -eq 1 ] &&
    ok "1 step on 1,000 shards, saved" || { cat many-run.log; fail "training on 1,000 shards"; }
finish
