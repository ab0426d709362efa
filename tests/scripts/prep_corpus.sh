#!/bin/sh
# prep at corpus scale: the same documents as text (--doc-sep), .gz, .zst,
# JSON Lines (--jsonl text) and JSON Lines .gz give the same shards, byte
# for byte, and so do 1 and 2 threads (byte and gpt2 tokenizers); a small
# --shard_tokens gives several shards whose counts add up, each with a
# valid header and the CRC-32 of its tokens; a prep killed midway leaves
# no OUT (or with --force the old set untouched), and the next prep
# removes its temporary folder; a folder with an older set is refused
# (--force replaces it whole), one with another file is refused even with
# --force; 300 MB (and unless MODTRAIN_SKIP_SLOW, 2.2 GB) on standard
# input stay under --mem 256M of peak RSS; a broken JSON line, a line
# without the key, a corrupt .gz and .zst, a document over the cap are
# one-line errors (exit 2) that leave nothing under a final name.
# MODTRAIN_SKIP_SLOW (the sanitizer pass): the corpus is the first four
# fortunes files by name (0.6 MB, two train shards at 400000 tokens a
# shard: still several) rather than all of them, and the 2.2 GB case is
# skipped; the 300 MB one stays (it alone runs long enough to report
# progress, from a pipe).
. "$(dirname "$0")/lib.sh"
cd "$TMP"
PEAKRSS=${PEAKRSS:-$(dirname "$MODTRAIN")/tests/tools/peakrss}
src=${FORTUNES_DIR:-/usr/share/games/fortunes}
if [ ! -d "$src" ]; then
    echo "SKIP: the fortunes package is not installed (apt-get install fortunes)"
    exit 77
fi

# the corpus: the fortunes as UTF-8 (so that JSON can carry them), and the
# same documents as JSON Lines
files=$(find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort)
[ $slow = 1 ] || files=$(printf '%s\n' "$files" | head -n 4)
# shellcheck disable=SC2086 # the file list
"$PYTHON" - corpus.txt corpus.jsonl $files <<'PY'
import json, sys
text = b"".join(open(f, "rb").read() for f in sys.argv[3:]).decode("utf-8", "replace")
if not text.endswith("\n"):
    text += "\n"
open(sys.argv[1], "w", encoding="utf-8").write(text)
# the documents as prep --doc-sep % cuts them: the pieces between lines "%"
docs, cur = [], []
for line in text.split("\n")[:-1]:
    if line == "%":
        if cur:
            docs.append("".join(cur))
        cur = []
    else:
        cur.append(line + "\n")
if cur:
    docs.append("".join(cur))
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for i, d in enumerate(docs):
        f.write(json.dumps({"id": i, "text": d, "meta": {"n": len(d)}}) + "\n")
PY
gzip -c corpus.txt > corpus.txt.gz
gzip -c corpus.jsonl > corpus.jsonl.gz
zst=no
if command -v zstd > /dev/null; then
    zstd -q -c corpus.txt > corpus.txt.zst && zstd -q -c corpus.jsonl > corpus.jsonl.zst && zst=yes
else
    echo "note: no zstd command: the .zst cases are skipped"
fi


S="--shard_tokens 400000"
# shellcheck disable=SC2086 # the options
"$MODTRAIN" prep --out text $S --doc-sep % corpus.txt > text.log || fail "prep of the text: $(cat text.log)"
grep -q "^prep: [0-9]* documents, [0-9.]* MB tokenised in [0-9.]* s ([0-9.]* MB/s on 1 thread): [0-9]* train tokens in [0-9]* shards, [0-9]* val tokens in 1 shard$" text.log &&
    ok "the summary line: $(tail -n 1 text.log)" || fail "the summary line: $(cat text.log)"
