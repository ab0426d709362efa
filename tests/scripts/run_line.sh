#!/bin/sh
# A run's line: resume = auto and a rollback take this run's own state, and
# never another run's checkpoints in the same ckpt_dir.
# - rollback after a resume from another ckpt_dir returns to the checkpoint
#   loaded (its weights and moments bit for bit), not to the seed's init;
# - resume = never over an older run's ckpt_dir moves its checkpoints to
#   abandoned/; a rollback then returns to this run's own step, and a crash
#   relaunched with resume = auto resumes this run, both ending equal to an
#   uninterrupted run in a clean ckpt_dir;
# - a rollback whose checkpoint no longer holds a step of this launch's
#   (swapped mid-run) stops rather than train from it;
# - a newer step-N of this run that `latest` does not name yet (a save
#   killed before it) is resumed; another run's is never loaded, counted,
#   pruned or replaced;
# - a run with watchdog_s > 0 ends normally (the watchdog thread is joined,
#   not cancelled: the sanitizer pass runs this to its end), and a rollback
#   whose reload is slow (MODTRAIN_FAULT's stall) counts it as progress.
# MODTRAIN_SKIP_SLOW=1 (the sanitizer pass and distcheck) leaves out case
# 3 (resume = never as in 2, then a relaunch as in 4; its reference stays,
# for 4) and case 5 (the slow reload's run is one with watchdog_s that
# ends normally), counts 6's chunks on case 1's step 4, and has 7's NaN at
# step 150 rather than 300 (time enough to swap the checkpoint still).
. "$(dirname "$0")/lib.sh"
prep_fortunes
cd "$TMP"
common="--config $srcdir/jobs/tiny.conf --train_data data/train_000000.bin --val_data data/val_000000.bin \
    --threads 1 --eval_every 0 --micro_batch 8 --ckpt_keep 5 --log_every 1000 --peak_gflops 50"
same_data() { cmp -s "$(step_dir "$1" "$2")/data.bin" "$(step_dir "$3" "$4")/data.bin"; }
index_key() { sed -n "s/^kv $2 //p" "$1/index"; }

# 1. resumed from another ckpt_dir, then a NaN: back to the checkpoint loaded
train A --steps 12 --ckpt_every 4
MODTRAIN_FAULT=nan-batch:5 train B --steps 12 --ckpt_every 100 --ckpt_async 0 \
    --resume "$(step_dir A 4)" --on_nonfinite rollback
[ "$rc" -eq 0 ] && grep -q "rolled back to step 4," B.log && same_data B 4 A 4 &&
    [ "$(index_key "$(step_dir B 4)" state.rollbacks)" = 1 ] &&
    ok "a rollback after a resume from elsewhere returns to the step-4 weights loaded" ||
    { cat B.log; fail "rollback after a resume from another ckpt_dir (exit $rc)"; }

# 2. resume = never over an older run's ckpt_dir (seed 1), then a NaN
train C --steps 12 --ckpt_every 4 --seed 1
MODTRAIN_FAULT=nan-batch:5 train C --steps 8 --ckpt_every 4 --seed 2 --resume never \
    --on_nonfinite rollback --ckpt_async 0
MODTRAIN_FAULT=nan-batch:5 train Cref --steps 8 --ckpt_every 4 --seed 2 \
    --on_nonfinite rollback --ckpt_async 0
[ "$rc" -eq 0 ] && grep -q "rolled back to step 4," C.log && same_data C 8 Cref 8 &&
    [ -d C/ckpt/abandoned/step-00000012 ] && [ ! -e "$(step_dir C 12)" ] &&
    [ "$(index_key "$(step_dir C 8)" state.seed)" = 2 ] &&
    ok "resume = never: the older run's checkpoints moved to abandoned/; rolled back to its own step 4" ||
    { cat C.log; ls -R C/ckpt; fail "resume = never over an older run, with a rollback (exit $rc)"; }

# 3. the same run (seed 2) crashes at step 10; resume = auto continues it
if [ $slow = 1 ]; then
train D --steps 12 --ckpt_every 4 --seed 1
MODTRAIN_FAULT=rank-exit:0:10 train D --steps 12 --ckpt_every 4 --seed 2 --resume never --ckpt_async 0
train D --steps 12 --ckpt_every 4 --seed 2
train Dref --steps 12 --ckpt_every 4 --seed 2
[ "$rc" -eq 0 ] && grep -q "resume: loaded D/ckpt/step-00000008 " D.log && same_data D 12 Dref 12 &&
    ok "a resume = never run that crashed resumes its own step 8 and ends equal to an uninterrupted one" ||
    { cat D.log; ls -R D/ckpt; fail "a crashed resume = never run, relaunched (exit $rc)"; }
