#!/bin/sh
# docs/reference.md is what `modtrain reference` prints today, byte for
# byte; and what the code reads and writes, enumerated apart from the
# tables the reference is made from, is in it, and nothing else is:
# - the variables of every getenv and setenv in the C sources and every
#   ${NAME:-...}, ${NAME-...}, $MODTRAIN... and $SLURM_... in jobs/,
#   against the Environment table;
# - the fields of every metrics.jsonl line of real runs (a Mixture-of-
#   Depths-and-Experts model with a predictor on blended data, a non-finite
#   step rolled back and an MFU over 1; ZeRO-1 over dp 2; a dense pp 2),
#   against the metrics.jsonl table;
# - the lines of those runs' checkpoint indexes (their kinds, kv keys with
#   numbers as D and S, config keys, chunk prefixes), against the index
#   table and the configuration keys.
. "$(dirname "$0")/lib.sh"
cd "$TMP"
"$MODTRAIN" reference > reference.md
if cmp -s reference.md "$srcdir/docs/reference.md"; then
    ok "docs/reference.md is modtrain reference's output ($(wc -l < reference.md) lines)"
else
    diff "$srcdir/docs/reference.md" reference.md | head -n 20
    fail "docs/reference.md differs from 'modtrain reference' (regenerate: ./modtrain reference > docs/reference.md)"
fi

prep_fortunes
common="--config $srcdir/jobs/tiny.conf --seq_len 32 --eval_every 3 --eval_seqs 8 --log_every 100
    --ckpt_every 2 --train_data 0.7:data/train_000000.bin,0.3:data/val_000000.bin"
MODTRAIN_PEAK_GFLOPS=0.001 MODTRAIN_FAULT=nan-batch:3 train_ok mode --steps 6 \
    --val_data 0.5:data/val_000000.bin,0.5:data/train_000000.bin --route_every 2 \
    --causal_router predictor --n_expert 2 --n_noop_expert 1 --on_nonfinite rollback
train_ok zero 2 --steps 4 --zero 1 --val_data data/val_000000.bin
train_ok pp 2 --steps 4 --pp 2 --val_data data/val_000000.bin

"$PYTHON" - "$srcdir" reference.md mode zero pp << 'PY' ||
import glob, json, os, re, sys
src, ref = sys.argv[1], open(sys.argv[2]).read()
runs = sys.argv[3:]
bad = []

def table(heading_first_cell):
    """The first cells of the reference's table whose header starts so."""
    rows, on = [], False
    for line in ref.split("\n"):
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| " + heading_first_cell + " |"):
            on = True
            continue
        if on and line.startswith("|---"):
            continue
        if on and line.startswith("|"):
            rows.append(cells[0].strip("`"))
        elif on:
            break
    if not rows:
        bad.append("the reference has no table headed '%s'" % heading_first_cell)
    return rows

def compare(what, found, documented):
    before = len(bad)
    for name in sorted(set(found) - set(documented)):
        bad.append("%s %s (%s) is not in the reference" % (what, name, found[name]))
    for name in sorted(set(documented) - set(found)):
        bad.append("the reference's %s %s is nowhere to be found" % (what, name))
    print("ok: %d %ss, each in the reference and the reference's all found" % (len(found), what)
          if len(bad) == before else "checked %d %ss" % (len(found), what))

# the environment: C sources and jobs/
found = {}
for path in glob.glob(src + "/src/**/*.c", recursive=True) + glob.glob(src + "/mpi/*.c") + \
        glob.glob(src + "/checkpoint/*.c"):
    for m in re.finditer(r'\b(?:getenv|setenv)\("([A-Za-z_][A-Za-z0-9_]*)"', open(path).read()):
        found.setdefault(m.group(1), os.path.relpath(path, src))
for path in glob.glob(src + "/jobs/*.sh") + glob.glob(src + "/jobs/*.sbatch"):
    text = open(path).read()
    for m in re.finditer(r'\$\{([A-Z_][A-Z0-9_]*):?-|\$\{?((?:MODTRAIN|SLURM_)[A-Z0-9_]*)', text):
        found.setdefault(m.group(1) or m.group(2), os.path.relpath(path, src))
compare("variable", found, table("variable"))

# metrics.jsonl fields
found = {}
for run in runs:
    for line in open(run + "/metrics.jsonl"):
        for k in json.loads(line):
            found.setdefault(k, run)
compare("metrics field", found, table("field"))

# checkpoint index lines
keys = set(table("key"))
documented = {}
for row in table("index line"):
    w = row.split()
    documented[w[0] if w[0] not in ("kv", "chunk") else w[0] + " " + w[1].replace("TENSOR", "")] = 1
found = {}
for run in runs:
    for index in glob.glob(run + "/ckpt/step-*/index"):
        for line in open(index):
            w = line.split()
            if w[0] == "kv":
                k = w[1]
                if k.startswith("config."):
                    if k[7:] not in keys:
                        bad.append("%s: %s is not a configuration key" % (index, k))
                    k = "config.KEY"
                k = re.sub(r"^data\.p\d+\.s\d+$", "data.pD.sS", re.sub(r"^data\.p\d+$", "data.pD", k))
                found.setdefault("kv " + k, index)
            elif w[0] == "chunk":
                found.setdefault("chunk " + w[1].split("/")[0] + "/", index)
            else:
                found.setdefault(w[0], index)
compare("index line", found, documented)
for b in bad:
    print("FAIL: " + b)
sys.exit(1 if bad else 0)
PY
    fail "the reference and what the code reads and writes disagree (above)"
finish