for v in "gz --doc-sep % corpus.txt.gz" "zst --doc-sep % corpus.txt.zst" "jsonl --jsonl text corpus.jsonl" \
    "jsonl.gz --jsonl text corpus.jsonl.gz" "jsonl.zst --jsonl text corpus.jsonl.zst" "stdin --doc-sep % -"; do
    name=${v%% *}
    case $name in *zst) [ $zst = yes ] || continue ;; esac
    # shellcheck disable=SC2086 # the options
    "$MODTRAIN" prep --out "o-$name" $S ${v#* } < corpus.txt > o.log 2>&1 || fail "prep of $name: $(cat o.log)"
    same_files text "o-$name" && ok "$name gives the shards of the text, byte for byte" ||
        fail "$name gives other shards than the text: $(ls text "o-$name" | tr '\n' ' ')"
done

# 1 and 2 threads; gpt2 with GPT-2's vocabulary where it is cached, else
# a byte-level one (no merges) made here
vocab=${MODTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modtrain}/gpt2
if [ ! -f "$vocab/encoder.json" ] || [ ! -f "$vocab/vocab.bpe" ]; then
    vocab=$TMP/vocab
    byte_vocab "$vocab"
fi
for t in 1 2; do
    # shellcheck disable=SC2086 # the options
    "$MODTRAIN" prep --out "b$t" $S --jsonl text --threads $t corpus.jsonl > /dev/null || fail "byte prep on $t threads"
    # shellcheck disable=SC2086 # the options
    "$MODTRAIN" prep --out "g$t" --shard_tokens 100000 --tokenizer gpt2 --vocab "$vocab" --jsonl text \
        --threads $t corpus.jsonl.gz > "g$t.log" || fail "gpt2 prep on $t threads: $(cat "g$t.log")"
done
same_files b1 b2 && same_files b1 text && ok "byte, JSON Lines: the same shards on 1 and 2 threads" || fail "byte: 1 and 2 threads differ"
same_files g1 g2 && ok "gpt2: the same $(ls g1 | wc -l) shards on 1 and 2 threads ($(basename "$(dirname "$vocab")")/$(basename "$vocab"))" ||
    fail "gpt2: 1 and 2 threads differ"

# the shards: valid headers, CRC-32 of the tokens, counts that add up,
# every one full but the last; val every 10th document, whole
"$PYTHON" - text g1 corpus.jsonl <<'PY' > shards.txt || fail "shards: $(cat shards.txt)"
import glob, json, struct, sys, zlib
docs = [json.loads(l)["text"].encode() for l in open(sys.argv[3], encoding="utf-8")]
parts = {"train": [], "val": []}  # joined once: bytes += bytes copies each time
for d, doc in enumerate(docs):
    parts["val" if (d + 1) // 10 > d // 10 else "train"].append(doc)
want = {split: b"".join(p) for split, p in parts.items()}
for folder, per, vocab in ((sys.argv[1], 400000, 256), (sys.argv[2], 100000, None)):
    for split in ("train", "val"):
        names = sorted(glob.glob("%s/%s_*.bin" % (folder, split)))
        assert names, "no %s shards in %s" % (split, folder)
        bodies = []
        for i, n in enumerate(names):
            assert n.endswith("%s_%06d.bin" % (split, i)), n
            raw = open(n, "rb").read()
            h = struct.unpack("<256i", raw[:1024])
            body = raw[1024:]
            assert h[0] == 20240520 and h[1] == 1, (n, h[:2])
            assert h[2] * 2 == len(body), (n, h[2], len(body))
            assert h[8] == 1 and h[7] & 0xffffffff == zlib.crc32(body), (n, "CRC")
            assert vocab is None or h[3] == vocab, (n, h[3])
            assert (h[2] == per) if i < len(names) - 1 else (2 <= h[2] <= per + 1), (n, h[2])
            bodies.append(body)
        toks = b"".join(bodies)
        if vocab == 256:  # byte tokens: the documents' bytes, in order
            got = bytes(struct.unpack("<%dH" % (len(toks) // 2), toks))
            assert got == want[split], "%s/%s: not the documents of the split" % (folder, split)
        print(folder, split, len(names), "shards,", len(toks) // 2, "tokens")
PY
[ -s shards.txt ] && ok "shards: $(tr '\n' ';' < shards.txt)"

# the output folder: an older set refused, --force replaces it whole, a
# folder with another file refused even with --force, an empty one taken
# shellcheck disable=SC2086 # the options
"$MODTRAIN" prep --out set --shard_tokens 300000 --doc-sep % corpus.txt > /dev/null
ls set > set0.txt
cat set/* | cksum > sum0.txt
expect_refused() { # PATTERN CMD...: exit 2, one stderr line matching PATTERN
    pattern=$1
    shift
    set +e
    "$@" > out.txt 2> err.txt
    rc=$?
    set -e
    if [ "$rc" -ne 2 ] || [ "$(wc -l < err.txt)" -ne 1 ] || ! grep -q -- "$pattern" err.txt; then
        fail "'$*': exit $rc, expected 2 and one line /$pattern/: $(cat err.txt)"
    else ok "$(cat err.txt)"; fi
}
expect_refused "'set' already holds a shard set" "$MODTRAIN" prep --out set --doc-sep % corpus.txt
[ "$(cat set/* | cksum)" = "$(cat sum0.txt)" ] && ok "the refused prep left the set untouched" || fail "a refused prep changed the set"
"$MODTRAIN" prep --out set --force --shard_tokens 1000000 --doc-sep % corpus.txt > /dev/null ||
    fail "prep --force"
shards='train_000000.bin\ntrain_000001.bin\ntrain_000002.bin\nval_000000.bin'
[ $slow = 1 ] || shards='train_000000.bin\nval_000000.bin' # the smaller corpus: 2 shards before, 1 now
# shellcheck disable=SC2059 # the names' format
[ "$(ls set)" = "$(printf "$shards")" ] &&
    ok "--force replaces the set whole: $(ls set | tr '\n' ' ')" || fail "--force left: $(ls set | tr '\n' ' ')"
touch set/notes.txt
cat set/* | cksum > sum1.txt
expect_refused "'set' holds 'notes.txt', which is not a token shard" "$MODTRAIN" prep --out set --force --doc-sep % corpus.txt
[ "$(cat set/* | cksum)" = "$(cat sum1.txt)" ] && ok "and left the folder as it was" || fail "a refused --force changed the folder"
mkdir empty
"$MODTRAIN" prep --out empty/ --doc-sep % corpus.txt > /dev/null && [ -f empty/train_000000.bin ] &&
    ok "an empty folder takes the set" || fail "prep into an empty folder"
if ls -d ./*.prep-* > /dev/null 2>&1; then fail "temporary folders left: $(ls -d ./*.prep-*)"; else ok "no temporary folder is left"; fi
# another host's temporary folder (a folder shared between machines) is left alone
mkdir -p empty.prep-tmp.otherhost.1 && touch empty.prep-tmp.otherhost.1/train_000000.bin
"$MODTRAIN" prep --out empty --force --doc-sep % corpus.txt > /dev/null 2> err.txt || true
grep -q "^prep: left 'empty.prep-tmp.otherhost.1' alone: another host's prep wrote it" err.txt &&
    [ -f empty.prep-tmp.otherhost.1/train_000000.bin ] &&
    ok "another host's folder stays: $(cat err.txt)" || fail "another host's folder: $(cat err.txt)"
rm -rf empty.prep-tmp.otherhost.1
# a stale temporary folder of this host that is a symbolic link (to the
# shards of 'set'): the link goes, never what it names
pid=999999
while kill -0 $pid 2> /dev/null; do pid=$((pid + 1)); done
ln -s set "empty.prep-tmp.$(hostname).$pid"
"$MODTRAIN" prep --out empty --force --doc-sep % corpus.txt > /dev/null 2> err.txt || true
[ ! -e "empty.prep-tmp.$(hostname).$pid" ] && [ ! -L "empty.prep-tmp.$(hostname).$pid" ] &&
    [ "$(cat set/* | cksum)" = "$(cat sum1.txt)" ] &&
    ok "a stale temporary folder that is a link: removed itself, its target untouched" ||
    fail "a stale temporary link: $(cat err.txt); set now holds $(ls set)"

# a prep killed midway, reading from a slow pipe: nothing at OUT (with
# --force, the old set as it was); the next prep removes its temporary folder
mkfifo slow
kill_prep_midway() { # OUT OPTIONS...: starts a prep, kills it once it has closed a shard
    out=$1
    shift
    "$PYTHON" -c '
import sys, time
doc = b"the quick brown fox jumps over the lazy dog\nsome line of text\n%\n" * 4096
for _ in range(400):
    sys.stdout.buffer.write(doc)
    sys.stdout.flush()
    time.sleep(0.02)' > slow 2> /dev/null &
    writer=$!
    "$MODTRAIN" prep --out "$out" --mem 32M --shard_tokens 1000000 --doc-sep % "$@" - < slow > /dev/null 2>&1 &
    pid=$!
    n=0
    while ! ls "$out".prep-tmp.*."$pid"/train_000001.bin > /dev/null 2>&1 && [ $n -lt 600 ] && kill -0 $pid 2> /dev/null; do
        sleep 0.05
        n=$((n + 1))
    done
    kill -9 $pid 2> /dev/null || true
    wait $pid 2> /dev/null || true
    wait $writer 2> /dev/null || true
    tmp=$(ls -d "$out".prep-tmp.*."$pid" 2> /dev/null || true)
    [ -n "$tmp" ] && [ -d "$tmp" ] && ok "killed prep $pid with $(ls "$tmp" | wc -l) files in $tmp" ||
        fail "the prep was not killed while writing (no $out.prep-tmp.HOST.$pid)"
}
kill_prep_midway k
[ ! -e k ] && ok "a killed prep leaves no OUT" || fail "a killed prep left OUT: $(ls k)"
"$MODTRAIN" prep --out k --doc-sep % corpus.txt > out.txt 2> err.txt || fail "prep after a killed one: $(cat err.txt)"
grep -q "^prep: removed 'k.prep-tmp.[^']*\.[0-9]*', left by a prep (process [0-9]*) that did not finish$" err.txt &&
    ! ls -d k.prep-* > /dev/null 2>&1 && ok "the next prep said: $(cat err.txt)" ||
    fail "the next prep did not remove the stale folder: $(cat err.txt) $(ls -d k.prep-* 2> /dev/null)"
cat k/* | cksum > sumk.txt
kill_prep_midway k --force
[ "$(cat k/* | cksum)" = "$(cat sumk.txt)" ] && ok "a killed prep --force leaves the old set untouched" ||
    fail "a killed prep --force changed the set"
"$MODTRAIN" prep --out k --force --doc-sep % corpus.txt > /dev/null 2> err.txt && ! ls -d k.prep-* > /dev/null 2>&1 &&
    ok "and the next one cleans up: $(cat err.txt)" || fail "after a killed --force: $(cat err.txt)"

# the memory bound: documents on standard input through --mem 256M (not
# measured under AddressSanitizer: its shadow and quarantine are its own)
LIMIT_KB=262144
if ldd "$MODTRAIN" | grep -q libasan; then
    LIMIT_KB=999999999
    echo "note: an AddressSanitizer build: peak RSS is not checked against --mem"
fi
big() { # BYTES
    doc="$(printf 'the quick brown fox jumps over the lazy dog\nsome line of text\n%%')"
    set +e
    yes "$doc" | head -c "$1" | "$PEAKRSS" rss.txt "$MODTRAIN" prep --out big --doc-sep % --val-fraction 0.001 \
        --mem 256M --shard_tokens 500000000 - > big.log 2> big.err
    rc=$?
    set -e
    rss=$(cat rss.txt)
    if [ "$rc" -ne 0 ]; then
        fail "prep of $1 bytes on standard input: exit $rc: $(cat big.err)"
    elif [ "$rss" -ge "$LIMIT_KB" ]; then
        fail "prep of $1 bytes with --mem 256M peaked at $rss KiB"
    else ok "$1 bytes on standard input, --mem 256M: peak RSS $rss KiB; $(tail -n 1 big.log)"; fi
    # a run longer than 2 s says where it stands on stderr
    if [ -s big.err ] && ! grep -qv "^prep: [0-9.]* MB read, [0-9.]* MB/s, [0-9]* documents, [0-9]* tokens, [0-9]* shards written$" big.err; then
        ok "progress: $(tail -n 1 big.err)"
    elif [ -s big.err ]; then fail "progress lines: $(head -n 3 big.err)"; fi
    rm -rf big
}
big 300000000
if [ -n "${MODTRAIN_SKIP_SLOW:-}" ]; then
    echo "note: MODTRAIN_SKIP_SLOW: the 2.2 GB case is skipped"
else
    big 2200000000
fi

# hostile inputs: one line naming the file (and line), exit 2, no OUT and
# no temporary folder
hostile() { # PATTERN OPTIONS... (the prep's, after --out h)
    pattern=$1
    shift
    expect_refused "$pattern" "$MODTRAIN" prep --out h "$@"
    if [ -e h ] || ls -d h.prep-* > /dev/null 2>&1; then fail "a refused prep left output: $(ls -d h*)"; fi
}
head -n 100 corpus.jsonl > bad.jsonl
echo '{"id": 100, "text": "cut' >> bad.jsonl
tail -n 5 corpus.jsonl >> bad.jsonl
hostile "'bad.jsonl' line 101 is not JSON" --jsonl text --threads 2 bad.jsonl
sed '3s/"text"/"txet"/' bad.jsonl > bad2.jsonl # and an earlier bad line: the first is named
hostile "'bad2.jsonl' line 3 has no key \"text\"" --jsonl text --threads 2 bad2.jsonl
head -n 7 corpus.jsonl > nokey.jsonl
echo '{"id": 7, "body": "no text here"}' >> nokey.jsonl
hostile "'nokey.jsonl' line 8 has no key \"text\"" --jsonl text nokey.jsonl
head -n 4 corpus.jsonl > dupkey.jsonl
echo '{"text": "one", "id": 4, "text": "two"}' >> dupkey.jsonl # which text? refused, not guessed
hostile "'dupkey.jsonl' line 5 is not JSON (duplicate object key" --jsonl text dupkey.jsonl
echo '{"text": 42}' > number.jsonl
hostile "'number.jsonl' line 1: \"text\" is not a string" --jsonl text number.jsonl
echo '["text"]' > array.jsonl
hostile "'array.jsonl' line 1 is not a JSON object" --jsonl text array.jsonl
"$PYTHON" -c '
import sys
raw = bytearray(open("corpus.txt.gz", "rb").read())
for i in range(2000, 2064):
    raw[i] ^= 0x5a
open("bad.gz", "wb").write(raw)
open("cut.gz", "wb").write(raw[:1000])'
hostile "'bad.gz' is not valid gzip data" --doc-sep % bad.gz
head -c 30000 corpus.txt.gz > cut.gz
hostile "'cut.gz' ends in the middle of its gzip data" --doc-sep % cut.gz
if [ $zst = yes ]; then
    "$PYTHON" -c '
raw = bytearray(open("corpus.txt.zst", "rb").read())
for i in range(2000, 2064):
    raw[i] ^= 0x5a
open("bad.zst", "wb").write(raw)'
    hostile "'bad.zst' is not valid zstd data" --doc-sep % bad.zst
    head -c 30000 corpus.txt.zst > cut.zst
    hostile "'cut.zst' ends in the middle of a zstd frame" --doc-sep % cut.zst
fi
{
    printf 'a first document\n%%\n'
    head -c 3000000 /dev/zero | tr '\0' 'x'
    printf '\n%%\nthe third\n'
} > long.txt
hostile "'long.txt' line 3: the document from here is longer than 2.00 MiB, the cap under --mem" --mem 32M --doc-sep % long.txt
"$PYTHON" -c 'import json; print(json.dumps({"text": "y" * 3000000}))' > long.jsonl
hostile "'long.jsonl' line 1: the line is longer than 2.00 MiB" --mem 32M --jsonl text long.jsonl
hostile "cannot open 'missing.txt'" corpus.txt missing.txt
: > empty.txt
hostile "'empty.txt' is empty" corpus.txt empty.txt
hostile "1 document gives none to val at --val_fraction 0.1" corpus.txt
printf '%%\n%%\n' > seps.txt
hostile "the inputs hold no document" --val-fraction 0 --doc-sep % seps.txt
ln -s set link
hostile "'link' is a symbolic link" --out link --force --doc-sep % corpus.txt
"$MODTRAIN" prep --out one --val-fraction 0 corpus.txt > out.txt && [ "$(ls one)" = train_000000.bin ] &&
    ok "--val-fraction 0: $(tail -n 1 out.txt)" || fail "--val-fraction 0 on one document: $(ls one)"

"$MODTRAIN" prep --help > help.txt
for o in --out --force --val_fraction --tokenizer --vocab --doc_sep --jsonl --threads --mem --shard_tokens; do
    grep -q -- "$o" help.txt || fail "prep --help does not document $o"
done
ok "prep --help documents every option"

finish
