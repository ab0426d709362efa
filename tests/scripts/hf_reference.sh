#!/bin/sh
# Hugging Face tokenizer.json files against Hugging Face's tokenizers
# itself (the npm package tokenizers 0.23.2, its native build, run with
# node):
# - `modtrain tokenize` with GPT-2's and Llama 3's tokenizer.json
#   (jobs/get_tokenizers.sh) gives tokenizers' ids (no template tokens) on
#   the fortunes text (GPT-2's: its first 8,000 lines, since
#   bpe_reference.sh holds GPT-2's files, of the same hash, to js-tiktoken
#   on all of it) and the stress text, whose one exact added token is
#   changed for GPT-2 (tokenizers takes an added token's spelling in a text
#   as that token; modtrain encodes a document as text), and the ids
#   decode back to the texts and to random bytes;
# - Llama 3's file as tokenizers 0.23 saves it (merges as pairs) gives the
#   same hash (tokens, merges, pattern, ignore_merges, separator: the same
#   ids);
# - GPT-2's tokenizer.json gives GPT-2's two files' ids and their hash, so
#   shards of either train the same model;
# - prep --tokenizer hf writes the ids the rank file llama3.tiktoken gives,
#   after <|begin_of_text|>, in a shard recording tokenizer 7; a model
#   trains on GPT-2's tokenizer.json shards and sample takes the file;
# - ckpt export --format hf --vocab writes a tokenizer.json (from GPT-2's
#   files, from Llama 3's rank file) with which tokenizers gives
#   modtrain's ids, and which modtrain reads to them; killed at each
#   point of the file's durable write, or failing (EIO) at three, it leaves
#   the old file or the new one whole; another vocabulary than the
#   checkpoint's is one line;
# - what modtrain does not read (another model, pre-tokeniser or
#   normalizer, byte fallback, a bad merge, bad JSON) is one line each
#   (mem_bounds.sh: a file past the JSON budget).
# MODTRAIN_SKIP_SLOW (the sanitizer pass): three fortunes files, no
# training. Skips like bpe_reference.sh without node, npm or the registry,
# unless MODTRAIN_REQUIRE_REFERENCE=1 (CI).
. "$(dirname "$0")/lib.sh"
. "$srcdir/tests/scripts/tok_texts.sh"
tok_ref tokenizers@0.23.2
hf=$pkg
cat > ref.js <<'JS'
// TOKENIZER.JSON FILE...: tokenizers' ids of each file (no template
// tokens), one a line, into FILE.ref; with --save OUT, the file as
// tokenizers saves it
const { Tokenizer } = require("tokenizers");
const fs = require("fs");
const t = Tokenizer.fromFile(process.argv[2]);
if (process.argv[3] === "--save") return t.save(process.argv[4]);
(async () => {
    for (const f of process.argv.slice(3)) {
        const e = await t.encode(fs.readFileSync(f, "utf8"), null, { addSpecialTokens: false });
        fs.writeFileSync(f + ".ref", e.getIds().map((id) => id + "\n").join(""));
    }
})();
JS
tok_texts
gpt2=$ranks/gpt2/tokenizer.json llama3=$ranks/llama3/tokenizer.json
NODE_PATH="$hf/node_modules" node ref.js "$llama3" --save pairs.json
sed 's/<|endoftext|>/<|endoftext|\/>/' stress.txt > stress-hf.txt
head -n 8000 fortunes.txt > part.txt
# Llama 3's file on every fortunes file; GPT-2's on their first 8,000 lines
# (bpe_reference.sh holds GPT-2's two files, whose hash it has, to
# js-tiktoken on all of them), and the two files to the same ids
for c in "llama3:$llama3:fortunes.txt" "gpt2:$gpt2:part.txt:$vocab"; do
    name=${c%%:*} rest=${c#*:}
    file=${rest%%:*} rest=${rest#*:}
    text=${rest%%:*} also=${rest#"$text"}
    NODE_PATH="$hf/node_modules" node ref.js "$file" stress-hf.txt "$text"
    for f in stress-hf.txt "$text"; do
        for v in "$file" ${also#:}; do
            "$MODTRAIN" tokenize --vocab "$v" "$f" > "$f.mine"
            cmp -s "$f.mine" "$f.ref" || fail "$v: ids other than tokenizers' on $f: $(diff "$f.mine" "$f.ref" | head -n 4 | tr '\n' ' ')"
        done
    done
    with= on="the $n fortunes files"
    [ -z "$also" ] || with=" and GPT-2's files" on="the first 8,000 lines of those"
    ok "$name tokenizer.json$with: tokenizers' ids on the stress text and $on ($(cat stress-hf.txt.ref "$text.ref" | wc -l) ids)"
done
[ "$("$MODTRAIN" tokenize --vocab "$gpt2" --hash)" = "$("$MODTRAIN" tokenize --vocab "$vocab" --hash)" ] &&
    ok "gpt2 tokenizer.json: the hash of GPT-2's files" || fail "gpt2 tokenizer.json: another hash than GPT-2's files'"
# decoding: Llama 3's (GPT-2's tokenizer.json is GPT-2's files, by its hash)
cat stress.txt fortunes.txt random.bin > all.bin
"$MODTRAIN" tokenize --vocab "$llama3" all.bin | "$MODTRAIN" tokenize --vocab "$llama3" --decode |
    cmp -s - all.bin && ok "llama3 tokenizer.json: the texts and random bytes decode back to their bytes" ||
    fail "llama3 tokenizer.json: the texts and random bytes do not decode back"
# the hash covers tokens, merges, pattern, ignore_merges and the separator:
# the same hash is the same ids
[ "$("$MODTRAIN" tokenize --vocab pairs.json --hash)" = "$("$MODTRAIN" tokenize --vocab "$llama3" --hash)" ] &&
    ok "llama3: the file tokenizers 0.23 saves (merges as pairs) hashes as the one with strings" ||
    fail "llama3: pairs and strings hash apart"
# prep: Llama 3's tokenizer.json = its rank file, each fortune after <|begin_of_text|>
"$MODTRAIN" prep --out prep-hf --tokenizer hf --vocab "$llama3" --doc_sep % --val_fraction 0 \
    "$fortunes/fortunes" > prep-hf.log || { cat prep-hf.log; fail "prep --tokenizer hf failed"; }
"$MODTRAIN" prep --out prep-l3 --tokenizer llama3 --vocab "$ranks/llama3.tiktoken" --doc_sep % \
    --val_fraction 0 "$fortunes/fortunes" > prep-l3.log || { cat prep-l3.log; fail "prep --tokenizer llama3 failed"; }
"$PYTHON" - prep-hf/train_000000.bin prep-l3/train_000000.bin <<'PY' || fail "prep --tokenizer hf: the shard is not the rank file's"
import struct, sys
a, b = (open(p, "rb").read() for p in sys.argv[1:])
ha, hb = struct.unpack("<5i", a[:20]), struct.unpack("<5i", b[:20])
assert ha[:4] == hb[:4] and ha[4] == 7 and hb[4] == 6, (ha, hb)
assert a[1024:] == b[1024:] and struct.unpack("<I", a[1024:1028])[0] == 128000
print("ok: prep --tokenizer hf: %d tokens of 431 fortunes, those of llama3.tiktoken after <|begin_of_text|>; tokenizer 7, vocabulary %d" % (ha[2], ha[3]))
PY
if [ $slow = 1 ]; then
    "$MODTRAIN" prep --out prep-g2 --tokenizer hf --vocab "$gpt2" --doc_sep % --val_fraction 0 \
        "$fortunes/fortunes" > prep-g2.log || { cat prep-g2.log; fail "prep --tokenizer hf (gpt2) failed"; }
    common="--config $srcdir/jobs/tiny.conf --train_data prep-g2/train_*.bin --val_data= --steps 2 \
        --batch_size 4 --micro_batch 4 --d_model 32 --n_head 2 --eval_every 0 --threads 1 --ckpt_every 0"
    train_ok one
    "$MODTRAIN" sample --ckpt one/ckpt --vocab "$gpt2" --prompt "The" --tokens 4 --ids ids.txt > sample.txt 2>&1 &&
        [ "$(wc -l < ids.txt)" -ge 4 ] && ok "2 steps on tokenizer.json shards (tokenizer hf); sample takes the file" ||
        { cat sample.txt; fail "sample with GPT-2's tokenizer.json"; }
    # the HF export's tokenizer.json, from GPT-2's two files and from Llama
    # 3's rank file: tokenizers encodes with it to modtrain's ids (on the
    # stress text and the first 8,000 lines of the fortunes: the files they
    # come from are held to the references on all of them)
    # (Llama 3's vocabulary on a Llama-style model: a LlamaForCausalLM folder)
    common="--config $srcdir/jobs/tiny.conf --train_data prep-l3/train_*.bin --val_data= --steps 1 \
        --batch_size 4 --micro_batch 4 --d_model 32 --n_head 2 --eval_every 0 --threads 1 --ckpt_every 0 \
        --arch llama --n_kv_head 1"
    train_ok l3
    for c in "one:$vocab:gpt2" "l3:$ranks/llama3.tiktoken:llama3.tiktoken"; do
        run=${c%%:*} rest=${c#*:} from=${rest%:*} name=${rest##*:}
        "$MODTRAIN" ckpt export --ckpt "$run/ckpt" --format hf --out "hf-$run" --vocab "$from" > export.log 2>&1 ||
            { cat export.log; fail "ckpt export --format hf --vocab $from failed"; }
        NODE_PATH="$hf/node_modules" node ref.js "hf-$run/tokenizer.json" stress-hf.txt part.txt
        for f in stress-hf.txt part.txt; do
            "$MODTRAIN" tokenize --vocab "$from" "$f" | cmp -s - "$f.ref" ||
                fail "the tokenizer.json exported from $name: tokenizers' ids differ from modtrain's on $f"
            "$MODTRAIN" tokenize --vocab "hf-$run/tokenizer.json" "$f" | cmp -s - "$f.ref" ||
                fail "the tokenizer.json exported from $name: modtrain reads it to other ids on $f"
        done
        ok "ckpt export --format hf --vocab $name: tokenizers gives its tokenizer.json modtrain's ids ($(cat stress-hf.txt.ref part.txt.ref | wc -l)), and so does modtrain"
    done
    # the folder's commit: its files are written into a folder beside --out,
    # which is then renamed or exchanged into place whole. Killed at each
    # point an export over an older set (Llama 3's tokenizer.json alone)
    # reaches, the folder holds the old set or the new one whole, and the
    # export run again writes the new one and leaves nothing beside it;
    # failing (EIO) before the commit: one line, exit 1, the old set, nothing
    # beside; a file system that cannot exchange (EINVAL): the old set goes
    # aside and the new one in
    new="hf-one/tokenizer.json"
    fresh() { rm -rf hf-f hf-f.hf-* && mkdir hf-f && cp "$llama3" hf-f/tokenizer.json; }
    state() { # old, new or mixed
        if cmp -s hf-f/tokenizer.json "$llama3" && [ ! -e hf-f/config.json ] && [ ! -e hf-f/model.safetensors ]; then
            echo old
        elif cmp -s hf-f/tokenizer.json "$new" && cmp -s hf-f/config.json hf-one/config.json &&
            cmp -s hf-f/model.safetensors hf-one/model.safetensors; then
            echo new
        else
            echo mixed
        fi
    }
    fresh
    MODTRAIN_FAULT_TRACE=$TMP/trace "$MODTRAIN" ckpt export --ckpt one/ckpt --format hf --out hf-f \
        --vocab "$vocab" > /dev/null
    points=$(awk '$1 ~ /^(hf|file)\./ && !seen[$1]++ { printf "%s ", $1 }' trace)
    for want in hf.mkdir hf.tokenizer.rename hf.config.fsync hf.commit.exchange hf.remove.rmdir hf.commit.fsync_dir; do
        case " $points" in *" $want "*) ;; *) fail "the export reaches no $want: $points" ;; esac
    done
    bad=0 n=0
    for c in $points EIO:hf.tokenizer.write EIO:hf.config.rename EIO:hf.commit.fsync_tmp EINVAL:hf.commit.exchange; do
        p=${c#*:} a=${c%%:*}
        [ "$p" = "$c" ] && a=kill
        fresh
        set +e
        MODTRAIN_FAULT="at:$p:*:$a" "$MODTRAIN" ckpt export --ckpt one/ckpt --format hf --out hf-f \
            --vocab "$vocab" > fault.out 2> fault.err
        rc=$?
        set -e
        grep -v "MODTRAIN_FAULT" fault.err > fault.line || true
        st=$(state) n=$((n + 1))
        case $a in
        kill) [ "$st" != mixed ] && "$MODTRAIN" ckpt export --ckpt one/ckpt --format hf --out hf-f \
            --vocab "$vocab" > /dev/null 2>&1 && [ "$(state)" = new ] && ! ls -d hf-f.hf-* > /dev/null 2>&1 ;;
        EIO) [ "$st" = old ] && [ $rc = 1 ] && [ "$(wc -l < fault.line)" = 1 ] && ! ls -d hf-f.hf-* > /dev/null 2>&1 ;;
        EINVAL) [ "$st" = new ] && [ $rc = 0 ] && ! ls -d hf-f.hf-* > /dev/null 2>&1 ;;
        esac || { bad=1; fail "$a at $p: exit $rc, the $st set, '$(cat fault.line)', beside: $(ls -d hf-f.hf-* 2> /dev/null)"; }
    done
    [ $bad = 1 ] || ok "the export's folder killed at each of its points, or failing (EIO, EINVAL) at 4 ($n in all): the old set or the new one whole; a failure one line, nothing left beside"
    expect_error "has the hash .*, but 'l3/ckpt' was trained with" "$MODTRAIN" ckpt export --ckpt l3/ckpt --format hf --out hf-x --vocab "$gpt2"
fi
# what modtrain does not read, one line each
"$PYTHON" - "$gpt2" <<'PY'
import json, sys
base = open(sys.argv[1], encoding="utf-8").read()
def edit(name, f):
    d = json.loads(base)
    f(d)
    json.dump(d, open(name + ".json", "w"), ensure_ascii=False)
edit("unigram", lambda d: d["model"].update(type="Unigram"))
edit("wordpiece", lambda d: d["model"].update(type="WordPiece"))
edit("metaspace", lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "\u2581"}))
edit("nfc", lambda d: d.update(normalizer={"type": "NFC"}))
edit("fallback", lambda d: d["model"].update(byte_fallback=True))
edit("badmerge", lambda d: d["model"]["merges"].insert(5, "x yz"))
open("cut.json", "w").write(base[:5000])
PY
for c in "unigram:model Unigram is not supported" "wordpiece:model WordPiece is not supported" \
    "metaspace:pre_tokenizer Metaspace is not supported" "nfc:normalizer NFC is not supported" \
    "fallback:model BPE with byte_fallback is not supported" "badmerge:model.merges.5.: expected" \
    "cut:not valid JSON"; do
    expect_error "${c#*:}" "$MODTRAIN" tokenize --vocab "${c%%:*}.json" stress.txt
done
finish
