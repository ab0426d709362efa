#!/bin/sh
# From a fresh Debian machine to a trained model and a sample: installs the
# dependencies (when run as root), builds, prepares the fortunes text, trains
# jobs/small.conf, prints a sample and draws the run (runs/small/metrics.png).
# usage: jobs/quickstart.sh   (--help prints this and does nothing else)
set -eu
usage() {
    echo "usage: jobs/quickstart.sh"
    echo "From a fresh Debian machine to a trained model and a sample: installs the"
    echo "dependencies (as root, jobs/deps.sh), builds, prepares the fortunes text"
    echo "(data/fortunes), trains jobs/small.conf (runs/small) and prints a sample."
}
for a in "$@"; do
    case $a in --help | -h) usage; exit 0 ;; esac
done
if [ $# -gt 0 ]; then
    echo "quickstart: unexpected argument '$1' (it takes none; see jobs/quickstart.sh --help)" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
[ -f configure.ac ] || {
    echo "quickstart: $(pwd) is not a modtrain source tree (an installed copy?): run it from a checkout" >&2
    exit 2
}
if [ "$(id -u)" -eq 0 ]; then jobs/deps.sh; fi
[ -x configure ] || ./autogen.sh
[ -f Makefile ] || ./configure
make -j"$(nproc)"
jobs/prep_fortunes.sh data/fortunes ./modtrain
./modtrain train --config jobs/small.conf
echo "--- a sample from runs/small/ckpt:"
./modtrain sample --ckpt runs/small/ckpt --prompt "Q: What is the meaning of life?
A: " --tokens 300 --temperature 0.8 --top_k 40 --stats
echo "--- the run in one picture:"
if command -v gnuplot > /dev/null; then
    jobs/plot_run.sh runs/small
else
    echo "no gnuplot: install gnuplot-nox, then jobs/plot_run.sh runs/small draws runs/small/metrics.png"
fi
