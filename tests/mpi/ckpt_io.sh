#!/bin/sh
# The checkpoint writer and reader on real MPI ranks (Open MPI, oversubscribed):
# written by 4 ranks, read back by 1, 2, 3 and 4 ranks under another split;
# written by 2, read by 4. Then `modtrain ckpt verify` on it, and a flipped
# byte that verify and a reader both report naming the chunk.
. "$(dirname "$0")/../scripts/lib.sh"
IO=${CKPT_IO:-$(dirname "$MODTRAIN")/tests/mpi/ckpt_io}
cd "$TMP"
run_io() { # NP ARGS...
    np=$1
    shift
    if $MPIRUN -np "$np" "$IO" "$@" > out.txt 2>&1; then
        ok "$np ranks: $(tail -n 1 out.txt)"
    else
        cat out.txt
        fail "$np ranks: ckpt_io $*"
    fi
}
run_io 4 write w4
for np in 1 2 3 4; do run_io "$np" read w4; done
run_io 2 write w2
run_io 4 read w2
"$MODTRAIN" ckpt verify --ckpt w4 > v.txt 2>&1 && ok "$(cat v.txt)" || { cat v.txt; fail "verify"; }
"$MODTRAIN" ckpt inspect --ckpt w4 > inspect.txt && grep -q "param/C" inspect.txt &&
    ok "inspect lists the tensors" || fail "inspect"

# flip one byte inside the first chunk's compressed data
off=$(awk '$1 == "chunk" { print $10 + 3; exit }' w4/index)
printf '\377' | dd of=w4/data.bin bs=1 seek="$off" conv=notrunc 2> /dev/null
if "$MODTRAIN" ckpt verify --ckpt w4 > v.txt 2>&1; then
    fail "verify passed a flipped byte"
else
    grep -q "chunk param/A" v.txt && ok "flipped byte: $(cat v.txt)" || { cat v.txt; fail "flipped byte message"; }
fi
if $MPIRUN -np 2 "$IO" read w4 > out.txt 2>&1; then
    fail "reading a flipped byte succeeded"
else
    grep -q "CRC32\|does not inflate" out.txt && ok "a reader names the corrupt chunk" || { cat out.txt; fail "reader message"; }
fi
finish
