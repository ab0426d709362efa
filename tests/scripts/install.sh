#!/bin/sh
# `make install` puts the job scripts and configs in share/modtrain/jobs,
# byte for byte, and links share/modtrain/modtrain to the installed binary,
# so the installed scripts find it with neither MODTRAIN nor the PATH:
# prep_fortunes.sh writes shards, train.sbatch (outside SLURM, under
# mpirun) trains with the installed tiny.conf and ends bitwise equal to the
# build's binary. It installs a man page for each page `modtrain reference
# --pages` names, which man renders from MANPATH, and a modulefile that
# Lmod loads (PATH and MANPATH: `modtrain --version`, `man modtrain`)
# naming the prefix, never a DESTDIR; `make uninstall` leaves no file
# behind.
. "$(dirname "$0")/lib.sh"
build=$(dirname "$MODTRAIN")
[ -f "$build/Makefile" ] || { echo "SKIP: no Makefile beside $MODTRAIN"; exit 77; }
MAKE=${MAKE:-make}
inst=$TMP/inst
jobs=$inst/share/modtrain/jobs
$MAKE -C "$build" install prefix="$inst" > "$TMP/install.log" 2>&1 ||
    { cat "$TMP/install.log"; fail "make install prefix=$inst"; finish; }
n=0
for f in "$srcdir"/jobs/*.sh "$srcdir"/jobs/*.sbatch "$srcdir"/jobs/*.conf; do
    b=$(basename "$f")
    if ! cmp -s "$f" "$jobs/$b"; then
        fail "jobs/$b is not installed as $jobs/$b"
    elif [ "${b%.conf}" = "$b" ] && [ ! -x "$jobs/$b" ]; then
        fail "$jobs/$b is not executable"
    else n=$((n + 1)); fi
done
[ "$(readlink -f "$inst/share/modtrain/modtrain")" = "$(readlink -f "$inst/bin/modtrain")" ] &&
    cmp -s "$MODTRAIN" "$inst/bin/modtrain" &&
    ok "$n job files in share/modtrain/jobs; share/modtrain/modtrain -> $(readlink "$inst/share/modtrain/modtrain")" ||
    fail "share/modtrain/modtrain does not lead to the installed binary: $(ls -l "$inst/share/modtrain" "$inst/bin")"

# the man pages, rendered by man from the installed tree
pages=$("$MODTRAIN" reference --pages)
for p in $pages; do
    f=$inst/share/man/man1/$p.1
    if [ ! -s "$f" ]; then
        fail "no man page $f"
    elif ! MANPATH="$inst/share/man" MANWIDTH=80 man -P cat "$p" > "$TMP/$p.txt" 2> "$TMP/$p.err" ||
        [ -s "$TMP/$p.err" ] || ! grep -q "^NAME" "$TMP/$p.txt"; then
        fail "man $p: $(head -c 300 "$TMP/$p.err")"
    fi
done
grep -q -e "--n_layer" "$TMP/modtrain-train.txt" && grep -q "EXIT STATUS" "$TMP/modtrain.txt" &&
    ok "man renders the $(echo $pages | wc -w) installed pages (modtrain-train lists the keys)" ||
    fail "the installed man pages lack the keys or the exit codes"

# the modulefile: Lmod puts the installed binary and man pages in reach
mod=$inst/share/modulefiles
lmod_init=/usr/share/lmod/lmod/init/sh
if [ -f "$lmod_init" ]; then
    out=$(env -u MODTRAIN PATH=/usr/bin:/bin MANPATH= sh -c ". $lmod_init > /dev/null 2>&1
        module use '$mod' && module load modtrain && command -v modtrain && modtrain --version &&
        MANWIDTH=80 man -P cat modtrain | head -n 4" 2>&1)
    printf '%s\n' "$out" | grep -q "^$inst/bin/modtrain\$" &&
        printf '%s\n' "$out" | grep -q "^modtrain [0-9]" && printf '%s\n' "$out" | grep -q "^NAME" &&
        ok "module load modtrain: $(printf '%s\n' "$out" | sed -n 2p | cut -c 1-40)..., man modtrain" ||
        fail "module load modtrain: $out"
else
    echo "SKIP: no Lmod ($lmod_init; apt-get install lmod) for the modulefile's check"
fi
# a staged install (DESTDIR) writes a modulefile naming the prefix alone
$MAKE -C "$build" install-data DESTDIR="$TMP/stage" prefix=/opt/modtrain-test > "$TMP/stage.log" 2>&1 ||
    { cat "$TMP/stage.log"; fail "make install-data DESTDIR=$TMP/stage"; }
mf=$(find "$TMP/stage" -path '*modulefiles/modtrain/*' -type f)
grep -q "prepend-path PATH /opt/modtrain-test/bin" "$mf" && ! grep -q "$TMP/stage" "$mf" &&
    ok "a DESTDIR install's modulefile names the prefix alone" ||
    fail "the staged modulefile ($mf): $(cat "$mf")"

cd "$TMP"
mkdir text
printf 'the quick brown fox jumps over the lazy dog\n%%\n%.0s' $(seq 1 400) > text/fox
# no MODTRAIN, no modtrain on the PATH: the installed scripts find their own
clean="env -u MODTRAIN PATH=/usr/bin:/bin"
if $clean FORTUNES_DIR="$TMP/text" "$jobs/prep_fortunes.sh" data > prep.log 2>&1 && [ -s data/train_000000.bin ]; then
    ok "the installed prep_fortunes.sh wrote data/ with the installed binary"
else
    cat prep.log
    fail "the installed prep_fortunes.sh"
fi
K="--train_data $TMP/data/train_000000.bin --val_data= --steps 3 --ckpt_every 0 --log_every 1 --threads 1"
$clean OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MODTRAIN_LAUNCH=mpirun \
    MODTRAIN_MPIRUN_ARGS="--oversubscribe --mca btl self,vader" \
    bash "$jobs/train.sbatch" "$jobs/tiny.conf" $K --run_dir "$TMP/inst-run" > sbatch.log 2>&1 ||
    { cat sbatch.log; fail "the installed train.sbatch outside SLURM"; }
"$MODTRAIN" train --config "$srcdir/jobs/tiny.conf" $K --run_dir "$TMP/build-run" > build.log 2>&1 ||
    { cat build.log; fail "the build's run"; }
if grep -q "binary $inst/share/modtrain/modtrain (the tree of $jobs/train.sbatch)" sbatch.log &&
    cmp -s inst-run/ckpt/step-00000003/data.bin build-run/ckpt/step-00000003/data.bin; then
    ok "the installed train.sbatch ran the installed binary on the installed tiny.conf: bitwise the build's run"
else
    cat sbatch.log
    fail "the installed train.sbatch: no binary line, or its checkpoint differs from the build's"
fi
$MAKE -C "$build" uninstall prefix="$inst" > "$TMP/uninstall.log" 2>&1 ||
    { cat "$TMP/uninstall.log"; fail "make uninstall"; }
left=$(find "$inst" ! -type d | head -n 3)
[ -z "$left" ] && ok "make uninstall left no file" || fail "make uninstall left $left"
finish
