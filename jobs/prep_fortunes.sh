#!/bin/sh
# Tokenises the plain text of Debian's `fortunes` package (apt-get install
# fortunes) with the byte tokenizer into the shards OUT_DIR/train_000000.bin,
# ... and OUT_DIR/val_000000.bin, ... (each fortune a document, every 20th
# one to val). An OUT_DIR that already holds a set is left as it is.
# usage: jobs/prep_fortunes.sh [OUT_DIR] [MODTRAIN]
set -eu
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
exec "$modtrain" prep --out "$out" --doc-sep % --val-fraction 0.05 $files
