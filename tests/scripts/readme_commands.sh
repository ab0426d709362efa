#!/bin/bash
# Runs every command the guide shows (README.md, then each page of docs/ in
# the order README's map gives them), as written, in order, on the
# shipped configs: a line of an indented code block is a command when its
# first word is a program (./modtrain, modtrain SUBCOMMAND, mpirun, sbatch,
# jobs/..., make, ...) or a shell assignment; lines ending in '\' continue.
# Lines of program output never start so. Each command runs with bash from
# one scratch folder holding ./modtrain, jobs/ and the inputs the pages'
# examples name (made from the fortunes text), so later commands read what
# earlier ones wrote: each page states that starting state in a line
# "Starting state: ...", which every page with commands must have. Training is shortened by MODTRAIN_MAX_STEPS, and
# mpirun may oversubscribe the cores; nothing else differs from a user's
# shell. A command fails the test when it exits otherwise than its page says,
# unless SKIP below lists it with its reason.
. "$(dirname "$0")/lib.sh"
# The sanitizer pass (MODTRAIN_SKIP_SLOW) leaves the guide's commands to the
# first pass: they run what the other tests run, on larger inputs.
[ $slow = 1 ] || { echo "SKIP: MODTRAIN_SKIP_SLOW is set"; exit 77; }
[ -d "${FORTUNES_DIR:-/usr/share/games/fortunes}" ] ||
    { echo "SKIP: the fortunes package is not installed (apt-get install fortunes)"; exit 77; }
fortunes=${FORTUNES_DIR:-/usr/share/games/fortunes}

# A command the guide shows that this test does not run: a prefix of the
# command, a tab, the reason.
SKIP="jobs/quickstart.sh	installs packages and builds the tree it lives in; README's tour runs its steps
jobs/test.sh	runs this suite (CI runs it)
jobs/deps.sh	installs Debian packages as root (jobs/test.sh and CI run it)
./autogen.sh	builds the tree; this suite runs in the build
apt-get install	installs Debian packages (jobs/deps.sh installs these)
jobs/isoflop.sh --out isoflop	the default sweep takes about 30 minutes; the --quick sweep runs
jobs/isoflop.sh --out iso2	a sweep of minutes on a corpus of the reader's own; the --quick sweep runs
jobs/isoflop.sh --kinds dense,mod,moe	six kinds of model at three budgets take about 110 minutes; the --quick sweep of every kind runs in tests/scripts/isoflop.sh
mpirun -np 8 --hostfile HOSTFILE	a cluster's command: two nodes of 64 cores and their hostfile
tests/tools/nodes.sh	makes network namespaces and a bridge as root; tests/mpi/nodes.sh runs these steps
sbatch jobs/train.sbatch	needs a SLURM cluster: tests/slurm/launch.sh and preempt.sh submit it to a real one
jobs/chain.sh	needs a SLURM cluster: tests/slurm/preempt.sh chains jobs on a real one
make fuzz	minutes of libFuzzer; CI runs make fuzz
./modtrain reference > docs/reference.md	rewrites the source tree's reference; tests/scripts/reference.sh checks it is what this prints"
# A command the guide shows ending otherwise than with 0: a prefix, a tab,
# the exit codes it may give (the SIGUSR1 stop, which runs uncapped: 0
# only on a machine that trains its 200 steps in under 8 s).
EXPECT="timeout --preserve-status -s USR1	75 0"
# Commands that run whole, a prefix a line: a sweep's budgets fix its runs'
# steps, and the SIGUSR1 example must still be training when it comes.
UNCAPPED="jobs/isoflop.sh
timeout --preserve-status -s USR1"

W=$TMP/w
mkdir -p "$W/bin" "$W/my-texts" "$W/corpus/books"
cp -R "$srcdir/jobs" "$W/jobs"
chmod -R u+w "$W/jobs" # a distcheck source tree is read-only
cp "$MODTRAIN" "$W/modtrain"
ln -s ../modtrain "$W/bin/modtrain"
: > "$W/.session"

# The inputs the examples name: text files, JSON Lines (gzip) of
# documents, a folder of books.
texts=$(ls "$fortunes" | grep -v -E '\.(dat|u8)$' | head -n 12)
for f in $texts; do [ -f "$fortunes/$f" ] && cp "$fortunes/$f" "$W/my-texts/$f.txt"; done
for f in $(echo "$texts" | head -n 4); do [ -f "$fortunes/$f" ] && cp "$fortunes/$f" "$W/corpus/books/$f"; done
"$PYTHON" - "$fortunes" "$W" <<'PY'
import gzip, json, os, sys
src, out = sys.argv[1], sys.argv[2]
docs = []
for name in sorted(os.listdir(src)):
    path = os.path.join(src, name)
    if name.endswith((".dat", ".u8")) or not os.path.isfile(path):
        continue
    text = open(path, "rb").read().decode("utf-8", "replace")
    docs += [d.strip() for d in text.split("\n%\n") if d.strip()]
for name, part in (("corpus.jsonl.gz", docs[::3]), ("corpus/web.jsonl.gz", docs[1::3]),
                   ("rep.jsonl.gz", docs[2::3])):
    with gzip.open(os.path.join(out, name), "wt") as f:
        for d in part:
            f.write(json.dumps({"text": d}) + "\n")
PY

