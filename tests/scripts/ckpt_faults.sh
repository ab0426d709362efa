#!/bin/sh
# Checkpoints under faults: a truncated data file, a flipped byte, a missing,
# garbled or foreign index, a wrong data magic, a .tmp directory left by a
# crash and a `latest` pointing nowhere each give a clear error naming the
# file (and chunk), and resume = auto falls back to the newest checkpoint that
# loads; a process killed in the middle of a save (fault injection and a real
# kill -9) leaves the previous checkpoint intact and resumable; an unwritable
# directory and a full disk during a save are clear errors that keep older
# checkpoints; metrics.jsonl on a disk that fills mid-run costs the metrics,
# never the training. Resumed runs end bit for bit where an uninterrupted
# run ends. MODTRAIN_SKIP_SLOW=1 (the sanitizer pass and distcheck) checks
# every fault, but resumes past only three (an index that does not read,
# a .tmp and a `latest` naming nothing: resume passes over any other the
# same way, and verify and eval have found it), leaves out the injected
# crash mid-save (the base run's, resumed by the .tmp case, is one), kills
# the run that saves every step at step 5 rather than 20 and saves the
# unwritable ckpt_dir's run at steps 2 and 3 rather than 10 and 12.
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --eval_every 0 --log_every 1000 --ckpt_every 10 --ckpt_keep 5"
train_cmd() { "$MODTRAIN" train $common "$@"; } # output as the caller redirects it

train_cmd --steps 40 --run_dir ref > ref.log 2>&1 || { cat ref.log; fail "reference run"; finish; }
# base: the same run, killed while saving its last step (fault injection):
# checkpoints of steps 10, 20 and 30 of the 40-step run
set +e
MODTRAIN_FAULT=save-crash:40 train_cmd --steps 40 --run_dir base > base.log 2>&1
rc=$?
set -e
[ "$rc" -eq 137 ] || { cat base.log; fail "base run did not stop at its last save"; finish; }
"$MODTRAIN" ckpt list --ckpt base/ckpt > list.txt
cat list.txt
[ "$(grep -c verified list.txt)" -eq 3 ] && grep -q "latest -> step-00000030" list.txt &&
    grep -q "step-00000040.tmp .*incomplete" list.txt &&
    [ "$(grep -c " v2 h [1-9][0-9]*% r [1-9][0-9]*% *verified" list.txt)" -eq 3 ] &&
    ok "ckpt list: 3 verified checkpoints (format 2, their codec mix), latest step 30, an incomplete step 40" ||
    fail "ckpt list"

# expect_bad DIR PATTERN: verify fails and names the problem
expect_bad() {
    if "$MODTRAIN" ckpt verify --ckpt "$1" > v.txt 2>&1; then
        fail "verify accepted $1 ($2)"
    elif grep -q -- "$2" v.txt; then
        ok "$(cat v.txt)"
    else
        fail "verify of $1 said '$(cat v.txt)', expected /$2/"
    fi
}
# resumes DIR FROM: continuing to 40 steps skips the broken newest
# checkpoint, loads step FROM and ends equal to the uninterrupted run;
# resumes_all DIR FROM: the same, unless MODTRAIN_SKIP_SLOW
resumes_all() { [ $slow = 0 ] || resumes "$@"; }
resumes() {
    cp -r "$1" "$1.run"
    train_cmd --steps 40 --run_dir "$1.run" > "$1.log" 2>&1 || { cat "$1.log"; fail "$1: resume failed"; return; }
    grep -q "resume: loaded $1.run/ckpt/step-000000$2" "$1.log" &&
        cmp -s ref/ckpt/step-00000040/data.bin "$1.run/ckpt/step-00000040/data.bin" &&
        ok "$1: resume passed over what is broken, loaded step $2, ended bitwise equal to the uninterrupted run" ||
        { cat "$1.log"; fail "$1: resume did not fall back to step $2 and match"; }
}
breakcopy() { rm -rf "$1"; cp -r base "$1"; }

breakcopy trunc
truncate -s -100 trunc/ckpt/step-00000030/data.bin
expect_bad trunc/ckpt/step-00000030 "data.bin' is .* bytes, its index says"
resumes_all trunc 20

