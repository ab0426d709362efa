#!/bin/sh
# prep's commit of a shard set, swept point by point (as crash_sweep.sh
# does for checkpoints): every file-system change prep makes goes through a
# named fault point (src/base/fault.h), and for each point reached, in
# three preps (into an absent OUT; --force over an older set, the folders
# exchanged; --force where the exchange fails, the old set renamed aside
# first), a prep killed there, or whose call there fails (EIO, and ENOSPC
# at the writes), leaves OUT absent, holding the old set byte for byte, or
# holding the new set byte for byte: never a mix, never a shard whose
# header is still zeros. A failed call is one line and exit 2, unless the
# set was committed before it (then exit 0 and OUT is the new set). The
# same prep run again (--force) then exits 0, OUT is the new set byte for
# byte and no OUT.prep-* folder is left beside it.
. "$(dirname "$0")/lib.sh"
cd "$TMP"

# two corpora of a few hundred documents: the new set and an older one
"$PYTHON" - new.txt old.txt <<'PY'
import random, sys
for path, seed in ((sys.argv[1], 1), (sys.argv[2], 2)):
    r = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "mu", "nu", "omicron", "pi", "rho", "sigma"]
    with open(path, "w") as f:
        for d in range(300):
            f.write(" ".join(r.choice(words) for _ in range(r.randint(5, 40))) + "\n%\n")
PY
opts="--doc-sep % --shard-tokens 4000 --threads 1"


# the reference sets: new (what every prep below must leave), old
# shellcheck disable=SC2086 # the options
"$MODTRAIN" prep --out ref.new $opts new.txt > /dev/null
# shellcheck disable=SC2086
"$MODTRAIN" prep --out ref.old $opts old.txt > /dev/null
[ "$(ls ref.new | wc -l)" -ge 4 ] && ok "the new set has $(ls ref.new | wc -l) shards" ||
    fail "the new set has too few shards to sweep: $(ls ref.new)"

# setup MODE: the state before a prep of MODE (fresh: no OUT; force and
# fallback: OUT holds the old set)
setup() {
    rm -rf out out.prep-*
    [ "$1" = fresh ] || cp -r ref.old out
}
# the fault a prep of MODE runs under beside the swept one
base_fault() { [ "$1" = fallback ] && echo "at:prep.commit.exchange:*:EINVAL," || true; }
force_of() { [ "$1" = fresh ] || echo "--force"; }

cases=0
# sweep MODE: one case a point reached and an action
prep_sweep() {
    mode=$1
    setup "$mode"
    rm -f trace
    # shellcheck disable=SC2086,SC2046
    MODTRAIN_FAULT_TRACE=$TMP/trace MODTRAIN_FAULT="$(base_fault "$mode" | sed 's/,$//')" \
        "$MODTRAIN" prep --out out $(force_of "$mode") $opts new.txt > /dev/null 2> err ||
        { fail "$mode: the traced prep failed: $(cat err)"; return; }
    same_files out ref.new || fail "$mode: the traced prep did not write the new set"
    # the points in order, each with the number of times it was reached
    awk '{ if (!($1 in n)) order[k++] = $1; n[$1]++ }
         END { for (i = 0; i < k; i++) print order[i], n[order[i]] }' trace > points
    for want in prep.mkdir prep.shard.header prep.shard.fsync prep.commit.fsync_tmp; do
        grep -q "^$want " points || fail "$mode: the prep never reached $want"
    done
    case $mode in
    fresh) want=prep.commit.rename ;;
    force) want=prep.commit.exchange ;;
    fallback) want=prep.commit.aside ;;
    esac
    grep -q "^$want " points || fail "$mode: the prep never reached $want: $(cut -d' ' -f1 points)"
    while read -r point count; do
        # under fallback the exchange's point fails already (force sweeps it)
        [ "$mode:$point" != fallback:prep.commit.exchange ] || continue
        # its first reach and its last
        nths="1 $count"
        [ "$count" -gt 1 ] || nths=1
        # MODTRAIN_SKIP_SLOW (the sanitizer pass): each point's first reach,
        # and past the fresh prep only the points of the commit and cleanup
        if [ $slow = 0 ]; then
            case $mode:$point in fresh:* | *:prep.commit.* | *:prep.remove.* | *:prep.stale.*) ;; *) continue ;; esac
            nths=1
        fi
        for nth in $nths; do
            actions="kill EIO"
            case $point in *.write | *.zeros | *.header) actions="$actions ENOSPC" ;; esac
            for action in $actions; do one_case "$mode" "$point" "$nth" "$action"; done
        done
    done < points
}

