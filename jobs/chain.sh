#!/bin/sh
# Chains N jobs of one run: each starts when the previous ends (afterany) and
# resumes from its last checkpoint, for clusters that forbid requeueing or to
# cover a run longer than the partition's time limit.
#   jobs/chain.sh N my.conf [--key value ...]
# (--dependency=singleton with a fixed --job-name does the same.)
set -eu
usage() {
    echo "usage: jobs/chain.sh N CONFIG [--key value ...]"
    echo "Submits N jobs of jobs/train.sbatch CONFIG, each after the previous one ends"
    echo "(afterany), each resuming the run from its newest checkpoint."
}
case ${1:-} in --help | -h) usage; exit 0 ;; esac
case ${2:-} in --help | -h) usage; exit 0 ;; esac
if [ $# -lt 2 ]; then
    usage >&2
    exit 2
fi
n=$1
case $n in
'' | *[!0-9]* | 0*)
    echo "chain: N = '$n' is not a whole number >= 1 (see jobs/chain.sh --help)" >&2
    exit 2
    ;;
esac
shift
dir=$(cd "$(dirname "$0")" && pwd)
prev=""
i=0
while [ $i -lt "$n" ]; do
    id=$(sbatch --parsable ${prev:+--dependency=afterany:$prev} "$dir/train.sbatch" "$@")
    echo "submitted job $id${prev:+ after $prev}"
    prev=$id
    i=$((i + 1))
done