breakcopy flip
off=$(awk '$1 == "chunk" && $2 == "param/h.0.mlp.c_fc.weight" { print $10 + 5 }' flip/ckpt/step-00000030/index)
printf '\125' | dd of=flip/ckpt/step-00000030/data.bin bs=1 seek="$off" conv=notrunc 2> /dev/null
expect_bad flip/ckpt/step-00000030 "chunk param/h.0.mlp.c_fc.weight"
resumes_all flip 20

breakcopy noindex
rm noindex/ckpt/step-00000030/index
expect_bad noindex/ckpt/step-00000030 "cannot open 'noindex/ckpt/step-00000030/index'"
resumes_all noindex 20

breakcopy garbled
sed -i 's/^kv state.step 30$/kv state.step 31/' garbled/ckpt/step-00000030/index
expect_bad garbled/ckpt/step-00000030 "index' is garbled"
resumes garbled 20

breakcopy foreign
sed -i '1s/.*/some-other-format 2/' foreign/ckpt/step-00000030/index
expect_bad foreign/ckpt/step-00000030 "does not start with 'modtrain-checkpoint 2' or 'modtrain-checkpoint 1'"

breakcopy magic
printf 'XXXXXXXX' | dd of=magic/ckpt/step-00000030/data.bin bs=1 seek=0 conv=notrunc 2> /dev/null
expect_bad magic/ckpt/step-00000030 "data.bin' has the wrong magic"
resumes_all magic 20

# a .tmp directory left by a crash (base's own, plus junk) is listed as
# incomplete, ignored by resume and replaced by the next save of its step
breakcopy tmpdir
echo junk > tmpdir/ckpt/step-00000040.tmp/index
"$MODTRAIN" ckpt list --ckpt tmpdir/ckpt | grep -q "step-00000040.tmp .*incomplete" &&
    ok "ckpt list shows the .tmp directory as incomplete" || fail ".tmp listing"
resumes tmpdir 30

# a state.step that is no step (negative, non-numeric, nine digits) in an
# index whose CRC was made good again: a clear error for eval, passed over
# by resume = auto
for bad in -5 abc 123456789; do
    breakcopy "step$bad"
    "$PYTHON" - "step$bad/ckpt/step-00000030/index" "$bad" <<'PY'
import sys, zlib
path, value = sys.argv[1], sys.argv[2].encode()
lines = [l for l in open(path, "rb").read().split(b"\n")[:-1] if not l.startswith(b"end ")]
lines = [b"kv state.step " + value if l.startswith(b"kv state.step ") else l for l in lines]
text = b"".join(l + b"\n" for l in lines)
open(path, "wb").write(text + b"end %08x\n" % zlib.crc32(text))
PY
    set +e
    "$MODTRAIN" eval --ckpt "step$bad/ckpt/step-00000030" --data data/val_000000.bin > e.txt 2>&1
    rc=$?
    set -e
    [ "$rc" -eq 2 ] && [ "$(wc -l < e.txt)" -eq 1 ] && grep -q "has state.step = '$bad' (expected an integer in \[0, 99999999\])" e.txt &&
        ok "$(cat e.txt)" || { cat e.txt; fail "state.step = $bad accepted"; }
    resumes_all "step$bad" 20
done

# a checkpoint older than state.samples, whose cursor a resume computes as
# (state.step + state.batch_offset) x batch_size: a batch_offset of 2^50
# under batch_size 2^14 would wrap past 2^64 into sample 30 x 2^14 (the run
# asks for no more steps, so only the check can stop it)
breakcopy offset
edit_index offset/ckpt/step-00000030 '
lines = [l for l in lines if not l.startswith((b"kv state.samples ", b"kv state.data_cursor "))]
lines = [b"kv state.batch_offset 1125899906842624" if l.startswith(b"kv state.batch_offset ") else l for l in lines]'
set +e
train_cmd --steps 30 --batch_size 16384 --micro_batch 2 --run_dir offset > o.txt 2> oe.txt
rc=$?
set -e
[ "$rc" -eq 2 ] && [ "$(wc -l < oe.txt)" -eq 1 ] &&
    grep -q "state.step + state.batch_offset = 1125899906842654 batches of batch_size 16384 is more than 2^62 samples" oe.txt &&
    ok "$(cat oe.txt)" || { cat o.txt oe.txt; fail "batch_offset 2^50 x batch_size 2^14: exit $rc, not refused"; }