# one_case MODE POINT NTH ACTION
one_case() {
    mode=$1 name="$1 $2#$3 $4"
    cases=$((cases + 1))
    setup "$mode"
    rc=0
    # shellcheck disable=SC2086,SC2046
    MODTRAIN_FAULT="$(base_fault "$mode")at:$2:*:$4:*:$3" \
        "$MODTRAIN" prep --out out $(force_of "$mode") $opts new.txt > /dev/null 2> err || rc=$?
    # what a reader of OUT finds now: nothing, the old set or the new one
    if [ ! -e out ]; then
        state=absent
    elif same_files out ref.new; then
        state=new
    elif same_files out ref.old; then
        state=old
    else
        state=mixed
    fi
    case $state in
    mixed) fail "$name: OUT holds neither set: $(ls out)" ;;
    old) [ "$mode" != fresh ] || fail "$name: OUT holds the old set" ;;
    absent) # only the fallback has a moment without OUT: between its renames
        [ "$mode" != force ] || fail "$name: OUT is missing (the exchange leaves no moment without it)" ;;
    esac
    if [ "$4" = kill ]; then
        [ "$rc" -eq 137 ] || fail "$name: exit $rc, expected the kill's 137: $(cat err)"
    else
        lines=$(grep -v MODTRAIN_FAULT err | grep -c . || true)
        if [ "$rc" -eq 2 ]; then
            [ "$lines" -eq 1 ] || fail "$name: $lines lines of error (expected 1): $(cat err)"
            case $2 in
            prep.remove.*) ;; # the folder whose removal failed stays, for the next prep
            *) ! ls -d out.prep-* > /dev/null 2>&1 ||
                fail "$name: a failed prep left $(ls -d out.prep-*)" ;;
            esac
        elif [ "$rc" -eq 0 ]; then
            [ "$state" = new ] || fail "$name: exit 0 but OUT is $state"
        else
            fail "$name: exit $rc (expected 2, or 0 after the commit): $(cat err)"
        fi
    fi
    # the same prep again: the new set, nothing beside it
    # shellcheck disable=SC2086
    "$MODTRAIN" prep --out out --force $opts new.txt > /dev/null 2> err2 ||
        fail "$name: the prep run again failed: $(cat err2)"
    same_files out ref.new || fail "$name: the prep run again left OUT other than the new set"
    ! ls -d out.prep-* > /dev/null 2>&1 || fail "$name: the prep run again left $(ls -d out.prep-*)"
}

for mode in fresh force fallback; do prep_sweep "$mode"; done
ok "$cases cases: each left OUT absent, old or new, and the prep run again wrote the new set"

# a prep killed between the fallback's two renames: the next prep puts the
# old set back before it works (and says so), so a reader between the two
# preps finds OUT missing, never a mix
setup fallback
MODTRAIN_FAULT="at:prep.commit.exchange:*:EINVAL,at:prep.commit.rename_new" \
    "$MODTRAIN" prep --out out --force $opts new.txt > /dev/null 2>&1 || true
[ ! -e out ] && ls -d out.prep-old.* > /dev/null 2>&1 && ok "killed between the renames: the old set is aside" ||
    fail "killed between the renames: expected OUT absent and OUT.prep-old.*: $(ls -d out*)"
# shellcheck disable=SC2086
"$MODTRAIN" prep --out out $opts new.txt > /dev/null 2> err || true
grep -q "put .* back as 'out'" err && same_files out ref.old &&
    ok "the next prep put the old set back (and, without --force, refused to replace it)" ||
    fail "the next prep did not put the old set back: $(cat err); $(ls out 2>&1)"
finish