# The pages in the order of README's map (the links of its Documentation
# section; the generated reference and the architecture notes hold no
# commands), and every page of docs/ must be among them.
pages=$(cd "$srcdir" && { echo README.md; sed -n '/^## Documentation/,$p' README.md | grep -o '](docs/[a-z_]*\.md)' |
    sed 's/^](\(.*\))$/\1/' | grep -v -x -e docs/reference.md -e docs/architecture.md | awk '!seen[$0]++'; })
for f in "$srcdir"/docs/*.md; do
    case " $(echo $pages) docs/reference.md docs/architecture.md " in
    *" docs/$(basename "$f") "*) ;;
    *) fail "docs/$(basename "$f") is not in README's map of the docs" ;;
    esac
done
# the guide's commands, one a line, with their pages and line numbers
(cd "$srcdir" && "$PYTHON" - $pages) > "$TMP/commands" <<'PY'
import re, sys
programs = {"mpirun", "sbatch", "srun", "make", "apt-get", "echo", "printf", "time",
            "timeout", "export", "cat", "tc"}
subcommands = {"train", "eval", "sample", "ckpt", "plan", "prep", "data", "tokenize",
               "--version", "--help"}
def is_command(line):
    words = line.split()
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        if len(words) == 1:
            return True  # an assignment of its own
        words = words[1:]
    if not words:
        return False
    w = words[0]
    if w.startswith(("./", "jobs/", "tests/")):
        return True
    if w == "modtrain":
        return len(words) > 1 and words[1] in subcommands
    return w in programs
for page in sys.argv[1:]:
    lines = open(page, encoding="utf-8").read().split("\n")
    has_commands = False
    prev_blank, in_block, i = True, False, 0
    while i < len(lines):
        line = lines[i]
        code = line.startswith("    ") and (in_block or prev_blank)
        in_block = code
        prev_blank = line.strip() == ""
        if code and is_command(line.strip()):
            start, cmd = i + 1, line.strip()
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            print("%s:%d\t%s" % (page, start, cmd))
            has_commands = True
        i += 1
    if has_commands and not any(l.startswith("Starting state: ") for l in lines):
        print("%s:0\tMISSING-STARTING-STATE" % page)
PY
grep "	MISSING-STARTING-STATE$" "$TMP/commands" | cut -d: -f1 | while read -r page; do
    echo "FAIL: $page shows commands but no line 'Starting state: ...' saying what they need" >&2
done | tee "$TMP/nostate"
[ -s "$TMP/nostate" ] && fail "pages without their starting state"
sed -i '/	MISSING-STARTING-STATE$/d' "$TMP/commands"
n=$(wc -l < "$TMP/commands")
[ "$n" -ge 60 ] && ok "the guide shows $n commands on $(echo $pages | wc -w) pages" ||
    fail "found only $n commands in README.md and docs/"

# whether a command line is only an assignment (NAME=VALUE)
is_assignment() { printf '%s\n' "$1" | grep -q -E '^[A-Za-z_][A-Za-z0-9_]*=[^ ]*$'; }

lookup() { # TABLE COMMAND: the value of the first row whose prefix starts COMMAND
    printf '%s\n' "$1" | while IFS="	" read -r prefix value; do
        case $2 in "$prefix"*) printf '%s\n' "$value"; break ;; esac
    done
}

export PATH="$W/bin:$PATH" MODTRAIN_MAX_STEPS=${MODTRAIN_MAX_STEPS:-8}
export OMPI_MCA_rmaps_base_oversubscribe=1 # README's 4-rank examples on a 2-core machine
unset OMPI_MCA_ess_singleton_isolated OMPI_MCA_pml # Open MPI's defaults, as in a user's shell
ran=0 skipped=0
while IFS="	" read -r at cmd; do
    reason=$(lookup "$SKIP" "$cmd")
    if [ -n "$reason" ]; then
        echo "skip $at: $cmd ($reason)"
        skipped=$((skipped + 1))
        continue
    fi
    codes=$(lookup "$EXPECT" "$cmd")
    codes=${codes:-0}
    cap="MODTRAIN_MAX_STEPS=$MODTRAIN_MAX_STEPS"
    while read -r prefix; do
        case $cmd in "$prefix"*) cap="-u MODTRAIN_MAX_STEPS" ;; esac
    done <<< "$UNCAPPED"
    t0=$(date +%s)
    set +e
    # one shell session: the assignments a page makes hold for what follows
    (cd "$W" && env $cap bash -c ". ./.session; $cmd") < /dev/null > "$TMP/out" 2>&1
    rc=$?
    set -e
    case $cmd in *=*) is_assignment "$cmd" && printf 'export %s\n' "$cmd" >> "$W/.session" ;; esac
    ran=$((ran + 1))
    case " $codes " in
    *" $rc "*) ok "$at: $cmd (exit $rc, $(($(date +%s) - t0)) s)" ;;
    *)
        tail -n 20 "$TMP/out" | sed 's/^/    /'
        fail "$at: $cmd exited $rc (its page shows it ending with $codes)"
        ;;
    esac
done < "$TMP/commands"
echo "$ran commands run, $skipped skipped with their reasons"
# every skip reason still names a command the guide shows
printf '%s\n' "$SKIP" | while IFS="	" read -r prefix _; do
    cut -f2 "$TMP/commands" | grep -q -F -- "$prefix" || echo "stale skip: $prefix"
done > "$TMP/stale"
[ -s "$TMP/stale" ] && fail "skip entries for commands the guide no longer shows: $(cat "$TMP/stale")"
finish