# chunk(NAME, i): the index of the i-th chunk line of tensor NAME
chunk='def chunk(name, i): return [k for k, l in enumerate(lines) if l.split(b" ")[:2] == [b"chunk", name]][i]'
qkv='b"param/h.0.attn.c_attn.weight"'
# c_attn is stored as 3 column blocks: the second stored twice in place of
# the third would cover as many elements as the tensor has
breakcopy twice
edit_index twice/ckpt/step-00000030 "$chunk
lines[chunk($qkv, 2)] = lines[chunk($qkv, 1)]"
expect_bad twice/ckpt/step-00000030 "chunks of param/h.0.attn.c_attn.weight overlap"
resumes_all twice 20
breakcopy gap
edit_index gap/ckpt/step-00000030 "$chunk
del lines[chunk($qkv, 2)]"
expect_bad gap/ckpt/step-00000030 "hold 8192 of its 12288 elements (a region is missing)"
# shapes and offsets that overflow 32- and 64-bit arithmetic, a negative
# ndim, a key twice: clear errors, and ckpt diff does not crash on them
for case in "cols 4294967296:4:a number is missing, malformed or out of range" \
    "ndim -1:2:a number is missing" \
    "offset 9223372036854775800:9:lies outside the data file"; do
    field=${case%%:*} rest=${case#*:}
    name=${field%% *} value=${field#* } col=${rest%%:*} pattern=${rest#*:}
    breakcopy "ovf$name"
    edit_index "ovf$name/ckpt/step-00000030" "$chunk
f = lines[chunk($qkv, 0)].split(b' '); f[$col] = b'$value'; lines[chunk($qkv, 0)] = b' '.join(f)"
    expect_bad "ovf$name/ckpt/step-00000030" "$pattern"
    set +e
    "$MODTRAIN" ckpt diff --a "ovf$name/ckpt/step-00000030" --b base/ckpt/step-00000030 > d.txt 2>&1
    rc=$?
    set -e
    [ "$rc" -eq 2 ] && grep -q -- "$pattern" d.txt && ok "ckpt diff of a $name overflow: exit 2" ||
        { cat d.txt; fail "ckpt diff of a $name overflow: rc $rc"; }
done
breakcopy dupkey
edit_index dupkey/ckpt/step-00000030 'lines.insert(3, lines[2])'
expect_bad dupkey/ckpt/step-00000030 "the key appears twice"
# the planes field of a version-2 chunk (under a valid CRC): sizes that do
# not add up, a raw plane of the wrong size, an unknown codec, a missing
# plane, and a deflated plane cut one byte short of its stream
wte='b"param/wte.weight"'
for case in "sum|a[3] = a[3][:1] + b'%d' % (int(a[3][1:]) + 1)|do not add up to the stored size" \
    "raw|a[0] = b'r7'|a raw plane is not a quarter" \
    "codec|a[0] = b'x' + a[0][1:]|a plane is not h or r" \
    "three|del a[3]|does not have 4 planes"; do
    name=${case%%|*} rest=${case#*|}
    code=${rest%%|*} pattern=${rest#*|}
    breakcopy "pl$name"
    edit_index "pl$name/ckpt/step-00000030" "$chunk
f = lines[chunk($wte, 0)].split(b' '); a = f[13].split(b','); $code
f[13] = b','.join(a); lines[chunk($wte, 0)] = b' '.join(f)"
    expect_bad "pl$name/ckpt/step-00000030" "$pattern"
done
breakcopy plstream
edit_index plstream/ckpt/step-00000030 "$chunk
f = lines[chunk($wte, 0)].split(b' '); a = f[13].split(b',')
k = [i for i, p in enumerate(a) if p[:1] == b'h'][0]
a[k] = b'h%d' % (int(a[k][1:]) - 1); f[10] = b'%d' % (int(f[10]) - 1)
f[13] = b','.join(a); lines[chunk($wte, 0)] = b' '.join(f)"
expect_bad plstream/ckpt/step-00000030 "chunk param/wte.weight .*does not inflate"

# a NaN among the weights under a valid CRC (the chunk stored again, the
# index's offset, sizes, planes and CRCs made good): verify names the tensor, eval
# refuses it, resume = auto passes over it
breakcopy nan
"$PYTHON" - nan/ckpt/step-00000030 <<'PY'
import struct, sys, zlib
d = sys.argv[1]
lines = [l for l in open(d + "/index", "rb").read().split(b"\n")[:-1] if not l.startswith(b"end ")]
data = bytearray(open(d + "/data.bin", "rb").read())
out = []
for l in lines:
    f = l.split(b" ")
    if f[0] == b"chunk" and f[1] == b"param/h.0.mlp.c_fc.weight":
        off, csize, usize = int(f[9]), int(f[10]), int(f[11])
        n, at, planes = usize // 4, off, b""
        for p in f[13].split(b","):  # each plane raw (r) or a zlib stream (h)
            size = int(p[1:])
            chunk = bytes(data[at:at + size])
            planes += chunk if p[:1] == b"r" else zlib.decompress(chunk)
            at += size
        raw = bytearray(usize)
        for b in range(4):
            raw[b::4] = planes[b * n:(b + 1) * n]
        raw[0:4] = struct.pack("<f", float("nan"))
        stored = b"".join(bytes(raw[b::4]) for b in range(4))  # every plane raw
        f[9], f[10], f[12] = b"%d" % len(data), b"%d" % len(stored), b"%08x" % zlib.crc32(bytes(raw))
        f[13] = b",".join(b"r%d" % n for _ in range(4))
        data += stored
        l = b" ".join(f)
    out.append(b"data data.bin %d" % len(data) if l.startswith(b"data ") else l)
out = [b"data data.bin %d" % len(data) if l.startswith(b"data ") else l for l in out]
text = b"".join(l + b"\n" for l in out)
open(d + "/data.bin", "wb").write(data)
open(d + "/index", "wb").write(text + b"end %08x\n" % zlib.crc32(text))
PY
expect_bad nan/ckpt/step-00000030 "chunk param/h.0.mlp.c_fc.weight .*: element 0 is nan"
set +e
"$MODTRAIN" eval --ckpt nan/ckpt/step-00000030 --data data/val_000000.bin > e.txt 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "element 0 is nan (weights and moments must be finite)" e.txt &&
    ok "eval: $(cat e.txt)" || { cat e.txt; fail "eval accepted NaN weights"; }
resumes_all nan 20

# latest pointing nowhere: a clear error for eval, ignored by resume = auto
breakcopy dangling
echo step-00000099 > dangling/ckpt/latest
set +e
"$MODTRAIN" eval --ckpt dangling/ckpt --data data/val_000000.bin > e.txt 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "latest' names 'step-00000099', which is not a checkpoint" e.txt &&
    ok "$(cat e.txt)" || { cat e.txt; fail "dangling latest"; }
resumes dangling 30

# every checkpoint broken: resume = auto refuses rather than starting over
breakcopy allbad
for d in allbad/ckpt/step-*; do truncate -s 100 "$d/data.bin"; done
set +e
train_cmd --steps 40 --run_dir allbad > allbad.log 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "none of the 3 checkpoints in 'allbad/ckpt' loads" allbad.log &&
    ok "no loadable checkpoint: $(tail -n 1 allbad.log)" || { cat allbad.log; fail "all broken"; }

# killed in the middle of a save (fault injection): the previous checkpoint stays
[ $slow = 0 ] || {
set +e
MODTRAIN_FAULT=save-crash:20 train_cmd --steps 40 --run_dir crash > crash.log 2>&1
rc=$?
set -e
[ "$rc" -eq 137 ] && [ -d crash/ckpt/step-00000020.tmp ] && [ ! -e crash/ckpt/step-00000020 ] &&
    grep -q step-00000010 crash/ckpt/latest && "$MODTRAIN" ckpt verify --ckpt crash/ckpt > /dev/null &&
    ok "a crash in the middle of saving step 20 left step 10 as latest, verified" ||
    { cat crash.log; ls crash/ckpt; fail "crash mid-save"; }
train_cmd --steps 40 --run_dir crash > crash2.log 2>&1
grep -q "resume: loaded crash/ckpt/step-00000010" crash2.log &&
    cmp -s ref/ckpt/step-00000040/data.bin crash/ckpt/step-00000040/data.bin &&
    [ ! -e crash/ckpt/step-00000020.tmp ] &&
    ok "resumed after the crash from step 10, ended bitwise equal" || { cat crash2.log; fail "resume after crash"; }
}

# a real kill -9 at an arbitrary moment of a run that saves every step
"$MODTRAIN" train $common --steps 100000 --ckpt_every 1 --ckpt_keep 3 --run_dir killed > killed.log 2>&1 &
pid=$!
i=0
at=killed/ckpt/step-00000020
[ $slow = 1 ] || at=killed/ckpt/step-00000005
while [ ! -e $at ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
kill -9 $pid
wait $pid 2> /dev/null || true
"$MODTRAIN" ckpt list --ckpt killed/ckpt > kl.txt 2>&1 || true
cat kl.txt
if grep -q BAD kl.txt; then fail "kill -9 left a damaged checkpoint"; else ok "kill -9: every committed checkpoint verifies"; fi
# resume = auto takes the newest checkpoint, not `latest`: a kill between the
# rename of step N into place and the update of `latest` leaves latest at N-1
last=$(sed -n 's/^step-0*\([0-9][0-9]*\) .*verified.*/\1/p' kl.txt | tail -n 1)
train_cmd --steps $((last + 2)) --ckpt_every 1 --ckpt_keep 3 --run_dir killed > killed2.log 2>&1 &&
    grep -q "resume: loaded killed/ckpt/step-.*(step $last)" killed2.log &&
    ok "resumed from step $last after kill -9" || { cat killed2.log; fail "resume after kill -9"; }

# an unwritable checkpoint directory (even root cannot create a directory
# under a regular file): periodic saves report it and training goes on; the
# final save fails the run
echo > afile
n=12 every=
[ $slow = 1 ] || n=3 every="--ckpt_every 2" # a periodic save and the final one
set +e
train_cmd --steps $n $every --ckpt_dir afile/ckpt --run_dir unwritable > unw.log 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "cannot create 'afile/ckpt'" unw.log &&
    [ "$(grep -c '"loss"' unwritable/metrics.jsonl)" -eq $n ] &&
    ok "unwritable ckpt_dir: $(grep -m 1 'cannot create' unw.log)" || { cat unw.log; fail "unwritable ckpt_dir"; }

# a full disk: a small tmpfs holds one checkpoint but not two
size=$(du -sk base/ckpt/step-00000030 | cut -f1)
mkdir full
if mount -t tmpfs -o size=$((size * 3 / 2))k tmpfs full 2> /dev/null; then
    mkdir full/ckpt
    cp -r base/ckpt/step-00000030 full/ckpt/
    echo step-00000030 > full/ckpt/latest
    before=$(md5sum full/ckpt/step-00000030/data.bin)
    set +e
    train_cmd --steps 32 --ckpt_every 0 --ckpt_dir full/ckpt --run_dir fullrun > full.log 2>&1
    rc=$?
    set -e
    after=$(md5sum full/ckpt/step-00000030/data.bin)
    [ "$rc" -eq 1 ] && grep -q "checkpoint of step 32 not saved; older ones untouched" full.log &&
        [ "$before" = "$after" ] && [ ! -e full/ckpt/step-00000032.tmp ] &&
        "$MODTRAIN" ckpt verify --ckpt full/ckpt > /dev/null &&
        ok "full disk: $(grep -m 1 'not saved' full.log)" || { cat full.log; ls -la full/ckpt; fail "full disk"; }
    umount full
else
    echo "note: cannot mount a tmpfs here; the full-disk case is skipped"
fi

# metrics.jsonl on a file system that fills mid-run: one warning, and the
# run trains on to the uninterrupted run's checkpoint (ckpt_dir elsewhere)
mkdir mfull
if mount -t tmpfs -o size=16k tmpfs mfull 2> /dev/null; then
    set +e
    train_cmd --steps 40 --ckpt_dir mfullck --run_dir mfull > mfull.log 2>&1
    rc=$?
    set -e
    logged=$(grep -c '"loss"' mfull/metrics.jsonl)
    [ "$rc" -eq 0 ] && [ "$(grep -c 'the run goes on without metrics.jsonl' mfull.log)" -eq 1 ] &&
        [ "$logged" -gt 0 ] && [ "$logged" -lt 40 ] &&
        same_ckpt ref/ckpt/step-00000040 mfullck/step-00000040 &&
        ok "metrics on a full disk after $logged steps: $(grep -m 1 '^modtrain: metrics' mfull.log | cut -c1-90)..." ||
        { cat mfull.log; fail "metrics.jsonl on a full disk (exit $rc, $logged steps logged)"; }
    umount mfull
fi
finish
