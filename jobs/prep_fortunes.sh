#!/bin/sh
# Tokenises the plain text of Debian's `fortunes` package (apt-get install
# fortunes) with the byte tokenizer into the shards OUT_DIR/train_000000.bin,
# ... and OUT_DIR/val_000000.bin, ... (each fortune a document, every 20th
# one to val). An OUT_DIR that already holds a set is left as it is.
# usage: jobs/prep_fortunes.sh [OUT_DIR] [MODTRAIN]
set -eu
usage() {
    echo "usage: jobs/prep_fortunes.sh [OUT_DIR] [MODTRAIN]"
    echo "Tokenises Debian's fortunes (FORTUNES_DIR, else /usr/share/games/fortunes) with"
    echo "the byte tokenizer into OUT_DIR (data/fortunes)/train_*.bin and val_*.bin, every"
    echo "20th fortune to val. MODTRAIN (else \$MODTRAIN, else ./modtrain) is the binary."
}
for a in "$@"; do
    case $a in
    --help | -h) usage; exit 0 ;;
    -*)
        echo "prep_fortunes: unknown option '$a' (see jobs/prep_fortunes.sh --help)" >&2
        exit 2
        ;;
    esac
done
if [ $# -gt 2 ]; then
    echo "prep_fortunes: $# arguments, expected at most 2: [OUT_DIR] [MODTRAIN]" >&2
    exit 2
fi
out=${1:-data/fortunes}
# the binary: MODTRAIN, else the tree's this script lives in (jobs/..), else the PATH's
tree=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$tree/modtrain" ] && [ -f "$tree/modtrain" ] && dflt=$tree/modtrain || dflt=modtrain
modtrain=${2:-${MODTRAIN:-$dflt}}
src=${FORTUNES_DIR:-/usr/share/games/fortunes}
if [ ! -d "$src" ]; then
    echo "prep_fortunes: $src not found (apt-get install fortunes)" >&2
    exit 2
fi
# The .dat files are indexes and the .u8 ones duplicates in UTF-8: skip both.
files=$(find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort)
# shellcheck disable=SC2086
exec "$modtrain" prep --out "$out" --doc_sep % --val_fraction 0.05 $files
