#!/bin/sh
# Every script in jobs/ (each *.sh and *.sbatch there, found by globbing, so
# a script added later is covered), every modtrain command (as `modtrain
# --help` lists them) and every `ckpt` subcommand (as `modtrain ckpt --help`
# lists them) answers --help and -h: exit 0, a first line "usage: ..." that
# names it, and nothing else done. Each runs in an empty folder with a PATH
# whose apt-get, mpirun, srun, sbatch, make, npm, ... (and MODTRAIN, for the
# scripts) are tripwires: they only record that they were called, and fail.
# The folder must stay empty and no tripwire may have been called.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
mkdir bin
calls=$TMP/calls.log
for tool in apt-get apt dpkg sudo mpirun mpiexec srun sbatch scontrol squeue make autoreconf \
    npm node gnuplot python3 modtrain; do
    printf '#!/bin/sh\necho "%s $*" >> "%s"\nexit 1\n' "$tool" "$calls" > "bin/$tool"
    chmod +x "bin/$tool"
done

# check NAME CMD...: CMD --help and CMD -h, in an empty folder under the tripwires
check_help() {
    name=$1
    shift
    for h in --help -h; do
        rm -rf work "$calls"
        mkdir work
        set +e
        (cd work && PATH="$TMP/bin:$PATH" MODTRAIN="$TMP/bin/modtrain" "$@" "$h") > out.txt 2> err.txt
        rc=$?
        set -e
        first=$(head -n 1 out.txt)
        if [ "$rc" -ne 0 ]; then
            fail "$name $h exited $rc: $(head -c 300 err.txt)"
        elif [ -n "$(ls -A work)" ]; then
            fail "$name $h wrote into its folder: $(ls -A work | head -n 5 | tr '\n' ' ')"
        elif [ -s "$calls" ]; then
            fail "$name $h ran: $(head -n 3 "$calls" | tr '\n' ';')"
        elif ! printf '%s\n' "$first" | grep -q "^usage: " ||
            ! printf '%s\n' "$first" | grep -q -F "$name"; then
            fail "$name $h: the first line is '$first', not a usage line naming $name"
        else
            ok "$name $h: $first"
        fi
    done
}

n=0
for f in "$srcdir"/jobs/*.sh "$srcdir"/jobs/*.sbatch; do
    [ -f "$f" ] || continue
    if [ ! -x "$f" ]; then
        fail "jobs/$(basename "$f") is not executable"
        continue
    fi
    check_help "jobs/$(basename "$f")" "$f"
    n=$((n + 1))
done
[ "$n" -ge 9 ] && ok "$n scripts in jobs/" || fail "only $n scripts found in $srcdir/jobs"

# the commands as modtrain's own help lists them, then ckpt's subcommands
check_help "modtrain" "$MODTRAIN"
cmds=$("$MODTRAIN" --help | sed -n '/^commands:/,/^$/s/^  \([a-z][a-z]*\) .*/\1/p')
[ "$(echo $cmds | wc -w)" -ge 8 ] && ok "commands: $(echo $cmds)" || fail "modtrain --help lists '$cmds'"
for c in $cmds; do check_help "modtrain $c" "$MODTRAIN" "$c"; done
subs=$("$MODTRAIN" ckpt --help | sed -n '1s/^usage: modtrain ckpt \([a-z|]*\) .*/\1/p' | tr '|' ' ')
[ "$(echo $subs | wc -w)" -ge 6 ] && ok "ckpt subcommands: $subs" || fail "modtrain ckpt --help lists '$subs'"
for s in $subs; do check_help "modtrain ckpt $s" "$MODTRAIN" ckpt "$s"; done
finish
