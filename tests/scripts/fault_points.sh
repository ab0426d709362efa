#!/bin/sh
# Every call that changes the file system in checkpoint/, in the
# durable-write helper (src/base/files.c), in prep's shard writer and set
# commit (src/prep/) and in the tokenizer's (src/tokenizer/: the exported
# tokenizer.json) sits behind a fault point, so that the
# crash-point sweeps (tests/scripts/crash_sweep.sh, prep_crash_sweep.sh)
# cannot quietly leave a step of a save or a commit out: write, pwrite, fsync, fdatasync, rename, unlink,
# rmdir, mkdir, ftruncate, fwrite, fopen for writing, open for writing and
# MPI-IO's open, set_size, write, sync and close may be called only by the
# fault layer's wrappers (the fp_ functions of src/base/fault.c, and
# ckio_write.c's fp_file_ ones, each naming its point). The test also checks
# that it finds what it looks for: a call planted in a copy is reported.
. "$(dirname "$0")/lib.sh"
# scan FILE...: prints FILE:LINE: CALL for each unguarded call
scan() {
    awk '
        # the function a line belongs to: the last definition opened at column 0
        /^[A-Za-z_].*\(/ && !/;[ \t]*$/ { fn = $0; sub(/\(.*/, "", fn); sub(/.*[ *]/, "", fn) }
        /^[ \t]*(\/\*|\*)/ { next } # comments
        {
            line = $0
            sub(/\/\*.*/, "", line) # a trailing comment
            if (fn ~ /^fp_/) next
            if (match(line, /(^|[^A-Za-z0-9_.>])(write|pwrite|fsync|fdatasync|rename|renameat2|unlink|unlinkat|rmdir|mkdir|ftruncate|fwrite)[ \t]*\(/) ||
                match(line, /MPI_File_(open|set_size|write[A-Za-z_]*|iwrite[A-Za-z_]*|sync|close)[ \t]*\(/) ||
                (match(line, /(^|[^A-Za-z0-9_])open[ \t]*\(/) && line ~ /O_WRONLY|O_RDWR|O_CREAT/) ||
                (match(line, /fopen[ \t]*\(/) && line ~ /"[wa]/))
                printf "%s:%d: %s\n", FILENAME, FNR, substr(line, RSTART, RLENGTH)
        }' "$@"
}
files=$(ls "$srcdir"/checkpoint/*.c "$srcdir"/src/base/files.c "$srcdir"/src/base/folder_set.c "$srcdir"/src/prep/*.c "$srcdir"/src/tokenizer/*.c)
# shellcheck disable=SC2086 # the file list
found=$(scan $files)
if [ -z "$found" ]; then
    ok "every file-system change in checkpoint/, files.c, src/prep/ and src/tokenizer/ goes through a fault point"
else
    fail "calls outside the fault layer (use the fp_ wrappers of src/base/fault.h):
$found"
fi
# the scan sees a planted call (and one in a comment is not one)
cp "$srcdir/checkpoint/ckpt_commit.c" "$TMP/planted.c"
printf 'static void planted(const char *p) {\n    /* rename(p, p) in a comment */\n    unlink(p);\n}\n' >> "$TMP/planted.c"
n=$(scan "$TMP/planted.c" | wc -l)
[ "$n" -eq 1 ] && ok "a planted unlink is found, a comment is not" ||
    fail "the scan found $n calls in the planted file (expected 1): $(scan "$TMP/planted.c")"
# the wrappers name their points: each fp_ call passes a string literal
n=$(grep -hoE 'fp_(open|write_all|pwrite_all|fsync|fsync_dir|rename|exchange|unlink|rmdir|mkdir)\("[a-z_.]+"' $files |
    wc -l)
[ "$n" -ge 15 ] && ok "$n fault points named in checkpoint/, files.c, src/prep/ and src/tokenizer/" ||
    fail "only $n named fault points found"
finish