else
train Dref --steps 12 --ckpt_every 4 --seed 2
fi

# 4. `latest` behind this run's newest (a save killed before it), and a
# newer checkpoint of another run beside: this run's step 12 is resumed;
# the other's step 20 is left alone by resume and keep-1, and its step 16
# moves aside rather than be replaced
cp -r Dref E
printf 'step-00000008\n' > E/ckpt/latest
cp -r "$(step_dir A 12)" "$(step_dir E 20)"
cp -r "$(step_dir A 12)" "$(step_dir E 16)"
train E --steps 16 --ckpt_every 4 --seed 2 --ckpt_keep 1
train Eref --steps 16 --ckpt_every 4 --seed 2
[ "$rc" -eq 0 ] && grep -q "resume: loaded E/ckpt/step-00000012 " E.log &&
    grep -q "left alone 2 checkpoints of another run" E.log && same_data E 16 Eref 16 &&
    cmp -s "$(step_dir E 20)/data.bin" "$(step_dir A 12)/data.bin" &&
    cmp -s E/ckpt/abandoned/step-00000016/data.bin "$(step_dir A 12)/data.bin" &&
    [ ! -e "$(step_dir E 12)" ] && ok "this run's newest is resumed past latest; another run's left alone" ||
    { cat E.log; ls -R E/ckpt; fail "a run's own line beside another's (exit $rc)"; }

# 6. a rollback whose reload outlasts watchdog_s 0.5 (12 chunk reads stalled
# 0.15 s each): the load is progress, chunk by chunk
if [ $slow = 1 ]; then
    train Sref --steps 4 --ckpt_async 0
    nth=$(($(grep -c '^chunk ' "$(step_dir Sref 4)/index") - 11))
else
    nth=$(($(grep -c '^chunk ' "$(step_dir A 4)/index") - 11)) # as many chunks
fi
MODTRAIN_FAULT=nan-batch:5 MODTRAIN_FAULT_AT=at:load.chunk:*:stall:*:$nth train S --steps 8 \
    --ckpt_every 4 --ckpt_async 0 --on_nonfinite rollback --watchdog_s 0.5
[ "$rc" -eq 0 ] && grep -q "load.chunk stalls" S.log && grep -q "rolled back to step 4," S.log &&
    ok "a 1.8 s reload under watchdog_s 0.5: progress, not a hang" ||
    { cat S.log; fail "a slow reload under the watchdog (exit $rc)"; }

# 7. the checkpoint a rollback returns to, swapped mid-run for one of step 2
# (before this launch's start at step 4): refused, not trained from
train A2 --steps 2
cp -r "$(step_dir A 4)" X
nan=299 steps=400
[ $slow = 1 ] || nan=149 steps=200
MODTRAIN_FAULT=nan-batch:$nan timeout -k 10 120 "$MODTRAIN" train $common --run_dir G --steps $steps \
    --ckpt_every 1000 --resume X --on_nonfinite rollback > G.log 2>&1 &
pid=$!
n=0
while ! grep -q "resume: loaded X" G.log && [ $n -lt 600 ]; do
    sleep 0.05
    n=$((n + 1))
done
rm -rf X && cp -r "$(step_dir A2 2)" X
set +e
wait $pid
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "rollback: 'X' holds step 2, outside this run's steps 4-$nan" G.log &&
    ok "a rollback target swapped for an older step: $(grep -m 1 'rollback:' G.log | cut -c1-80)..." ||
    { cat G.log; fail "a rollback target outside the run's steps (exit $rc)"; }

# 5. watchdog_s on a run that ends normally
[ $slow = 0 ] || {
train W --steps 4 --watchdog_s 60
[ "$rc" -eq 0 ] && ! grep -q "ERROR: AddressSanitizer\|runtime error" W.log &&
    ok "a run with watchdog_s 60 ends normally (exit 0)" ||
    { cat W.log; fail "a watchdog run's end (exit $rc)"; }
}
finish
